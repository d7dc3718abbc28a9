#!/usr/bin/env bash
# Packs what a GPU-machine run needs into .gpu/ (git-ignored, carried by the device tool): the
# library and the GPU-side executables, stripped, with the benchmark scripts next to them.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
rm -rf .gpu && mkdir -p .gpu/bench
# the newest build of the library (a build directory keeps the files of earlier versions)
cp "$(ls -t "$BUILD_DIR"/libtilejit.so.0.* | head -1)" .gpu/libtilejit.so.0
cp "$BUILD_DIR"/bindings/libtilejit_c.so .gpu/ 2>/dev/null || true  # the C ABI (bindings/c)
for t in test_jit_gpu test_driver_gpu test_jit test_cuda_backend; do cp "$BUILD_DIR/tests/$t" .gpu/; done
USER_EXAMPLES="cumsum_row topk_logits argmax_rows histogram_atomic layernorm softmax_xent"
for e in attention gemm vector_add softmax bundle_app $USER_EXAMPLES; do cp "$BUILD_DIR/examples/$e" .gpu/; done
cp "$BUILD_DIR"/examples/bundle_app.tjb .gpu/ 2>/dev/null || true
for t in test_bundle test_function_gpu test_autotuner test_autotuner_gpu test_attention_gpu test_attention_api test_attention_backward test_nccl test_nccl_gpu test_context_parallel_gpu test_context_parallel_kernels test_c_abi; do cp "$BUILD_DIR/tests/$t" .gpu/ 2>/dev/null || true; done
cp "$BUILD_DIR"/bench/tune_gemm .gpu/bench/ 2>/dev/null || true
cp "$BUILD_DIR"/bench/launch_overhead .gpu/bench/ 2>/dev/null || true
cp "$BUILD_DIR"/bench/gemm_bench .gpu/bench/
cp "$BUILD_DIR"/bench/attention_bench .gpu/bench/ 2>/dev/null || true
cp "$BUILD_DIR"/bench/attention_timeline .gpu/bench/ 2>/dev/null || true
cp "$BUILD_DIR"/bench/dkdv_probe .gpu/bench/ 2>/dev/null || true
cp "$BUILD_DIR"/bench/transformer_block .gpu/bench/ 2>/dev/null || true
cp "$BUILD_DIR"/tools/tilejit "$BUILD_DIR"/tools/tilejit_fuzz .gpu/
strip --strip-unneeded .gpu/libtilejit.so.0 .gpu/test_* .gpu/attention .gpu/gemm .gpu/vector_add .gpu/softmax .gpu/bundle_app .gpu/tilejit .gpu/tilejit_fuzz .gpu/bench/* $(for e in $USER_EXAMPLES; do echo .gpu/$e; done)
# another build's kernels for `gpu_suites.sh buildab` (tools/build_ab_bundle.sh COMMIT build-ab/COMMIT.tjb):
# the newest one, as .gpu/old.tjb
old_bundle=$(ls -t build-ab/*.tjb 2>/dev/null | head -1 || true)
if [ -n "$old_bundle" ]; then cp "$old_bundle" .gpu/old.tjb && echo "old.tjb: $old_bundle"; fi
cp bench/attention.py bench/timing.py bench/gemm.py bench/cp_torch.py bench/cp.py bench/torch_users_refs.py .gpu/bench/  # after strip: scripts next to the binaries
# The commit these binaries were built from (the GPU machine's copy has no .git); "-dirty" when
# the tree had uncommitted changes.
{ git rev-parse --short HEAD 2>/dev/null || echo unknown; } | tr -d '\n' > .gpu/COMMIT
git diff --quiet HEAD 2>/dev/null || echo -n "-dirty" >> .gpu/COMMIT
du -sh .gpu
