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

``install()`` wraps ``_patch_lang``: a call made while a launch's patches are in place, for a helper
whose language modules that launch already patched, changes nothing and is skipped (it would only
re-set the same replacements, which the launch's restore undoes anyway); every other call runs as
before. What the kernels compute is unchanged: the same numpy implementations run either way.
Installed by tests/conftest.py and by each rank of tests/kcp/_dist.py when TRITON_INTERPRET=1.
"""

from __future__ import annotations

import inspect

_active: list[frozenset] = []  # the language modules the launch in progress patched (at most one entry)


class _Nothing:
    """The scope of a skipped patch: nothing to restore."""

    def restore(self) -> None:
        pass


def _language_modules(fn) -> frozenset:
    import triton.language as tl

    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def install() -> None:
    """Wrap triton.runtime.interpreter._patch_lang (idempotent)."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang
    if getattr(original, "_patches_once", False):
        return

    def patch_lang(fn):
        langs = _language_modules(fn)
        if _active:  # a helper inside a launch (kernels launch no kernels)
            if langs <= _active[0]:
                return _Nothing()
            return original(fn)  # other language modules: patched as Triton does (never restored)
        scope = original(fn)  # a launch: GridExecutor restores this scope when the launch ends
        _active.append(langs)
        restore = scope.restore

        def restore_and_forget():
            _active.clear()
            restore()

        scope.restore = restore_and_forget
        return scope

    patch_lang._patches_once = True
    interpreter._patch_lang = patch_lang
