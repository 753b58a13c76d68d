"""Correctness before speed: every provider's y, dx, dweight and dbias against an FP32 reference of SPEC section 1
(1b: any width W from 2 to 8, SiLU or no activation), at the shape's W and activation.

The reference (independent of cakeconv) computes in FP32 with its reductions in FP64, on channel blocks to
bound memory. The comparison is the relative L2 error with a bf16 tolerance (``CHECK_TOL``); NaN or inf
fails. Two more checks when their providers ran: ours and ours_search must give the same bits, and ours'
y is compared directly with flash-linear-attention's (relative error and max |diff|).

Shape legend: S tokens, C channels, W taps per channel.
"""

from __future__ import annotations

import math

from measures import CHECK_TOL, activation_label
from progress import note
from shapes import ShapeData

CHUNK = 1 << 24  # elements per chunk of a comparison (the big shapes hold 2e9)

def _shift(torch, t, s: int, pos, back: bool):
    """t moved s rows within each document, zeros where that leaves it: back=True gives row t - s at row t (the
    forward's taps), back=False row t + s (the backward's), using pos (each token's position in its document)."""
    out = torch.zeros_like(t)
    if back:
        out[s:] = t[:-s]
        out[pos < s] = 0.0
    else:
        src = t.clone()
        src[pos < s] = 0.0  # row t' reaches back to t' - s only inside its document
        out[:-s] = src[s:]
    return out


def reference(torch, sh: ShapeData, x, dy, use_bias: bool, block_c: int = 1024):
    """(y, dx fp32 [S, C], dweight fp64 [C, W], dbias fp64 [C]) of SPEC section 1b on x, dy [S, C], with the
    shape's taps [C, W] (w[:, W - 1] multiplies the current token) and activation ("silu" or None)."""
    S, C = x.shape
    W, silu = sh.w.shape[1], sh.activation is not None
    y = torch.empty(S, C, dtype=torch.float32, device=x.device)
    dx = torch.empty(S, C, dtype=torch.float32, device=x.device)
    dw = torch.empty(C, W, dtype=torch.float64, device=x.device)
    db = torch.empty(C, dtype=torch.float64, device=x.device)
    pos = sh.pos
    for c0 in range(0, C, block_c):
        c1 = min(C, c0 + block_c)
        xf = x[:, c0:c1].float()
        wf = sh.w[c0:c1].float()
        pre = xf * wf[:, W - 1]
        if use_bias:
            pre = pre + sh.b[c0:c1].float()
        for s in range(1, W):
            pre = pre + _shift(torch, xf, s, pos, True) * wf[:, W - 1 - s]
        g = dy[:, c0:c1].float()
        if silu:
            sig = 1.0 / (1.0 + torch.exp(-pre))
            y[:, c0:c1] = pre * sig
            g = g * sig * (1.0 + pre * (1.0 - sig))
            del sig
        else:
            y[:, c0:c1] = pre
        dxb = g * wf[:, W - 1]
        dw[c0:c1, W - 1] = torch.sum(g * xf, 0, dtype=torch.float64)
        for s in range(1, W):
            dxb = dxb + _shift(torch, g, s, pos, False) * wf[:, W - 1 - s]
            dw[c0:c1, W - 1 - s] = torch.sum(g * _shift(torch, xf, s, pos, True), 0, dtype=torch.float64)
        dx[:, c0:c1] = dxb
        db[c0:c1] = torch.sum(g, 0, dtype=torch.float64)
        del xf, pre, g, dxb
    return y, dx, dw, db


