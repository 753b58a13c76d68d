"""The providers a run times: ours, ours with the segment indices off, ours through autograd, the peers, the baselines.

Every provider gets the same inputs (shapes.ShapeData: taps [C, W] and the activation, "silu" or None, included)
and runs in its own input format:

* ``ours``: cakeconv's entry points ``cake_causal_conv1d_det_train_forward`` / ``_backward`` (GPU time; the
  library allocates), the autograd op ``cake_causal_conv1d_det`` (eager loop, host cost) on [S, C];
* ``ours_search``: ours with the per-token segment indices off (the rows of programs that touch 5 or more
  documents placed by a binary search over cu_seqlens), the same bits (checked): an A/B of that path in one run;
* ``ours_ag``: the autograd op, timed as the peers are;
* ``fla``: flash-linear-attention's Triton ``causal_conv1d`` on [1, S, C] (``FLA_GLUON=0``); any W (fla-core
  0.6.0's Triton kernels take W as a compile-time constant padded to a power of two), SiLU or none;
* ``dao``: Dao-AILab's ``causal_conv1d_fn`` on the channel-last [1, C, S] view with ``seq_idx``, in its default
  mode (atomic dweight); W = 2..4 only (its C++ checks the width), SiLU or none;
* ``dao_det``: the same function in its deterministic mode (``CAUSAL_CONV1D_DETERMINISTIC=1``; DaoProvider);
* ``trivial`` and ``silu``: host-cost baselines of the same form y = op(x, w).

A provider that cannot take a (W, activation) says why (``Provider.supports``); the run skips it there
with a note. The peers' backward is autograd: fwd = the op, bwd = torch.autograd.grad over a graph built
before the timed region (kept with retain_graph=True), fwd+bwd = the op then autograd.grad.

Shape legend: S tokens, C channels, W taps per channel.
"""

from __future__ import annotations

import abc
import inspect
import os

from shapes import ShapeData

class Provider(abc.ABC):
    name = "?"
    is_peer = False

    def prepare_shape(self, sh: ShapeData):
        pass

    def prepare_bias(self, sh: ShapeData, use_bias: bool, need_bwd_graph: bool):
        pass

    def release_bias(self):
        pass

    def release_shape(self):
        pass

    def supports(self, width: int, activation) -> str | None:
        """None when the provider takes taps [C, width] and ``activation`` ("silu" or None); else why not."""
        return None

    def around(self, fn):
        """fn, or fn wrapped in what the provider's calls need around them (dao_det: its environment variable).
        Every call the run makes goes through it: the timed calls, the check, the eager-loop and host-cost samples."""
        return fn

    @abc.abstractmethod
    def callable_for(self, pass_: str, sh: ShapeData, use_bias: bool):
        """fn(i) running one timed call of pass_ on input set i."""

    @abc.abstractmethod
    def outputs(self, sh: ShapeData, use_bias: bool):
        """(y, dx [S, C], dw [C, W], db [C] or None) on set 0, for the correctness check."""

    # The eager loop and the host cost use the provider's autograd op in its own input format.
    def to_layout(self, t, sh):  # [S, C] -> the provider's layout
        return t

    def from_layout(self, t, sh):  # back to [S, C]
        return t

    @abc.abstractmethod
    def op(self, x, w, b, sh):
        """The provider's autograd op on x in its layout (returns y in the same layout)."""

    def extra_host_items(self, sh: ShapeData, calls: int):
        """{item: (fn, calls)} host-cost items only this provider has (ours: the workspace entry points)."""
        return {}


def _takes_width(cakeconv) -> bool:
    """Whether this cakeconv takes ``activation=`` (and so any width); an older version (an A/B of code versions)
    runs W = 4 + SiLU only and is called without the keyword."""
    try:
        return "activation" in inspect.signature(cakeconv.cake_causal_conv1d_det_train_forward).parameters
    except (TypeError, ValueError):
        return False


