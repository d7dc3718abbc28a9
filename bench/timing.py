"""The Python benches' CUDA-event timing (the rules attention_bench's time_ms / queued_ms follow).

queued_ms: as a training step runs it -- after `settle_ms` of calls back to back (under the H200's
700 W cap the SM clock falls from 1,980 MHz within ~200 ms: decision 099), calls queued back to
back between one pair of events (as many as fill ~5 ms, 3 to 64), the per-call mean of each of 7
batches, their median. synced_ms: one call between two events, synchronised after each (the older
tables' rule): the host's work inside the call (for SDPA, Python and the dispatcher) lands between
the events.
"""
import torch


def _one_call_ms(fn):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    torch.cuda.synchronize()
    return max(a.elapsed_time(b), 1e-3)


def queued_ms(fn, settle_ms=500.0):
    one = _one_call_ms(fn)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    settled = 0.0
    while settled < settle_ms:
        a.record()
        for _ in range(max(1, min(4096, int(50.0 / one) + 1))):
            fn()
        b.record()
        torch.cuda.synchronize()
        settled += a.elapsed_time(b)
    calls = max(3, min(64, int(5.0 / one) + 1))
    ms = []
    for _ in range(7):
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        torch.cuda.synchronize()
        ms.append(a.elapsed_time(b) / calls)
    return sorted(ms)[len(ms) // 2]


def synced_ms(fn, min_total_ms=300.0, max_reps=20):
    one = _one_call_ms(fn)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(max(3, min(max_reps, int(min_total_ms / one)))):
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ms.append(a.elapsed_time(b))
    return sorted(ms)[len(ms) // 2]
