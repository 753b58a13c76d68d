"""Tier 2 speed: Triton's CPU interpreter patches triton.language once per launch, not once per call.

Triton 3.6's interpreter maps the language's builtins (``tl.load``, ``tl.where``, ...) to their
numpy versions with ``_patch_lang(fn)``: once when a kernel is launched (``GridExecutor``, which
restores the originals when the launch ends) and again on every call of a ``@triton.jit`` helper
inside it (``InterpretedFunction.__call__``), with the same replacements. The kernels here call
helpers per row and per tap: in tests/test_plans.py's fast/general-path test the repeats ran 61,470
times, 37% of its profile (``python -m cProfile -s cumtime -m pytest ...``), each one walking every
member of ``tl``, ``tl.core``, ``tl.tensor`` and ``tl.math`` with ``inspect.getmembers``. Skipping
them took that test from 32.8 to 23.7 s and the whole tier from 484 to 370 s (two workers on a
2-core machine).

``install()`` wraps ``_patch_lang``: a helper's call inside a launch whose patches are in place, for a
helper whose language modules that launch already patched, changes nothing and is skipped (it would
only re-set the same replacements, which the launch's restore undoes anyway), unless a launch of
another thread began or ended since this one began (an end restores the originals, which the repeats
then put back); every other call runs as before. What the kernels compute is unchanged: the same
numpy implementations run either way. Installed by tests/conftest.py and by each rank of
tests/kcp/_dist.py when TRITON_INTERPRET=1.
"""

from __future__ import annotations

import inspect
import threading

# the launches in progress: thread id -> (the language modules its launch patched, the epoch it began in);
# the epoch counts launch starts and ends, so a launch that another one overlapped sees it changed
_active: dict[int, tuple[frozenset, int]] = {}
_epoch = [0]


class _Nothing:
    """The scope of a skipped patch: nothing to restore."""

    def restore(self) -> None:
        pass


_modules_of: dict[int, frozenset] = {}  # id(fn.__globals__) -> its language modules (a module's globals stay put)


def _language_modules(fn) -> frozenset:
    """The language modules a jitted function sees (what _patch_lang patches for it), once per module."""
    key = id(fn.__globals__)
    langs = _modules_of.get(key)
    if langs is None:
        import triton.language as tl

        langs = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
        _modules_of[key] = langs
    return langs


def install() -> None:
    """Wrap triton.runtime.interpreter._patch_lang (idempotent)."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang
    if getattr(original, "_patches_once", False):
        return

    def patch_lang(fn):
        langs = _language_modules(fn)
        me = threading.get_ident()
        if me in _active:  # a helper inside this thread's launch (kernels launch no kernels)
            launch_langs, began = _active[me]
            if began != _epoch[0]:
                # a launch of another thread began or ended meanwhile (an end restores the originals
                # under this one): patched again, as Triton does (never restored)
                return original(fn)
            if langs <= launch_langs:
                return _Nothing()
            # a helper seeing other language modules (Triton's own, e.g. tl.sum's sees triton.language.core):
            # patched as Triton does (never restored), then known to be patched for the rest of the launch
            _active[me] = (launch_langs | langs, began)
            return original(fn)
        scope = original(fn)  # a launch: GridExecutor restores this scope when the launch ends
        _epoch[0] += 1
        _active[me] = (langs, _epoch[0])
        restore = scope.restore

        def restore_and_forget():
            _active.pop(me, None)
            _epoch[0] += 1
            restore()

        scope.restore = restore_and_forget
        return scope

    patch_lang._patches_once = True
    patch_lang.original = original
    interpreter._patch_lang = patch_lang