class OursProvider(Provider):
    """cakeconv's forward and backward entry points (no workspace: the library allocates); the autograd op
    cakeconv.cake_causal_conv1d_det for the eager loop and the host cost; ``activation=`` from the shape."""

    name = "ours"

    def __init__(self, cakeconv, backend):
        self.m = cakeconv
        self.backend = backend
        self.any_width = _takes_width(cakeconv)

    def supports(self, width, activation):
        if self.any_width or (width, activation) == (4, "silu"):
            return None
        return "this cakeconv takes W = 4 with SiLU only (no activation= keyword)"

    def kw(self, sh) -> dict:
        """The keywords of every call at shape sh: the backend, and the activation when cakeconv takes it."""
        return {"backend": self.backend, **({"activation": sh.activation} if self.any_width else {})}

    def callable_for(self, pass_, sh, use_bias):
        fwd = self.m.cake_causal_conv1d_det_train_forward
        bwd = self.m.cake_causal_conv1d_det_train_backward
        w, cu, kw = sh.w, sh.cu, self.kw(sh)
        b = sh.b if use_bias else None
        sets = sh.sets
        if pass_ == "fwd":
            return lambda i: fwd(sets[i][0], w, b, cu, **kw)
        if pass_ == "bwd":
            return lambda i: bwd(sets[i][1], sets[i][0], w, b, cu, **kw)

        def fwdbwd(i):
            x, dy = sets[i]
            fwd(x, w, b, cu, **kw)
            return bwd(dy, x, w, b, cu, **kw)

        return fwdbwd

    def outputs(self, sh, use_bias):
        x, dy = sh.sets[0]
        b, kw = (sh.b if use_bias else None), self.kw(sh)
        y = self.m.cake_causal_conv1d_det_train_forward(x, sh.w, b, sh.cu, **kw)
        dx, dw, db = self.m.cake_causal_conv1d_det_train_backward(dy, x, sh.w, b, sh.cu, **kw)
        return y, dx, dw, db

    def op(self, x, w, b, sh):
        return self.m.cake_causal_conv1d_det(x, w, b, cu_seqlens=sh.cu, **self.kw(sh))

    def extra_host_items(self, sh, calls):
        """The workspace entry points, forward + backward per pair, every buffer preallocated."""
        import torch

        m, kw, cu = self.m, self.kw(sh), sh.cu
        x, dy = sh.sets[0]
        w = sh.w
        y = torch.empty_like(x)
        dx = torch.empty_like(x)
        size_kw = {"width": sh.width} if self.any_width else {}
        nbytes = m.cake_causal_conv1d_det_train_backward_workspace_bytes(sh.S, sh.C, **size_kw)
        ws = torch.empty(max(16, nbytes), dtype=torch.uint8, device=x.device)
        fwd, bwd = m.cake_causal_conv1d_det_train_forward, m.cake_causal_conv1d_det_train_backward

        def pairs():
            for _ in range(calls):
                fwd(x, w, None, cu, out=y, **kw)
                bwd(dy, x, w, None, cu, dx=dx, workspace=ws, **kw)

        return {"ws": (pairs, calls)}


class OursSearchProvider(OursProvider):
    """Ours with the per-token segment indices off (kernels/segment_ids.py): rows of programs touching 5+
    documents placed by a binary search over cu_seqlens. The same kernels otherwise, so
    ``--providers ours,ours_search`` is the A/B of the two paths in one run; the check requires the same bits."""

    name = "ours_search"

    def __init__(self, cakeconv, backend):
        super().__init__(cakeconv, backend)
        from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch

        self.launch = launch

    def _searching(self, fn):
        launch = self.launch

        def call(*args):
            launch.use_ids = False
            try:
                return fn(*args)
            finally:
                launch.use_ids = True

        return call

    def callable_for(self, pass_, sh, use_bias):
        return self._searching(super().callable_for(pass_, sh, use_bias))

    def outputs(self, sh, use_bias):
        return self._searching(super().outputs)(sh, use_bias)

    def op(self, x, w, b, sh):
        return self._searching(super().op)(x, w, b, sh)

    def extra_host_items(self, sh, calls):
        return {}


class AutogradProvider(Provider):
    """A provider timed through torch.autograd: fwd = the op, fwd+bwd = op + autograd.grad, bwd = autograd.grad
    over a graph built (per input set) before the timed region and kept with retain_graph=True."""

    def prepare_bias(self, sh, use_bias, need_bwd_graph):
        torch = self.torch
        self.use_bias = use_bias
        self.w_leaf = sh.w.detach().clone().requires_grad_()
        self.b_leaf = sh.b.detach().clone().requires_grad_() if use_bias else None
        self.xs = [self.to_layout(x, sh) for x, _ in sh.sets]
        self.dys = [self.to_layout(dy, sh) for _, dy in sh.sets]
        self.x_leaves = [x.detach().requires_grad_() for x in self.xs]
        self.inputs = [[xl, self.w_leaf] + ([self.b_leaf] if use_bias else []) for xl in self.x_leaves]
        self.graphs = []
        if need_bwd_graph:
            with torch.enable_grad():
                self.graphs = [self.op(xl, self.w_leaf, self.b_leaf, sh) for xl in self.x_leaves]

    def release_bias(self):
        self.graphs = []
        self.xs = self.dys = self.x_leaves = self.inputs = None
        self.w_leaf = self.b_leaf = None

    def callable_for(self, pass_, sh, use_bias):
        torch = self.torch
        op, xs, dys, w, b = self.op, self.xs, self.dys, sh.w, (sh.b if use_bias else None)
        if pass_ == "fwd":

            def fwd(i):
                with torch.no_grad():
                    return op(xs[i], w, b, sh)

            return fwd
        if pass_ == "bwd":
            graphs, inputs = self.graphs, self.inputs
            return lambda i: torch.autograd.grad(graphs[i], inputs[i], dys[i], retain_graph=True)
        xl, wl, bl, inputs = self.x_leaves, self.w_leaf, self.b_leaf, self.inputs

        def fwdbwd(i):
            with torch.enable_grad():
                y = op(xl[i], wl, bl, sh)
                return torch.autograd.grad(y, inputs[i], dys[i])

        return fwdbwd

    def outputs(self, sh, use_bias):
        torch = self.torch
        with torch.enable_grad():
            y = self.op(self.x_leaves[0], self.w_leaf, self.b_leaf, sh)
            grads = torch.autograd.grad(y, self.inputs[0], self.dys[0])
        dx, dw = grads[0], grads[1]
        db = grads[2] if use_bias else None
        return self.from_layout(y.detach(), sh), self.from_layout(dx, sh), dw, db


