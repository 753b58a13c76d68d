"""Host-side launchers of the Triton kernels (no validation here: ops.py validates first).

Shape legend: S packed tokens, C channels, N segments, L leaves of BWD_SUB rows, G groups.
"""

from __future__ import annotations

import os


from . import tuning
from .backward import (
    BWD_SUB,
    GROUP_BLOCK,
    LOG2_GROUP_BLOCK,
    LOG2_TREE_LEAVES,
    TREE_LEAVES,
    cake_conv_bwd_finalize_kernel,
    cake_conv_bwd_dx_rows_kernel,
    cake_conv_bwd_group_kernel,
    cake_conv_bwd_head_kernel,
    cake_conv_bwd_kernel,
)
from .forward import cake_conv_fwd_kernel, cake_conv_fwd_rows_kernel

_GROUP_BLK = 64
_FINAL_BLK = 32
# Explicit FMAs only: with contraction on, the compiler may fuse a multiply into a later add in one
# code path (masked / unmasked, varlen / uniform) and not in another, which changes bits.
_NO_FUSION = dict(enable_fp_fusion=False)


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def backward_workspace_floats(S: int, C: int) -> int:
    """FP32 elements of the backward workspace: level-0 leaf partials plus group sums.

    Sized for the smallest R a configuration may use (R = 1), so it never depends on tuning.
    """
    n_leaves = tuning.cdiv(S, BWD_SUB)
    n_groups = tuning.cdiv(n_leaves, TREE_LEAVES)
    return 5 * C * (n_leaves + n_groups)


def _segments(cu_seqlens, seq_len, S):
    """(cu or None, n_seg, seq_len) kernel arguments."""
    if cu_seqlens is not None:
        return cu_seqlens, cu_seqlens.numel() - 1, max(S, 1)
    T = seq_len if seq_len else max(S, 1)
    return None, tuning.cdiv(S, T), T


def triton_forward(x_SC, w_CW, b_C, cu_seqlens, seq_len, y_SC, hist_NHC=None, config=None):
    """Launch the forward kernel: y_SC <- silu(conv(x_SC)). x_SC, y_SC: unit channel stride."""
    S, C = x_SC.shape
    if S == 0:
        return y_SC
    cu, n_seg, T = _segments(cu_seqlens, seq_len, S)
    cfg = config or tuning.pick_fwd_config(C, x_SC.element_size(), interpreting())
    grid = (tuning.cdiv(S, cfg.R * cfg.SUB) * tuning.cdiv(C, cfg.BC),)
    dummy = w_CW
    cake_conv_fwd_kernel[grid](
        x_SC, y_SC, w_CW, b_C if b_C is not None else dummy,
        cu if cu is not None else dummy, hist_NHC if hist_NHC is not None else dummy,
        S, C // 8, n_seg, T, SX8=x_SC.stride(0) // 8, SY8=y_SC.stride(0) // 8,
        HAS_BIAS=b_C is not None, HAS_CU=cu is not None, HAS_HIST=hist_NHC is not None,
        R=cfg.R, SUB=cfg.SUB, BC=cfg.BC, STAGES=cfg.stages, num_warps=cfg.num_warps,
        **tuning.launch_options(cfg), **_NO_FUSION,
    )
    return y_SC


