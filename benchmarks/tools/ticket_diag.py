"""Which backward configuration, if any, breaks the group tickets at many channel blocks (GPU)?

A diagnosis of `test_gpu_every_config_gives_the_same_bits` outside the test harness. This runs what that test
runs (S = 100,003, documents of mean 700 tokens, bias) for C in CD_CS (default
1160,2048,4096), every configuration of tuning.BWD_CONFIGS, ROUNDS (2) times each, and for every launch reports
against the host's redo of the documented order from the nodes the launch wrote (tests/helpers.py): the group sums
(which groups and channel blocks differ), dweight/dbias, and dx, dw and db against the first configuration's (the inputs from tests/test_gpu.py's own helpers). The
ticket counters are checked to be 0 after each launch. Prints one line per launch; no GPU test harness, so nothing
is lost when a run is cut short. Writes $OUT/<CD_NAME>.txt (CD_NAME default ticket_diag).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from tests.helpers import backward_tree_from_nodes  # noqa: E402
from tests.test_gpu import _inputs, _random_docs  # noqa: E402  (the failed test's own inputs)

import cakeconv  # noqa: E402
from cakeconv.cake_causal_conv1d_det_train_backend.kernels import backward as tb, launch as tl_, tuning  # noqa: E402

DEV = "cuda"
lines = []


def say(msg):
    print(msg, flush=True)
    lines.append(msg)


say(f"cakeconv from {os.path.dirname(cakeconv.__file__)}")
S = int(os.environ.get("CD_S", "100003"))
for C in [int(c) for c in os.environ.get("CD_CS", "1160,2048,4096").split(",")]:
    cu = _random_docs(S, torch.Generator().manual_seed(C), mean=700)
    x, w, b, dy = _inputs(S, C, seed=3)
    n_ws = tl_.backward_workspace_floats(S, C)
    n_leaves, n_groups = -(-S // tb.BWD_SUB), -(-S // 8192)
    first = None
    for rnd in range(int(os.environ.get("ROUNDS", "2"))):
        for ci, cfg in enumerate(tuning.BWD_CONFIGS):
            dx = torch.full_like(x, float("nan"))
            dw = torch.full((C, 4), float("nan"), device=DEV)
            db = torch.full((C,), float("nan"), device=DEV)
            ws = torch.full((n_ws,), float("nan"), device=DEV)
            with tl_.record_launches(launch=True) as launches:
                tl_.triton_backward(dy, x, w, b, cu, None, dx, ws, dw, db, config=cfg)
            torch.cuda.synchronize()
            names = [r.kernel.name for r in launches]
            tk = [r for r in launches if r.kernel.name in ("cake_conv_bwd_ticket_kernel", "cake_conv_bwd_one_group_kernel")]
            tickets = tk[0].args[11] if tk else None  # (main's multi-group path has no tickets)
            left = int((tickets != 0).sum()) if tk else -1
            gs, dw_h, db_h = backward_tree_from_nodes(ws, S, C, cfg.R)
            got = ws[n_leaves * 5 * C:(n_leaves + n_groups) * 5 * C].view(n_groups, 5, C)
            bad = (got != gs) & ~(torch.isnan(got) & torch.isnan(gs))
            if n_groups == 1:
                got = gs  # one group: no group sums in the workspace (dweight/dbias checked below)
                bad = got != got
            bad_g = sorted(set(bad.any(dim=2).any(dim=1).nonzero().flatten().tolist()))
            bad_c = bad.any(dim=0).any(dim=0).nonzero().flatten()
            blocks = sorted(set((bad_c // cfg.BC).tolist()))
            nan_nodes = int(torch.isnan(ws[:-(-S // (tb.BWD_SUB * cfg.R)) * 5 * C]).sum())
            msg = (f"C={C} round {rnd} cfg {ci} {cfg}: gs wrong at {int(bad.sum())} elems, groups {bad_g[:8]}"
                   f"{'...' if len(bad_g) > 8 else ''}, channel blocks {blocks[:8]}{'...' if len(blocks) > 8 else ''}; "
                   f"NaN in nodes {nan_nodes}; dw==host {torch.equal(dw, dw_h)} db==host {torch.equal(db, db_h)}; "
                   f"counters left non-zero {left}; kernels {names}")
            if first is None:
                first = (dx, dw, db)
            else:
                msg += f"; dx==cfg0 {torch.equal(dx, first[0])} dw==cfg0 {torch.equal(dw, first[1])} db==cfg0 {torch.equal(db, first[2])}"
            say(msg)
            del ws, dx
    del x, dy
    torch.cuda.empty_cache()
out = os.environ.get("OUT", ".")
open(os.path.join(out, os.environ.get("CD_NAME", "ticket_diag") + ".txt"), "w").write("\n".join(lines) + "\n")