class OursAutogradProvider(AutogradProvider):
    """cakeconv.cake_causal_conv1d_det timed as the peers are (through torch.autograd)."""

    name = "ours_ag"

    def __init__(self, torch, cakeconv, backend):
        self.torch = torch
        self.ours = OursProvider(cakeconv, backend)

    def supports(self, width, activation):
        return self.ours.supports(width, activation)

    def op(self, x, w, b, sh):
        return self.ours.op(x, w, b, sh)


class FlaProvider(AutogradProvider):
    """flash-linear-attention's Triton causal_conv1d (see the module docstring for the exact call)."""

    name = "fla"
    is_peer = True

    def __init__(self, torch, causal_conv1d, prepare_chunk_indices):
        self.torch = torch
        self.fn = causal_conv1d
        self.prepare_chunk_indices = prepare_chunk_indices

    def prepare_shape(self, sh):
        # What fla's own layers do once per batch (it syncs with the host): keep it out of the timing.
        sh.extra["fla_chunk_indices"] = self.prepare_chunk_indices(sh.cu, 64)

    def to_layout(self, t, sh):
        return t.view(1, sh.S, sh.C)

    def from_layout(self, t, sh):
        return t.reshape(sh.S, sh.C)

    def op(self, x, w, b, sh):
        y, _ = self.fn(
            x=x,
            weight=w,
            bias=b,
            activation=sh.activation,
            backend="triton",
            cu_seqlens=sh.cu,
            chunk_indices=sh.extra["fla_chunk_indices"],
        )
        return y


DAO_DET_ENV = "CAUSAL_CONV1D_DETERMINISTIC"
DAO_WIDTHS = (2, 3, 4)  # causal-conv1d 1.7.0's C++ checks 2 <= width <= 4


class DaoProvider(AutogradProvider):
    """Dao-AILab causal-conv1d, token-major ("channel-last") layout with seq_idx; W = 2..4, SiLU or none.

    ``dao`` runs its default mode (dweight accumulated with atomics), ``dao_det`` its deterministic mode (per-chunk
    dweight/dbias partials in a zeroed fp32 workspace [1, chunks, C, W], summed by torch after the kernel).
    causal-conv1d 1.7.0 picks the mode in its C++ backward on every call, with getenv(CAUSAL_CONV1D_DETERMINISTIC)
    ('1' on, '0' off, unset: torch's deterministic-algorithms flag). Both providers therefore set the variable,
    '1' or '0', around each of their calls (``around``: a timed call, the check, one eager-loop or host-cost
    sample) and restore it after, so neither mode leaks into the other nor into the rest of the run, and the
    user's environment does not pick the mode. What that costs: two writes of os.environ (putenv), a few us of
    host time per wrapped unit. In GPU time the host-ahead window hides them; in the eager loop and the host cost
    one sample (16 calls, or one 16-call chain) pays them once, well under 1 us per call, and both Dao providers
    pay the same, so their difference is the mode's own (the workspace, its zeroing and the sum).
    """

    name = "dao"
    is_peer = True

    def __init__(self, torch, causal_conv1d_fn, deterministic: bool = False):
        self.torch = torch
        self.fn = causal_conv1d_fn
        self.mode = "1" if deterministic else "0"
        self.name = "dao_det" if deterministic else "dao"

    def supports(self, width, activation):
        return None if width in DAO_WIDTHS else f"causal_conv1d_fn takes W = 2..4, not {width}"

    def around(self, fn):
        mode = self.mode

        def call(*args):
            old = os.environ.get(DAO_DET_ENV)
            os.environ[DAO_DET_ENV] = mode
            try:
                return fn(*args)
            finally:
                if old is None:
                    del os.environ[DAO_DET_ENV]
                else:
                    os.environ[DAO_DET_ENV] = old

        return call

    def prepare_shape(self, sh):
        torch = self.torch
        lens = torch.tensor(sh.lengths, dtype=torch.int64, device=sh.device)
        ids = torch.arange(len(sh.lengths), dtype=torch.int32, device=sh.device)
        sh.extra["dao_seq_idx"] = torch.repeat_interleave(ids, lens).view(1, sh.S).contiguous()

    def to_layout(self, t, sh):
        return t.view(1, sh.S, sh.C).transpose(1, 2)  # [1, C, S], channel stride 1

    def from_layout(self, t, sh):
        return t.transpose(1, 2).reshape(sh.S, sh.C)

    def op(self, x, w, b, sh):
        return self.fn(x, w, b, seq_idx=sh.extra["dao_seq_idx"], activation=sh.activation)


