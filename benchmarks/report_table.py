"""The table a run prints last on stdout and writes to ``<stem>_table.txt``.

Blocks: the header (GPU, versions, commit, date, copy bandwidth), the check summary; GPU time, one block per
mix, width W, activation and bias, each line one (S, C, pass): ours' ms, GB/s and fraction, each peer's ms,
fraction and ``xN`` (the peer's time over ours); the eager loop per row and provider (GPU time of fwd+bwd,
chain time per call, fraction, ``e/g`` = chain / GPU time, one-call-per-step time); with two or more mixes a
summary (per mix, C, W and activation, fwd / fwd+bwd fractions for each provider); with two or more (W,
activation) a summary of ours' fractions per (W, activation) and their ratio to W = 4 + SiLU; the host cost
(us per call and ratio to the trivial Function); then ours against SPEC 7's targets, the notes, the files
written and the time taken.
"""

from __future__ import annotations

from measures import (ALL_PROVIDERS, CHECK_TOL, DEFAULT_ACTIVATION, DEFAULT_WIDTH, EAGER_TARGET, EAGER_TARGET_C,
                      HOST_ITEMS, HOST_METHOD, HOST_TARGETS, METHOD_LABEL, PASS_LABEL, PEERS, PROVIDER_ORDER,
                      WIDTH_TOLERANCE, target_steps)
from report_rows import act_of, method_of, mix_of, row_key, width_of



def _shape_keys(rows) -> list:
    """The (mix, S, C) of rows, each once, in the order they first appear."""
    return list(dict.fromkeys((mix_of(r), r["S"], r["C"]) for r in rows))


def _width_acts(rows) -> list:
    """The (W, activation) of rows, each once, in the order they first appear."""
    return list(dict.fromkeys((width_of(r), act_of(r)) for r in rows))


def _sorted_width_acts(rows) -> list:
    """The (W, activation) of rows, each once, by W, SiLU first."""
    return sorted(_width_acts(rows), key=lambda wa: (wa[0], wa[1] != "silu"))


def _wa_text(width, act) -> str:
    return f"W = {width}, {'SiLU' if act == 'silu' else 'no activation'}"


def _check_lines(checks):
    out = []
    bad = [c for c in checks if not c["ok"]]
    if not checks:
        return out
    worst = {}
    for c in checks:
        if c["provider"] == "ours_vs_fla":
            continue
        for k in ("y_rel", "dx_rel", "dw_rel", "db_rel"):
            v = c.get(k)
            if v is not None:
                worst[(c["provider"], k)] = max(worst.get((c["provider"], k), 0.0), v)
    byp = {}
    for (p, k), v in worst.items():
        byp.setdefault(p, []).append(f"{k[:-4]} {v:.1e}")
    out.append("# check vs FP32 reference (worst rel. L2 error, tol %.0e): " % CHECK_TOL
               + "; ".join(f"{p}: {', '.join(v)}" for p, v in byp.items())
               + (f"  ** {len(bad)} FAILED **" if bad else "  all ok"))
    ovf = [c for c in checks if c["provider"] == "ours_vs_fla"]
    if ovf:
        out.append(f"# ours y vs fla y: worst rel {max(c['y_rel'] for c in ovf):.1e}, "
                   f"worst max|diff| {max(c['y_max_abs'] for c in ovf):.3g}")
    for c in bad[:10]:
        out.append(f"#   FAILED check: {c}")
    return out


def _gpu_head(ours_like, peers) -> str:
    head = f"{'S':>7} {'C':>5} {'pass':<7}"
    for p in ours_like:
        head += f" | {p + ' ms':>10} {'GB/s':>5} {'f':>4}"
    for p in peers:
        head += f" | {p + ' ms':>10} {'GB/s':>5} {'f':>4}" + "".join(f" {_x_label(o, p):>{_x_width(o, p)}}"
                                                                  for o in ours_like)
    return head


def _x_label(o, p) -> str:
    return ("x" + p) if o == "ours" else (o[-2:] + "/" + p)


