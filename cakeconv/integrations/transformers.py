"""Hugging Face transformers' causal-conv1d calls on cakeconv, in one call: ``swap_causal_conv1d``.

transformers' linear-attention and state-space layers (Qwen3-Next's and Qwen3.5's GatedDeltaNet,
Mamba2, Falcon-Mamba, Jamba, Lfm2, Kimi-Linear, Olmo-Hybrid, ...) run their short convolution
through Dao's ``causal_conv1d_fn`` when causal-conv1d is installed, else through a slower PyTorch
path. ``swap_causal_conv1d(model)`` makes every such layer of a model call
``cakeconv.integrations.dao.causal_conv1d_fn`` instead (deterministic, and faster than both; see
that module for what runs on cakeconv and what it delegates). It never imports transformers: it
finds the call sites in the model's modules.

transformers holds the function in one of two ways, and the swap handles both:

1. An instance attribute ``module.causal_conv1d_fn`` (transformers 4.57's
   ``Qwen3NextGatedDeltaNet``, and code written in that style): Dao's function, or None, in which
   case the layer runs its ``nn.Conv1d`` and the activation. The swap sets the attribute to
   cakeconv's function, None included, and ``module.causal_conv1d_update`` to
   ``cakeconv.integrations.dao.causal_conv1d_update`` where it is None (so that decoding works).
2. A module-level function (transformers 5.x, every model above): the layer's methods call the
   global ``causal_conv1d_fn`` of their modeling module, which transformers resolved at import to
   Dao's function or to its PyTorch fallback (which refuses ``seq_idx``). The swap changes the
   layer's class (``module.__class__``) to a subclass built once per class: each method that reads
   that global (through its decorators too) is replaced by a copy of itself, with the same code and
   decorators, whose globals are those of its modeling module with ``causal_conv1d_fn`` bound to
   cakeconv's. Only the swapped instances change: another instance of the same class, in the same
   process, keeps transformers' function. The copies see the module's globals as they were at
   the latest ``swap_causal_conv1d`` call (a name of the modeling module patched after it is not
   seen by swapped methods until the next call). The subclass keeps the class's name, so model
   code that checks class names is unaffected; ``is_swapped(module)`` tells. The decode step
   (``causal_conv1d_update``) stays transformers' own: Dao's when installed, else its PyTorch one.

In the second form the layer passes its keyword arguments on (``**kwargs``, transformers'
``TransformersKwargs``): ``seq_idx`` there (e.g. from ``DataCollatorWithFlattening(
return_seq_idx=True)``) keeps packed documents apart in the convolution, as with Dao's function;
other keys are ignored, as transformers does for Dao's function. A call with an activation that
causal-conv1d does not take (its PyTorch fallback takes any of transformers' activations) goes to
transformers' own function unchanged.

Parameters, buffers, ``state_dict`` keys, hooks and the training mode are untouched, so an
optimizer built before the swap keeps working, and checkpoints load either way. A swapped model
deep-copies and pickles (it unpickles swapped, given cakeconv and transformers).
"""

from __future__ import annotations

import dis
import functools
import types

import torch.nn as nn

from . import dao

__all__ = ["swap_causal_conv1d", "is_swapped"]

FN_NAME = "causal_conv1d_fn"
UPDATE_NAME = "causal_conv1d_update"
CAKE_BACKENDS = dao.CAKE_BACKENDS

# (original class, cake backend) -> its swapped subclass, or None when no method reads the global.
_CLASSES: dict = {}
# (id of a modeling module's globals, cake backend) -> those globals with causal_conv1d_fn replaced.
_GLOBALS: dict = {}


