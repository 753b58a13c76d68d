"""What a swap changed: ``SwapReport``, returned by every swap of the integrations.

A swap (``fla.swap_short_convolutions``, ``transformers.swap_causal_conv1d``,
``mamba_ssm.swap``) lists each place it looked at, one ``SwapEntry`` each: a module of the model
(by its name in ``model.named_modules()``) or a function binding of a library module (by its
dotted name). An entry says whether that place now runs cakeconv's op and, either way, why:
how it is reached, or what keeps it on the library's own code. The report prints as a table,
and the swap warns (``CakeconvSwapWarning``) when convolutions of the model stay unreached, so
nothing is silent.

A place that runs cakeconv still delegates, call by call, what the op does not compute (conv
state, decode steps; each integration's docstring gives its rule): "runs cakeconv" means its
training calls do.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

__all__ = ["CakeconvSwapWarning", "SwapEntry", "SwapReport"]

_MAX_WARNED = 8  # entries named in a warning's text (the report has them all)


def qualified_name(value) -> str:
    """``module.qualname`` of a function (of a partial's function), for a report's "was ..." text."""
    if isinstance(value, functools.partial):
        value = value.func
    return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__name__)}"


class CakeconvSwapWarning(UserWarning):
    """A swap left convolutions of the model on the library's own code (the report says why)."""


@dataclasses.dataclass(frozen=True)
class SwapEntry:
    """One place a swap looked at.

    Attributes:
        where: the module's name in the model ("" for the model itself), or a function binding's
            dotted name (``mamba_ssm.ops.triton.ssd_combined.causal_conv1d_fwd_function``).
        what: the module's class name, or "function".
        on_cakeconv: whether its training calls run cakeconv's op after the swap.
        why: how it reaches cakeconv, or why it does not.
        newly_swapped: whether this swap call changed it (False: it was swapped before, or is not
            swapped).
    """

    where: str
    what: str
    on_cakeconv: bool
    why: str
    newly_swapped: bool = False


@dataclasses.dataclass(frozen=True)
class SwapReport:
    """The entries of one swap (or unswap) call; ``str(report)`` is a table.

    Attributes:
        integration: "fla", "transformers" or "mamba_ssm" (joined with "+" when merged).
        entries: every place looked at, in the order found.
        action: "swap", or "unswap" for what an unswap returns (its entries' ``newly_swapped``:
            restored by this call).
    """

    integration: str
    entries: tuple[SwapEntry, ...] = ()
    action: str = "swap"

    @property
    def swapped(self) -> int:
        """How many places this call changed (0 on a second call)."""
        return sum(e.newly_swapped for e in self.entries)

    @property
    def on_cakeconv(self) -> tuple[SwapEntry, ...]:
        """The entries whose training calls run cakeconv."""
        return tuple(e for e in self.entries if e.on_cakeconv)

    @property
    def not_on_cakeconv(self) -> tuple[SwapEntry, ...]:
        """The entries left on the library's own code, each with its reason."""
        return tuple(e for e in self.entries if not e.on_cakeconv)

    def merged(self, other: "SwapReport") -> "SwapReport":
        """Both reports' entries (this one's first), under the joined integration names."""
        names = self.integration if other.integration in self.integration.split("+") else \
            f"{self.integration}+{other.integration}"
        return SwapReport(names, self.entries + other.entries, self.action)

    def warn_if_unreached(self, stacklevel: int = 3) -> None:
        """Warn (``CakeconvSwapWarning``) when some entries stay off cakeconv, naming them."""
        left = self.not_on_cakeconv
        if not left:
            return
        named = "; ".join(f"{e.where or '<model>'} ({e.what}): {e.why}" for e in left[:_MAX_WARNED])
        more = f"; and {len(left) - _MAX_WARNED} more" if len(left) > _MAX_WARNED else ""
        warnings.warn(f"{self.integration} {self.action}: {len(left)} of {len(self.entries)} places stay off cakeconv: "
                      f"{named}{more} (the returned SwapReport lists them all)", CakeconvSwapWarning,
                      stacklevel=stacklevel)

    def __str__(self) -> str:
        if not self.entries:
            return f"{self.integration} {self.action}: nothing found to {self.action}"
        if self.action == "unswap":
            head = (f"{self.integration} unswap: {self.swapped} of {len(self.entries)} places restored, "
                    f"{len(self.on_cakeconv)} still run cakeconv")
        else:
            head = (f"{self.integration} swap: {len(self.on_cakeconv)} of {len(self.entries)} places run cakeconv "
                    f"({self.swapped} changed by this call)")
        width = max(len(e.where or "<model>") for e in self.entries)
        kind = max(len(e.what) for e in self.entries)
        lines = [head]
        for e in self.entries:
            mark = "cakeconv" if e.on_cakeconv else "own code"
            lines.append(f"  {(e.where or '<model>'):<{width}}  {e.what:<{kind}}  {mark:<8}  {e.why}")
        return "\n".join(lines)
