"""Host time per call of the single-rank op, rung by rung, on the CPU (no GPU needed; issue 16).

The Python above the driver is the same on the CPU and the GPU: the public function, the autograd
Function, validation, allocation and the launchers. This tool times the issue's 16-call chain
(``y = op(y, w_i)``, one ``backward()`` per step, gradients reset) with the Triton backend selected
under TRITON_INTERPRET=1 and the kernels never run, taking away one rung at a time:

    full         the op as users call it; ``Prepared.run`` reads the pointers, checks their alignment
                 and finds the compiled kernel as on the GPU, then returns before the launch
    no_launch    ``Prepared.run`` replaced by a function that returns at once
    no_launcher  the prepared launches' ``run`` (``ForwardLaunch`` / ``BackwardLaunches``) replaced
                 too (what is left: the public function, autograd, plan lookup, allocation)
    floor        an autograd.Function with this op's structure and no work: the same five inputs
                 and four saved operands, y allocated in the forward, dx, dweight and the workspace
                 in the backward, dx and dweight returned (what any op of this design costs)
    trivial      an autograd.Function that returns ``x.clone()`` (the issue's baseline)

S is tiny (the work is nothing); the trivial Function's clone costs what a small copy costs here.
Wall time per call = median step time / 16. The CPU's Python is slower than the H200 host's, so
read ratios, not microseconds.

    python benchmarks/tools/host_rungs_cpu.py [--steps 100] [--rounds 7] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import statistics
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports the kernels

import torch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from cakeconv import cake_causal_conv1d_det  # noqa: E402
from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch  # noqa: E402

S, C, CHAIN = 64, 256, 16  # shape legend: S tokens, C channels; CHAIN calls per step


# the benchmark's own baseline (forward: one clone; backward: identity), so both time the same thing
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from bench_cake_causal_conv1d_det import BaselineProvider  # noqa: E402

_TRIVIAL = BaselineProvider(torch, "trivial")._op


def make_step(op):
    x_SC = torch.randn(S, C).bfloat16().requires_grad_(True)
    ws_CW = [(torch.randn(C, 4) * 0.5).requires_grad_(True) for _ in range(CHAIN)]
    dy_SC = torch.randn(S, C).bfloat16()
    cu = torch.tensor([0, S], dtype=torch.int32)

    def step():
        y = x_SC
        for w in ws_CW:
            y = op(y, w, cu)
        y.backward(dy_SC)
        x_SC.grad = None
        for w in ws_CW:
            w.grad = None
    return step


def per_call_us(step, steps):
    for _ in range(20):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / CHAIN * 1e6


def ours(y, w, cu):
    return cake_causal_conv1d_det(y, w, None, cu_seqlens=cu, backend="triton")


def trivial(y, w, cu):
    return _TRIVIAL(y, w, None)


class _Floor(torch.autograd.Function):
    """The op's structure, no validation, no launch (the ``floor`` rung)."""

    @staticmethod
    def forward(ctx, x, w, b, cu, backend):
        ctx.save_for_backward(x, w, b, cu)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        x, w, b, cu = ctx.saved_tensors
        dx = torch.empty_like(x)
        dw = torch.empty_like(w)
        w.new_empty(5 * C * 2)  # the workspace
        return dx, dw, None, None, None


def floor(y, w, cu):
    return _Floor.apply(y, w, None, cu, "triton")


@contextlib.contextmanager
def replaced(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def run_without_launching(self, pointers):
    """Prepared.run's own host work on the GPU path (addresses, alignment, the remembered compiled
    kernel), no launch.

    A copy of the first lines of kernels/launch.py's Prepared.run (keep them in step): the real
    method, recording instead of launching, would time the recording too."""
    addrs = [p.data_ptr() for p in pointers]
    bits = 0
    for a in addrs:
        bits |= a
    if not bits & 15:
        compiled = self._compiled
        if compiled is None or self._device != 0:
            self._device, self._compiled = 0, self.kernel._compiled.get((0, self.key))
    return None


RUNGS = ("full", "no_launch", "no_launcher", "floor", "trivial")


@contextlib.contextmanager
def rung(name):
    """The op of one rung, with the layers below it replaced (module docstring)."""
    if name == "full":
        with replaced(launch.Prepared, "run", run_without_launching):
            yield ours
    elif name == "no_launch":
        with replaced(launch.Prepared, "run", lambda self, pointers: None):
            yield ours
    elif name == "no_launcher":
        with replaced(launch.ForwardLaunch, "run", lambda self, *a, **k: None), \
                replaced(launch.BackwardLaunches, "run", lambda self, *a, **k: None):
            yield ours
    elif name == "floor":
        yield floor
    else:
        yield trivial


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="timed steps per rung and round (default 100)")
    p.add_argument("--rounds", type=int, default=7, help="rounds, the rungs interleaved (default 7)")
    p.add_argument("--profile", action="store_true", help="cProfile of the no_launch rung, top 20 by own time")
    args = p.parse_args(argv)
    times = {name: [] for name in RUNGS}
    for _ in range(args.rounds):
        for name in RUNGS:
            with rung(name) as op:
                times[name].append(per_call_us(make_step(op), args.steps))
    if args.profile:
        with rung("no_launch") as op:
            step = make_step(op)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.steps):
                step()
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    med = {name: statistics.median(v) for name, v in times.items()}
    print(f"# host time per call, {CHAIN}-call chain, forward+backward, S = {S}, C = {C}, CPU "
          f"({os.cpu_count()} cores), torch {torch.__version__}; median of {args.rounds} interleaved rounds")
    print(f"{'rung':12s} {'us/call':>8s} {'x trivial':>9s} {'rounds (us)':>12s}")
    for name in RUNGS:
        spread = ", ".join(f"{v:.0f}" for v in times[name])
        print(f"{name:12s} {med[name]:8.1f} {med[name] / med['trivial']:9.2f}   {spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
