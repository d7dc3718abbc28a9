#!/usr/bin/env bash
# On the GPU machine, from the repository root, after tools/pack_gpu.sh (carry .gpu): every GPU
# check in one command, each log under OUT (default $OUT, else /tmp/gpu-suites), one summary line
# per step on stdout. Multi-GPU steps run when there are 2+ GPUs (on an x4 machine they also cover
# W = 2). Steps (all by default but `tables`, `block`, `hiding`, `gemm`, `buildab`, `masks`, `masksab`, `varlen`, `dropout`, `timing`; or name some): suites (= suites1
# then suites2: one call each on a lent machine) bundle fuzz
# examples torch cp cpbench tables (bench/attention.py beside SDPA: bf16, --gqa 4, --dtype f16; ~95 s a round
# settled (decision 099), ROUNDS (default 3) each; TABLES= to pick) timing (--timing-ab, power_probe.py) block (bench/transformer_block) hiding (its --hiding per MASK_TILES) gemm (bench/gemm.py vs cuBLAS)
# buildab (attention_bench --build-ab .gpu/old.tjb) varlen (--varlen-ab, decision 113) masks (--masks beside flex_masks.py) masksab (--masks --with MASK_WITH) dropout (attention_bench --dropout 0.1 --phases, D128 and D64, ~2 min). torch: bindings/torch's GPU tests and its per-call cost
# (needs PyTorch on the machine).
#   tools/gpu_suites.sh [STEP ...]          FUZZ_SEEDS=A:B (default 700000:720000), FUZZ_TIME=seconds
set -u
OUT=${OUT:-/tmp/gpu-suites}
mkdir -p "$OUT"
cd .gpu || exit 2
export LD_LIBRARY_PATH=$PWD TILEJIT_CACHE_DIR=${TILEJIT_CACHE_DIR:-/tmp/tilejit-gpu-suites} TILEJIT_QUIET=1 NCCL_NVLS_ENABLE=0
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(suites bundle fuzz examples torch cp cpbench)
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
echo "commit $(cat COMMIT); $gpus x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
summary() { grep -E "test cases:|Status:" "$1" | tail -2 | tr '\n' ' '; }
for step in "${steps[@]}"; do
  start=$(date +%s)
  case $step in
    suites|suites1|suites2)
      # all of them took over 600 s (one call's limit) on a fresh H200: suites1 then suites2 in two calls
      first=(test_jit_gpu test_attention_gpu test_attention_api)
      second=(test_driver_gpu test_function_gpu test_autotuner_gpu test_bundle test_cuda_backend test_attention_backward test_c_abi
              test_context_parallel_kernels)
      case $step in suites1) tests=("${first[@]}") ;; suites2) tests=("${second[@]}") ;; *) tests=("${first[@]}" "${second[@]}") ;; esac
      for t in "${tests[@]}"; do
        s=$(date +%s); timeout 600 ./$t > "$OUT/$t.log" 2>&1
        echo "$t rc=$? $(( $(date +%s) - s ))s $(summary "$OUT/$t.log")"
      done ;;
    bundle) bash ../tools/gpu_check_bundle.sh . > "$OUT/bundle.log" 2>&1; echo "bundle rc=$? $(tail -1 "$OUT/bundle.log")" ;;
    fuzz)
      # --time stops starting seeds and still prints the summary (a timeout kill prints nothing).
      # A third of the time each: the default programs, TMA stores (--tma-stores: faults and proxy
      # ordering the emulator cannot see), and the launch-time specialisation (--specialize).
      t=$(( ${FUZZ_TIME:-420} / 3 ))
      for mode in default tma-stores specialize; do
        flags=(); [ "$mode" != default ] && flags=(--$mode)
        timeout $((t + 120)) ./tilejit_fuzz --gpu "${flags[@]}" --seeds "${FUZZ_SEEDS:-700000:720000}" --time "$t" --jobs 16 --quiet \
          > "$OUT/fuzz_$mode.log" 2>&1
        echo "fuzz $mode rc=$? $(( $(date +%s) - start ))s"; grep -A8 "summary" "$OUT/fuzz_$mode.log" | head -10
      done ;;
    examples)  # users' kernels: checked against host references, then GB/s at a large shape
      for e in cumsum_row topk_logits argmax_rows histogram_atomic layernorm softmax_xent; do
        timeout 120 ./$e > "$OUT/example_$e.log" 2>&1; echo "$e rc=$?: $(tr '\n' ' ' < "$OUT/example_$e.log" | tail -c 400)"
      done ;;
    torch)  # tilejit_torch (bindings/torch) over this build's libtilejit_c
      (cd .. && TILEJIT_C_LIBRARY=$PWD/.gpu/libtilejit_c.so timeout 400 python3 bindings/torch/tests/test_torch_gpu.py > "$OUT/torch.log" 2>&1)
      echo "torch tests rc=$? $(( $(date +%s) - start ))s: $(grep -E '^(Ran|OK|FAILED|SKIPPED)' "$OUT/torch.log" | tr '\n' ' ')"
      (cd .. && TILEJIT_C_LIBRARY=$PWD/.gpu/libtilejit_c.so timeout 300 python3 bench/torch_overhead.py > "$OUT/torch_overhead.md" 2>&1)
      echo "torch_overhead rc=$?"; grep "^|" "$OUT/torch_overhead.md" ;;
    cp)
      if [ "$gpus" -lt 2 ]; then echo "cp: skipped ($gpus GPU)"; continue; fi
      timeout 300 ./test_nccl_gpu > "$OUT/nccl_gpu.log" 2>&1; echo "test_nccl_gpu rc=$? $(summary "$OUT/nccl_gpu.log")"
      timeout 600 ./test_context_parallel_gpu > "$OUT/cp_gpu.log" 2>&1
      echo "test_context_parallel_gpu rc=$? $(( $(date +%s) - start ))s $(summary "$OUT/cp_gpu.log")"
      grep -v "^\[" "$OUT/cp_gpu.log" | grep -E "ERROR|HANG|logged|what" | head -10 ;;
    cpbench)
      if [ "$gpus" -lt 2 ]; then echo "cpbench: skipped ($gpus GPU)"; continue; fi
      (cd bench && timeout 900 python3 cp.py ./attention_bench --reps 5 > "$OUT/cp_table.md" 2> "$OUT/cp_table.err")
      echo "cp.py rc=$? $(( $(date +%s) - start ))s"; cat "$OUT/cp_table.md"
      timeout 300 bench/attention_bench --cp --documents --reps 5 > "$OUT/cp_documents.log" 2>&1
      echo "--documents rc=$?"; grep "^CP" "$OUT/cp_documents.log" ;;
    tables)  # issue 22's bars: one run per variant, each its own table (ratios only within a run)
      for v in ${TABLES:-bf16 gqa4 f16}; do
        case $v in bf16) args=() ;; gqa4) args=(--gqa 4) ;; f16) args=(--dtype f16) ;; *) echo "unknown table $v"; continue ;; esac
        (cd .. && timeout 590 python3 bench/attention.py .gpu/bench/attention_bench --no-check --rounds "${ROUNDS:-3}" --out "$OUT/table_$v" "${args[@]}" \
           > "$OUT/table_$v.log" 2>&1)
        echo "table $v rc=$? $(( $(date +%s) - start ))s"; grep "^|" "$OUT/table_$v.log" | tail -20
      done ;;
    block)  # issue 30: one Llama block per dropout mode (bench/transformer_block), S 4k and 8k
      timeout 590 bench/transformer_block > "$OUT/block.log" 2>&1
      echo "transformer_block rc=$? $(( $(date +%s) - start ))s"; grep -E "^(MASK|BLOCK|PARTS)" "$OUT/block.log" ;;
    hiding)  # issue 30 / decision 094: each GEMM's mask curve in the block, the model's split; per mask tile, S 4k (~45 s each)
      # a token: MxW (mask tile, written in the K loop) or MxW@4:MMA_REGS:MASK_REGS (by 4 mask warps of their own)
      for t in ${MASK_TILES:-64x16 64x8 128x4 64x16@4:176:152}; do
        warps=(); [[ $t == *@* ]] && warps=(--mask-warps "${t#*@}")
        timeout 200 bench/transformer_block --hiding --seq "${HIDING_SEQ:-4096}" --mask-tile "${t%@*}" "${warps[@]}" > "$OUT/hiding_${t//[@:]/_}.log" 2>&1
        echo "hiding $t rc=$? $(( $(date +%s) - start ))s"; grep -E "^(ASSIGN|HIDING|MASK)" "$OUT/hiding_${t//[@:]/_}.log"
      done ;;
    gemm)  # GEMM vs cuBLAS in one run, K-major, B[K,N] and A^T layouts (bench/gemm.py)
      (cd .. && timeout 590 python3 bench/gemm.py .gpu > "$OUT/gemm.md" 2> "$OUT/gemm.err")
      echo "gemm.py rc=$? $(( $(date +%s) - start ))s"; grep "^|" "$OUT/gemm.md" ;;
    dropout)  # dropout's cost (S4k, fused and reading bits, forward and backward; the backward's phases for none / once / twice:
      # decision 097) at D128 with the QKV GEMM + attention end to end, then D64 (~60 s each)
      for d in 128 64; do
        timeout 300 bench/attention_bench --dropout 0.1 --phases --head-dim $d > "$OUT/dropout_d$d.log" 2>&1
        echo "dropout D$d rc=$? $(( $(date +%s) - start ))s"; grep -E "^(DROPOUT|E2E )" "$OUT/dropout_d$d.log"
      done ;;
    buildab)  # a compiler change in one process: .gpu/old.tjb (tools/build_ab_bundle.sh COMMIT build-ab/COMMIT.tjb, then pack_gpu.sh)
      if [ ! -f old.tjb ]; then echo "buildab: no .gpu/old.tjb (tools/build_ab_bundle.sh COMMIT build-ab/COMMIT.tjb here, then pack_gpu.sh)"; continue; fi
      timeout 590 bench/attention_bench --build-ab old.tjb > "$OUT/buildab.log" 2>&1
      echo "build-ab rc=$? $(( $(date +%s) - start ))s"; grep "^BUILD_AB" "$OUT/buildab.log" ;;
    masks)  # library masks beside FlexAttention (BENCHMARKS "Masks vs FlexAttention"; ~3 min), MASK_SEQ=S for one length, MASK_D=64
      seq=(); [ -n "${MASK_SEQ:-}" ] && seq=(--seq "$MASK_SEQ"); [ -n "${MASK_D:-}" ] && seq+=(--head-dim "$MASK_D")
      timeout 300 bench/attention_bench --masks "${seq[@]}" > "$OUT/masks.log" 2>&1; echo "masks rc=$?"; grep "^MASK " "$OUT/masks.log"
      (cd .. && timeout 250 python3 bench/flex_masks.py "${seq[@]}" > "$OUT/flex_masks.log" 2>&1); echo "flex rc=$?"; grep "^FLEX" "$OUT/flex_masks.log" ;;
    masksab)  # the masked forward A/B (MASK_WITH, default PERSISTENT=1: RING_PRODUCER is the default since 110), MASK_SEQ=S for one length, MASK_D=64
      seq=(); [ -n "${MASK_SEQ:-}" ] && seq=(--seq "$MASK_SEQ"); [ -n "${MASK_D:-}" ] && seq+=(--head-dim "$MASK_D")
      timeout 400 bench/attention_bench --masks "${seq[@]}" --with "${MASK_WITH:-PERSISTENT=1}" > "$OUT/masks_ab.log" 2>&1
      echo "masks A/B rc=$?"; grep "^MASK_AB" "$OUT/masks_ab.log" ;;
    varlen)  # decision 113: packed self-attention, the varlen kernels against Options::varlen_documents, D128 then D64 (~1-2 min each)
      for d in 128 64; do
        timeout 280 bench/attention_bench --varlen-ab --head-dim $d > "$OUT/varlen_d$d.log" 2>&1
        echo "varlen-ab D$d rc=$? $(( $(date +%s) - start ))s"; grep "^VARLEN_AB" "$OUT/varlen_d$d.log"
      done ;;
    timing)  # decision 099: the timing methods in one process, then sustained phases with clock and power beside cuDNN (~2 min)
      timeout 200 bench/attention_bench --timing-ab > "$OUT/timing_ab.log" 2>&1; echo "timing-ab rc=$?"; grep "^TIMING_AB" "$OUT/timing_ab.log"
      (cd .. && TILEJIT_C_LIBRARY=$PWD/.gpu/libtilejit_c.so timeout 300 python3 bench/power_probe.py --seconds 3 --phases 4 --backward \
         > "$OUT/power_probe.md" 2>&1); echo "power_probe rc=$? $(( $(date +%s) - start ))s"; grep "^|" "$OUT/power_probe.md" ;;
    *) echo "unknown step $step (valid: suites bundle fuzz examples torch cp cpbench tables block hiding gemm buildab masks masksab varlen dropout timing)"; exit 2 ;;
  esac
done
