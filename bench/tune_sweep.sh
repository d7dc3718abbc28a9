#!/usr/bin/env bash
# Exhaustive `tilejit tune` over the attention forward's, dK/dV's, dQ's and the GEMM's valid spaces (issue
# 29's check of the performance model): one CSV row per config and shape (the model's terms, the
# measurement, the compiled resources). Run on the GPU machine from the repository root after
# tools/pack_gpu.sh (carry .gpu):  bench/tune_sweep.sh [attention|dkdv|dkdv_atomic|dq|gemm ...]
#   SEQS="1024 4096 16384" HEAD_DIMS="64 128" MASKS="false true" REP_MS=30 GEMM_SHAPE=4096,4096,4096
#   TUNE_BUDGET=900 (s per tune run: it stops timing and still writes its CSV; an outer kill writes none)
# Under OUT only two files (the device machine returns few): sweep.csv (every run's rows, one header)
# and sweep.txt (per run: wall, space, Spearman, best, any hang or failure); logs stay in WORK.
set -u
OUT=${OUT:-/tmp/tune-sweep}
WORK=${WORK:-/tmp/tune-sweep-work}
mkdir -p "$OUT" "$WORK"
cd .gpu || exit 2
export LD_LIBRARY_PATH=$PWD TILEJIT_CACHE_DIR=${TILEJIT_CACHE_DIR:-/tmp/tilejit-tune-sweep} TILEJIT_QUIET=1
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(attention gemm)
summary="$OUT/sweep.txt"
: > "$summary"
rm -f "$WORK"/*.csv "$WORK"/*.log
# one tune run: NAME, then tilejit tune's arguments
tune() {
  local name=$1; shift
  local start=$(date +%s)
  timeout $(( ${TUNE_BUDGET:-900} + 120 )) ./tilejit tune "$@" --exhaustive --force --budget-s "${TUNE_BUDGET:-900}" \
    --rep-ms "${REP_MS:-30}" --csv "$WORK/$name.csv" > "$WORK/$name.log" 2>&1
  local rc=$?
  { echo "== $name rc=$rc $(( $(date +%s) - start ))s"
    grep -E "Spearman|^best|^default|space:" "$WORK/$name.log"
    grep -E "hung|GpuHang|failed:" "$WORK/$name.log" | head -3; } | tee -a "$summary"
}
for w in "${what[@]}"; do
  case $w in
    attention)
      for d in ${HEAD_DIMS:-64 128}; do
        heads=$(( d == 64 ? 32 : 16 ))
        for causal in ${MASKS:-false true}; do
          shapes=()
          for s in ${SEQS:-1024 4096 16384}; do shapes+=(--shape "$(( 16384 / s )),$heads,$s,$d"); done
          tune "attention_d${d}_causal_$causal" attention_fwd "${shapes[@]}" --meta CAUSAL=$causal
        done
      done ;;
    dkdv|dq|dkdv_atomic)  # the backward's dK/dV or dQ kernel (recompute reduction), or dK/dV with the atomic one (decision 106)
      kernel=attention_bwd_${w%_atomic}; extra=(); [ "$w" = dkdv_atomic ] && extra=(--meta DQ_REDUCTION=1)
      for d in ${HEAD_DIMS:-64 128}; do
        for causal in ${MASKS:-false true}; do
          shapes=()
          for s in ${SEQS:-1024 4096 16384}; do shapes+=(--shape "$(( 16384 / s )),16,$s,$d"); done
          tune "${w}_d${d}_causal_$causal" "$kernel" "${shapes[@]}" --meta CAUSAL=$causal "${extra[@]}"
        done
      done ;;
    gemm) tune gemm gemm --shape "${GEMM_SHAPE:-4096,4096,4096}" ;;
  esac
done
# every CSV's rows under one header
first=1
for f in "$WORK"/*.csv; do
  [ -s "$f" ] || continue
  if [ $first = 1 ]; then cat "$f"; first=0; else tail -n +2 "$f"; fi
done > "$OUT/sweep.csv"
rows=$(wc -l < "$OUT/sweep.csv")
echo "sweep.csv: $(( rows > 0 ? rows - 1 : 0 )) rows" | tee -a "$summary"
