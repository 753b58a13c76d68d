"""Hugging Face transformers' causal-conv1d calls on cakeconv, in one call: ``swap_causal_conv1d``.

transformers' linear-attention and state-space layers (Qwen3-Next's and Qwen3.5's GatedDeltaNet,
Mamba2, Falcon-Mamba, Jamba, LFM2, LFM3, the Inkling families, Kimi-Linear, Olmo-Hybrid, ...) run
their short convolution through Dao's ``causal_conv1d_fn`` when causal-conv1d is installed, else
through a slower PyTorch path. ``swap_causal_conv1d(model)`` makes every such layer of a model call
``cakeconv.integrations.dao.causal_conv1d_fn`` instead (deterministic, and faster than both; see
that module for what runs on cakeconv and what it delegates: every width from 2 to 8, with SiLU or
without an activation, runs on cakeconv at its real width). It never imports transformers: it
finds the call sites in the model's modules.

What reaches cakeconv, in transformers 5.25. Each of the 25 modeling files that call the short
convolution (Bailing-Hybrid, Bamba, Falcon-H1, Falcon-Mamba, GLM-5-Next, GraniteMoeHybrid,
Inkling, Inkling2, Inkling2-Loop, Jamba, Kimi-Linear, Lara-Mini, LFM2, LFM2-MoE, LFM3, Mamba,
Mamba2, NemotronH, Olmo-Hybrid, Qwen3.5, Qwen3.5-MoE, Qwen3-Next, Qwen4-Exp, Zamba, Zamba2; the
language models of LFM2-VL and LFM3-VL are LFM2 and LFM3) routes it through one function of the
module, ``causal_conv1d_forward(conv1d, hidden_states, cache, layer_idx, activation=...,
**kwargs)``. That function calls ``causal_conv1d_fn`` (Dao's function, or transformers' PyTorch
fallback: ``F.conv1d`` with the layer's ``nn.Conv1d`` taps, then the activation) for every call
but a one-token decode step with a cache, which calls ``causal_conv1d_update``. So the swap
reaches the PyTorch path as well as Dao's by replacing the function, not the ``nn.Conv1d``
module; with a cache (prefill, chunked prefill) the cache prepends the conv state to x and the
call still runs on cakeconv. The width and the activation are the layer's own: LFM2 and LFM2-MoE
W = 3 and LFM3 W = 7, the Inkling families W = 4 (four convolutions per layer), all three without
an activation; the others mostly W = 4 with SiLU (``config.hidden_act``). What is not reached: the
one-token decode step (conv state is delegated, see ``cakeconv.integrations.dao``); the fused
training kernels of mamba_ssm (``mamba_split_conv1d_scan_combined``, ``mamba_inner_fn``), which
the Mamba-style layers (Mamba, Mamba2, Bamba, Falcon-H1, GraniteMoeHybrid, NemotronH, Zamba2)
call first when mamba_ssm is installed and x is on a GPU, and which compute the convolution inside
them (without them those layers take the path above); and Qwen4-Exp's second, dilated
convolution, which calls its ``nn.Conv1d`` directly (a dilated convolution is not cakeconv's op;
neither is LFM3-VL's vision tower's 2D convolution).

transformers holds the function in one of three ways, and the swap handles each:

1. An instance attribute ``module.causal_conv1d_fn`` (transformers 4.57's
   ``Qwen3NextGatedDeltaNet``, and code written in that style): Dao's function, or None, in which
   case the layer runs its ``nn.Conv1d`` and the activation. The swap sets the attribute to
   cakeconv's function, None included, and ``module.causal_conv1d_update`` to
   ``cakeconv.integrations.dao.causal_conv1d_update`` where it is None (so that decoding works).
2. A module-level function (transformers 5.x, every model above): the layer's methods call the
   global ``causal_conv1d_fn`` of their modeling module, which transformers resolved at import to
   Dao's function or to its PyTorch fallback (which refuses ``seq_idx``), directly (5.17) or
   through another function of that module (5.25: ``forward`` calls ``causal_conv1d_forward``,
   which calls ``causal_conv1d_fn``). The swap changes the layer's class (``module.__class__``) to
   a subclass built once per class: each method that reads that global, or a function of its
   module that leads to it (through decorators too, at any depth), is replaced by a copy of itself,
   with the same code and decorators, whose globals are those of its modeling module with
   ``causal_conv1d_fn`` bound to cakeconv's and each function leading to it bound to such a copy. Only the swapped instances change: another instance of the same class, in the same
   process, keeps transformers' function. The copies see the module's globals as they were at
   the latest ``swap_causal_conv1d`` call (a name of the modeling module patched after it is not
   seen by swapped methods until the next call). The subclass keeps the class's name, so model
   code that checks class names is unaffected; ``is_swapped(module)`` tells. The decode step
   (``causal_conv1d_update``) stays transformers' own: Dao's when installed, else its PyTorch one.

3. Per-instance kernel functions (transformers 5.25 with the ``kernels`` package, which it
   requires): the modeling module's ``causal_conv1d_fn`` is a ``kernels`` function module, and
   each layer instance holds its private copy in ``module._kernel_funcs["causal_conv1d_fn"]``,
   which its forward routes the global's calls to (``kernels.use_kernelized_func``, the place where
   ``kernels.kernelize`` puts a hub kernel). The swap sets that copy's ``forward`` to cakeconv's,
   as ``kernelize`` does with its kernels; what it replaced (transformers' function, or a kernel
   ``kernelize`` put there before) runs the calls cakeconv does not take. Per instance, like the
   other forms; the decode step stays transformers' own.

In the second and third forms the layer passes its keyword arguments on (``**kwargs``, transformers'
``TransformersKwargs``): ``seq_idx`` there (e.g. from ``DataCollatorWithFlattening(
return_seq_idx=True)``) keeps packed documents apart in the convolution, as with Dao's function;
other keys are ignored, as transformers does for Dao's function. A call with an activation that
causal-conv1d does not take (None, "silu" and "swish" are what it takes; transformers' PyTorch
fallback takes any of transformers' activations) goes to transformers' own function unchanged.

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
KERNEL_FUNCS = "_kernel_funcs"  # kernels.use_kernelized_func's per-instance function modules (form 3)
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
        return _cake_or_original(self.original, self.cake_backend, args, kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cake_backend={self.cake_backend!r})"


def _cake_or_original(original, cake_backend: str, args: tuple, kwargs: dict):
    """One call of transformers' ``causal_conv1d_fn`` on cakeconv (``CakeCausalConv1dForTransformers``)."""
    if len(args) > 3 or kwargs.get("activation") not in dao.ACTIVATIONS:
        return original(*args, **kwargs)
    named = dict(zip(("x", "weight", "bias"), args))
    if "hidden_states" in kwargs:  # transformers' own name for x
        named["x"] = kwargs["hidden_states"]
    for key in ("x", "weight", "bias", "seq_idx", "initial_states", "return_final_states", "final_states_out",
                "activation"):
        if key in kwargs:
            named[key] = kwargs[key]
    return dao.causal_conv1d_fn(named.get("x"), named.get("weight"), named.get("bias"), named.get("seq_idx"),
                                named.get("initial_states"), named.get("return_final_states", False),
                                named.get("final_states_out"), named.get("activation"), backend=cake_backend)


