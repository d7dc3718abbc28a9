# References for the users-kernel examples (BENCHMARKS.md, "topk and histogram"): torch.topk and
# torch.bincount at the examples' large shapes, and a 256 MB copy for the copy bandwidth; CUDA events,
# 20 calls after one warm-up. Run on the GPU machine: python3 bench/torch_users_refs.py
import torch
x = torch.randn(65536, 1024, device="cuda")
def t(f, n=20):
    f(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1e3
us = t(lambda: torch.topk(x, 16, dim=1))
print(f"torch.topk 65536x1024 f32 k=16: {us:.1f} us, {(x.numel()*4 + 65536*16*12)/us/1e3:.0f} GB/s")
h = (torch.arange(1 << 26, device="cuda", dtype=torch.int32) % 97)
us = t(lambda: torch.bincount(h, minlength=64))
print(f"torch.bincount 2^26 i32: {us:.1f} us, {h.numel()*4/us/1e3:.0f} GB/s")
us = t(lambda: torch.histc(h.float(), bins=64, min=0, max=64))
print(f"torch.histc (incl. float cast) 2^26: {us:.1f} us")
y = torch.empty_like(x)
us = t(lambda: y.copy_(x))
print(f"copy 256MB: {us:.1f} us, {2*x.numel()*4/us/1e3:.0f} GB/s")

# Triton's tl.topk (a bitonic network, as tilejit's) at the same shape: one program per row.
try:
    import triton
    import triton.language as tl

    @triton.jit
    def _triton_topk(X, V, C: tl.constexpr, K: tl.constexpr):
        r = tl.program_id(0)
        x = tl.load(X + r * C + tl.arange(0, C))
        tl.store(V + r * K + tl.arange(0, K), tl.topk(x, K))

    v = torch.empty(65536, 16, device="cuda")
    ref = torch.topk(x, 16, dim=1).values
    for w in (1, 2, 4, 8):
        f = lambda: _triton_topk[(65536,)](x, v, C=1024, K=16, num_warps=w)
        us = t(f)
        ok = torch.equal(v, ref)
        print(f"triton tl.topk 65536x1024 f32 k=16, {w} warps: {us:.1f} us, {x.numel()*4/us/1e3:.0f} GB/s, values equal torch: {ok}")
except Exception as e:  # an older Triton without tl.topk
    print(f"triton tl.topk: not measured ({type(e).__name__}: {str(e)[:200]})")