def _x_width(o, p) -> int:
    return max(6, len(_x_label(o, p)))


def _gpu_line(idx, head_key, S, C, p_, ours_like, peers):
    """One (S, C, pass) line of a GPU-time block, or None when no provider has that row."""
    mix, width, act, bias = head_key
    line = f"{S:>7} {C:>5} {PASS_LABEL[p_]:<7}"
    any_row = False
    for p in ours_like:
        r = idx.get((mix, "gpu", S, C, width, act, p_, bias, p))
        if r:
            any_row = True
            gbs = f"{r['gbs']:>5.0f}" if r["gbs"] >= 10 else f"{r['gbs']:>5.2f}"
            line += f" | {r['ms']:>10.4f} {gbs} {r['fraction']:>4.2f}"
        else:
            line += f" | {'-':>10} {'-':>5} {'-':>4}"
    for p in peers:
        r = idx.get((mix, "gpu", S, C, width, act, p_, bias, p))
        if r:
            any_row = True
            line += f" | {r['ms']:>10.3f} {r['gbs']:>5.0f} {r['fraction']:>4.2f}"
            for o in ours_like:
                ro = idx.get((mix, "gpu", S, C, width, act, p_, bias, o))
                xw, x = _x_width(o, p), (ro or {}).get("speedup_vs_" + p)
                line += f" {x:>{xw - 1}.1f}x" if x else f" {'-':>{xw}}"
        else:
            line += f" | {'-':>10} {'-':>5} {'-':>4}" + "".join(f" {'-':>{_x_width(o, p)}}" for o in ours_like)
    return line if any_row else None


def _gpu_table(rows, passes, bias_variants):
    out = []
    gpu = [r for r in rows if method_of(r) == "gpu"]
    idx = {row_key(r): r for r in gpu}
    provs = [p for p in ALL_PROVIDERS if any(r["provider"] == p for r in gpu)]
    ours_like = [p for p in provs if p not in PEERS]
    peers = [p for p in provs if p in PEERS]
    keys = _shape_keys(gpu)
    mixes = list(dict.fromkeys(m for m, _, _ in keys))
    for mix in mixes:
        for width, act in _width_acts([r for r in gpu if mix_of(r) == mix]):
            for bias in bias_variants:
                block = [_gpu_line(idx, (mix, width, act, bias), S, C, p_, ours_like, peers)
                         for m, S, C in keys if m == mix for p_ in passes]
                block = [line for line in block if line]
                if not block:
                    continue
                docs = sorted({r["n_docs"] for r in gpu if mix_of(r) == mix and r.get("n_docs")})
                n_txt = docs[0] if len(docs) == 1 else f"{docs[0]}-{docs[-1]}" if docs else "?"
                out += ["", f"== GPU time, {mix} ({n_txt} documents), {_wa_text(width, act)}, "
                            f"{'bias' if bias else 'no bias'} ==", _gpu_head(ours_like, peers)] + block
    return out


