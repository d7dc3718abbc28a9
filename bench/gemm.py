"""bench/gemm.py: cuBLAS (through torch.matmul) and the tilejit DSL GEMM in one run, one table.

Usage (on the GPU machine, from the repo root, after building):  python3 bench/gemm.py BUILD_DIR
bf16 inputs, f32 accumulate, bf16 output; both B layouts: K-major (torch: a @ b.T with b [N, K])
and MN-major (a @ b with b [K, N]), the same operand layout for both libraries. Prints a markdown
table for BENCHMARKS.md.
"""
import subprocess
import sys

import torch

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 6144, 2048)]


def cublas_tflops(m, n, k, b_mn_major, a_mn_major=False, reps=30):
    a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).T if a_mn_major else torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) if b_mn_major else torch.randn(n, k, device="cuda", dtype=torch.bfloat16).T
    for _ in range(5):
        torch.matmul(a, b)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # back to back for ~500 ms first, as gemm_bench does: the clock settles under the power cap
    # (decision 099)
    settled = 0.0
    while settled < 500.0:
        start.record()
        for _ in range(reps):
            torch.matmul(a, b)
        end.record()
        torch.cuda.synchronize()
        settled += start.elapsed_time(end)
    start.record()
    for _ in range(reps):
        torch.matmul(a, b)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / reps
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| layout | M x N x K | cuBLAS TFLOP/s | tilejit TFLOP/s | ratio | tilejit config | rel. err |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    # (A^T[K,M] with B[K,N]: a weight gradient, dW = dY^T X)
    for a_mn_major, b_mn_major in ((False, False), (False, True), (True, True)):
        flag = "--a-mn-major" if a_mn_major else "--b-mn-major" if b_mn_major else None
        args = ([flag] if flag else []) + [str(x) for s in SHAPES for x in s]
        out = subprocess.run([f"{build}/bench/gemm_bench", *args], capture_output=True, text=True)
        sys.stderr.write(out.stderr)
        ours = {}
        for line in out.stdout.splitlines():
            m, n, k, tf, cfg, err = line.split()
            ours[(int(m), int(n), int(k))] = (float(tf), cfg, err)
        for s in SHAPES:
            cb = cublas_tflops(*s, b_mn_major, a_mn_major)
            tf, cfg, err = ours.get(s, (0.0, "-", "-"))
            layout = "A^T[K,M], B[K,N]" if a_mn_major else "B[K,N] (NN)" if b_mn_major else "B^T[N,K] (TN)"
            print(f"| {layout} | {s[0]}x{s[1]}x{s[2]} | {cb:.0f} | {tf:.0f} | {tf / cb:.2f} | {cfg} | {err} |")


if __name__ == "__main__":
    main()
