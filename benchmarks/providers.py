"""The providers a run times: ours, ours with the segment indices off, ours through autograd, the peers, the baselines.

Every provider gets the same inputs (shapes.ShapeData) and runs in its own input format:

* ``ours``: cakeconv's entry points ``cake_causal_conv1d_det_train_forward`` / ``_backward`` (GPU time; the
  library allocates), the autograd op ``cake_causal_conv1d_det`` (eager loop, host cost) on [S, C];
* ``ours_search``: ours with the per-token segment indices off (the rows of programs that touch 5 or more
  documents placed by a binary search over cu_seqlens), the same bits (checked): an A/B of that path in one run;
* ``ours_ag``: the autograd op, timed as the peers are;
* ``fla``: flash-linear-attention's Triton ``causal_conv1d`` on [1, S, C] (``FLA_GLUON=0``);
* ``dao``: Dao-AILab's ``causal_conv1d_fn`` on the channel-last [1, C, S] view with ``seq_idx``;
* ``trivial`` and ``silu``: host-cost baselines of the same form y = op(x, w).

The peers' backward is autograd: fwd = the op, bwd = torch.autograd.grad over a graph built before the
timed region (kept with retain_graph=True), fwd+bwd = the op then autograd.grad.

Shape legend: S tokens, C channels.
"""

from __future__ import annotations

import abc
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

    @abc.abstractmethod
    def callable_for(self, pass_: str, sh: ShapeData, use_bias: bool):
        """fn(i) running one timed call of pass_ on input set i."""

    @abc.abstractmethod
    def outputs(self, sh: ShapeData, use_bias: bool):
        """(y, dx [S, C], dw [C, 4], db [C] or None) on set 0, for the correctness check."""

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


class OursProvider(Provider):
    """cakeconv's forward and backward entry points (no workspace: the library allocates); the autograd op
    cakeconv.cake_causal_conv1d_det for the eager loop and the host cost."""

    name = "ours"

    def __init__(self, cakeconv, backend):
        self.m = cakeconv
        self.backend = backend

    def callable_for(self, pass_, sh, use_bias):
        fwd = self.m.cake_causal_conv1d_det_train_forward
        bwd = self.m.cake_causal_conv1d_det_train_backward
        w, cu, be = sh.w, sh.cu, self.backend
        b = sh.b if use_bias else None
        sets = sh.sets
        if pass_ == "fwd":
            return lambda i: fwd(sets[i][0], w, b, cu, backend=be)
        if pass_ == "bwd":
            return lambda i: bwd(sets[i][1], sets[i][0], w, b, cu, backend=be)

        def fwdbwd(i):
            x, dy = sets[i]
            fwd(x, w, b, cu, backend=be)
            return bwd(dy, x, w, b, cu, backend=be)

        return fwdbwd

    def outputs(self, sh, use_bias):
        x, dy = sh.sets[0]
        b = sh.b if use_bias else None
        y = self.m.cake_causal_conv1d_det_train_forward(x, sh.w, b, sh.cu, backend=self.backend)
        dx, dw, db = self.m.cake_causal_conv1d_det_train_backward(dy, x, sh.w, b, sh.cu, backend=self.backend)
        return y, dx, dw, db

    def op(self, x, w, b, sh):
        return self.m.cake_causal_conv1d_det(x, w, b, cu_seqlens=sh.cu, backend=self.backend)

    def extra_host_items(self, sh, calls):
        """The workspace entry points, forward + backward per pair, every buffer preallocated."""
        import torch

        m, be, cu = self.m, self.backend, sh.cu
        x, dy = sh.sets[0]
        w = sh.w
        y = torch.empty_like(x)
        dx = torch.empty_like(x)
        nbytes = m.cake_causal_conv1d_det_train_backward_workspace_bytes(sh.S, sh.C)
        ws = torch.empty(max(16, nbytes), dtype=torch.uint8, device=x.device)
        fwd, bwd = m.cake_causal_conv1d_det_train_forward, m.cake_causal_conv1d_det_train_backward

        def pairs():
            for _ in range(calls):
                fwd(x, w, None, cu, out=y, backend=be)
                bwd(dy, x, w, None, cu, dx=dx, workspace=ws, backend=be)

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
    name = "ours_ag"

    def __init__(self, torch, cakeconv, backend):
        self.torch = torch
        self.m = cakeconv
        self.backend = backend

    def op(self, x, w, b, sh):
        return self.m.cake_causal_conv1d_det(x, w, b, cu_seqlens=sh.cu, backend=self.backend)


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
            activation="silu",
            backend="triton",
            cu_seqlens=sh.cu,
            chunk_indices=sh.extra["fla_chunk_indices"],
        )
        return y


class DaoProvider(AutogradProvider):
    """Dao-AILab causal-conv1d, token-major ("channel-last") layout with seq_idx."""

    name = "dao"
    is_peer = True

    def __init__(self, torch, causal_conv1d_fn):
        self.torch = torch
        self.fn = causal_conv1d_fn

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
        return self.fn(x, w, b, seq_idx=sh.extra["dao_seq_idx"], activation="silu")


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
        elif name == "dao":
            if not cuda:
                notes.append("dao: skipped (CUDA extension)")
                continue
            try:
                from causal_conv1d import causal_conv1d_fn
            except Exception as exc:  # noqa: BLE001
                notes.append(f"dao: skipped, causal_conv1d did not import ({type(exc).__name__}: {exc}); build: "
                             "benchmarks/device_run.sh daobuild ... waitdao")
                continue
            provs.append(DaoProvider(torch, causal_conv1d_fn))
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
    if "dao" in names:
        try:
            import causal_conv1d

            out["causal_conv1d"] = getattr(causal_conv1d, "__version__", None)
        except Exception:  # noqa: BLE001
            out["causal_conv1d"] = None
        out["causal_conv1d"] = out["causal_conv1d"] or _distribution_version("causal-conv1d")
    return out
