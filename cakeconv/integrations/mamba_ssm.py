"""mamba_ssm's short convolution on cakeconv: ``swap()`` and ``unswap()``.

mamba_ssm (state-spaces/mamba 2.3) trains its layers through fused functions that compute the
short convolution inside them: Mamba2's ``mamba_split_conv1d_scan_combined``
(``mamba_ssm.ops.triton.ssd_combined``, what ``mamba_ssm.modules.mamba2.Mamba2`` runs with
``use_mem_eff_path=True``, its default, and what transformers' Mamba2, Bamba, Falcon-H1,
GraniteMoeHybrid, NemotronH and Zamba2 layers call when mamba_ssm is installed) and Mamba1's
``mamba_inner_fn`` (``mamba_ssm.ops.selective_scan_interface``). Those functions call
causal-conv1d's ``causal_conv1d_fwd_function`` / ``causal_conv1d_bwd_function``, which each
module binds as a global at import. Mamba2's unfused path (``use_mem_eff_path=False``) and the
other modules call ``causal_conv1d_fn``, bound the same way.

``swap()`` rebinds those globals, in every mamba_ssm module that binds them, to
``cakeconv.integrations.dao``'s functions of the same names and signatures:

    ======================================  ====================================================
    module                                  names rebound
    ======================================  ====================================================
    mamba_ssm.ops.triton.ssd_combined       causal_conv1d_fwd_function, causal_conv1d_bwd_function,
                                            causal_conv1d_fn
    mamba_ssm.ops.selective_scan_interface  the same three (it imports Mamba1's CUDA extension)
    mamba_ssm.modules.mamba2                causal_conv1d_fn
    mamba_ssm.modules.mamba2_simple         causal_conv1d_fn
    mamba_ssm.modules.mamba_simple          causal_conv1d_fn
    mamba_ssm.modules.mha                   causal_conv1d_fn
    ======================================  ====================================================

It imports each of these modules first, so that a module imported later cannot bind
causal-conv1d's functions behind the swap; a module that does not import (e.g.
``selective_scan_interface`` without Mamba1's built CUDA extension) is reported and left alone.
The decode path (``causal_conv1d_update``) is not touched: it carries conv state.

What then runs on cakeconv: every call whose operands cakeconv's op takes (widths 2..8, SiLU or
none, D a multiple of 8, no ``initial_states``, no final states; ``seq_idx`` read as document
boundaries, see ``cakeconv.integrations.dao``), with bitwise repeatable dweight and dbias in
mamba_ssm's default mode already; other calls are delegated per call to causal-conv1d's function
(or a PyTorch implementation when it is not installed). Where causal-conv1d is not installed,
mamba_ssm's globals are None and its fused path fails or falls back to ``nn.Conv1d``; after the
swap it runs cakeconv.

The rebinding is process-wide: every Mamba layer of every model in the process calls cakeconv
until ``unswap()``, which puts back exactly the objects it replaced (a binding changed by someone
else since is reported and left as it is). Both return a ``SwapReport``; ``swap`` warns
(``CakeconvSwapWarning``) when mamba_ssm is not importable or none of its modules could be
reached. This module does not import mamba_ssm until ``swap()`` is called.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys

from . import dao
from .report import SwapEntry, SwapReport, qualified_name

__all__ = ["swap", "unswap", "is_swapped"]

FN_NAMES = ("causal_conv1d_fwd_function", "causal_conv1d_bwd_function", "causal_conv1d_fn")
# mamba_ssm 2.3's modules and the causal-conv1d names each binds as a global.
MODULE_BINDINGS = {
    "mamba_ssm.ops.triton.ssd_combined": FN_NAMES,
    "mamba_ssm.ops.selective_scan_interface": FN_NAMES,
    "mamba_ssm.modules.mamba2": ("causal_conv1d_fn",),
    "mamba_ssm.modules.mamba2_simple": ("causal_conv1d_fn",),
    "mamba_ssm.modules.mamba_simple": ("causal_conv1d_fn",),
    "mamba_ssm.modules.mha": ("causal_conv1d_fn",),
}
CAKE_BACKENDS = dao.CAKE_BACKENDS

# (module name, global name) -> (the object swap replaced, the object it bound).
_SWAPPED: dict[tuple[str, str], tuple[object, object]] = {}


def _cake_function(name: str, cake_backend: str):
    """cakeconv's function for the global ``name`` (a partial carrying the backend unless "auto")."""
    fn = getattr(dao, name)
    return fn if cake_backend == "auto" else functools.partial(fn, backend=cake_backend)


