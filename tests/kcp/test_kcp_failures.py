"""A rank that raises inside a KCP call ends every rank with an error (SPEC section 6), over gloo (tier 3).

The scenarios and their driver live in tests/multigpu/kcp_failure.py (the multi-GPU tier runs the
same ones over NCCL). Each scenario starts two rank processes of its own with a 10 s process-group
timeout (not tests/kcp/_dist.py's harness: there a rank's error fails the run, and the blocked
rank's timeout error is exactly what is to be observed here). Rank 1 fails inside a KCP call while
rank 0 makes the same call and then all-reduces its gradient:

  first_call_bad_input_stays       the group's first KCP call; rank 1's x_local has one row too
                                   many (ValueError before its exchange) and rank 1 stays alive:
                                   rank 0's exchange must time out by itself
  later_call_kernel_failure_exits  after a good step, rank 1's backward program raises inside the
                                   op (simulated kernel failure) and rank 1's process ends

Asserted: both processes end with a nonzero exit status, rank 1's error names the cause, and rank
0 raises within the timeout + 20 s after rank 1 failed. (What gloo reports on rank 0: "Timed out
waiting 10000ms for send/recv operation to complete", or "Connection closed by peer" once rank 1's
process is gone.)
"""

import pytest

from tests.multigpu.kcp_failure import run_scenarios

TIMEOUT_S = 10.0


@pytest.mark.dist
def test_a_failing_rank_does_not_leave_the_others_blocked():
    reports = run_scenarios(["first_call_bad_input_stays", "later_call_kernel_failure_exits"], backend="gloo",
                            timeout_s=TIMEOUT_S, margin_s=20.0, startup_s=120.0, verbose=False)
    bad = {name: r for name, r in reports.items() if not r["ok"]}
    assert not bad, "\n".join(f"{name}: {r['problems']}\n  ranks: {r['ranks']}" for name, r in bad.items())
    for name, r in reports.items():
        blocked = r["ranks"][0]
        assert blocked["exit"] != 0 and blocked["error"], (name, blocked)
        assert any(s in blocked["error"] for s in ("Timed out", "Connection closed", "Connection reset")), (name, blocked)
    # the stay-alive case shows the timeout itself (rank 1's process is still there)
    stays = reports["first_call_bad_input_stays"]["ranks"][0]
    assert "Timed out" in stays["error"], stays