def triton_backward(dy_SC, x_SC, w_CW, b_C, cu_seqlens, seq_len, dx_SC, ws_F, dw_CW, db_C,
                    hist_NHC=None, fut_NHC=None, config=None):
    """Launch the three backward kernels; writes dx_SC, dw_CW and (if given) db_C.

    ws_F: FP32 workspace of at least backward_workspace_floats(S, C) elements. KCP: hist_NHC
    (and fut_NHC, or None while the look-ahead halo is still in flight: triton_dx_rows then
    rewrites the affected rows).
    """
    S, C = x_SC.shape
    cfg = config or tuning.pick_bwd_config(C, x_SC.element_size(), interpreting(), has_bias=b_C is not None)
    assert fut_NHC is None or hist_NHC is not None
    cu, n_seg, T = _segments(cu_seqlens, seq_len, S)
    R = cfg.R
    logr = R.bit_length() - 1
    assert 1 << logr == R and R <= TREE_LEAVES
    n_nodes = tuning.cdiv(S, R * BWD_SUB)
    n_leaves = tuning.cdiv(S, BWD_SUB)
    n_groups = tuning.cdiv(n_leaves, TREE_LEAVES)
    ws_nodes = ws_F[: n_nodes * 5 * C]
    gs = ws_F[n_leaves * 5 * C: (n_leaves + n_groups) * 5 * C]
    dummy = w_CW
    cake_conv_bwd_kernel[(n_nodes * tuning.cdiv(C, cfg.BC),)](
        x_SC, dy_SC, dx_SC, w_CW, b_C if b_C is not None else dummy,
        cu if cu is not None else dummy,
        hist_NHC if hist_NHC is not None else dummy, fut_NHC if fut_NHC is not None else dummy,
        ws_nodes, S, C // 8, n_seg, T,
        SX8=x_SC.stride(0) // 8, SDY8=dy_SC.stride(0) // 8, SDX8=dx_SC.stride(0) // 8,
        HAS_BIAS=b_C is not None, HAS_CU=cu is not None, HAS_HIST=hist_NHC is not None,
        HAS_FUT=fut_NHC is not None, R=R, LOGR=logr, SUB=BWD_SUB, BC=cfg.BC, STAGES=cfg.stages,
        STEP_BRANCH=cfg.step_branch,
        num_warps=cfg.num_warps, **tuning.launch_options(cfg), **_NO_FUSION,
    )
    M = TREE_LEAVES // R
    blk = 16 if interpreting() else _GROUP_BLK
    cake_conv_bwd_group_kernel[(n_groups, tuning.cdiv(5 * C, blk))](
        ws_nodes, gs, n_nodes, 5 * C, M=M, LOGM=LOG2_TREE_LEAVES - logr, BLK=blk,
        num_warps=1 if interpreting() else 4, **_NO_FUSION,
    )
    fblk = 16 if interpreting() else _FINAL_BLK
    cake_conv_bwd_finalize_kernel[(tuning.cdiv(C, fblk),)](
        gs, dw_CW, db_C if db_C is not None else dw_CW, n_groups, C,
        HAS_BIAS=db_C is not None, BLK=fblk, GB=GROUP_BLOCK, LOGGB=LOG2_GROUP_BLOCK,
        num_warps=1 if interpreting() else 4, **_NO_FUSION,
    )
    return dx_SC, dw_CW, db_C


def triton_head_g(dy_SC, x_SC, w_CW, b_C, cu_seqlens, hist_NHC, rows_F, g_FC):
    """KCP: g_FC[i] <- FP32 g of local row rows_F[i] (segments from cu_seqlens, halo hist_NHC)."""
    S, C = x_SC.shape
    n = rows_F.numel()
    if n == 0:
        return g_FC
    rb, bc, nw = (4, 16, 1) if interpreting() else (8, 128, 4)
    cake_conv_bwd_head_kernel[(tuning.cdiv(n, rb), tuning.cdiv(C, bc))](
        x_SC, dy_SC, w_CW, b_C if b_C is not None else w_CW, cu_seqlens, hist_NHC, rows_F, g_FC,
        n, S, C // 8, x_SC.stride(0) // 8, dy_SC.stride(0) // 8, cu_seqlens.numel() - 1,
        HAS_BIAS=b_C is not None, RB=rb, BC=bc, num_warps=nw, **_NO_FUSION,
    )
    return g_FC


def _rows_launch_shape():
    return (4, 16, 1) if interpreting() else (8, 128, 4)


def triton_forward_rows(x_SC, w_CW, b_C, cu_seqlens, hist_NHC, rows_F, y_SC):
    """KCP: rewrite y of local rows rows_F (segment starts) with the history halo hist_NHC."""
    S, C = x_SC.shape
    n = rows_F.numel()
    if n == 0:
        return y_SC
    rb, bc, nw = _rows_launch_shape()
    cake_conv_fwd_rows_kernel[(tuning.cdiv(n, rb), tuning.cdiv(C, bc))](
        x_SC, y_SC, w_CW, b_C if b_C is not None else w_CW, cu_seqlens, hist_NHC, rows_F,
        n, S, C // 8, x_SC.stride(0) // 8, y_SC.stride(0) // 8, cu_seqlens.numel() - 1,
        HAS_BIAS=b_C is not None, RB=rb, BC=bc, num_warps=nw, **_NO_FUSION,
    )
    return y_SC


def triton_dx_rows(dy_SC, x_SC, w_CW, b_C, cu_seqlens, hist_NHC, fut_NHC, rows_F, dx_SC):
    """KCP: rewrite dx of local rows rows_F (segment ends) with the look-ahead halo fut_NHC."""
    S, C = x_SC.shape
    n = rows_F.numel()
    if n == 0:
        return dx_SC
    rb, bc, nw = _rows_launch_shape()
    cake_conv_bwd_dx_rows_kernel[(tuning.cdiv(n, rb), tuning.cdiv(C, bc))](
        x_SC, dy_SC, dx_SC, w_CW, b_C if b_C is not None else w_CW, cu_seqlens, hist_NHC, fut_NHC, rows_F,
        n, S, C // 8, x_SC.stride(0) // 8, dy_SC.stride(0) // 8, dx_SC.stride(0) // 8, cu_seqlens.numel() - 1,
        HAS_BIAS=b_C is not None, RB=rb, BC=bc, num_warps=nw, **_NO_FUSION,
    )
    return dx_SC
