"""GPU time of every (provider, pass) at one shape and bias variant (benchmarks/README.md, "GPU time").

Each pass is the whole call a user makes, between two marks. The calls of every provider and pass are
interleaved round by round (the order rotates each round) and take the input sets in turn; each one is
preceded by the host-ahead sleep and the L2 eviction (timing.py). The first ``warmup`` rounds are dropped
(compilation and autotuning fall there). ``auto`` window: per provider and pass, 3x the largest host time
to enqueue the call in the warm-up rounds (the first, which compiles, excluded when there are two or more).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from measures import HOST_AHEAD_MAX_US
from timing import auto_ahead_us, resolve, rotation, time_call


@dataclass
class GpuRounds:
    """The rounds of one shape and bias: device ms and host ms per timed call, the window per (provider, pass)."""

    times: dict = field(default_factory=dict)
    host_times: dict = field(default_factory=dict)
    window_us: dict = field(default_factory=dict)
    failed: set = field(default_factory=set)
    counter: int = 0  # calls made so far over the run (the input set of a call: counter % number of sets)


def time_gpu(clock, calls, n_sets: int, counter: int, reps: int, warmup: int, base_ahead_us: float,
             ahead_auto: bool, on_error) -> GpuRounds:
    """Run the rounds of ``calls`` [(provider, pass, fn(i) running one call on input set i)].

    A provider whose call raises is reported (on_error(provider name, pass, exc)) and left out of the rest.
    """
    keys = [(p.name, p_) for p, p_, _ in calls]
    out = GpuRounds(times={k: [] for k in keys}, host_times={k: [] for k in keys},
                    window_us={k: base_ahead_us for k in keys}, counter=counter)
    warm_host = {k: [] for k in keys}
    for r in range(warmup + reps if calls else 0):
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
        for key, h in handles:
            ms, host_ms = resolve(clock, h)
            if r >= warmup:
                out.times[key].append(ms)
                out.host_times[key].append(host_ms)
            elif r >= 1 or warmup == 1:  # the first round compiles and autotunes
                warm_host[key].append(host_ms)
        if ahead_auto and r == warmup - 1:
            # the window per (provider, pass): 3x its host time to enqueue a call, so none leaks into the span
            for key, hs in warm_host.items():
                if hs:
                    out.window_us[key] = auto_ahead_us(max(hs), base_ahead_us, HOST_AHEAD_MAX_US)
    return out
