"""Hugging Face transformers' short convolutions on cakeconv, in one call: ``swap_causal_conv1d``.

transformers' linear-attention and state-space layers (Qwen3-Next's and Qwen3.5's GatedDeltaNet,
Mamba2, Falcon-Mamba, Jamba, LFM2, LFM3, the Inkling families, Kimi-Linear, Olmo-Hybrid, ...) run
their short convolution through the function ``causal_conv1d_fn`` of their modeling module: Dao's
function when causal-conv1d is installed and x is on a CUDA device, else transformers' PyTorch
fallback. ``swap_causal_conv1d(model)`` rebinds that function, in the modeling module of every
layer of ``model``, to a callable that runs ``cakeconv.integrations.dao.causal_conv1d_fn``
(deterministic, and faster than both; see that module for what runs on cakeconv and what it
delegates: every width from 2 to 8, with SiLU or without an activation, runs on cakeconv at its
real width). It returns a ``SwapReport`` that names each convolution of the model, whether it now
runs cakeconv and why (or why not), and warns (``CakeconvSwapWarning``) when some stay off it.
``unswap_causal_conv1d()`` puts back exactly what the swap replaced. This module never imports
transformers.

The swap is process-wide. A modeling module is shared by every model built from it: after
``swap_causal_conv1d(model)``, every model of the same family in the process (an unswapped copy
made before the swap, a model built later, the reference model of a comparison) calls cakeconv as
well, until ``unswap_causal_conv1d()``. To compare against transformers' own convolution in one
process, run the reference before the swap or after the unswap.

How transformers holds the function, and what the swap does with each form:

1. An instance attribute ``module.causal_conv1d_fn`` (transformers 4.57's
   ``Qwen3NextGatedDeltaNet``, and code written in that style): Dao's function, or None, in which
   case the layer runs its ``nn.Conv1d`` and the activation. The swap sets the attribute to
   cakeconv's function, None included, and ``module.causal_conv1d_update`` to
   ``cakeconv.integrations.dao.causal_conv1d_update`` where it is None (so that decoding works).
   This form alone is per instance; the originals are kept on the instance for the unswap.
2. A global of the modeling module (transformers 5.x without the ``kernels`` package): the
   layer's methods call ``causal_conv1d_fn`` directly (5.17) or through the module's
   ``causal_conv1d_forward`` (5.25), both by name at call time. The swap rebinds the global,
   ``modeling_module.causal_conv1d_fn = CakeCausalConv1dForTransformers(original, cake_backend)``,
   as Liger Kernel patches transformers' modeling modules; the layers' code is unchanged.
3. A ``kernels`` function module (transformers 5.25 with the ``kernels`` package, which it
   requires): the globals ``causal_conv1d_fn`` and ``causal_conv1d_forward`` are ``nn.Module``
   instances made by ``kernels.use_kernel_forward_from_hub``, and each layer holds private copies of
   them in ``module._kernel_funcs`` (``kernels.use_kernelized_func``: the place where
   ``kernels.kernelize`` puts a hub kernel). A call of a global is routed to the calling layer's
   private copy by the global object itself, and ``causal_conv1d_forward`` (its private copy runs
   transformers' function) looks the name ``causal_conv1d_fn`` up in the module at call time. So a
   rebound global is what it calls, and the private ``causal_conv1d_fn`` copies are no longer
   reached (a hub kernel ``kernelize`` put on one of them is bypassed too). The swap rebinds the
   global as in form 2, to a new function module of the same ``kernels`` class whose ``forward`` is
   the ``CakeCausalConv1dForTransformers`` (as ``kernelize`` sets a hub kernel's): ``kernels``
   rebuilds a layer's private copies from the global's class when a model is unpickled, so a model
   unpickled while swapped still gets transformers' own copies. What the rebinding does not reach:
   a hub kernel ``kernelize`` put on a layer's private ``causal_conv1d_forward`` (it does not call
   ``causal_conv1d_fn``), and one put on a fused Mamba kernel (below). The report names such layers.

In forms 2 and 3 the layer passes its keyword arguments on (``**kwargs``, transformers'
``TransformersKwargs``): ``seq_idx`` there (e.g. from ``DataCollatorWithFlattening(
return_seq_idx=True)``) keeps packed documents apart in the convolution, as with Dao's function
(transformers' PyTorch fallback refuses it); other keys are ignored, as transformers does for Dao's
function. In transformers 5.25 every family's ``causal_conv1d_forward`` passes ``seq_idx`` on, and
every model's forward brings it down to the layer but Falcon-Mamba's, Inkling's, Jamba's and
Mamba's. A call with an activation that causal-conv1d does not take (None, "silu" and "swish" are
what it takes; transformers' PyTorch fallback takes any of transformers' activations) goes to the
function the swap replaced, unchanged. The decode step (``causal_conv1d_update``, one token with a
cache) stays transformers' own: conv state is delegated (see ``cakeconv.integrations.dao``).

mamba_ssm. transformers' Mamba-style layers (Mamba, Mamba2, Bamba, Falcon-H1, GraniteMoeHybrid,
NemotronH, Zamba2) first call a fused kernel in training without a cache:
``mamba_split_conv1d_scan_combined`` (Mamba1: ``mamba_inner_fn``), which transformers resolves at
import to mamba_ssm's function when mamba_ssm is installed (and runs on CUDA inputs), else to a
PyTorch stand-in that returns None, so that the layer takes the ``causal_conv1d_fn`` path. The
fused kernels compute the convolution inside them, through causal-conv1d's
``causal_conv1d_fwd_function`` / ``causal_conv1d_bwd_function``, globals of mamba_ssm's modules.
When a modeling module of the model resolved a fused kernel to mamba_ssm, the swap also calls
``cakeconv.integrations.mamba_ssm.swap()``, which rebinds those globals, and merges its report;
``unswap_causal_conv1d`` calls ``cakeconv.integrations.mamba_ssm.unswap()`` when this swap changed
them. mamba_ssm's own layers (``mamba_ssm.modules``) are not swapped here: call
``cakeconv.integrations.mamba_ssm.swap()`` for them.

What the report says, in transformers 5.25. One entry per depthwise ``nn.Conv1d`` of the model
(groups equal to its channels, at least two taps): ``where`` is the convolution's name in
``model.named_modules()``, ``what`` its class, and ``why`` names the layer that owns it (its parent
module), which decides. Each of the 25 modeling files that call the short
convolution (Bailing-Hybrid, Bamba, Falcon-H1, Falcon-Mamba, GLM-5-Next, GraniteMoeHybrid,
Inkling, Inkling2, Inkling2-Loop, Jamba, Kimi-Linear, Lara-Mini, LFM2, LFM2-MoE, LFM3, Mamba,
Mamba2, NemotronH, Olmo-Hybrid, Qwen3.5, Qwen3.5-MoE, Qwen3-Next, Qwen4-Exp, Zamba, Zamba2; the
language models of LFM2-VL and LFM3-VL are LFM2 and LFM3) routes it through
``causal_conv1d_forward``, so each of their convolutions runs cakeconv in training, with the
layer's width and activation (LFM2 and LFM2-MoE W = 3 and LFM3 W = 7, the Inkling families
W = 4 with up to four convolutions per layer, all three without an activation; the others W = 4 with
SiLU), with a cache too (prefill, chunked prefill: the cache prepends the conv state to x). Not
reached, each with its reason in the report: Qwen4-Exp's second, dilated convolution (its PLE
layer calls its ``nn.Conv1d`` directly; a dilated convolution is not cakeconv's op), the fused
mamba_ssm kernels where ``cakeconv.integrations.mamba_ssm`` could not rebind their globals, hub
kernels put by ``kernelize`` (above), FLA's ``ShortConvolution`` (swapped by
``cakeconv.integrations.fla.swap_short_convolutions``), and a depthwise convolution whose layer
neither holds nor binds ``causal_conv1d_fn``. A layer counts as reached when it holds the
attribute (form 1) or its class's modeling module binds the rebound global; the swap does not read
the layer's code, so a layer that binds the global but calls its ``nn.Conv1d`` anyway is only told
apart by its dilation.

Parameters, buffers, ``state_dict`` keys, hooks, classes and the training mode are untouched, so an
optimizer built before the swap keeps working, checkpoints load either way, and a model deep-copies
and pickles as usual (it is the modeling module, not the model, that is swapped; form 1's
attributes are plain functions).
"""

