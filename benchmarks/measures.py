"""What the single-GPU benchmark measures: passes and their floor bytes, widths and activations, timing methods,
providers, SPEC 7's targets."""

from doc_mixes import is_short_mix

PASSES = ("fwd", "bwd", "fwdbwd")
PASS_LABEL = {"fwd": "fwd", "bwd": "bwd", "fwdbwd": "fwd+bwd"}
FLOOR_FACTOR = {"fwd": 2, "bwd": 3, "fwdbwd": 5}  # times S*C*itemsize(x): 4, 6, 10 bytes per element in bf16

# Widths W (taps per channel) and activations (SPEC section 1b): a row's "activation" is "silu" or "none".
WIDTHS = tuple(range(2, 9))
ACTIVATIONS = ("silu", "none")
DEFAULT_WIDTH, DEFAULT_ACTIVATION = 4, "silu"


def activation_arg(label: str):
    """The ``activation=`` argument of a row's activation label: "silu", or None for "none"."""
    return None if label == "none" else label


def activation_label(activation) -> str:
    """A row's label of an ``activation=`` argument: "silu", or "none" for None."""
    return "none" if activation is None else str(activation)


def parse_widths(text: str) -> list[int]:
    """The widths of a comma list, e.g. "3,8" (each once, in order); ValueError names a bad one."""
    out = []
    for tok in str(text).split(","):
        tok = tok.strip()
        if not tok:
            continue
        if not tok.isdigit() or int(tok) not in WIDTHS:
            raise ValueError(f"width {tok!r} is not among {WIDTHS[0]}..{WIDTHS[-1]}")
        if int(tok) not in out:
            out.append(int(tok))
    if not out:
        raise ValueError(f"no width in {text!r}")
    return out


def parse_activations(text: str) -> list[str]:
    """The activation labels of a comma list among "silu", "none" (each once, in order); ValueError names a bad one."""
    out = []
    for tok in str(text).split(","):
        tok = tok.strip().lower()
        if not tok:
            continue
        if tok not in ACTIVATIONS:
            raise ValueError(f"activation {tok!r} is not among {ACTIVATIONS}")
        if tok not in out:
            out.append(tok)
    if not out:
        raise ValueError(f"no activation in {text!r}")
    return out

PEERS = ("fla", "dao", "dao_det")
BASELINES = ("trivial", "silu")  # host-cost baselines (not in the GPU-time grid)
ALL_PROVIDERS = ("ours", "ours_search", "ours_ag", "fla", "dao", "dao_det")
DEFAULT_PROVIDERS = ("ours", "fla", "dao", "dao_det")
PROVIDER_ORDER = ALL_PROVIDERS + BASELINES

# Timing methods of a row ("method"): GPU time, eager loop at the row's shape, host cost at the tiny shape.
EAGER_MODES = ("chain", "step")
EAGER_METHOD = {"chain": "eager", "step": "eager_step"}
HOST_ITEMS = ("chain", "step", "nograd", "ws")
HOST_METHOD = {i: "host_" + i for i in HOST_ITEMS}
HOST_PASS = {"chain": "fwdbwd", "step": "fwdbwd", "nograd": "fwd", "ws": "fwdbwd"}
METHOD_LABEL = {"gpu": "GPU time", "eager": "eager, chain", "eager_step": "eager, one call per step",
                "host_chain": "chain (per call)", "host_step": "one call + backward per step",
                "host_nograd": "forward under no_grad", "host_ws": "workspace entry points fwd+bwd"}
CALLS_PER_SAMPLE = 16  # host-cost samples and one-call-per-step samples: 16 calls between two syncs (2 dry)

# SPEC section 7 targets (fraction of copy bandwidth; GPU time)
TARGETS = {"fwd": 0.90, "bwd": 0.85, "fwdbwd": 0.85}  # seed mix, C >= 512
TARGETS_SMALL_C = {"fwdbwd": 0.80}  # seed mix, C = 128 and 256
TARGETS_SHORT_DOCS = {"fwd": 0.85, "fwdbwd": 0.80}  # short-document mixes, C >= 512
SMALL_C_BELOW = 512
EAGER_TARGET = 1.05  # eager-loop time per call <= 1.05 x the GPU time per call (seed mix, C = 128 and 512)
EAGER_TARGET_C = (128, 512)
HOST_TARGETS = {"chain_ratio": 2.0, "nograd_us": 25.0, "ws_us": 40.0}
WIDTH_TOLERANCE = 0.97  # every (W, activation): ours' fraction >= 0.97 x W = 4 + SiLU's, same mix, C, pass, bias
CHECK_TOL = 1e-2
HOST_AHEAD_MAX_US = 200000.0  # --host-ahead-us auto: at most this window


def target_steps(mix: str, pass_: str) -> list:
    """[(C_lo, C_hi or None, target)] of SPEC section 7 for a GPU-time pass at a mix."""
    if mix == "seed":
        out = []
        if pass_ in TARGETS_SMALL_C:
            out.append((0, SMALL_C_BELOW, TARGETS_SMALL_C[pass_]))
        out.append((SMALL_C_BELOW, None, TARGETS[pass_]))
        return out
    if is_short_mix(mix) and pass_ in TARGETS_SHORT_DOCS:
        return [(SMALL_C_BELOW, None, TARGETS_SHORT_DOCS[pass_])]
    return []
