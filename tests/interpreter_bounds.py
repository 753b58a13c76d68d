"""Out-of-bounds detection for Triton kernels run by the CPU interpreter (TRITON_INTERPRET=1).

The interpreter reads and writes raw host memory: a load or store past a tensor's storage does not
fail there, it reads whatever lies beside it (or corrupts it), while the same launch on a GPU is an
illegal memory access. ``checked_memory()`` makes it fail: inside the context, every launch records
the byte range of each tensor argument's storage, and every load and store checks that each of its
unmasked addresses (every byte of the element) lies inside one of those ranges. A violation raises
``OutOfBounds`` naming the kernel, the address and how far it lies from the nearest argument.
Atomics are not checked (no kernel of this package uses them). Contexts nest (the conftest
fixture's and a test's own).

Usage (tier 2 only: the interpreter must be on before Triton kernels are imported)::

    from tests.interpreter_bounds import checked_memory
    with checked_memory():
        y = cake_causal_conv1d_det(x, w, cu_seqlens=cu, backend="triton")
"""

from __future__ import annotations

import contextlib

import numpy as np


class OutOfBounds(AssertionError):
    """A Triton kernel touched memory outside every tensor argument of its launch."""


_state = {"ranges": None, "kernel": None}


def _ranges_of(args) -> tuple[np.ndarray, np.ndarray]:
    """(first byte, one past the last byte) of each tensor argument's storage, sorted by start."""
    spans = set()

    def visit(a):
        if isinstance(a, (tuple, list)):
            for b in a:
                visit(b)
        elif hasattr(a, "untyped_storage"):
            st = a.untyped_storage()
            spans.add((st.data_ptr(), st.data_ptr() + st.nbytes()))

    visit(args)
    spans = sorted(spans)
    return (np.array([lo for lo, _ in spans], dtype=np.uint64), np.array([hi for _, hi in spans], dtype=np.uint64))


def _check(ptrs, mask, elem_bytes: int, what: str) -> None:
    ranges = _state["ranges"]
    if ranges is None:
        return
    los, his = ranges
    addr = np.asarray(ptrs).astype(np.uint64, copy=False)
    m = np.asarray(mask, dtype=bool)
    if m.shape != addr.shape:
        m = np.broadcast_to(m, addr.shape)
    addr = addr[m] if not m.all() else addr.ravel()
    if addr.size == 0:
        return
    # Storages do not overlap: the one that can hold an address is the last one starting at or before it.
    k = np.searchsorted(los, addr, side="right") - 1
    ok = (k >= 0) & (addr + np.uint64(elem_bytes) <= his[np.maximum(k, 0)])
    if not ok.all():
        bad = int(addr[~ok][0])
        dist = min((min(abs(bad - int(lo)), abs(bad - int(hi))) for lo, hi in zip(los, his)), default=-1)
        raise OutOfBounds(f"{_state['kernel']}: {what} of {int((~ok).sum())} element(s) outside every tensor "
                          f"argument, e.g. address {bad:#x}, {dist} bytes from the nearest argument's edge")


@contextlib.contextmanager
def checked_memory():
    """Check every load and store of the interpreted kernels launched inside (module docstring)."""
    from triton.runtime import interpreter as it

    builder = it.InterpreterBuilder
    executor = it.GridExecutor
    orig_load, orig_store = builder.create_masked_load, builder.create_masked_store
    orig_init = executor._init_args_hst

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = orig_init(self, args_dev, kwargs)
        _state["ranges"] = _ranges_of((args_hst, list(kwargs_hst.values())))
        _state["kernel"] = getattr(self.fn, "__name__", str(self.fn))
        return args_hst, kwargs_hst

    def load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile):
        size = np.dtype(it._get_np_dtype(ptrs.get_element_ty())).itemsize
        _check(ptrs.data, mask.data, size, "load")
        return orig_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile)

    def store(self, ptrs, value, mask, cache_modifier, eviction_policy):
        _check(ptrs.data, mask.data, np.asarray(value.data).dtype.itemsize, "store")
        return orig_store(self, ptrs, value, mask, cache_modifier, eviction_policy)

    builder.create_masked_load, builder.create_masked_store = load, store
    executor._init_args_hst = init_args
    try:
        yield
    finally:
        builder.create_masked_load, builder.create_masked_store = orig_load, orig_store
        executor._init_args_hst = orig_init
        _state["ranges"] = None
        _state["kernel"] = None