from __future__ import annotations

import functools
import sys
import types
import warnings
import weakref

import torch.nn as nn

from . import dao
from .report import CakeconvSwapWarning, SwapEntry, SwapReport, qualified_name

__all__ = ["swap_causal_conv1d", "unswap_causal_conv1d", "is_swapped"]

FN_NAME = "causal_conv1d_fn"
UPDATE_NAME = "causal_conv1d_update"
FORWARD_NAME = "causal_conv1d_forward"
KERNEL_FUNCS = "_kernel_funcs"  # kernels.use_kernelized_func's per-instance function modules (form 3)
FUSED_NAMES = ("mamba_split_conv1d_scan_combined", "mamba_inner_fn")  # mamba_ssm's kernels with the conv inside
FUSED_CONV_NAMES = ("causal_conv1d_fwd_function", "causal_conv1d_bwd_function")  # what the fused kernels call
ORIGINALS = "_cake_original_functions"  # form 1: {attribute: what the swap replaced}, on the instance
CAKE_BACKENDS = dao.CAKE_BACKENDS

# modeling module name -> (the object the swap replaced, the object it bound): forms 2 and 3.
_REBOUND: dict[str, tuple[object, object]] = {}
# Form 1's swapped instances, for an unswap without a model.
_ATTRIBUTE_SWAPPED: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()
# Whether swap_causal_conv1d changed mamba_ssm's bindings (then unswap_causal_conv1d undoes them).
_MAMBA_SSM = {"swapped": False}