class CakeCausalConv1dForTransformers:
    """What a swapped method finds under the global name ``causal_conv1d_fn``.

    Called as transformers calls its function (``fn(x, weight, bias, activation=..., **kwargs)``
    in 5.x, or Dao's keywords ``x=``, ``weight=``, ...): it runs
    ``cakeconv.integrations.dao.causal_conv1d_fn`` with the arguments it knows (``seq_idx``,
    ``initial_states``, ``return_final_states``, ``final_states_out`` among the keywords) and
    ignores the other keywords. Calls it cannot read as Dao's (more than three positional
    arguments, an activation other than None, "silu" and "swish") go to ``original``,
    transformers' own function.
    """

    __slots__ = ("original", "cake_backend")

    def __init__(self, original, cake_backend: str):
        self.original = original
        self.cake_backend = cake_backend

    def __call__(self, *args, **kwargs):
        if len(args) > 3 or kwargs.get("activation") not in dao.ACTIVATIONS:
            return self.original(*args, **kwargs)
        named = dict(zip(("x", "weight", "bias"), args))
        if "hidden_states" in kwargs:  # transformers' own name for x
            named["x"] = kwargs["hidden_states"]
        for key in ("x", "weight", "bias", "seq_idx", "initial_states", "return_final_states", "final_states_out",
                    "activation"):
            if key in kwargs:
                named[key] = kwargs[key]
        return dao.causal_conv1d_fn(named.get("x"), named.get("weight"), named.get("bias"), named.get("seq_idx"),
                                    named.get("initial_states"), named.get("return_final_states", False),
                                    named.get("final_states_out"), named.get("activation"), backend=self.cake_backend)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cake_backend={self.cake_backend!r})"


# ------------------------------------------------------------------ finding and copying methods

@functools.lru_cache(maxsize=4096)
def _reads_global(code: types.CodeType, name: str) -> bool:
    """Whether ``code`` (or code nested in it: comprehensions, inner functions) loads global ``name``."""
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_GLOBAL" and ins.argval == name:
            return True
    return any(_reads_global(c, name) for c in code.co_consts if isinstance(c, types.CodeType))


def _globals_for(fn_globals: dict, cake_backend: str) -> dict:
    """The modeling module's globals with ``causal_conv1d_fn`` bound to cakeconv's: one copy per
    module and backend, which every ``swap_causal_conv1d`` call refreshes (``_refresh_globals``)."""
    key = (id(fn_globals), cake_backend)
    entry = _GLOBALS.get(key)
    if entry is None or entry[0] is not fn_globals:
        entry = (fn_globals, {}, cake_backend)  # holds the original: its id stays unique
        _GLOBALS[key] = entry
        _refresh(entry)
    return entry[1]


def _refresh(entry) -> None:
    """Copy the module's current globals into the replaced ones (the same dict, which the swapped
    methods hold), ``causal_conv1d_fn`` bound to cakeconv's in front of the module's current one."""
    fn_globals, replaced, cake_backend = entry
    replaced.clear()
    replaced.update(fn_globals)
    replaced[FN_NAME] = CakeCausalConv1dForTransformers(fn_globals[FN_NAME], cake_backend)


def _refresh_globals() -> None:
    for entry in _GLOBALS.values():
        _refresh(entry)


