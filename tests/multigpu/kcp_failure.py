"""A rank that raises inside a KCP call must not leave the other ranks blocked (SPEC section 6).

Run as a script (the multi-GPU tier, ``tests/multigpu/run.sh``): NCCL on 2 GPUs when CUDA is
available, else gloo on the CPU. ``tests/kcp/test_kcp_failures.py`` runs two of the scenarios over
gloo under pytest (tier 3).

Each scenario starts its own 2 ranks (plain processes with RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT, no torchrun: torchrun's agent ends every rank as soon as one fails, which would hide
what the process group's timeout does) and gives the process group a short timeout (20 s on NCCL,
10 s on gloo). Both ranks build one zigzag context (a document crossing the ranks, so each rank
exchanges with the other); then rank 1 fails inside a KCP call while rank 0 makes the same call.
The scenarios run side by side:

  first_call_bad_input_stays       the group's FIRST KCP call; rank 1's x_local has one row too many
                                   (ValueError before its exchange); rank 1 stays alive afterwards
                                   (a caller that catches the error and goes on with other work)
  first_call_bad_input_exits       the same, and rank 1's process ends with the exception
  later_call_bad_input_stays       the same bad input after one good step (the pair's connections
                                   exist); rank 1 stays alive
  later_call_kernel_failure_exits  after one good step, rank 1's backward program raises inside the
                                   KCP backward (a simulated kernel failure: the function computing
                                   the gradient rows it would send is replaced on rank 1); rank 1's
                                   process ends with the exception

After its KCP call rank 0 does what a training step does next (all-reduce of the gradient, a
synchronize), so it cannot finish without rank 1. Asserted per scenario: every rank's process ends
with a nonzero exit status; rank 1's error names the cause (``x_local has ... rows`` / ``simulated
kernel failure``); rank 0 sees its error within the timeout plus a margin after rank 1 failed
(20 s on gloo; 90 s on NCCL, see below). Each rank prints its stage to stderr and, if still
running 25 s past the timeout, the Python stack of every thread (faulthandler): a failing scenario
shows where rank 0 is blocked.

What ends rank 0 (the governing timeout is the ``timeout`` given to init_process_group / new_group):
  gloo: its send/receive raises RuntimeError after the timeout ("Timed out waiting 10000ms for
        send operation to complete"), or at once when rank 1's process is gone ("Connection closed
        by peer ... typically caused by a remote worker crashing").
  NCCL, a later call: the exchange is asynchronous, so rank 0's host goes on and blocks at its next
        synchronizing call; the ProcessGroupNCCL watchdog finds the point-to-point work past the
        timeout ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=.., OpType=COALESCED,
        ..., Timeout(ms)=20000) ran for 20025 milliseconds", with the stack of the call that issued
        it: start_exchange, _backward_program), then, with the flight recorder's debug dump on
        (torch's default), waits up to TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC (60 s) for the dump, then
        "To avoid data inconsistency, we are taking the entire process down" (SIGABRT, exit status
        -6). Seen on 2 H200s, torch 2.11, NCCL 2.28.9: every scenario's rank 0 ended 82-86 s after
        rank 1 failed (timeout 20 s; the log shows the 60 s dump wait). With
        TORCH_NCCL_DUMP_ON_TIMEOUT=0 (tried once, as a scenario field: SCENARIOS' last element)
        rank 0 was still running 60 s after the failure: the watchdog reported the timeout and did
        not end the process, so every scenario keeps torch's default.
  NCCL, the group's first call: NCCL sets up a pair's point-to-point connection on the host, at
        the pair's first exchange (inside ncclGroupEnd), and that needs the peer. Before
        build_kcp_context connected the pairs itself (commit d1258cc: one tiny exchange per direction
        after its all-rank check), rank 0 blocked there with no work queued, so the watchdog had
        nothing to time out: seen on 2 H200s still blocked 140 s after rank 1 failed (timeout 20 s),
        also when rank 1's process was gone. The first_call scenarios guard that fix: on the H200s
        they now end like the later_call ones (rank 0's watchdog times out the exchange; its host
        was inside CUDA's lazy loading of the forward kernel, behind the exchange).

Usage: ``python tests/multigpu/kcp_failure.py [--timeout S] [--margin S] [--startup S] [--only a,b]``.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback

for _var, _val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_var, _val)

WORLD = 2
FAILING_RANK = 1
SCENARIOS = {
    # name: (phase, how, failing rank's process exits, a good step first, NCCL's debug dump on timeout)
    "first_call_bad_input_stays": ("forward", "bad_input", False, False, True),
    "first_call_bad_input_exits": ("forward", "bad_input", True, False, True),
    "later_call_bad_input_stays": ("forward", "bad_input", False, True, True),
    "later_call_kernel_failure_exits": ("backward", "kernel", True, True, True),
}
# NCCL only: how long the watchdog waits for its debug dump before it ends the process when the
# dump is on (torch's default; TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC, 60 s in torch 2.11). A scenario
# whose last field is False runs with TORCH_NCCL_DUMP_ON_TIMEOUT=0 (none does: module docstring).
DUMP_WAIT_S = 60.0
CAUSE = {"bad_input": "x_local has", "kernel": "simulated kernel failure"}


# ------------------------------------------------------------------------------------ worker

def _write(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _patch_backward_on_this_rank():
    """Make this rank's KCP backward raise inside the op (before its halo exchange).

    The function is looked up at run time: the module behind the SPEC's public
    ``cake_causal_conv1d_det_train_backend.kcp.cake_causal_conv1d_det_multi_backward_kcp``, and
    in it the first program the backward runs (the gradient rows it sends): ``triton_head_g``
    (Triton) and ``reference_g_dw`` (reference). Returns the names patched.
    """
    from cakeconv.cake_causal_conv1d_det_train_backend import kcp as kcp_api

    fn = kcp_api.cake_causal_conv1d_det_multi_backward_kcp
    mod = sys.modules[fn.__module__]
    patched = []

    def boom(*_args, **_kwargs):
        raise RuntimeError("simulated kernel failure on this rank (patched by tests/multigpu/kcp_failure.py)")

    for name in ("triton_head_g", "reference_g_dw"):
        if hasattr(mod, name):
            setattr(mod, name, boom)
            patched.append(f"{mod.__name__}.{name}")
    if not patched:
        raise RuntimeError(f"kcp_failure.py: found neither triton_head_g nor reference_g_dw in {mod.__name__}; "
                           f"update _patch_backward_on_this_rank")
    return patched


def worker(scenario: str, out_dir: str, backend: str, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    from cakeconv import build_kcp_context, cake_causal_conv1d_det_kcp

    phase, how, exits, warm, _dump = SCENARIOS[scenario]
    rank = int(os.environ["RANK"])
    # If this rank is still running well past the timeout, print where every thread is.
    faulthandler.dump_traceback_later(timeout_s + 25, exit=False)

    def stage(msg):
        print(f"[{scenario} rank {rank} +{time.time() - t_start:.1f}s] {msg}", file=sys.stderr, flush=True)

    t_start = time.time()
    world = int(os.environ["WORLD_SIZE"])
    failing = rank == FAILING_RANK
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    T, C = (8192, 256) if device.type == "cuda" else (512, 16)
    cu = torch.tensor([0, 5, T // 3, T // 3 + 2, T], dtype=torch.int32, device=device)
    ctx = build_kcp_context(cu, layout="zigzag")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, C, generator=g).to(torch.bfloat16).to(device)
    dy = torch.randn(T, C, generator=g).to(torch.bfloat16).to(device)
    w = (torch.randn(C, 4, generator=g) * 0.5).to(device).requires_grad_(True)
    b = (torch.randn(C, generator=g) * 0.5).to(device).requires_grad_(True)
    xl, dyl = ctx.shard(x), ctx.shard(dy)

    def step(x_local):
        stage("forward")
        y = cake_causal_conv1d_det_kcp(x_local.requires_grad_(True), w, ctx, bias=b)
        stage("backward")
        y.backward(dyl)
        stage("all_reduce")
        dist.all_reduce(w.grad)  # what a training step does next
        if device.type == "cuda":
            stage("synchronize")
            torch.cuda.synchronize()
        stage("step done")

    if warm:
        step(xl.clone())
        dist.barrier()
    x_bad = xl.clone()
    if failing and how == "bad_input":
        x_bad = torch.cat([x_bad, x_bad[:1]])  # one row too many on this rank only
    if failing and how == "kernel":
        _patch_backward_on_this_rank()
    _write(os.path.join(out_dir, f"entered_{rank}.json"), {"t": time.time()})
    stage("the failing step" if failing else "the step the failing rank fails in")
    try:
        step(x_bad)
        dist.barrier()
        _write(os.path.join(out_dir, f"result_{rank}.json"), {"status": "completed", "t": time.time()})
        print(f"rank {rank}: the step completed", flush=True)
        sys.exit(0)
    except Exception as exc:
        _write(os.path.join(out_dir, f"result_{rank}.json"),
               {"status": "error", "t": time.time(), "type": type(exc).__name__, "message": str(exc)[:2000]})
        if failing and not exits:
            traceback.print_exc()
            sys.stderr.flush()
            # stay alive (as a caller that caught the error) until the driver has seen the others end
            release = os.path.join(out_dir, "release")
            limit = time.time() + 3 * timeout_s + 120
            while not os.path.exists(release) and time.time() < limit:
                time.sleep(0.2)
            os._exit(1)
        raise


# ------------------------------------------------------------------------------------ driver

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _tail(text: str, n: int = 6) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


def run_scenarios(names=None, *, backend=None, timeout_s=None, margin_s=None, startup_s=None, verbose=True):
    """Run the scenarios side by side; returns {name: report dict} with ``ok`` and ``problems``.

    backend: "nccl" (needs 2 GPUs) or "gloo"; default nccl when CUDA is available.
    timeout_s: the process groups' timeout (default 20 s on NCCL, 10 s on gloo).
    margin_s: how long past timeout_s a blocked rank may take to end (default 30 s on NCCL, plus
        DUMP_WAIT_S where the debug dump is on, since the watchdog waits for it before it ends the
        process: 90 s; 20 s on gloo).
    startup_s: allowance for start-up, process-group set-up and the kernels' first compile before
        the failing call (default 240 s on NCCL, 120 s on gloo). A scenario whose ranks are still
        running past its deadline (failure + timeout + margin + 10 s) is killed and fails.
    """
    if backend is None:
        import torch

        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= WORLD else "gloo"
    timeout_s = timeout_s if timeout_s is not None else (20.0 if backend == "nccl" else 10.0)
    base_margin = margin_s if margin_s is not None else (30.0 if backend == "nccl" else 20.0)

    def margin_of(name):
        return base_margin + (DUMP_WAIT_S if backend == "nccl" and SCENARIOS[name][4] else 0.0)

    startup_s = startup_s if startup_s is not None else (240.0 if backend == "nccl" else 120.0)
    names = list(names or SCENARIOS)
    root = tempfile.mkdtemp(prefix="cakeconv_kcp_failure_")
    runs = {}
    t_launch = time.time()
    for name in names:
        d = os.path.join(root, name)
        os.makedirs(d)
        port = _free_port()
        procs = []
        for rank in range(WORLD):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            if not SCENARIOS[name][4]:
                env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "0"
            err = open(os.path.join(d, f"stderr_{rank}.txt"), "w")
            out = open(os.path.join(d, f"stdout_{rank}.txt"), "w")
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", name, "--dir", d,
                                  "--backend", backend, "--timeout", str(timeout_s)],
                                 env=env, stdout=out, stderr=err)
            procs.append((p, out, err))
        runs[name] = {"dir": d, "procs": procs, "end": [None] * WORLD}
    name_of = {id(run): name for name, run in runs.items()}

    def deadline(run):
        """launch + startup_s until rank FAILING_RANK has failed; then its failure + timeout + margin + 10 s."""
        failed = _read(os.path.join(run["dir"], f"result_{FAILING_RANK}.json"))
        if failed and failed.get("status") == "error":
            return failed["t"] + timeout_s + margin_of(name_of[id(run)]) + 10.0
        return t_launch + startup_s

    while True:
        now = time.time()
        busy = False
        for name, run in runs.items():
            for rank, (p, _, _) in enumerate(run["procs"]):
                if run["end"][rank] is None:
                    if p.poll() is None:
                        busy = True
                    else:
                        run["end"][rank] = now
                        if verbose:
                            print(f"  {name}: rank {rank} ended, exit status {p.returncode}, {now - t_launch:.0f} s "
                                  f"after the launch", flush=True)
            others_done = all(run["end"][r] is not None for r in range(WORLD) if r != FAILING_RANK)
            release = os.path.join(run["dir"], "release")
            if others_done and not os.path.exists(release):
                open(release, "w").close()
        for name, run in runs.items():
            if now > deadline(run) and any(p.poll() is None for p, _, _ in run["procs"]):
                open(os.path.join(run["dir"], "release"), "w").close()
                for rank, (p, _, _) in enumerate(run["procs"]):
                    if p.poll() is None:
                        if verbose:
                            print(f"  {name}: deadline: rank {rank} still running, killed", flush=True)
                        p.kill()
                        run.setdefault("killed", []).append(rank)
                for rank, (p, _, _) in enumerate(run["procs"]):
                    p.wait()
                    if run["end"][rank] is None:
                        run["end"][rank] = time.time()
        if not busy:
            break
        time.sleep(0.2)

    reports = {}
    for name, run in runs.items():
        phase, how, exits, warm, dump = SCENARIOS[name]
        margin = margin_of(name)
        d = run["dir"]
        problems = []
        ranks = []
        # The moment rank FAILING_RANK raised (its first KCP call may spend seconds in one-time set-up
        # before its checks run), else when it entered the call.
        entered = _read(os.path.join(d, f"entered_{FAILING_RANK}.json"))
        failed = _read(os.path.join(d, f"result_{FAILING_RANK}.json"))
        t_fail = failed["t"] if failed and failed.get("status") == "error" else (entered["t"] if entered else None)
        for rank, (p, out, err) in enumerate(run["procs"]):
            out.close()
            err.close()
            with open(os.path.join(d, f"stderr_{rank}.txt")) as f:
                stderr = f.read()
            result = _read(os.path.join(d, f"result_{rank}.json"))
            code = p.returncode
            seen = result["type"] + ": " + result["message"] if result and result.get("status") == "error" else None
            exit_after = run["end"][rank] - t_fail if t_fail is not None else None
            error_after = result["t"] - t_fail if (t_fail is not None and seen) else None
            # When the rank saw its error: the exception (gloo), else the end of its process (NCCL's
            # watchdog ends it without a Python exception).
            after = error_after if error_after is not None else exit_after
            info = {"rank": rank, "exit": code, "error_after_s": None if error_after is None else round(error_after, 1),
                    "exit_after_s": None if exit_after is None else round(exit_after, 1),
                    "error": seen, "stderr_tail": _tail(stderr), "stderr_long": _tail(stderr, 60)}
            ranks.append(info)
            if rank in run.get("killed", []) and not (rank == FAILING_RANK and not exits):
                problems.append(f"rank {rank} was still running at the driver's deadline (killed): blocked")
            if code == 0:
                problems.append(f"rank {rank} ended with exit status 0 (expected an error)")
            if t_fail is None:
                problems.append(f"rank {FAILING_RANK} never reached the failing call (start-up failed?)")
            if rank == FAILING_RANK:
                if CAUSE[how] not in (seen or "") + stderr:
                    problems.append(f"rank {rank}'s error does not name the cause ({CAUSE[how]!r})")
            elif after is not None and after > timeout_s + margin:
                problems.append(f"rank {rank} saw its error {after:.1f} s after rank {FAILING_RANK} failed, more than "
                                f"the timeout {timeout_s:g} s + margin {margin:g} s")
        if not problems:
            shutil.rmtree(d, ignore_errors=True)
        reports[name] = {"ok": not problems, "problems": problems, "ranks": ranks, "backend": backend,
                         "timeout_s": timeout_s, "margin_s": margin, "dir": d}
        if verbose:
            dump_txt = ("" if backend != "nccl" else ", NCCL debug dump on timeout" if dump
                        else ", TORCH_NCCL_DUMP_ON_TIMEOUT=0")
            print(f"--- {name} ({backend}, process-group timeout {timeout_s:g} s, margin {margin:g} s{dump_txt}): "
                  f"{'PASS' if not problems else 'FAIL'}", flush=True)
            for info in ranks:
                print(f"  rank {info['rank']}: exit status {info['exit']}; after rank {FAILING_RANK}'s failure: error raised "
                      f"{info['error_after_s']} s, process ended {info['exit_after_s']} s; error: {info['error']}", flush=True)
                tail = info["stderr_long"] if problems else info["stderr_tail"]
                if tail:
                    print("    stderr: " + tail.replace("\n", "\n            "), flush=True)
            for msg in problems:
                print(f"  PROBLEM: {msg}", flush=True)
    return reports


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default=None, choices=("nccl", "gloo"))
    parser.add_argument("--timeout", type=float, default=None, help="process-group timeout in seconds")
    parser.add_argument("--margin", type=float, default=None, help="seconds a blocked rank may take past the timeout")
    parser.add_argument("--startup", type=float, default=None, help="seconds allowed before the failing call")
    parser.add_argument("--only", default="", help="comma-separated scenarios (default: all)")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.dir, args.backend, args.timeout)
        return 0
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    t0 = time.time()
    reports = run_scenarios(names, backend=args.backend, timeout_s=args.timeout, margin_s=args.margin,
                            startup_s=args.startup)
    ok = all(r["ok"] for r in reports.values())
    print(f"RESULT: {'PASS' if ok else 'FAIL'} ({len(reports)} scenarios side by side, {time.time() - t0:.0f} s)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