class CakeCausalConv1dForTransformers:
    """What a swapped modeling module binds under the global name ``causal_conv1d_fn``.

    Called as transformers calls its function (``fn(x, weight, bias, activation=..., **kwargs)``
    in 5.x, or Dao's keywords ``x=``, ``weight=``, ...): it runs
    ``cakeconv.integrations.dao.causal_conv1d_fn`` with the arguments it knows (``seq_idx``,
    ``initial_states``, ``return_final_states``, ``final_states_out`` among the keywords) and
    ignores the other keywords. Calls it cannot read as Dao's (more than three positional
    arguments, an activation other than None, "silu" and "swish") go to ``original``, the object
    the swap replaced (transformers' function; None when the module bound None, and then
    cakeconv's function takes the call and raises for what it does not take).
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
    if original is not None and (len(args) > 3 or kwargs.get("activation") not in dao.ACTIVATIONS):
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


# ------------------------------------------------------------------------- reading the model

def _modeling_modules(cls: type) -> list:
    """The modules that define ``cls`` and its bases and bind a global ``causal_conv1d_fn`` (a
    callable or None): the modeling modules the swap rebinds. torch's, cakeconv's and mamba_ssm's
    own modules are never among them (mamba_ssm has its own swap)."""
    found = []
    for klass in cls.__mro__:
        name = klass.__module__
        if name.split(".")[0] in ("builtins", "torch", "cakeconv", "mamba_ssm"):
            continue
        module = sys.modules.get(name)
        if module is None or FN_NAME not in vars(module) or module in found:
            continue
        value = vars(module)[FN_NAME]
        if value is None or callable(value):
            found.append(module)
    return found


def _closure_value(fn, name: str):
    """The value of the free variable ``name`` of function ``fn``, or None."""
    code = getattr(fn, "__code__", None)
    if code is None or name not in code.co_freevars or not fn.__closure__:
        return None
    try:
        return fn.__closure__[code.co_freevars.index(name)].cell_contents
    except ValueError:  # an empty cell
        return None


def _implementation(value):
    """What a global of a modeling module runs, as transformers resolved it at import.

    ``kernels``' function modules hold the function in their forward's closure (``func``), and
    transformers' ``use_kernel_func_from_hub_with_fallback`` wrapper holds the resolved function
    in its closure (``implementation``: the package's function, or transformers' own). Anything
    else is returned as it is (transformers 4.57 binds mamba_ssm's function itself).
    """
    if isinstance(value, nn.Module):
        value = _closure_value(type(value).forward, "func") or value
    return _closure_value(value, "implementation") or value


def _fused_mamba_ssm(module) -> dict:
    """{fused kernel name: the mamba_ssm module implementing it} for the fused kernels (conv inside)
    that the modeling ``module`` resolved to mamba_ssm."""
    found = {}
    for value in list(vars(module).values()):
        if isinstance(value, type) or not callable(value):
            continue
        impl = _implementation(value)
        name = getattr(impl, "__name__", None)
        impl_module = getattr(impl, "__module__", None) or ""
        if name in FUSED_NAMES and impl_module.split(".")[0] == "mamba_ssm":
            found[name] = impl_module
    return found


def _hub_kernel(owner: nn.Module, name: str) -> bool:
    """Whether ``kernels.kernelize`` put a hub kernel on ``owner``'s private function module
    ``name`` (form 3): its instance ``forward`` is bound to another class's forward."""
    funcs = owner.__dict__.get(KERNEL_FUNCS)
    func_module = funcs.get(name) if isinstance(funcs, dict) else None
    if not isinstance(func_module, nn.Module):
        return False
    forward = func_module.__dict__.get("forward")
    return isinstance(forward, types.MethodType) and forward.__func__ is not type(func_module).forward


def _is_short_conv(module: nn.Module) -> bool:
    """A depthwise ``nn.Conv1d`` (one group per channel) of at least two taps."""
    return (isinstance(module, nn.Conv1d) and module.groups == module.in_channels == module.out_channels
            and module.kernel_size[0] >= 2)


def _instance_function(cake_backend: str):
    if cake_backend == "auto":
        return dao.causal_conv1d_fn  # pickles by name
    return functools.partial(dao.causal_conv1d_fn, backend=cake_backend)


def _is_cake_function(value) -> bool:
    if isinstance(value, functools.partial):
        value = value.func
    return value is dao.causal_conv1d_fn


def _cake_binding(value):
    """The ``CakeCausalConv1dForTransformers`` behind a modeling module's global, or None: the global
    itself (form 2), or the forward of the ``kernels`` function module bound in its place (form 3)."""
    if isinstance(value, nn.Module):
        value = value.__dict__.get("forward")
    return value if isinstance(value, CakeCausalConv1dForTransformers) else None


def _rebound_here(module) -> bool:
    return _cake_binding(vars(module).get(FN_NAME)) is not None


def is_swapped(module: nn.Module) -> bool:
    """Whether ``module`` calls cakeconv's ``causal_conv1d_fn``: its attribute is cakeconv's, when it
    holds one (form 1), else its class's modeling module is rebound (forms 2 and 3, process-wide:
    then every instance of the class is swapped)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if FN_NAME in module.__dict__:
        return _is_cake_function(module.__dict__[FN_NAME])
    return any(_rebound_here(m) for m in _modeling_modules(type(module)))


# ---------------------------------------------------------------------------------- swapping

def _swap_attribute(module: nn.Module, cake_backend: str) -> bool:
    """Form 1 (module docstring): True when this call set ``module``'s attribute."""
    attrs = module.__dict__
    if FN_NAME not in attrs or _is_cake_function(attrs[FN_NAME]):
        return False
    if attrs[FN_NAME] is not None and not callable(attrs[FN_NAME]):
        return False
    originals = {FN_NAME: attrs[FN_NAME]}
    setattr(module, FN_NAME, _instance_function(cake_backend))
    if UPDATE_NAME in attrs and attrs[UPDATE_NAME] is None:
        originals[UPDATE_NAME] = None
        setattr(module, UPDATE_NAME, dao.causal_conv1d_update)
    setattr(module, ORIGINALS, originals)
    _ATTRIBUTE_SWAPPED.add(module)
    return True


def _rebind(module, cake_backend: str) -> bool:
    """Forms 2 and 3: bind cakeconv's callable as the modeling ``module``'s ``causal_conv1d_fn``;
    True when this call rebound it (False: it already was).

    Form 3's global is a ``kernels`` function module, and ``kernels`` rebuilds a layer's private
    copies from the global's class when a model is unpickled; so there the binding is a new instance
    of that class whose ``forward`` is cakeconv's callable (as ``kernelize`` sets a hub kernel's),
    and an unpickled layer still gets transformers' own private copies. A binding of this module
    that the record lost (put back by someone else after an unswap) is adopted.
    """
    current = vars(module)[FN_NAME]
    ours = _cake_binding(current)
    if ours is not None:
        if module.__name__ not in _REBOUND:
            _REBOUND[module.__name__] = (ours.original, current)
        return False
    bound = CakeCausalConv1dForTransformers(current, cake_backend)
    if isinstance(current, nn.Module):
        function_module = type(current)()
        function_module.forward = bound
        bound = function_module
    setattr(module, FN_NAME, bound)
    _REBOUND[module.__name__] = (current, bound)
    return True


def _swap_mamba_ssm(cake_backend: str) -> SwapReport:
    """``cakeconv.integrations.mamba_ssm.swap()``, its warning left to the merged report."""
    from . import mamba_ssm as cake_mamba_ssm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CakeconvSwapWarning)
        report = cake_mamba_ssm.swap(cake_backend=cake_backend)
    if report.swapped:
        _MAMBA_SSM["swapped"] = True
    return report