def rel_err(torch, got, ref, chunk: int = CHUNK) -> float:
    """||got - ref|| / ||ref|| in FP64, over chunks (the big shapes hold 2e9 elements); inf if got is not finite."""
    if got is None:
        return float("nan")
    g_all = got.reshape(-1)
    r_all = ref.reshape(-1)
    if g_all.numel() != r_all.numel():
        return float("inf")
    num = den = 0.0
    for i in range(0, g_all.numel(), chunk):
        g = g_all[i:i + chunk].double()
        r = r_all[i:i + chunk].double()
        if not bool(torch.isfinite(g).all()):
            return float("inf")
        num += float(torch.sum((g - r) ** 2))
        den += float(torch.sum(r * r))
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)

def _provider_check(torch, sh, p, use_bias, ref):
    """(check row, outputs) of provider p on set 0."""
    y, dx, dw, db = p.around(p.outputs)(sh, use_bias)
    errs = {
        "y_rel": rel_err(torch, y, ref[0]),
        "dx_rel": rel_err(torch, dx, ref[1]),
        "dw_rel": rel_err(torch, dw, ref[2]),
        "db_rel": rel_err(torch, db, ref[3]) if use_bias else None,
    }
    ok = all(v is not None and v <= CHECK_TOL for k, v in errs.items() if not (k == "db_rel" and not use_bias))
    return {"provider": p.name, **errs, "ok": bool(ok)}, (y, dx, dw, db)


def _same_bits_check(torch, ours, search):
    """ours against ours_search: the per-token segment indices change no bit of y, dx, dweight, dbias."""
    pairs = list(zip(ours, search))
    errs = {k: (None if a is None else 0.0 if torch.equal(a, c) else rel_err(torch, a, c))
            for k, (a, c) in zip(("y_rel", "dx_rel", "dw_rel", "db_rel"), pairs)}
    return {"provider": "ours_vs_ours_search", **errs,
            "ok": all(a is None and c is None or torch.equal(a, c) for a, c in pairs)}


def _ours_vs_fla_check(torch, y_ours, y_fla):
    yo, yf = y_ours.reshape(-1), y_fla.reshape(-1)
    d = max(float((yo[i:i + CHUNK].float() - yf[i:i + CHUNK].float()).abs().max())
            for i in range(0, yo.numel(), CHUNK)) if yo.numel() else 0.0
    e = rel_err(torch, yo, yf)
    return {"provider": "ours_vs_fla", "y_rel": e, "y_max_abs": d, "dx_rel": None, "dw_rel": None, "db_rel": None,
            "ok": bool(e <= CHECK_TOL)}


def check_shape(torch, sh: ShapeData, active: list, use_bias: bool, notes: list) -> list[dict]:
    """The check rows of one shape and bias variant (also the first compilation of every provider).

    A provider whose check run raises is noted, released and removed from ``active``.
    """
    x0, dy0 = sh.sets[0]
    ref = reference(torch, sh, x0, dy0, use_bias)
    rows, outputs = [], {}  # every output of ours and ours_search (compared bit by bit), y of the others
    for p in list(active):
        try:
            row, out = _provider_check(torch, sh, p, use_bias, ref)
        except Exception as exc:  # noqa: BLE001 - a provider that fails is reported and dropped
            note(notes, f"{p.name} failed its check run {sh.mix} S={sh.S} C={sh.C} W={sh.width} "
                        f"activation={activation_label(sh.activation)} bias={use_bias}: "
                        f"{type(exc).__name__}: {exc}")
            active.remove(p)
            p.release_bias()
            continue
        rows.append(row)
        outputs[p.name] = out if p.name in ("ours", "ours_search") else (out[0],)
        del out
    del ref
    if "ours" in outputs and "ours_search" in outputs:
        rows.append(_same_bits_check(torch, outputs["ours"], outputs["ours_search"]))
    if "ours" in outputs and "fla" in outputs:
        rows.append(_ours_vs_fla_check(torch, outputs["ours"][0], outputs["fla"][0]))
    head = {"kind": "check", "mix": sh.mix, "S": sh.S, "C": sh.C, "width": sh.width,
            "activation": activation_label(sh.activation), "bias": use_bias}
    return [{**head, **row} for row in rows]
