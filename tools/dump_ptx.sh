#!/usr/bin/env bash
# Dumps the tile IR and PTX of every library kernel at its default schedule and at the
# configurations the attention API and the benchmarks use (plus a few non-default schedule
# variants), through both backends, one file per (configuration, backend):
#   tools/dump_ptx.sh OUT_DIR [TILEJIT_BINARY]
# Compare two dumps with `diff -r`: a refactoring that changes no generated code leaves them
# byte-identical. Needs no GPU (PTX only, no cubin).
set -euo pipefail
OUT=${1:?usage: tools/dump_ptx.sh OUT_DIR [TILEJIT_BINARY]}
BIN=${2:-$(dirname "$0")/../build/tools/tilejit}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")

bf=DTYPE=bf16
# name | kernel | options (--meta K=V, --num-warps, --stages, --min-programs-per-sm)
CONFIGS=$(cat <<'LIST'
gemm|gemm|
gemm_bn|gemm|--meta B_KMAJOR=false --meta BLOCK_N=128 --num-warps 8 --stages 4
gemm_f16|gemm|--meta DTYPE=f16 --meta OUT_DTYPE=f32
gemm_at|gemm|--meta A_KMAJOR=false --meta B_KMAJOR=false --meta OUT_DTYPE=bf16
gemm_mask|gemm|--meta DROPOUT_MASK=true --meta MASK_WARPS=4 --meta MASK_REGISTERS=40 --meta MMA_REGISTERS=232 --num-warps 12
fwd|attention_fwd|
fwd_d64|attention_fwd|--meta HEAD_DIM=64 --meta BSHD=true --meta POSITIVE_SCALE=true --meta EXACT_NORMALIZE=false --min-programs-per-sm 2
fwd_d64_causal|attention_fwd|--meta HEAD_DIM=64 --meta BSHD=true --meta CAUSAL=true --meta POSITIVE_SCALE=true --meta EXACT_NORMALIZE=false --min-programs-per-sm 2
fwd_d128|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta POSITIVE_SCALE=true
fwd_d128_causal|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta CAUSAL=true --meta POSITIVE_SCALE=true
fwd_d128_f16|attention_fwd|--meta DTYPE=f16 --meta HEAD_DIM=128 --meta BSHD=true
fwd_d256|attention_fwd|--meta HEAD_DIM=256 --meta BLOCK_N=64 --meta BSHD=true
fwd_d64_dropout|attention_fwd|--meta HEAD_DIM=64 --meta BLOCK_M=64 --meta BSHD=true --meta DROPOUT=true --num-warps 4
fwd_d128_dropout_causal|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta CAUSAL=true --meta DROPOUT=true
fwd_d128_dropout_bits|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta DROPOUT=true --meta DROPOUT_BITS=true
fwd_d64_return_mask|attention_fwd|--meta HEAD_DIM=64 --meta BLOCK_M=64 --meta DROPOUT=true --meta RETURN_MASK=true --meta DROPOUT_PAIRS=false --num-warps 4
fwd_varlen|attention_fwd|--meta HEAD_DIM=64 --meta BLOCK_M=64 --meta BLOCK_N=64 --meta VARLEN=true --num-warps 4 --stages 3
fwd_varlen_causal_d128|attention_fwd|--meta HEAD_DIM=128 --meta BLOCK_M=64 --meta BLOCK_N=64 --meta VARLEN=true --meta CAUSAL=true --num-warps 4 --stages 3
fwd_mask_window|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta MASK=3 --meta POSITIVE_SCALE=true
fwd_mask_document|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta MASK=6 --meta POSITIVE_SCALE=true
fwd_mask_prefix|attention_fwd|--meta HEAD_DIM=64 --meta BSHD=true --meta MASK=7
fwd_mask_sparse|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta MASK=10
fwd_alibi|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta SCORE_MOD=1
fwd_softcap_causal|attention_fwd|--meta HEAD_DIM=64 --meta BSHD=true --meta CAUSAL=true --meta SCORE_MOD=2
fwd_pingpong|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta PINGPONG=true --meta PIPELINE_QK=false
fwd_pipeline_pv|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta PIPELINE_PV=true
fwd_no_sections|attention_fwd|--meta HEAD_DIM=128 --meta CAUSAL=true --meta HEAVY_FIRST_SECTIONS=false
fwd_rng_warps|attention_fwd|--meta HEAD_DIM=64 --meta BLOCK_M=64 --meta DROPOUT=true --meta RNG_WARPS=4 --num-warps 8
fwd_dropout_ahead|attention_fwd|--meta HEAD_DIM=128 --meta DROPOUT=true --meta DROPOUT_AHEAD=true
fwd_api_d128|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta POSITIVE_SCALE=true --meta PERSISTENT=true --meta RING_PRODUCER=true --meta PIPELINE_PV=true --meta TMA_STORE=true --meta BLOCK_N=128 --num-warps 8 --stages 2
fwd_api_d128_causal|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta CAUSAL=true --meta POSITIVE_SCALE=true --meta PERSISTENT=true --meta RING_PRODUCER=true --meta PIPELINE_PV=true --meta TMA_STORE=true --meta BLOCK_N=128 --num-warps 8 --stages 2
fwd_overlap_tiles_causal|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta CAUSAL=true --meta POSITIVE_SCALE=true --meta PERSISTENT=true --meta RING_PRODUCER=true --meta PIPELINE_PV=true --meta OVERLAP_TILES=true --meta BLOCK_N=128 --num-warps 8 --stages 2
fwd_timeline_causal|attention_fwd|--meta HEAD_DIM=128 --meta BSHD=true --meta CAUSAL=true --meta POSITIVE_SCALE=true --meta PERSISTENT=true --meta RING_PRODUCER=true --meta PIPELINE_PV=true --meta TIMELINE=true --meta BLOCK_N=128 --num-warps 8 --stages 2
bwd_pre|attention_bwd_preprocess|--meta HEAD_DIM=128 --meta BSHD=true --stages 1
bwd_pre_varlen|attention_bwd_preprocess|--meta HEAD_DIM=64 --meta VARLEN=true --stages 1
dkdv|attention_bwd_dkdv|
dkdv_d64|attention_bwd_dkdv|--meta HEAD_DIM=64 --meta BSHD=true --min-programs-per-sm 3
dkdv_d128|attention_bwd_dkdv|--meta HEAD_DIM=128 --meta BSHD=true
dkdv_d128_causal|attention_bwd_dkdv|--meta HEAD_DIM=128 --meta BSHD=true --meta CAUSAL=true
dkdv_d128_atomic|attention_bwd_dkdv|--meta HEAD_DIM=128 --meta BLOCK_N=128 --meta BSHD=true --meta DQ_REDUCTION=1 --num-warps 8
dkdv_d64_split|attention_bwd_dkdv|--meta HEAD_DIM=64 --meta BSHD=true --meta DQ_REDUCTION=2
dkdv_d64_ordered|attention_bwd_dkdv|--meta HEAD_DIM=64 --meta BSHD=true --meta CAUSAL=true --meta DQ_REDUCTION=3 --meta PERSISTENT=true
dkdv_d64_ordered_desc|attention_bwd_dkdv|--meta HEAD_DIM=64 --meta BSHD=true --meta CAUSAL=true --meta DQ_REDUCTION=3 --meta Q_DESCENDING=true
dkdv_d128_dropout|attention_bwd_dkdv|--meta HEAD_DIM=128 --meta BSHD=true --meta DROPOUT=true
dkdv_d64_dropout_bits|attention_bwd_dkdv|--meta HEAD_DIM=64 --meta BSHD=true --meta DROPOUT=true --meta DROPOUT_BITS=true
dkdv_mask_document|attention_bwd_dkdv|--meta HEAD_DIM=128 --meta BSHD=true --meta MASK=5
dkdv_mask_window|attention_bwd_dkdv|--meta HEAD_DIM=64 --meta BSHD=true --meta MASK=2
dkdv_softcap|attention_bwd_dkdv|--meta HEAD_DIM=128 --meta BSHD=true --meta SCORE_MOD=2
dkdv_varlen|attention_bwd_dkdv|--meta HEAD_DIM=64 --meta VARLEN=true --num-warps 8
dkdv_all_tiles|attention_bwd_dkdv|--meta HEAD_DIM=128 --meta CAUSAL=true --meta PARTIAL_TILES_ONLY=false
dkdv_timeline|attention_bwd_dkdv|--meta HEAD_DIM=128 --meta BSHD=true --meta LSE_IN_RING=true --meta TIMELINE=true
dq|attention_bwd_dq|
dq_d128_causal|attention_bwd_dq|--meta HEAD_DIM=128 --meta BSHD=true --meta CAUSAL=true
dq_d64_dropout|attention_bwd_dq|--meta HEAD_DIM=64 --meta BSHD=true --meta DROPOUT=true --meta BLOCK_M=64 --meta BLOCK_N=64 --num-warps 4
dq_mask_sparse|attention_bwd_dq|--meta HEAD_DIM=128 --meta BSHD=true --meta MASK=10 --meta BLOCK_M=64 --meta BLOCK_N=64 --num-warps 4
dq_alibi|attention_bwd_dq|--meta HEAD_DIM=64 --meta BSHD=true --meta SCORE_MOD=1 --meta BLOCK_M=64 --meta BLOCK_N=64 --num-warps 4
dq_varlen|attention_bwd_dq|--meta HEAD_DIM=128 --meta VARLEN=true --meta CAUSAL=true --meta BLOCK_M=64 --meta BLOCK_N=64 --num-warps 4
dq_convert|attention_bwd_dq_convert|--meta HEAD_DIM=128 --meta BSHD=true
dq_reduce|attention_bwd_dq_reduce|--meta HEAD_DIM=64 --meta BSHD=true --meta BLOCK_N=64
classes|attention_block_classes|--meta MASK=5
classes_sparse|attention_block_classes|--meta MASK=10 --meta BLOCK_M=64 --meta BLOCK_N=64 --num-warps 4
lists|attention_block_lists|
lists_kv|attention_block_lists|--meta KV_MAJOR=true
dropout_mask|dropout_mask|
dropout_mask_causal|dropout_mask|--meta CAUSAL=true --meta PERSISTENT=true
LIST
)