def _fused_reason(owner: nn.Module, fused: dict, mamba_report: SwapReport | None) -> tuple[bool, str]:
    """(whether the fused mamba_ssm kernels ``fused`` of ``owner`` reach cakeconv, how or why not)."""
    reached, missing = [], []
    for name, impl_module in fused.items():
        wanted = {f"{impl_module}.{n}" for n in FUSED_CONV_NAMES}
        entries = [e for e in (mamba_report.entries if mamba_report else ()) if e.where in wanted]
        if len(entries) == len(wanted) and all(e.on_cakeconv for e in entries):
            reached.append(f"{name} of {impl_module}")
        else:
            why = "; ".join(e.why for e in entries if not e.on_cakeconv) or "its bindings were not found"
            missing.append(f"{name} of {impl_module} ({why})")
    if missing:
        return False, (f"{type(owner).__name__}'s fused training path (mamba_ssm, CUDA, no cache) runs the "
                       f"convolution inside {', '.join(missing)}, which cakeconv.integrations.mamba_ssm did not reach")
    return True, (f"; its fused training path ({', '.join(reached)}) through cakeconv.integrations.mamba_ssm's "
                  f"{' and '.join(FUSED_CONV_NAMES)}")


def _entry(name: str, conv: nn.Conv1d, owner: nn.Module | None, newly: set, fused_of: dict,
           mamba_report: SwapReport | None) -> SwapEntry:
    """The report's entry for the depthwise convolution ``conv`` (``name`` in the model) of ``owner``.

    ``newly``: what this swap call changed (form-1 instance ids, modeling module names);
    ``fused_of``: modeling module name -> its fused mamba_ssm kernels (``_fused_mamba_ssm``).
    """
    what = type(conv).__name__
    conv_module = type(conv).__module__
    if conv_module.split(".")[0] == "fla":
        return SwapEntry(name, what, False, "an FLA ShortConvolution: cakeconv.integrations.fla."
                                            "swap_short_convolutions swaps it")
    if conv_module.split(".")[0] == "cakeconv":
        return SwapEntry(name, what, True, "a cakeconv module already")
    if owner is None:
        return SwapEntry(name, what, False, "no layer owns it, so nothing calls causal_conv1d_fn on it")
    owner_name = type(owner).__name__
    if conv.dilation[0] != 1:
        return SwapEntry(name, what, False, f"{owner_name}'s dilated convolution (dilation {conv.dilation[0]}) calls "
                                            f"its nn.Conv1d directly: a dilated convolution is not cakeconv's op")
    if _is_cake_function(owner.__dict__.get(FN_NAME)):
        return SwapEntry(name, what, True, f"{owner_name}.causal_conv1d_fn (instance attribute) set to cakeconv's",
                         newly_swapped=id(owner) in newly)
    modules = [m for m in _modeling_modules(type(owner)) if _rebound_here(m)]
    if not modules:
        if type(owner).__module__.split(".")[0] == "mamba_ssm":
            return SwapEntry(name, what, False, f"mamba_ssm's own {owner_name}: cakeconv.integrations.mamba_ssm.swap() "
                                                f"swaps it")
        return SwapEntry(name, what, False, f"{owner_name} ({type(owner).__module__}) neither holds nor binds "
                                            f"causal_conv1d_fn")
    if _hub_kernel(owner, FORWARD_NAME):
        return SwapEntry(name, what, False, f"kernelize put a hub kernel on {owner_name}'s {FORWARD_NAME}, which does "
                                            f"not call causal_conv1d_fn")
    funcs = owner.__dict__.get(KERNEL_FUNCS)
    for fused_name in FUSED_NAMES:
        if _hub_kernel(owner, fused_name):
            return SwapEntry(name, what, False, f"kernelize put a hub kernel on {owner_name}'s {fused_name}, "
                                                f"which runs the convolution inside it in training")
    fused = {}
    for module in modules:
        fused.update(fused_of[module.__name__])
    if isinstance(funcs, dict):  # form 3: the kernels the layer lists
        fused = {k: v for k, v in fused.items() if k in funcs}
    why = f"{owner_name} calls causal_conv1d_fn of {', '.join(m.__name__ for m in modules)}, rebound to cakeconv's"
    changed = any(m.__name__ in newly for m in modules)
    if fused:
        reached, how = _fused_reason(owner, fused, mamba_report)
        if not reached:
            return SwapEntry(name, what, False, how)
        why += how
        changed = changed or bool(mamba_report and mamba_report.swapped)
    return SwapEntry(name, what, True, why, newly_swapped=changed)


