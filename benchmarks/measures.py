"""What the single-GPU benchmark measures: passes and their floor bytes, timing methods, providers, SPEC 7's targets."""

from doc_mixes import is_short_mix

PASSES = ("fwd", "bwd", "fwdbwd")
PASS_LABEL = {"fwd": "fwd", "bwd": "bwd", "fwdbwd": "fwd+bwd"}
FLOOR_FACTOR = {"fwd": 2, "bwd": 3, "fwdbwd": 5}  # times S*C*itemsize(x): 4, 6, 10 bytes per element in bf16

PEERS = ("fla", "dao")
BASELINES = ("trivial", "silu")  # host-cost baselines (not in the GPU-time grid)
ALL_PROVIDERS = ("ours", "ours_search", "ours_ag", "fla", "dao")
DEFAULT_PROVIDERS = ("ours", "fla", "dao")
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
