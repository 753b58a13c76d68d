"""The host cost per call (benchmarks/README.md, "Host cost"): the eager loop's items at a tiny shape where the
GPU is idle, so the time per call is the host's.

Every provider that imports (but ours_ag, the same op as ours) plus two baselines in the same run, a trivial
``autograd.Function`` and ``torch.nn.functional.silu``; items ``chain`` (the chain, per call), ``step`` (one
call and its backward per step), ``nograd`` (forward under torch.no_grad) and, ours only, ``ws`` (the
workspace entry points, every buffer preallocated). One document, bf16, no bias, the run's first width and
activation (``--width``, ``--activation``; default 4 and SiLU); interleaved samples.
"""

from __future__ import annotations

import statistics
import time

from eager_loop import provider_eager_forms
from measures import BASELINES, HOST_METHOD, HOST_PASS, activation_arg
from progress import log, note
from providers import BaselineProvider
from shapes import make_shape
from timing import wall_samples


def host_cost(torch, device, provs, settings, sync, notes: list, record) -> None:
    """Time the host-cost items of every provider and baseline; record(measurement) each one.

    settings: host_shape, host_steps, host_warmup, chain, n_calls, seed, mean_doc_len, l2_bytes, width_acts.
    """
    S, C = settings.host_shape
    chain, calls = settings.chain, settings.n_calls
    width, act = settings.width_acts[0]
    sh = make_shape(torch, S, C, device, settings.seed, settings.mean_doc_len, settings.l2_bytes, 1, mix="one")
    sh.use_taps(torch, width, activation_arg(act))
    everyone = [p for p in provs if p.name != "ours_ag"] + [BaselineProvider(torch, n) for n in BASELINES]
    subjects = {}
    for p in everyone:
        why = p.supports(width, sh.activation)
        if why is not None:
            note(notes, f"{p.name}: no host cost at W={width}, activation {act}: {why}")
            continue
        try:
            p.prepare_shape(sh)
            items = provider_eager_forms(torch, p, sh, False, chain, ("chain", "step", "nograd"), calls)
            items.update(p.extra_host_items(sh, calls))
        except Exception as exc:  # noqa: BLE001 - a provider that fails is reported and dropped
            note(notes, f"{p.name} host cost failed to set up: {type(exc).__name__}: {exc}")
            continue
        for item, fn_calls in items.items():
            subjects[(p.name, item)] = fn_calls
    log(f"host cost: S={S} C={C} W={width} {act} one document, {len(subjects)} items, {settings.host_steps} samples "
        f"of {calls} calls "
        f"(chain: {chain}) (+{settings.host_warmup} warm-up)")

    def on_error(key, exc):
        note(notes, f"{key[0]} host cost {key[1]} failed: {type(exc).__name__}: {exc}")

    t0 = time.perf_counter()
    res = wall_samples(subjects, settings.host_steps, settings.host_warmup, sync, sync, on_error)
    subjects = None
    base = {"mix": "one", "S": S, "C": C, "width": width, "activation": act, "n_docs": sh.n_docs,
            "doc_min": sh.doc_min, "doc_max": sh.doc_max}
    for (name, item), ts in res.items():
        record({**base, "method": HOST_METHOD[item], "pass": HOST_PASS[item], "provider": name, "bias": False,
                "times": ts, "host_ms": 0.0, "chain": chain if item == "chain" else 1, "n_sets": 1})
    log(f"host cost: {time.perf_counter() - t0:.1f}s  " + "  ".join(
        f"{n}:{i}={statistics.median(ts) * 1e3:.1f}us" for (n, i), ts in res.items()))
    for p in everyone:
        p.release_shape()
