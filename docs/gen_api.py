"""Generate docs/api.md from the docstrings of every public name of cakeconv.

Run:  python docs/gen_api.py            (writes docs/api.md)
      python docs/gen_api.py --check    (exits 1 if docs/api.md is not what the code generates)

Sections, in order:
1. each public module of the top-level package, with the names of ``cakeconv.__all__`` it defines
   (single rank, KCP), then any other name of ``cakeconv.__all__``;
2. ``CakeShortConv`` (``cakeconv.short_conv``), whether or not it is re-exported yet;
3. the backend programs of ``cakeconv.cake_causal_conv1d_det_train_backend.kcp.__all__`` (names
   documented above are linked, not repeated);
4. the integrations, each module's ``__all__``: ``cakeconv.integrations.fla``, ``.dao``,
   ``.mamba_ssm``, ``.transformers``, ``.report`` (importing them imports none of those libraries);
5. the warm-up, ``cakeconv.warmup``.

For a function: its signature and docstring. For a class: the constructor's signature (for an
autograd Function, ``.apply`` with the forward's arguments), its docstring, then each public method
or property defined on the class with its own signature and docstring. Docstrings are copied
verbatim into ``text`` blocks: they carry shape tables and equations whose alignment matters.
"""

from __future__ import annotations

import argparse
import inspect
import pathlib
import sys

import torch

import cakeconv
import cakeconv.cake_causal_conv1d_det_train as single_module
import cakeconv.cake_causal_conv1d_det_train_kcp as kcp_module
from cakeconv.cake_causal_conv1d_det_train_backend import kcp as backend_kcp
from cakeconv.integrations import dao as dao_integration
from cakeconv.integrations import fla as fla_integration
from cakeconv.integrations import mamba_ssm as mamba_ssm_integration
from cakeconv.integrations import report as report_integration
from cakeconv.integrations import transformers as transformers_integration
from cakeconv import warmup as warmup_module
from cakeconv.short_conv import CakeShortConv

API_PATH = pathlib.Path(__file__).resolve().parent / "api.md"


def anchor(name: str) -> str:
    return name.lower()


def docstring_block(obj) -> list[str]:
    doc = inspect.getdoc(obj)
    if not doc:
        return ["*(no docstring)*", ""]
    return ["```text", doc, "```", ""]


def signature_text(obj, skip_first: bool = False) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    if skip_first:
        params = list(sig.parameters.values())[1:]
        sig = sig.replace(parameters=params)
    return str(sig)


def public_members(cls) -> list[tuple[str, object]]:
    """Public methods and properties defined on the class itself, in definition order."""
    members = []
    for name, value in cls.__dict__.items():
        if name.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            members.append((name, value.__func__))
        elif inspect.isfunction(value) or isinstance(value, property):
            members.append((name, value))
    return members


def document(name: str, obj, module_name: str) -> list[str]:
    lines = [f"### `{name}`", "", f"Defined in `{obj.__module__}`, public as `{module_name}.{name}`.", ""]
    if inspect.isclass(obj):
        bases = ", ".join(f"{b.__module__}.{b.__qualname__}" if b.__module__ != obj.__module__ else b.__qualname__
                          for b in obj.__bases__)
        if issubclass(obj, torch.autograd.Function):
            # forward(ctx, *inputs), or forward(*inputs) for a Function with setup_context
            forward = obj.forward
            first = next(iter(inspect.signature(forward).parameters), None)
            call = f"{name}.apply{signature_text(forward, skip_first=first == 'ctx')}"
        else:
            call = f"{name}{signature_text(obj)}"
        lines += ["```python", f"class {name}({bases})", call, "```", ""]
        lines += docstring_block(obj)
        if not issubclass(obj, torch.autograd.Function):
            for member_name, member in public_members(obj):
                if isinstance(member, property):
                    lines += [f"#### `{name}.{member_name}` (property)", ""]
                    lines += docstring_block(member.fget)
                    continue
                is_classmethod = isinstance(obj.__dict__[member_name], classmethod)
                skip = not isinstance(obj.__dict__[member_name], staticmethod)
                sig = signature_text(member, skip_first=skip)
                prefix = "classmethod " if is_classmethod else ""
                lines += [f"#### `{name}.{member_name}`", "", "```python", f"{prefix}{name}.{member_name}{sig}", "```", ""]
                lines += docstring_block(member)
    else:
        lines += ["```python", f"{name}{signature_text(obj)}", "```", ""]
        lines += docstring_block(obj)
    return lines


