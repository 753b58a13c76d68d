"""The timing protocol both benchmarks (and the kernel tools) share; benchmarks/README.md has the long form.

* Copy bandwidth: ``dst.copy_(src)`` of a large bf16 tensor, bytes read plus bytes written, the median of
  several calls. It is the ceiling every time is rated against (SPEC section 7).
* Cold L2: before each timed call and outside its span, a read of a 256 MiB buffer evicts the L2. It is a
  read, so the eviction leaves no dirty lines for the timed call to write back.
* Host queued ahead: before each timed call ``torch.cuda._sleep`` holds the GPU, so that the host enqueues
  the whole call before the GPU reaches it (the host's launch time is hidden, as in a pipelined training
  step). The ``auto`` window is ``HOST_AHEAD_FACTOR`` x the host time to enqueue the call, at least
  ``HOST_AHEAD_MIN_US``.
* Eager loop: no sleep; wall time between two synchronisations. A chain step sets every gradient to None,
  runs ``chain`` calls ``y = call(y, i)`` starting from x and one ``backward(dy)``; a one-call step runs one
  call and its backward; the no-grad item runs forward calls under ``torch.no_grad()``. The subjects are
  sampled round by round, in an order that rotates every round, so none always follows the same neighbour.

On the CPU (``--dry-run``) the marks are ``time.perf_counter`` readings and nothing sleeps or evicts.
"""

from __future__ import annotations

import math
import statistics
import time

SLEEP_CYCLES_PER_US = 2000  # torch.cuda._sleep counts SM cycles: ~2 GHz under load (a slower clock sleeps longer)
L2_EVICT_BYTES = 256 * 2**20
HOST_AHEAD_MIN_US = 1000.0
HOST_AHEAD_FACTOR = 3.0


class DeviceClock:
    """Marks around calls (CUDA events on a GPU, perf_counter on the CPU), the L2 eviction by reading and
    the host-ahead sleep."""

    def __init__(self, torch, device, flush: bool):
        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.can_sleep = self.cuda and hasattr(torch.cuda, "_sleep")
        self.flush_buf = None
        if self.cuda and flush:
            self.flush_buf = torch.empty(L2_EVICT_BYTES // 4, dtype=torch.float32, device=device).normal_()

    def hold_gpu(self, us: float) -> None:
        """Queue a sleep of ``us`` microseconds on the GPU (nothing on the CPU or for us <= 0)."""
        if self.can_sleep and us > 0:
            self.torch.cuda._sleep(int(us * SLEEP_CYCLES_PER_US))

    def evict_l2(self) -> None:
        """Queue the read of the eviction buffer (nothing without one)."""
        if self.flush_buf is not None:
            self.flush_buf.sum()

    def before_call(self, ahead_us: float) -> None:
        """What precedes a timed call, outside its span: the host-ahead sleep, then the L2 eviction."""
        self.hold_gpu(ahead_us)
        self.evict_l2()

    def mark(self):
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def elapsed_ms(self, a, b) -> float:
        if self.cuda:
            return a.elapsed_time(b)
        return (b - a) * 1e3

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


def time_call(clock: DeviceClock, fn, ahead_us: float):
    """Run fn() once between two marks, after the sleep and the eviction. Returns a handle for ``resolve``
    (the device time is known only once the device has reached the second mark)."""
    clock.before_call(ahead_us)
    m0 = clock.mark()
    t0 = time.perf_counter()
    fn()
    host_ms = (time.perf_counter() - t0) * 1e3
    m1 = clock.mark()
    return m0, m1, host_ms


def resolve(clock: DeviceClock, handle) -> tuple[float, float]:
    """(device ms between the marks, host ms to enqueue the call) of a ``time_call`` handle."""
    m0, m1, host_ms = handle
    return clock.elapsed_ms(m0, m1), host_ms


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
    gbs = [2 * n * 2 / (resolve(clock, h)[0] * 1e-3) / 1e9 for h in handles]
    del src, dst
    return statistics.median(gbs), gbs


def auto_ahead_us(host_ms: float, floor_us: float, cap_us: float) -> float:
    """The ``auto`` host-ahead window for a call whose host time to enqueue is ``host_ms``."""
    return min(cap_us, max(floor_us, HOST_AHEAD_FACTOR * host_ms * 1e3))


def rotation(items: list, round_index: int) -> list:
    """``items`` in the order of round ``round_index``: the order rotates by one every round."""
    k = round_index % max(1, len(items))
    return items[k:] + items[:k]


def eager_forms(torch, call, x, dy, params, chain: int, calls: int, modes) -> dict:
    """{form: (fn, calls per sample)} of the eager-loop protocol for one op.

    call(y, i) runs the i-th call of a chain on y; x and dy are a tensor or a list of tensors (the multi
    form), x requiring grad; params are the leaves whose ``.grad`` each step sets to None (x, the taps,
    the biases: ``zero_grad(set_to_none=True)``). Forms (``modes``):
    ``chain``: one step = zero grads, ``chain`` calls from x, one backward(dy);
    ``step``: ``calls`` steps of zero grads, call(x, 0) and its backward;
    ``nograd``: ``calls`` forward calls call(x, 0) under torch.no_grad().
    """

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
    """Wall-clock samples of several subjects, interleaved round by round (the order rotates).

    subjects: {key: (fn, calls)}; one sample = before(), fn(), after(), recorded as ms per call (the
    sample's wall time / calls). The first ``warmup`` rounds are dropped. A subject that raises is dropped
    when ``on_error`` is given (on_error(key, exc) is called); without it the exception propagates.
    Returns {key: [ms per call, one per timed sample]}.
    """
    keys = list(subjects)
    out = {k: [] for k in keys}
    dead = set()
    for r in range(warmup + rounds):
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


def percentile(values, q: float) -> float:
    """The q-quantile of values, linear between neighbours (nan when empty)."""
    v = sorted(values)
    if not v:
        return float("nan")
    pos = (len(v) - 1) * q
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)