def swap_causal_conv1d(model: nn.Module, *, cake_backend: str = "auto") -> SwapReport:
    """Make every layer of ``model`` that calls transformers' ``causal_conv1d_fn`` call cakeconv's.

    Process-wide: the modeling modules of the model's layers are rebound (module docstring), so
    every model of those families in this process is swapped, not only ``model``; instance
    attributes (transformers 4.57's form) are set on ``model``'s layers only. When a modeling module
    resolved mamba_ssm's fused kernels, ``cakeconv.integrations.mamba_ssm.swap()`` is called too.
    What is already swapped is left as it is (its backend too): a second call changes nothing.

    Args:
        model: any ``nn.Module`` (a transformers model, a layer, or one module).
        cake_backend: "auto" (Triton on CUDA, the PyTorch reference on the CPU), "triton" or
            "reference", for the calls cakeconv runs.

    Returns:
        A ``SwapReport`` with one entry per depthwise ``nn.Conv1d`` of ``model`` (its name in
        ``model.named_modules()``): whether its training calls now run cakeconv, and how or why not;
        ``report.swapped`` counts those this call put on cakeconv (0 on a second call). mamba_ssm's
        entries are merged in when it was swapped. Warns (``CakeconvSwapWarning``) when some
        entries stay off cakeconv.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: an unknown ``cake_backend``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(cake_backend, str) or cake_backend not in CAKE_BACKENDS:
        raise ValueError(f"cake_backend must be one of {CAKE_BACKENDS}, got {cake_backend!r}")
    named = dict(model.named_modules())
    newly: set = set()  # ids of form-1 instances and names of modeling modules this call changed
    fused_of: dict = {}  # modeling module name -> its fused mamba_ssm kernels
    for module in named.values():
        if _swap_attribute(module, cake_backend):
            newly.add(id(module))
        for modeling in _modeling_modules(type(module)):
            if _rebind(modeling, cake_backend):
                newly.add(modeling.__name__)
            if modeling.__name__ not in fused_of:
                fused_of[modeling.__name__] = _fused_mamba_ssm(modeling)
    mamba_report = _swap_mamba_ssm(cake_backend) if any(fused_of.values()) else None
    entries = []
    for name, module in named.items():
        if _is_short_conv(module):
            owner = named.get(name.rpartition(".")[0]) if name else None
            entries.append(_entry(name, module, owner, newly, fused_of, mamba_report))
    report = SwapReport("transformers", tuple(entries))
    if mamba_report is not None:
        report = report.merged(mamba_report)
    report.warn_if_unreached()
    return report


# -------------------------------------------------------------------------------- unswapping

def _describe(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, nn.Module):
        return f"{type(value).__module__}.{getattr(value, 'kernel_layer_name', type(value).__name__)} (kernels)"
    return qualified_name(value)


def _restore_global(module_name: str) -> SwapEntry:
    """Put back the modeling module's ``causal_conv1d_fn`` (the very object the swap replaced)."""
    original, bound = _REBOUND.pop(module_name)
    module = sys.modules.get(module_name)
    where = f"{module_name}.{FN_NAME}"
    if module is not None and vars(module).get(FN_NAME) is bound:
        setattr(module, FN_NAME, original)
        return SwapEntry(where, "function", False, f"restored to {_describe(original)}", newly_swapped=True)
    return SwapEntry(where, "function", False, "rebound by someone else since the swap; left as it is")


