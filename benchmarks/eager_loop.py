"""The eager loop at a shape: what a user gets in an ordinary training loop (benchmarks/README.md, "Eager loop").

No host-ahead sleep: the device is synchronised before and after each sample and the wall time per call
is recorded (timing.eager_forms and timing.wall_samples). The op is each provider's autograd op in its own
input format, so y keeps the format of x. One chain step keeps about ``chain`` + 4 activations alive; a
shape whose chain would not fit in the free device memory is skipped with a note.

Shape legend: S tokens, C channels.
"""

from __future__ import annotations

from progress import note
from shapes import ShapeData
from timing import eager_forms, wall_samples


def provider_eager_forms(torch, p, sh: ShapeData, use_bias: bool, chain: int, modes, calls: int) -> dict:
    """{form: (fn, calls)} of provider p at shape sh (timing.eager_forms): x and the ``chain`` distinct taps
    [C, W] (and biases) are leaves of their own, in p's layout; the taps are the same for every provider. Each
    sample runs inside p.around (dao_det: its environment variable)."""
    x0, dy0 = sh.sets[0]
    x_leaf = p.to_layout(x0, sh).detach().requires_grad_()
    dy = p.to_layout(dy0, sh)
    ws, bs = sh.chain_params(torch, chain, use_bias)
    ws = [w.detach().clone().requires_grad_() for w in ws]
    bs = [b.detach().clone().requires_grad_() if b is not None else None for b in bs]
    params = [x_leaf] + ws + [b for b in bs if b is not None]
    forms = eager_forms(torch, lambda y, i: p.op(y, ws[i], bs[i], sh), x_leaf, dy, params, chain, calls, modes)
    return {form: (p.around(fn), n) for form, (fn, n) in forms.items()}


def eager_fits(torch, sh: ShapeData, chain: int) -> tuple[bool, str]:
    """Whether a chain step fits in the free device memory (it keeps ~chain + 4 activations alive)."""
    if sh.device.type != "cuda":
        return True, ""
    need = (chain + 6) * sh.S * sh.C * 2 * 2  # saved inputs, y, dy, dx, peers' extra buffers; x2 margin
    free, _ = torch.cuda.mem_get_info(sh.device)
    if need > 0.9 * free:
        return False, f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
    return True, ""


def eager_at_shape(torch, sh: ShapeData, active: list, use_bias: bool, settings, sync, notes: list) -> dict:
    """{(provider, form): [ms per call]} of the eager loop at one shape and bias variant.

    settings: chain, eager_modes, n_calls, eager_steps, eager_warmup (the run's settings).
    """
    where = f"{sh.mix} S={sh.S} C={sh.C} W={sh.width} activation={sh.activation}"
    fits, why = eager_fits(torch, sh, settings.chain)
    if not fits:
        note(notes, f"eager loop skipped at {where}: {why}")
        return {}
    subjects = {}
    for p in active:
        if p.name == "ours_ag" and any(q.name == "ours" for q in active):
            continue  # the same autograd op as ours' eager loop
        try:
            forms = provider_eager_forms(torch, p, sh, use_bias, settings.chain, settings.eager_modes,
                                         settings.n_calls)
        except Exception as exc:  # noqa: BLE001 - a provider that fails is reported and dropped
            note(notes, f"{p.name} eager loop failed to set up {where}: {type(exc).__name__}: {exc}")
            continue
        for mode, fn_calls in forms.items():
            subjects[(p.name, mode)] = fn_calls

    def on_error(key, exc):
        note(notes, f"{key[0]} eager {key[1]} failed {where}: {type(exc).__name__}: {exc}")

    return wall_samples(subjects, settings.eager_steps, settings.eager_warmup, sync, sync, on_error)
