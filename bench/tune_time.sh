#!/usr/bin/env bash
# How long `tilejit tune` takes for one shape, model-pruned (the default: the model's best 12
# compiled in parallel, its best 6 plus the default timed), from a cold cache: issue 29's "<= 5 s
# per attention shape". Run on the GPU machine from the repository root after tools/pack_gpu.sh
# (carry .gpu). Prints per shape the process's wall time, the tuner's own split and its choice
# against the default. A second run of the same shape is a lookup (also printed).
#   bench/tune_time.sh            REP_MS (default 20: timed repetitions per config)
set -u
cd .gpu || exit 2
export LD_LIBRARY_PATH=$PWD TILEJIT_QUIET=1
export TILEJIT_CACHE_DIR=$(mktemp -d /tmp/tune-time-XXXX)  # cold: nothing compiled or tuned before
run() {
  local start=$(date +%s%N)
  ./tilejit tune "$@" --rep-ms "${REP_MS:-20}" > "$TILEJIT_CACHE_DIR/last.log" 2>&1
  local rc=$? end=$(date +%s%N)
  local ms=$(( (end - start) / 1000000 ))
  printf '%-60s rc=%d process wall %d.%03d s\n' "$*" $rc $((ms / 1000)) $((ms % 1000))
  grep -E "^space:|^best:|^default|^from the" "$TILEJIT_CACHE_DIR/last.log" | sed 's/^/    /'
}
for args in "attention_fwd --shape 4,16,4096,128 --meta CAUSAL=false" "attention_fwd --shape 4,16,4096,128 --meta CAUSAL=true" \
            "attention_fwd --shape 4,32,4096,64 --meta CAUSAL=false" "attention_fwd --shape 1,16,16384,128 --meta CAUSAL=false" \
            "attention_bwd_dkdv --shape 4,16,4096,64 --meta CAUSAL=false" "attention_bwd_dkdv --shape 4,16,4096,128 --meta CAUSAL=true" \
            "attention_bwd_dq --shape 4,16,4096,128 --meta CAUSAL=false" "gemm --shape 4096,4096,4096"; do
  run $args
done
run attention_fwd --shape 4,16,4096,128 --meta CAUSAL=false  # warm: a lookup
rm -rf "$TILEJIT_CACHE_DIR"