def _eager_table(rows):
    ev = [r for r in rows if method_of(r) in ("eager", "eager_step")]
    if not ev:
        return []
    idx = {row_key(r): r for r in rows}
    provs = [p for p in PROVIDER_ORDER if any(r["provider"] == p for r in ev)]
    chain = next((r.get("chain") for r in ev if method_of(r) == "eager"), None)
    out = ["", f"== eager loop (no host-ahead sleep; wall time per call; f = 10*S*C / time / copy): GPU = GPU time of "
               f"fwd+bwd, chain = {chain or '-'}-call chain per step / {chain or '-'}, step = one call + backward per "
               "step; e/g = chain / GPU =="]
    head = f"{'mix':<15} {'S':>7} {'C':>5} {'W':>2} {'act':<4} {'bias':<4}"
    for p in provs:
        head += f" | {p + ' GPU ms':>11} {'chain ms':>9} {'f':>4} {'e/g':>5} {'step ms':>8} {'f':>4}"
    out.append(head)
    keys = list(dict.fromkeys((mix_of(r), r["S"], r["C"], width_of(r), act_of(r), r["bias"]) for r in ev))
    for mix, S, C, width, act, bias in keys:
        line = f"{mix:<15} {S:>7} {C:>5} {width:>2} {act:<4} {'yes' if bias else 'no':<4}"
        for p in provs:
            g = idx.get((mix, "gpu", S, C, width, act, "fwdbwd", bias, p))
            e = idx.get((mix, "eager", S, C, width, act, "fwdbwd", bias, p))
            s = idx.get((mix, "eager_step", S, C, width, act, "fwdbwd", bias, p))
            line += f" | {g['ms']:>11.4f}" if g else f" | {'-':>11}"
            line += f" {e['ms']:>9.4f} {e['fraction']:>4.2f}" if e else f" {'-':>9} {'-':>4}"
            line += f" {e['eager_vs_gpu']:>5.2f}" if e and e.get("eager_vs_gpu") else f" {'-':>5}"
            line += f" {s['ms']:>8.4f} {s['fraction']:>4.2f}" if s else f" {'-':>8} {'-':>4}"
        out.append(line)
    return out


def _mix_summary(rows):
    """Per mix, C, W and activation: fwd and fwd+bwd fractions (GPU time, no bias when present) for each provider."""
    gpu = [r for r in rows if method_of(r) == "gpu" and r["pass"] in ("fwd", "fwdbwd")]
    mixes = list(dict.fromkeys(mix_of(r) for r in gpu))
    if len(mixes) < 2:
        return []
    provs = [p for p in ALL_PROVIDERS if any(r["provider"] == p for r in gpu)]
    bias = False if any(not r["bias"] for r in gpu) else True
    idx = {row_key(r): r for r in gpu}
    out = ["", f"== document mixes, GPU time, {'bias' if bias else 'no bias'}: fraction of copy, fwd / fwd+bwd =="]
    head = f"{'mix':<15} {'docs':>6} {'S':>7} {'C':>5} {'W':>2} {'act':<4}" + "".join(f" | {p:>11}" for p in provs)
    out.append(head)
    keys = _shape_keys(gpu)
    was = _sorted_width_acts(gpu)
    for mix, S, C in sorted(keys, key=lambda k: (mixes.index(k[0]), k[2], k[1])):
        any_r = next((r for r in gpu if (mix_of(r), r["S"], r["C"]) == (mix, S, C)), None)
        for width, act in was:
            cells = [(idx.get((mix, "gpu", S, C, width, act, "fwd", bias, p)),
                      idx.get((mix, "gpu", S, C, width, act, "fwdbwd", bias, p))) for p in provs]
            if not any(f or fb for f, fb in cells):
                continue
            line = f"{mix:<15} {any_r.get('n_docs') or '-':>6} {S:>7} {C:>5} {width:>2} {act:<4}"
            for f, fb in cells:
                txt = f"{f['fraction']:.2f}" if f else "-"
                txt += " / " + (f"{fb['fraction']:.2f}" if fb else "-")
                line += f" | {txt:>11}"
            out.append(line)
    return out


def _width_summary(rows):
    """With two or more (W, activation): per mix, S, C, pass and bias, ours' fraction at each (W, activation) and
    its ratio to W = 4 + SiLU's (when the run has it)."""
    gpu = [r for r in rows if method_of(r) == "gpu" and r["provider"] == "ours"]
    was = _sorted_width_acts(gpu)
    if len(was) < 2:
        return []
    idx = {row_key(r): r for r in gpu}
    base_wa = (DEFAULT_WIDTH, DEFAULT_ACTIVATION)
    has_base = base_wa in was
    out = ["", "== widths and activations, GPU time, ours: fraction of copy"
           + (" (ratio to W = 4 + SiLU)" if has_base else "") + " =="]
    out.append(f"{'mix':<15} {'S':>7} {'C':>5} {'pass':<7} {'bias':<4}"
               + "".join(f" | {f'W{w} {a}':>11}" for w, a in was))
    keys = list(dict.fromkeys((mix_of(r), r["S"], r["C"], r["pass"], r["bias"]) for r in gpu))
    for mix, S, C, p_, bias in keys:
        base = idx.get((mix, "gpu", S, C) + base_wa + (p_, bias, "ours"))
        line = f"{mix:<15} {S:>7} {C:>5} {PASS_LABEL[p_]:<7} {'yes' if bias else 'no':<4}"
        for w, a in was:
            r = idx.get((mix, "gpu", S, C, w, a, p_, bias, "ours"))
            txt = "-" if r is None else f"{r['fraction']:.2f}" + (
                f" ({r['fraction'] / base['fraction']:.2f})" if base and has_base else "")
            line += f" | {txt:>11}"
        out.append(line)
    return out