one() {  # name kernel options backend
  local name=$1 kernel=$2 opts=$3 backend=$4 dir
  dir=$(mktemp -d)
  # shellcheck disable=SC2086
  if ! "$BIN" compile "$kernel" $opts --backend "$backend" --emit ir --emit ptx -o "$dir" > "$dir/log" 2>&1; then
    { echo "FAILED: $kernel $opts --backend $backend"; cat "$dir/log"; } > "$OUT/$name.$backend.error"
  else
    mv "$dir"/*.tir "$OUT/$name.tir"
    mv "$dir"/*.ptx "$OUT/$name.$backend.ptx"
  fi
  rm -rf "$dir"
}
export -f one
export BIN OUT
echo "$CONFIGS" | while IFS='|' read -r name kernel opts; do
  for backend in llvm nvrtc; do printf '%s|%s|%s|%s\n' "$name" "$kernel" "$opts" "$backend"; done
done | xargs -P "$JOBS" -d '\n' -n 1 bash -c 'IFS="|" read -r a b c d <<< "$0"; one "$a" "$b" "$c" "$d"'
n=$(find "$OUT" -name "*.ptx" | wc -l); e=$(find "$OUT" -name "*.error" | wc -l)
echo "tools/dump_ptx.sh: $n PTX files, $e failures in $OUT"
[ "$e" -eq 0 ]