def _restore_attributes(where: str, module: nn.Module) -> SwapEntry:
    """Form 1: put back the instance attributes the swap set."""
    originals = module.__dict__.pop(ORIGINALS)
    _ATTRIBUTE_SWAPPED.discard(module)
    for attribute, value in originals.items():
        setattr(module, attribute, value)
    return SwapEntry(where, type(module).__name__, False,
                     f"{', '.join(originals)} restored to {', '.join(_describe(v) for v in originals.values())}",
                     newly_swapped=True)


def unswap_causal_conv1d(model: nn.Module | None = None) -> SwapReport:
    """Undo ``swap_causal_conv1d``: every binding and attribute it changed gets back the very object
    it replaced.

    Args:
        model: None (the default) undoes every swap of this module in the process. With a model,
            only what concerns it: the modeling modules of its layers (process-wide still: the other
            models of those families are unswapped too), its layers' attributes, and mamba_ssm's
            bindings when they were swapped for its fused kernels. (A copy of a form-1 instance made
            after its swap is not tracked: pass its model to restore its attributes.)

    Returns:
        A ``SwapReport`` with one entry per binding or instance restored (``on_cakeconv`` False,
        ``newly_swapped`` True: this call changed it), or left as it is because someone rebound it
        since the swap (``newly_swapped`` False); mamba_ssm's unswap report merged in when it ran.
        Empty when nothing was swapped.

    Raises:
        TypeError: ``model`` is neither None nor an ``nn.Module``.
    """
    if model is not None and not isinstance(model, nn.Module):
        raise TypeError(f"model must be None or a torch.nn.Module, got {type(model).__name__}")
    if model is None:
        module_names = list(_REBOUND)
        instances = [(f"<{type(m).__qualname__} at 0x{id(m):x}>", m) for m in list(_ATTRIBUTE_SWAPPED)]
        undo_mamba_ssm = _MAMBA_SSM["swapped"]
    else:
        named = list(model.named_modules())
        module_names = []
        for _, module in named:
            for modeling in _modeling_modules(type(module)):
                if modeling.__name__ in _REBOUND and modeling.__name__ not in module_names:
                    module_names.append(modeling.__name__)
        instances = [(name, m) for name, m in named if ORIGINALS in m.__dict__]
        undo_mamba_ssm = _MAMBA_SSM["swapped"] and any(
            _fused_mamba_ssm(sys.modules[n]) for n in module_names if n in sys.modules)
    entries = [_restore_global(name) for name in module_names]
    entries += [_restore_attributes(where, module) for where, module in instances]
    report = SwapReport("transformers", tuple(entries), action="unswap")
    if undo_mamba_ssm:
        from . import mamba_ssm as cake_mamba_ssm

        report = report.merged(cake_mamba_ssm.unswap())
        _MAMBA_SSM["swapped"] = False
    return report