def _describe(value) -> str:
    return "None (causal-conv1d not installed)" if value is None else qualified_name(value)


def is_swapped() -> bool:
    """Whether some mamba_ssm global currently holds a function bound by ``swap()``."""
    return any(getattr(sys.modules.get(mod), name, None) is bound for (mod, name), (_, bound) in _SWAPPED.items())


def _import(module_name: str):
    """The module, imported if needed, or the reason it does not import."""
    try:
        return importlib.import_module(module_name), None
    except Exception as error:  # ImportError, or a CUDA extension that fails to load (OSError, RuntimeError)
        return None, f"{type(error).__name__}: {error}"


def _installed() -> bool:
    """Whether a ``mamba_ssm`` package can be found (imported already, or on the path)."""
    if "mamba_ssm" in sys.modules:
        return sys.modules["mamba_ssm"] is not None
    try:
        return importlib.util.find_spec("mamba_ssm") is not None
    except (ImportError, ValueError):
        return False


def swap(*, cake_backend: str = "auto") -> SwapReport:
    """Rebind causal-conv1d's functions in mamba_ssm's modules to cakeconv's (module docstring).

    Args:
        cake_backend: "auto" (Triton on CUDA, the PyTorch reference on the CPU), "triton" or
            "reference", for the calls cakeconv runs. A second ``swap`` keeps the first's bindings
            (call ``unswap`` first to change the backend).

    Returns:
        A ``SwapReport`` with one entry per (module, name): rebound, already swapped, or why not
        (the module does not import, or does not bind the name).

    Raises:
        ValueError: an unknown ``cake_backend``.
    """
    if not isinstance(cake_backend, str) or cake_backend not in CAKE_BACKENDS:
        raise ValueError(f"cake_backend must be one of {CAKE_BACKENDS}, got {cake_backend!r}")
    if not _installed():
        report = SwapReport("mamba_ssm", (SwapEntry("mamba_ssm", "package", False, "mamba_ssm is not installed"),))
        report.warn_if_unreached()
        return report
    entries = []
    for module_name, names in MODULE_BINDINGS.items():
        module, error = _import(module_name)
        for name in names:
            where = f"{module_name}.{name}"
            if module is None:
                entries.append(SwapEntry(where, "function", False, f"module does not import ({error})"))
                continue
            if not hasattr(module, name):
                entries.append(SwapEntry(where, "function", False, "the module binds no such name"))
                continue
            current = getattr(module, name)
            record = _SWAPPED.get((module_name, name))
            if record is not None and current is record[1]:
                entries.append(SwapEntry(where, "function", True, f"already swapped (was {_describe(record[0])})"))
                continue
            bound = _cake_function(name, cake_backend)
            setattr(module, name, bound)
            _SWAPPED[(module_name, name)] = (current, bound)
            entries.append(SwapEntry(where, "function", True,
                                     f"rebound to cakeconv.integrations.dao.{name} (was {_describe(current)})",
                                     newly_swapped=True))
    report = SwapReport("mamba_ssm", tuple(entries))
    if not report.on_cakeconv:
        report.warn_if_unreached()
    return report


def unswap() -> SwapReport:
    """Put back every global ``swap()`` rebound (the very objects it replaced).

    Returns:
        A ``SwapReport`` with one entry per binding: restored (``on_cakeconv`` False,
        ``newly_swapped`` True: this call changed it), or left as it is because someone rebound
        it since the swap (``on_cakeconv`` False, ``newly_swapped`` False).
    """
    entries = []
    for (module_name, name), (original, bound) in list(_SWAPPED.items()):
        module = sys.modules.get(module_name)
        where = f"{module_name}.{name}"
        if module is not None and getattr(module, name, None) is bound:
            setattr(module, name, original)
            entries.append(SwapEntry(where, "function", False, f"restored to {_describe(original)}",
                                     newly_swapped=True))
        else:
            entries.append(SwapEntry(where, "function", False, "rebound by someone else since the swap; left as it is"))
        del _SWAPPED[(module_name, name)]
    return SwapReport("mamba_ssm", tuple(entries), action="unswap")