class BaselineProvider(Provider):
    """A host-cost baseline: an op of the same form y = op(x, w), timed only in the eager loop and the host cost."""

    def __init__(self, torch, name):
        self.torch = torch
        self.name = name
        if name == "trivial":

            class TrivialFunction(torch.autograd.Function):
                """forward: one clone; backward: identity (no gradient for the taps)."""

                @staticmethod
                def forward(ctx, x, w):
                    return x.clone()

                @staticmethod
                def backward(ctx, g):
                    return g, None

            self._op = lambda x, w, b: TrivialFunction.apply(x, w)
        elif name == "silu":
            self._op = lambda x, w, b: torch.nn.functional.silu(x)
        else:
            raise ValueError(name)

    def op(self, x, w, b, sh):
        return self._op(x, w, b)

    def callable_for(self, pass_, sh, use_bias):
        raise RuntimeError(f"the {self.name} baseline is timed only in the eager loop and the host cost")

    def outputs(self, sh, use_bias):
        raise RuntimeError(f"the {self.name} baseline computes no convolution to check")


def load_providers(torch, names, cakeconv, backend, cuda: bool, notes: list):
    """The providers of ``names`` that can run here; each one that cannot is skipped with a note."""
    provs = []
    for name in names:
        if name in ("ours", "ours_search", "ours_ag"):
            if cakeconv is None:
                notes.append(f"{name}: skipped, cakeconv did not import")
                continue
            kinds = {"ours": lambda: OursProvider(cakeconv, backend),
                     "ours_search": lambda: OursSearchProvider(cakeconv, backend),
                     "ours_ag": lambda: OursAutogradProvider(torch, cakeconv, backend)}
            provs.append(kinds[name]())
        elif name == "fla":
            if not cuda:
                notes.append("fla: skipped (its Triton kernels need a CUDA device)")
                continue
            os.environ["FLA_GLUON"] = "0"  # its Triton path, the one SPEC section 7 quotes
            try:
                from fla.modules.causal_conv1d import causal_conv1d
                from fla.ops.utils import prepare_chunk_indices
            except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
                notes.append(f"fla: skipped, import failed ({type(exc).__name__}: {exc}); install: "
                             "pip install --no-deps --target /tmp/fla .fla/*.whl && export PYTHONPATH=/tmp/fla")
                continue
            provs.append(FlaProvider(torch, causal_conv1d, prepare_chunk_indices))
        elif name in ("dao", "dao_det"):
            if not cuda:
                notes.append(f"{name}: skipped (CUDA extension)")
                continue
            try:
                from causal_conv1d import causal_conv1d_fn
            except Exception as exc:  # noqa: BLE001
                notes.append(f"{name}: skipped, causal_conv1d did not import ({type(exc).__name__}: {exc}); build: "
                             "benchmarks/device_run.sh daobuild ... waitdao")
                continue
            provs.append(DaoProvider(torch, causal_conv1d_fn, deterministic=name == "dao_det"))
    return provs


def _distribution_version(name: str):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return None


def peer_versions(provs) -> dict:
    """{"fla": fla-core's version, "causal_conv1d": Dao's} of the peers in ``provs``."""
    names = {p.name for p in provs}
    out = {}
    if "fla" in names:
        out["fla"] = _distribution_version("fla-core")
        if out["fla"] is None:
            import fla

            out["fla"] = getattr(fla, "__version__", None)
    if names & {"dao", "dao_det"}:
        try:
            import causal_conv1d

            out["causal_conv1d"] = getattr(causal_conv1d, "__version__", None)
        except Exception:  # noqa: BLE001
            out["causal_conv1d"] = None
        out["causal_conv1d"] = out["causal_conv1d"] or _distribution_version("causal-conv1d")
    return out