def _host_table(rows):
    hv = [r for r in rows if method_of(r).startswith("host_")]
    if not hv:
        return []
    idx = {(method_of(r), r["provider"]): r for r in hv}
    provs = [p for p in PROVIDER_ORDER if any(r["provider"] == p for r in hv)]
    items = [HOST_METHOD[i] for i in HOST_ITEMS if any(method_of(r) == HOST_METHOD[i] for r in hv)]
    S, C, chain = hv[0]["S"], hv[0]["C"], next((r.get("chain") for r in hv if method_of(r) == "host_chain"), None)
    out = ["", f"== host cost per call, S={S} C={C} one document, {_wa_text(width_of(hv[0]), act_of(hv[0]))}, bf16, "
               f"GPU idle (us per call; xT = ratio to the trivial autograd.Function; chain = {chain}) =="]
    out.append(f"{'provider':<9}" + "".join(f" | {METHOD_LABEL[m]:>30}" for m in items))
    for p in provs:
        line = f"{p:<9}"
        for m in items:
            r = idx.get((m, p))
            if r:
                txt = f"{r['us']:.1f}" + (f" ({r['ratio_to_trivial']:.1f}xT)" if r.get("ratio_to_trivial") else "")
                line += f" | {txt:>30}"
            else:
                line += f" | {'-':>30}"
        out.append(line)
    return out


def _miss_text(checked: int, miss: list) -> str:
    return f"{checked} checks, " + (f"MISS {len(miss)}: " + " ".join(miss[:12]) + (" ..." if len(miss) > 12 else "")
                                    if miss else "all met")


def _gpu_target_lines(rows):
    """Ours' GPU time against SPEC 7, per mix, W and activation: a (W, activation) other than 4 + SiLU against
    the W = 4 + SiLU targets within 3%; then each (W, activation) against ours' W = 4 + SiLU row of the run."""
    out = []
    gpu = [r for r in rows if method_of(r) == "gpu" and r["provider"] == "ours"]
    base_wa = (DEFAULT_WIDTH, DEFAULT_ACTIVATION)
    several = len(_width_acts(gpu)) > 1
    groups = {}
    for r in gpu:
        groups.setdefault((mix_of(r), width_of(r), act_of(r)), []).append(r)
    for (mix, width, act), sel in groups.items():
        scale = 1.0 if (width, act) == base_wa else WIDTH_TOLERANCE
        miss, checked = [], 0
        for r in sel:
            for lo, hi, t in target_steps(mix, r["pass"]):
                if r["C"] >= lo and (hi is None or r["C"] < hi):
                    checked += 1
                    if r["fraction"] < t * scale:
                        miss.append(f"{PASS_LABEL[r['pass']]}{'+b' if r['bias'] else ''} S{r['S']} C{r['C']}:"
                                    f"{r['fraction']:.3f}<{t * scale:.3f}")
        if checked:
            what = f", W = {width} {act}" + (" (targets x 0.97)" if scale != 1.0 else "") if several else ""
            out.append(f"# ours GPU time vs SPEC 7, {mix}{what}: {_miss_text(checked, miss)}")
    idx = {row_key(r): r for r in gpu}
    miss, checked = [], 0
    for r in gpu:
        base = idx.get(row_key(r, width=base_wa[0], act=base_wa[1]))
        if base is None or (width_of(r), act_of(r)) == base_wa:
            continue
        checked += 1
        if r["fraction"] < WIDTH_TOLERANCE * base["fraction"]:
            miss.append(f"W{width_of(r)} {act_of(r)} {mix_of(r)} {PASS_LABEL[r['pass']]}{'+b' if r['bias'] else ''} "
                        f"C{r['C']}:{r['fraction'] / base['fraction']:.3f}")
    if checked:
        out.append(f"# ours at every (W, activation) vs its W = 4 + SiLU row (fraction ratio >= {WIDTH_TOLERANCE}): "
                   + _miss_text(checked, miss))
    return out