def _copy_function(fn: types.FunctionType, fn_globals: dict, closure) -> types.FunctionType:
    new = types.FunctionType(fn.__code__, fn_globals, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__annotations__ = fn.__annotations__
    new.__dict__.update(fn.__dict__)
    return new


def _rebound(fn, cake_backend: str, memo: dict):
    """A copy of ``fn`` in which the global ``causal_conv1d_fn`` is cakeconv's, or None when neither
    ``fn`` nor a function in its closure (a decorator's wrapped function, at any depth) reads it.

    Closure cells holding such functions are replaced by cells holding their copies; every other
    cell is shared with ``fn``. ``memo``: original -> copy (or None), for functions met twice.
    """
    if not isinstance(fn, types.FunctionType):
        return None
    if fn in memo:
        return memo[fn]
    memo[fn] = None  # a function in its own closure (recursion) is left as it is
    cells = fn.__closure__ or ()
    new_cells, changed = [], False
    for cell in cells:
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            new_cells.append(cell)
            continue
        copy = _rebound(inner, cake_backend, memo)
        new_cells.append(cell if copy is None else types.CellType(copy))
        changed = changed or copy is not None
    reads = FN_NAME in fn.__globals__ and _reads_global(fn.__code__, FN_NAME)
    if not (reads or changed):
        return None
    fn_globals = _globals_for(fn.__globals__, cake_backend) if reads else fn.__globals__
    new = _copy_function(fn, fn_globals, tuple(new_cells) if cells else None)
    wrapped = fn.__dict__.get("__wrapped__")
    if memo.get(wrapped) is not None:
        new.__wrapped__ = memo[wrapped]
    memo[fn] = new
    return new


def _rebound_attribute(value, cake_backend: str, memo: dict):
    """A class attribute (function, staticmethod or classmethod) rebound, or None."""
    if isinstance(value, (staticmethod, classmethod)):
        copy = _rebound(value.__func__, cake_backend, memo)
        return None if copy is None else type(value)(copy)
    return _rebound(value, cake_backend, memo)


def swapped_class(cls: type, cake_backend: str = "auto") -> type | None:
    """The subclass of ``cls`` whose methods that read the global ``causal_conv1d_fn`` call cakeconv's.

    Built once per (class, backend) and cached; None when no method of ``cls`` (its own or
    inherited, dunder methods such as ``__init__`` aside: they do not run on a swapped instance)
    reads that global.
    """
    key = (cls, cake_backend)
    if key in _CLASSES:
        return _CLASSES[key]
    memo: dict = {}
    methods = {}
    seen: set = set()
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in ("builtins", "torch"):
            continue  # object, nn.Module and torch's layers call no causal_conv1d_fn
        for name, value in vars(klass).items():
            if name in seen or (name.startswith("__") and name.endswith("__")):
                continue
            seen.add(name)
            copy = _rebound_attribute(value, cake_backend, memo)
            if copy is not None:
                methods[name] = copy
    new = None
    if methods:
        namespace = {**methods, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                     "__doc__": cls.__doc__, "_cake_original_class": cls, "_cake_backend": cake_backend,
                     "__reduce_ex__": _reduce_swapped}
        new = type(cls.__name__, (cls,), namespace)
    _CLASSES[key] = new
    return new


def _reduce_swapped(self, protocol):
    """Pickle a swapped instance as one: rebuilt from its original class (found by name) and state."""
    cls = type(self)
    return _new_swapped, (cls._cake_original_class, cls._cake_backend), self.__dict__.copy()


def _new_swapped(original: type, cake_backend: str):
    """An empty instance of ``original``'s swapped class (unpickling; the original if none)."""
    cls = swapped_class(original, cake_backend) or original
    return cls.__new__(cls)


# ---------------------------------------------------------------------------------- the swap

def _instance_function(cake_backend: str):
    if cake_backend == "auto":
        return dao.causal_conv1d_fn  # pickles by name
    return functools.partial(dao.causal_conv1d_fn, backend=cake_backend)


def _is_cake_function(value) -> bool:
    if isinstance(value, functools.partial):
        value = value.func
    return value is dao.causal_conv1d_fn


def is_swapped(module: nn.Module) -> bool:
    """Whether ``module`` calls cakeconv's causal_conv1d_fn (an attribute set, or its class swapped)."""
    return _is_cake_function(module.__dict__.get(FN_NAME)) or "_cake_original_class" in vars(type(module))


def _swap_attribute(module: nn.Module, cake_backend: str) -> bool:
    """Form 1 (module docstring): True when it applied to ``module``."""
    attrs = module.__dict__
    if FN_NAME not in attrs or _is_cake_function(attrs[FN_NAME]):
        return False
    if attrs[FN_NAME] is not None and not callable(attrs[FN_NAME]):
        return False
    setattr(module, FN_NAME, _instance_function(cake_backend))
    if UPDATE_NAME in attrs and attrs[UPDATE_NAME] is None:
        setattr(module, UPDATE_NAME, dao.causal_conv1d_update)
    return True


def swap_causal_conv1d(model: nn.Module, *, cake_backend: str = "auto") -> int:
    """Make every module of ``model`` that calls transformers' ``causal_conv1d_fn`` call cakeconv's.

    In place, per instance, both of transformers' forms (module docstring). Modules already
    swapped are left as they are (their backend too), so a second call returns 0.

    Args:
        model: any ``nn.Module`` (a transformers model, a layer, or one module).
        cake_backend: "auto" (Triton on CUDA, the PyTorch reference on the CPU), "triton" or
            "reference", for the calls cakeconv runs.

    Returns:
        The number of modules swapped by this call.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: an unknown ``cake_backend``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(cake_backend, str) or cake_backend not in CAKE_BACKENDS:
        raise ValueError(f"cake_backend must be one of {CAKE_BACKENDS}, got {cake_backend!r}")
    _refresh_globals()
    swapped = 0
    for module in model.modules():
        changed = _swap_attribute(module, cake_backend)
        if "_cake_original_class" not in vars(type(module)):
            cls = swapped_class(type(module), cake_backend)
            if cls is not None:
                module.__class__ = cls
                changed = True
        swapped += changed
    return swapped
