"""Compile a problem's training-step kernels for a GPU target, one at a time, and time each (no GPU needed).

The full variants and their quick twins (compile_ahead.py: what a first training step compiles and runs
while the full ones compile in the background), each into its own empty Triton cache, one after the
other in this process; per variant the stages' seconds (``compile_specialization``). Writes a JSON
report and prints a table.

``--first-step-wait N``: instead, what a cold first training step waits for before its forward's launch
and before its backward's (``compile_ahead._start``: the recording of the step's calls, then the quick
twins in N threads, the forward's waited for, the backward's compiling on beside it, the background
warm-up stood in by a finished process; and, with ``CAKECONV_QUICK_KERNELS=0``'s path, the full variants
in N threads), each into an empty cache.

    python tools/compile_times.py OUT.json [--channels 512] [--width 4] [--activation silu|none]
        [--tokens 32768] [--tiers full,quick] [--target sm_90] [--first-step-wait N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--channels", type=int, default=512)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--activation", default="silu", help="silu or none")
    ap.add_argument("--tokens", default="32768", help="packed token count (its regime's variants); 0: every variant")
    ap.add_argument("--tiers", default="full,quick")
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--first-step-wait", type=int, default=0, help="threads (module docstring); 0: per variant")
    a = ap.parse_args(argv)
    sys.path.insert(0, os.getcwd())
    import torch
    import triton

    from cakeconv.cake_causal_conv1d_det_train_backend import compile_ahead
    from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch
    from cakeconv.cake_causal_conv1d_det_train_backend.kernels.specialization import compile_specialization
    from cakeconv.warmup import WarmupProblem, _parse_target, regime_tokens

    act = None if a.activation.lower() == "none" else a.activation
    problem = WarmupProblem(a.channels, width=a.width, activation=act)
    target = _parse_target(a.target)
    tokens = regime_tokens(int(a.tokens)) if int(a.tokens) else None
    launch.cache_keys_in_fixed_order()
    if a.first_step_wait:
        return first_step_wait(a, compile_ahead, problem, target, tokens)
    start = time.perf_counter()
    with torch.enable_grad():
        full, quick = compile_ahead.training_step_items(problem, target, tokens)
    report = {"problem": str(problem), "target": a.target, "tokens": a.tokens, "recording_s": time.perf_counter() - start,
              "host": {"machine": platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
                       "triton": triton.__version__,
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
              "command": "python tools/compile_times.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    for tier in a.tiers.split(","):
        rows = []
        for name, spec in {"full": full, "quick": quick}[tier]:
            with tempfile.TemporaryDirectory() as cache:
                os.environ["TRITON_CACHE_DIR"] = cache
                times = compile_specialization(launch.KERNEL_FNS[name], spec, target)
            rows.append({"kernel": name, **{k: v for k, v in times.items() if k != "cache_key"}})
            print(f"{tier:>5} {name:<34} {times['total']:7.1f} s (front end {times['front_end']:.1f}, "
                  f"LLVM {times['llvm']:.1f}, ptxas {times['ptxas']:.1f})", flush=True)
        report[tier] = rows
        report[f"{tier}_total_s"] = sum(r["total"] for r in rows)
        report[f"{tier}_slowest_s"] = max(r["total"] for r in rows)
        print(f"{tier}: {len(rows)} variants, {report[f'{tier}_total_s']:.1f} s one after the other, the slowest "
              f"{report[f'{tier}_slowest_s']:.1f} s", flush=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


def first_step_wait(a, compile_ahead, problem, target, tokens) -> int:
    """The ``--first-step-wait`` report: seconds of ``compile_ahead._start`` per tier."""

    class Finished:  # the background warm-up, stood in
        returncode, pid = 0, None

        def poll(self):
            return 0

        def communicate(self):
            return None, ""

    compile_ahead.spawn_warmup = lambda *args: Finished()
    report = {"problem": str(problem), "target": a.target, "tokens": a.tokens, "threads": a.first_step_wait,
              "command": "python tools/compile_times.py " + " ".join(sys.argv[1:])}
    for tier in a.tiers.split(","):
        with tempfile.TemporaryDirectory() as cache:
            os.environ["TRITON_CACHE_DIR"] = cache
            state, start = compile_ahead._Compile(), time.perf_counter()
            compile_ahead._start(state, problem, target, a.first_step_wait, tokens, tier == "quick")
            report[f"{tier}_forward_wait_s"] = time.perf_counter() - start  # the first launch, the forward
            state.twins.wait()  # the quick tier: the backward's twins compile on in a thread; its launch waits
            report[f"{tier}_first_step_wait_s"] = time.perf_counter() - start
        print(f"{tier}: the first step's forward waits {report[f'{tier}_forward_wait_s']:.1f} s, its backward "
              f"{report[f'{tier}_first_step_wait_s']:.1f} s from the start", flush=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