def _target_lines(rows, sweep_s, env):
    if env["gpu"].startswith("cpu"):
        return []
    out = _gpu_target_lines(rows)
    ev = [r for r in rows if method_of(r) == "eager" and r["provider"] == "ours" and mix_of(r) == "seed"
          and r["C"] in EAGER_TARGET_C and r.get("eager_vs_gpu")]
    several = len(_width_acts(ev)) > 1
    if ev:
        out.append("# ours eager loop vs SPEC 7 (seed mix, C = 128 and 512, chain time per call <= 1.05 x GPU time): "
                   + ", ".join(f"C{r['C']}{'+b' if r['bias'] else ''}"
                               + (f" W{width_of(r)} {act_of(r)}" if several else "") + f" {r['eager_vs_gpu']:.2f}x"
                               + ("" if r["eager_vs_gpu"] <= EAGER_TARGET else " MISS") for r in ev))
    host = {method_of(r): r for r in rows if method_of(r).startswith("host_") and r["provider"] == "ours"}
    parts = []
    if "host_chain" in host and host["host_chain"].get("ratio_to_trivial"):
        v = host["host_chain"]["ratio_to_trivial"]
        parts.append(f"chain {v:.1f}x trivial (<= {HOST_TARGETS['chain_ratio']:.1f}x){'' if v <= HOST_TARGETS['chain_ratio'] else ' MISS'}")
    if "host_nograd" in host:
        v = host["host_nograd"]["us"]
        parts.append(f"no_grad forward {v:.1f} us (<= {HOST_TARGETS['nograd_us']:.0f}){'' if v <= HOST_TARGETS['nograd_us'] else ' MISS'}")
    if "host_ws" in host:
        v = host["host_ws"]["us"]
        parts.append(f"entry points fwd+bwd {v:.1f} us (<= {HOST_TARGETS['ws_us']:.0f}){'' if v <= HOST_TARGETS['ws_us'] else ' MISS'}")
    if parts:
        out.append("# ours host cost vs SPEC 7: " + "; ".join(parts))
    return out


def format_table(rows, checks, env, notes, passes, bias_variants, sweep_s, paths, elapsed) -> str:
    out = []
    out.append(f"# {env['gpu']} | torch {env['torch']} | triton {env['triton']} | cakeconv {env['cakeconv']} "
               f"({env['ours_backend']}) | fla {env.get('fla')} | dao {env.get('causal_conv1d')} | {env['date']} "
               f"| commit {env.get('commit')}")
    out.append(f"# copy bandwidth {env['copy_gbs']:.0f} GB/s (start {env['copy_gbs_start']:.0f}, end "
               f"{env['copy_gbs_end']:.0f}); floor bytes fwd 4SC, bwd 6SC, fwd+bwd 10SC; ms = median; "
               f"f = fraction of copy; xN = peer time / ours")
    out += _check_lines(checks)
    out += _gpu_table(rows, passes, bias_variants)
    out += _eager_table(rows)
    out += _mix_summary(rows)
    out += _width_summary(rows)
    out += _host_table(rows)
    out.append("")
    out += _target_lines(rows, sweep_s, env)
    for n in notes:
        out.append(f"# note: {n}")
    out.append(f"# wrote: {', '.join(paths)}")
    out.append(f"# time taken: {elapsed:.1f} s")
    return "\n".join(out)

