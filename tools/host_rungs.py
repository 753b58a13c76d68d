"""Host time per call of the single-rank op, rung by rung, on the CPU or the GPU.

The Python above the driver is the same on the CPU and the GPU: the public function, the autograd
Function, validation, allocation and the launchers. This tool times the eager loop's 16-call chain
(``y = op(y, w_i)``, one ``backward()`` per step, gradients reset; the GPU is idle at this size),
taking away one rung at a time:

    full         the op as users call it. On the CPU (``--device cpu``, the Triton backend under
                 TRITON_INTERPRET=1, kernels never run) ``Prepared.run`` reads the pointers, checks
                 their alignment and finds the compiled kernel as on the GPU, then returns before
                 the launch; on the GPU (``--device cuda``) the kernels are launched
    no_launch    ``Prepared.run``'s host work without the launch (the CPU: returns at once)
    no_launcher  the prepared launches' ``run`` (``ForwardLaunch`` / ``BackwardLaunches``) replaced
                 too (what is left: the public function, autograd, plan lookup, allocation)
    floor        an autograd.Function with this op's structure and no work: the same five inputs
                 and four saved operands, y allocated in the forward, dx, dweight and the workspace
                 in the backward, dx and dweight returned (what any op of this design costs)
    trivial      an autograd.Function that returns ``x.clone()`` (the host-cost baseline of the benchmark)

S is tiny (the work is nothing); the trivial Function's clone costs what a small copy costs here.
Wall time per call = median step time / 16 (on the GPU each step ends with a synchronize). The
CPU's Python is slower than the H200 host's, so read ratios, not microseconds. On the GPU the tool
also times single operations (``--device cuda``; ``single_launches``: host and GPU us per call).

    python tools/host_rungs.py [--device cpu|cuda] [--steps 100] [--rounds 7] [--profile]
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

# --device is read here, before anything imports the kernels (the CPU needs the interpreter set first)
_DEVICE_ARG = argparse.ArgumentParser(add_help=False)
_DEVICE_ARG.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                         help="cpu: the interpreter, kernels never run (default); cuda: the GPU, kernels launched")
DEVICE = _DEVICE_ARG.parse_known_args()[0].device
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.append(REPO)  # after PYTHONPATH: an A/B puts another version of the package there

from benchmarks.op import baseline_op  # noqa: E402
from cakeconv import cake_causal_conv1d_det  # noqa: E402
from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch  # noqa: E402
from cakeconv.cake_causal_conv1d_det_train_backend.kernels.launch import (  # noqa: E402
    _cuda_getCurrentRawStream,
    _cuda_getDevice,
)

S, C, CHAIN = 64, 256, 16  # shape legend: S tokens, C channels; CHAIN calls per step
SYNC = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
TRIVIAL = baseline_op(torch, "trivial")  # the benchmark's host-cost baseline: forward one clone, backward identity


def make_step(op):
    x_SC = torch.randn(S, C, device=DEVICE).bfloat16().requires_grad_(True)
    ws_CW = [(torch.randn(C, 4, device=DEVICE) * 0.5).requires_grad_(True) for _ in range(CHAIN)]
    dy_SC = torch.randn(S, C, device=DEVICE).bfloat16()
    cu = torch.tensor([0, S], dtype=torch.int32, device=DEVICE)

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
    SYNC()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        SYNC()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / CHAIN * 1e6


def ours(y, w, cu):
    return cake_causal_conv1d_det(y, w, None, cu_seqlens=cu, backend="triton")


def trivial(y, w, cu):
    return TRIVIAL(y, w, None)


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
    """Prepared.run's own host work on the GPU path (addresses, alignment, the device, the
    remembered launch function, the stream), no launch.

    A copy of kernels/launch.py's Prepared.run without its launch (keep them in step): the real
    method, recording instead of launching, would time the recording too."""
    addrs = [p.data_ptr() for p in pointers]
    bits = 0
    for a in addrs:
        bits |= a
    device = _cuda_getDevice() if DEVICE == "cuda" else 0
    if not bits & 15:
        direct = self._direct if self._device == device else self._find(device)
        if direct is not None and not launch._hooks_set():
            stream = _cuda_getCurrentRawStream(device) if DEVICE == "cuda" else 0
            return (stream, *addrs, *self.args)
    return None


RUNGS = ("full", "no_launch", "no_launcher", "floor", "trivial")


@contextlib.contextmanager
def rung(name):
    """The op of one rung, with the layers below it replaced (module docstring)."""
    if name == "full" and DEVICE == "cuda":
        yield ours
    elif name == "full" or (name == "no_launch" and DEVICE == "cuda"):
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


def single_launches(n=200):
    """Host and GPU microseconds per call of single operations (GPU only), n in a row.

    host: wall time of the n calls before the synchronize (the GPU queue holds them all, so this
    is the host's own cost). gpu: CUDA events around the n calls queued behind a ``torch.cuda._sleep``
    (the GPU starts on them only once all are queued, so this is the GPU's own time per call).
    Operations: the forward's ``Prepared.run``; Triton's launcher object and its C launch function
    (``direct_launch``) for the same compiled kernel; the C launch of a kernel with one pointer and
    no body; the backward's prepared launches (``BackwardLaunches.run``: every launch of a backward
    at this S); torch's ``empty_like``, ``zero_`` and ``clone`` of the op's output.
    """
    import triton

    @triton.jit
    def _nothing(p):
        pass

    x_SC = torch.randn(S, C, device=DEVICE).bfloat16()
    w_CW = torch.randn(C, 4, device=DEVICE)
    y_SC = torch.empty_like(x_SC)
    dx_SC = torch.empty_like(x_SC)
    dw_CW = torch.empty_like(w_CW)
    ws_F = torch.empty(launch.backward_workspace_floats(S, C), device=DEVICE)
    cu = torch.tensor([0, S], dtype=torch.int32, device=DEVICE)
    fwd = launch.prepare_forward(S, C, C, C, x_SC.dtype, w_CW.dtype, None, cu.dtype, 2, 0).main
    bwd = launch.prepare_backward(S, C, C, C, C, x_SC.dtype, x_SC.dtype, w_CW.dtype, None, cu.dtype, 2, 0, w_CW.dtype)
    pointers = (x_SC, y_SC, w_CW, w_CW, cu, w_CW)

    def backward():
        bwd.run(y_SC, x_SC, w_CW, None, cu, dx_SC, ws_F, dw_CW, None)

    fwd.run(pointers)
    backward()
    device = _cuda_getDevice()
    compiled = fwd.kernel._compiled[(device, fwd.key)]
    addrs = [p.data_ptr() for p in pointers]
    stream = _cuda_getCurrentRawStream(device)
    g, args = fwd.grid, fwd.args
    fn, head = launch.direct_launch(compiled)
    nothing = _nothing[(1,)](y_SC)
    nfn, nhead = launch.direct_launch(nothing)
    y_addr = y_SC.data_ptr()

    def timed(f):
        f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        host = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time: every call below is queued behind it
        start.record()
        for _ in range(n):
            f()
        end.record()
        torch.cuda.synchronize()
        return host, start.elapsed_time(end) / n * 1e3

    return {
        "Prepared.run (forward)": timed(lambda: fwd.run(pointers)),
        "launcher object (fwd)": timed(lambda: compiled.run(g[0], g[1], g[2], stream, compiled.function,
                                                            compiled.packed_metadata, None, None, None, *addrs, *args)),
        "direct_launch (fwd)": timed(lambda: fn(g[0], g[1], g[2], stream, *head, *addrs, *args)),
        "direct_launch (empty)": timed(lambda: nfn(1, 1, 1, stream, *nhead, y_addr)),
        "BackwardLaunches.run": timed(backward),
        "torch.empty_like": timed(lambda: torch.empty_like(x_SC)),
        "Tensor.zero_": timed(lambda: y_SC.zero_()),
        "Tensor.clone": timed(lambda: x_SC.clone()),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[_DEVICE_ARG])
    p.add_argument("--steps", type=int, default=100, help="timed steps per rung and round (default 100)")
    p.add_argument("--rounds", type=int, default=7, help="rounds, the rungs interleaved (default 7)")
    p.add_argument("--profile", action="store_true", help="cProfile of the no_launch rung, top 20 by own time")
    p.add_argument("--rungs", default=",".join(RUNGS), help="comma-separated rungs to time (default: all)")
    args = p.parse_args(argv)
    rungs = [r for r in RUNGS if r in args.rungs.split(",")] + ([] if "trivial" in args.rungs else ["trivial"])
    times = {name: [] for name in rungs}
    for _ in range(args.rounds):
        for name in rungs:
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
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU"
    print(f"# host time per call, {CHAIN}-call chain, forward+backward, S = {S}, C = {C}, {where} "
          f"({os.cpu_count()} cores), torch {torch.__version__}; median of {args.rounds} interleaved rounds; "
          f"cakeconv from {os.path.dirname(os.path.dirname(sys.modules['cakeconv'].__file__))}")
    print(f"{'rung':12s} {'us/call':>8s} {'x trivial':>9s} {'rounds (us)':>12s}")
    for name in rungs:
        spread = ", ".join(f"{v:.0f}" for v in times[name])
        print(f"{name:12s} {med[name]:8.1f} {med[name] / med['trivial']:9.2f}   {spread}")
    if DEVICE == "cuda" and hasattr(launch, "direct_launch"):
        print("# single operations, us per call (single_launches: host = the host's own time, gpu = the GPU's)")
        print(f"{'operation':26s} {'host us':>8s} {'gpu us':>8s}")
        for what, (host, gpu) in single_launches().items():
            print(f"{what:26s} {host:8.2f} {gpu:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