class CakeKernelForward:
    """The ``forward`` that form 3 (module docstring) binds to a layer's private ``causal_conv1d_fn``
    function module, as ``kernels.kernelize`` binds a hub kernel's.

    ``kernels`` calls it with a function module first (the private one eagerly, the module-level one
    under torch.compile), then transformers' arguments; they go to cakeconv as in
    ``CakeCausalConv1dForTransformers``, else to ``replaced(func_module, ...)``: the forward it
    took the place of (None: the function module's own, i.e. transformers' function). Holds no
    reference to the module, so a swapped model deep-copies and pickles.
    """

    __slots__ = ("cake_backend", "replaced")

    def __init__(self, cake_backend: str, replaced=None):
        self.cake_backend = cake_backend
        self.replaced = replaced

    def __call__(self, func_module, *args, **kwargs):
        forward = self.replaced if self.replaced is not None else type(func_module).forward
        return _cake_or_original(functools.partial(forward, func_module), self.cake_backend, args, kwargs)

    def __getstate__(self):
        return self.cake_backend, self.replaced

    def __setstate__(self, state):
        self.cake_backend, self.replaced = state

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


def _reads_any(code: types.CodeType, names) -> bool:
    return any(_reads_global(code, name) for name in names)


def _closure_functions(fn: types.FunctionType):
    for cell in fn.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(inner, types.FunctionType):
            yield inner


def _leads_to(fn: types.FunctionType, fn_globals: dict, names: set, seen: set) -> bool:
    """Whether ``fn`` reads one of ``names`` of ``fn_globals`` (its own globals), or a function in its
    closure (a decorator's wrapped function, at any depth) does."""
    if id(fn) in seen:
        return False
    seen.add(id(fn))
    if fn.__globals__ is fn_globals and _reads_any(fn.__code__, names):
        return True
    return any(_leads_to(inner, fn_globals, names, seen) for inner in _closure_functions(fn))


