"""The timing protocol the benchmarks (and the kernel tools) share (benchmarks/README.md has the long form): copy
bandwidth (``dst.copy_(src)``, bytes read + written), cold L2 (a 256 MiB read before each timed call), the host queued
ahead (``torch.cuda._sleep`` for HOST_AHEAD_FACTOR x the host time to enqueue the call, clamped), the eager loop (wall
time between two synchronisations, rotating order). On the CPU: perf_counter marks, no sleep, no eviction."""

from __future__ import annotations

import math
import statistics
import sys
import time
import types

SLEEP_CYCLES_PER_US = 2000  # torch.cuda._sleep counts SM cycles: ~2 GHz under load (a slower clock sleeps longer)
L2_EVICT_BYTES = 256 * 2**20
HOST_AHEAD_MIN_US = 1000.0
HOST_AHEAD_FACTOR = 3.0
HOST_AHEAD_MAX_US = 200000.0


class DeviceClock:
    """Marks around calls (CUDA events; perf_counter on the CPU), the L2 eviction and the host-ahead sleep."""

    def __init__(self, torch, device, flush: bool):
        self.torch, self.device, self.cuda = torch, device, device.type == "cuda"
        self.can_sleep = self.cuda and hasattr(torch.cuda, "_sleep")
        self.flush_buf = None
        if self.cuda and flush:
            self.flush_buf = torch.empty(L2_EVICT_BYTES // 4, dtype=torch.float32, device=device).normal_()

    def before_call(self, ahead_us: float) -> None:
        """Queue what precedes a timed call, outside its span: the sleep of ahead_us (if > 0), the L2 eviction."""
        if self.can_sleep and ahead_us > 0:
            self.torch.cuda._sleep(int(ahead_us * SLEEP_CYCLES_PER_US))
        if self.flush_buf is not None:
            self.flush_buf.sum()

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


def time_call(clock: DeviceClock, fn, ahead_us: float):
    """Run fn() once between two marks, after the sleep and the eviction: (mark, mark, host ms to enqueue)."""
    clock.before_call(ahead_us)
    m0, t0 = clock.mark(), time.perf_counter()
    fn()
    host_ms = (time.perf_counter() - t0) * 1e3
    return m0, clock.mark(), host_ms


def copy_bandwidth(torch, clock: DeviceClock, nbytes: int, reps: int, ahead_us: float) -> tuple[float, list]:
    """``dst.copy_(src)`` of ``nbytes`` of bf16, counting bytes read + bytes written: (median GB/s, all GB/s)."""
    n = nbytes // 2
    src = torch.randn(n, dtype=torch.bfloat16, device=clock.device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    clock.sync()
    handles = [time_call(clock, lambda: dst.copy_(src), ahead_us) for _ in range(reps)]
    clock.sync()
    gbs = [2 * n * 2 / (clock.elapsed_ms(m0, m1) * 1e-3) / 1e9 for m0, m1, _ in handles]
    return statistics.median(gbs), gbs


def auto_ahead_us(host_ms: float, cap_us: float) -> float:
    """The ``auto`` host-ahead window of a call whose host time to enqueue is ``host_ms``: HOST_AHEAD_MIN_US or more."""
    return min(cap_us, max(HOST_AHEAD_MIN_US, HOST_AHEAD_FACTOR * host_ms * 1e3))


def rotation(items: list, round_index: int) -> list:
    k = round_index % max(1, len(items))
    return items[k:] + items[:k]


def time_gpu(clock, calls, n_sets: int, counter: int, reps: int, warmup: int, on_error):
    """Rounds of ``calls`` [(provider, pass, fn(i): one call on input set i)]: ``times``, ``host_times`` (ms of each
    timed call on the device, on the host) and ``window_us`` (auto) per (provider, pass); ``failed``: providers that
    raised (on_error(name, pass, exc)), then left out; ``counter``: calls so far in the run (set: counter % n_sets)."""
    keys = [(p.name, p_) for p, p_, _ in calls]
    out = types.SimpleNamespace(times={k: [] for k in keys}, host_times={k: [] for k in keys},
                                window_us=dict.fromkeys(keys, HOST_AHEAD_MIN_US), failed=set(), counter=counter)
    warm_host = {k: [] for k in keys}
    for r in range(warmup + reps if calls else 0):
        if r == warmup:
            full_kernels_ready()
        handles = []
        for p, p_, fn in rotation(calls, r):
            if p.name in out.failed:
                continue
            i = out.counter % n_sets
            out.counter += 1
            try:
                h = time_call(clock, lambda: fn(i), out.window_us[(p.name, p_)])
            except Exception as exc:  # noqa: BLE001 - a provider that fails is reported and dropped
                on_error(p.name, p_, exc)
                out.failed.add(p.name)
                continue
            handles.append(((p.name, p_), h))
        clock.sync()
        for key, (m0, m1, host_ms) in handles:
            if r >= warmup:
                out.times[key].append(clock.elapsed_ms(m0, m1))
                out.host_times[key].append(host_ms)
            elif r >= 1 or warmup == 1:  # the first round compiles and autotunes
                warm_host[key].append(host_ms)
        if r == warmup - 1:  # the window per (provider, pass), from its warm-up host times
            for key, hs in warm_host.items():
                if hs:
                    out.window_us[key] = auto_ahead_us(max(hs), HOST_AHEAD_MAX_US)
    return out


def eager_forms(torch, call, x, dy, params, chain: int, calls: int, modes) -> dict:
    """{form in modes: (fn, calls per sample)} of the eager loop; call(y, i): the i-th call of a chain, x (requiring
    grad), dy: tensors or lists; a step sets ``params``' .grad to None. chain: ``chain`` calls from x, one backward(dy);
    step: ``calls`` x (call(x, 0), its backward); nograd: ``calls`` x call(x, 0) under no_grad."""

    def zero_grad():
        for t in params:
            t.grad = None

    def chain_step():
        zero_grad()
        y = x
        for i in range(chain):
            y = call(y, i)
        torch.autograd.backward(y, dy)

    def one_call_steps():
        for _ in range(calls):
            zero_grad()
            torch.autograd.backward(call(x, 0), dy)

    def nograd_calls():
        with torch.no_grad():
            for _ in range(calls):
                call(x, 0)

    forms = {"chain": (chain_step, chain), "step": (one_call_steps, calls), "nograd": (nograd_calls, calls)}
    return {mode: forms[mode] for mode in forms if mode in modes}


def wall_samples(subjects: dict, rounds: int, warmup: int, before, after, on_error=None) -> dict:
    """{key: [ms per call]} of subjects {key: (fn, calls)}, rounds in rotating order, a sample = before(), fn(), after()
    timed; the first ``warmup`` rounds dropped; a subject that raises: dropped with on_error(key, exc), else raised."""
    keys = list(subjects)
    out, dead = {k: [] for k in keys}, set()
    for r in range(warmup + rounds):
        if r == warmup:
            full_kernels_ready()
        for key in rotation(keys, r):
            if key in dead:
                continue
            fn, calls = subjects[key]
            try:
                before()
                t0 = time.perf_counter()
                fn()
                after()
                dt = time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001 - a subject that fails is reported and dropped
                if on_error is None:
                    raise
                dead.add(key)
                on_error(key, exc)
                continue
            if r >= warmup:
                out[key].append(dt * 1e3 / calls)
    return {k: v for k, v in out.items() if k not in dead}


def full_kernels_ready() -> None:
    """Wait for cakeconv's background compile of its full kernels, if any: timed rounds time those, not quick twins."""
    ahead = sys.modules.get("cakeconv.cake_causal_conv1d_det_train_backend.compile_ahead")
    if ahead is not None:
        ahead.wait_for_kernels()


def percentile(values, q: float) -> float:
    """The q-quantile of values, linear between neighbours (nan when empty)."""
    v, pos = sorted(values), (len(values) - 1) * q
    if not v:
        return float("nan")
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)