def sections() -> list[tuple[str, str, str, list[tuple[str, object]]]]:
    """(title, module name, module docstring source, [(name, object)]) in page order."""
    top = list(cakeconv.__all__)
    single = [n for n in top if n in single_module.__all__]
    kcp = [n for n in top if n in kcp_module.__all__]
    other = [n for n in top if n not in single and n not in kcp and n != "CakeShortConv"]
    out = [
        ("Single rank", "cakeconv.cake_causal_conv1d_det_train", single_module, [(n, getattr(cakeconv, n)) for n in single]),
        ("Context parallel (KCP)", "cakeconv.cake_causal_conv1d_det_train_kcp", kcp_module,
         [(n, getattr(cakeconv, n)) for n in kcp]),
    ]
    if other:
        out.append(("Other top-level names", "cakeconv", cakeconv, [(n, getattr(cakeconv, n)) for n in other]))
    short_conv_module = sys.modules[CakeShortConv.__module__]
    out.append(("nn.Module", "cakeconv.short_conv", short_conv_module, [("CakeShortConv", CakeShortConv)]))
    out.append(("KCP backend programs", "cakeconv.cake_causal_conv1d_det_train_backend.kcp", backend_kcp,
                [(n, getattr(backend_kcp, n)) for n in backend_kcp.__all__]))
    for title, module in (("flash-linear-attention", fla_integration), ("Dao's causal-conv1d API", dao_integration),
                          ("mamba_ssm", mamba_ssm_integration), ("Hugging Face transformers", transformers_integration),
                          ("Swap reports", report_integration), ("Warm-up (compiling ahead)", warmup_module)):
        out.append((title, module.__name__, module, [(n, getattr(module, n)) for n in module.__all__]))
    return out


def render() -> str:
    lines = [
        "# API reference",
        "",
        "<!-- GENERATED by docs/gen_api.py from the docstrings; do not edit by hand. -->",
        "",
        f"cakeconv {cakeconv.__version__}. Every name below is importable from the module named in its "
        "section; the names of `cakeconv.__all__` are also re-exported by `cakeconv` itself. "
        "Shapes use S packed tokens (S_local on a KCP rank), C channels, N documents, D local segments, "
        "H = 3 halo rows. Math conventions: [Determinism](determinism.md), layouts: [Layouts](layouts.md).",
        "",
        "## Contents",
        "",
    ]
    secs = sections()
    seen: dict[int, str] = {}
    for title, module_name, _, names in secs:
        lines.append(f"- **{title}** (`{module_name}`)")
        for name, obj in names:
            lines.append(f"  - [`{name}`](#{anchor(name)})")
    lines.append("")
    for title, module_name, module, names in secs:
        lines += [f"## {title}: `{module_name}`", ""]
        module_doc = inspect.getdoc(module)
        if module_doc and module is not cakeconv:
            lines += docstring_block(module)
        for name, obj in names:
            if id(obj) in seen:
                lines += [f"### `{name}` (in `{module_name}`)", "",
                          f"The same object as [`{seen[id(obj)]}`](#{anchor(name)}) above.", ""]
                continue
            seen[id(obj)] = f"{module_name}.{name}"
            lines += document(name, obj, module_name)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = API_PATH.read_text() if API_PATH.exists() else ""
        if current != text:
            print(f"{API_PATH} is stale: run python docs/gen_api.py", file=sys.stderr)
            return 1
        print(f"{API_PATH} is up to date")
        return 0
    API_PATH.write_text(text)
    print(f"wrote {API_PATH} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