def _names_leading_to_fn(fn_globals: dict) -> frozenset:
    """``causal_conv1d_fn`` and the names of the module's functions that lead to it: those that read
    it, or read a name that leads to it (to a fixed point), directly or through their closures."""
    names = {FN_NAME}
    functions = {n: v for n, v in fn_globals.items() if n != FN_NAME and isinstance(v, types.FunctionType)}
    grew = True
    while grew:
        grew = False
        for name, fn in functions.items():
            if name not in names and _leads_to(fn, fn_globals, names, set()):
                names.add(name)
                grew = True
    return frozenset(names)


def _swapped_names(fn_globals: dict) -> frozenset:
    """The names a copy of a function of ``fn_globals`` finds rebound (empty: not a modeling module)."""
    if FN_NAME not in fn_globals:
        return frozenset()
    for entry in _GLOBALS.values():
        if entry[0] is fn_globals:
            return entry[3]
    return _names_leading_to_fn(fn_globals)


def _globals_for(fn_globals: dict, cake_backend: str) -> dict:
    """The modeling module's globals with ``causal_conv1d_fn`` bound to cakeconv's: one copy per
    module and backend, which every ``swap_causal_conv1d`` call refreshes (``_refresh_globals``)."""
    key = (id(fn_globals), cake_backend)
    entry = _GLOBALS.get(key)
    if entry is None or entry[0] is not fn_globals:
        # holds the original (its id stays unique), the replaced globals, the backend, the rebound names
        entry = [fn_globals, {}, cake_backend, _names_leading_to_fn(fn_globals)]
        _GLOBALS[key] = entry
        _refresh(entry)
    return entry[1]


def _refresh(entry) -> None:
    """Copy the module's current globals into the replaced ones (the same dict, which the swapped
    methods hold): ``causal_conv1d_fn`` bound to cakeconv's in front of the module's current one,
    and each module function leading to it bound to a copy of itself that sees these globals."""
    fn_globals, replaced, cake_backend = entry[:3]
    entry[3] = _names_leading_to_fn(fn_globals)
    replaced.clear()
    replaced.update(fn_globals)
    replaced[FN_NAME] = CakeCausalConv1dForTransformers(fn_globals[FN_NAME], cake_backend)
    memo: dict = {}
    for name in entry[3] - {FN_NAME}:
        copy = _rebound(fn_globals[name], cake_backend, memo)
        assert copy is not None, name  # it leads to causal_conv1d_fn, so it has a copy
        replaced[name] = copy


def _refresh_globals() -> None:
    for entry in list(_GLOBALS.values()):
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
    ``fn`` nor a function in its closure (a decorator's wrapped function, at any depth) reads it or
    a function of its module that leads to it (``_names_leading_to_fn``).

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
    reads = _reads_any(fn.__code__, _swapped_names(fn.__globals__))
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


def _kernel_func(module: nn.Module):
    """Form 3: the module's private ``causal_conv1d_fn`` function module, or None."""
    funcs = module.__dict__.get(KERNEL_FUNCS)
    if not isinstance(funcs, dict) or not isinstance(funcs.get(FN_NAME), nn.Module):
        return None
    return funcs[FN_NAME]


def _kernel_func_swapped(func_module: nn.Module) -> bool:
    return isinstance(getattr(func_module.__dict__.get("forward"), "__func__", None), CakeKernelForward)


def is_swapped(module: nn.Module) -> bool:
    """Whether ``module`` calls cakeconv's causal_conv1d_fn (an attribute set, its class swapped, or
    its private kernel function's forward set)."""
    func_module = _kernel_func(module)
    return (_is_cake_function(module.__dict__.get(FN_NAME)) or "_cake_original_class" in vars(type(module))
            or (func_module is not None and _kernel_func_swapped(func_module)))


def _swap_kernel_func(module: nn.Module, cake_backend: str) -> bool:
    """Form 3 (module docstring): True when it applied to ``module``."""
    func_module = _kernel_func(module)
    if func_module is None or _kernel_func_swapped(func_module):
        return False
    bound = func_module.__dict__.get("forward")  # kernelize's kernel, when it put one there
    replaced = bound.__func__ if isinstance(bound, types.MethodType) else None
    func_module.forward = types.MethodType(CakeKernelForward(cake_backend, replaced), func_module)
    return True


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

    In place, per instance, each of transformers' forms (module docstring). Modules already
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
        changed = _swap_kernel_func(module, cake_backend) or changed
        if "_cake_original_class" not in vars(type(module)):
            cls = swapped_class(type(module), cake_backend)
            if cls is not None:
                module.__class__ = cls
                changed = True
        swapped += changed
    return swapped
