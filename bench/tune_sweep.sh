#!/usr/bin/env bash
# Exhaustive `tilejit tune` over the attention forward's and the GEMM's whole valid spaces (issue
# 29's check of the performance model): one CSV row per config and shape (the model's terms, the
# measurement, the compiled resources) under OUT. Run on the GPU machine from the repository root
# after tools/pack_gpu.sh (carry .gpu):  bench/tune_sweep.sh [attention|gemm ...]
#   SEQS="1024 4096 16384" HEAD_DIMS="64 128" MASKS="false true" REP_MS=30 TUNE_BUDGET=900 (s per tune run:
#   it stops timing and still writes its CSV) TUNE_TIMEOUT=400 (a kill: no CSV)
set -u
OUT=${OUT:-/tmp/tune-sweep}
mkdir -p "$OUT"
cd .gpu || exit 2
export LD_LIBRARY_PATH=$PWD TILEJIT_CACHE_DIR=${TILEJIT_CACHE_DIR:-/tmp/tilejit-tune-sweep} TILEJIT_QUIET=1
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(attention gemm)
for w in "${what[@]}"; do
  case $w in
    attention)
      for d in ${HEAD_DIMS:-64 128}; do
        heads=$(( d == 64 ? 32 : 16 ))
        for causal in ${MASKS:-false true}; do
          shapes=()
          for s in ${SEQS:-1024 4096 16384}; do shapes+=(--shape "$(( 16384 / s )),$heads,$s,$d"); done
          start=$(date +%s)
          timeout ${TUNE_TIMEOUT:-400} ./tilejit tune attention_fwd "${shapes[@]}" --meta CAUSAL=$causal --exhaustive --force --budget-s ${TUNE_BUDGET:-900} \
            --rep-ms "${REP_MS:-30}" --csv "$OUT/attention_d${d}_causal_$causal.csv" > "$OUT/attention_d${d}_causal_$causal.log" 2>&1
          echo "attention D$d causal=$causal rc=$? $(( $(date +%s) - start ))s"
          grep -E "Spearman|^best|space:" "$OUT/attention_d${d}_causal_$causal.log"
        done
      done ;;
    gemm)
      start=$(date +%s)
      timeout ${TUNE_TIMEOUT:-400} ./tilejit tune gemm --shape ${GEMM_SHAPE:-4096,4096,4096} --exhaustive --force --budget-s ${TUNE_BUDGET:-900} --rep-ms "${REP_MS:-30}" \
        --csv "$OUT/gemm.csv" > "$OUT/gemm.log" 2>&1
      echo "gemm rc=$? $(( $(date +%s) - start ))s"; grep -E "Spearman|^best|space:" "$OUT/gemm.log" ;;
  esac
done
