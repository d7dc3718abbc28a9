#!/usr/bin/env bash
# The other side of `attention_bench --build-ab`: builds COMMIT in a git worktree (Release, its own
# build folder, kept for the next call) and writes the API's attention kernels as that build compiles
# them to OUT.tjb (D 64 and 128, full and causal, with and without dropout, the backward included, and
# the atomic reduction's kernels). Run here (no GPU needed),
# then carry OUT.tjb with .gpu and run `bench/attention_bench --build-ab OUT.tjb` from .gpu.
#   tools/build_ab_bundle.sh COMMIT OUT.tjb      (WORKTREE=/tmp/tilejit-ab-COMMIT by default)
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 COMMIT OUT.tjb" >&2
  exit 2
fi
commit=$(git rev-parse --short "$1")
out=$(realpath -m "$2")
tree=${WORKTREE:-/tmp/tilejit-ab-$commit}
if [ ! -d "$tree" ]; then git worktree add --detach "$tree" "$commit"; fi
cmake -S "$tree" -B "$tree/build" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$tree/build" -j "${JOBS:-4}" --target tilejit_cli
mkdir -p "$(dirname "$out")"
# an empty cache: every kernel compiled by that build
TILEJIT_CACHE=0 LD_LIBRARY_PATH="$tree/build" "$tree/build/tools/tilejit" bundle -o "$out" \
  --attention D=64 --attention D=64,mask=causal --attention D=128 --attention D=128,mask=causal \
  --attention D=64,dropout=1 --attention D=64,mask=causal,dropout=1 --attention D=128,dropout=1 --attention D=128,mask=causal,dropout=1 \
  --attention D=64,reduction=atomic --attention D=64,mask=causal,reduction=atomic \
  --attention D=128,reduction=atomic --attention D=128,mask=causal,reduction=atomic
echo "wrote $out from $commit ($tree)"
