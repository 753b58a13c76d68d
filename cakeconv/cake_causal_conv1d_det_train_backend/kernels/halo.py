"""Triton kernel that moves KCP halo rows: packs the rows a rank sends, assembles the rows it reads.

Shape legend: n listed rows, C channels, L rows of the local source, K rows of the receive buffer.

One gather serves both directions of a halo exchange (kcp/ops.py):

    out[i, c] = local[m, c]        if m = map[i] >= 0      (a row of this rank)
              = recv[-2 - m, c]    if m <= -2              (a row another rank sent)
              = 0                  if m == -1              (no such row: outside the document)

Packing a send buffer is the case with no ``recv`` (every m >= 0); assembling the halo
(``hist`` [D * H, C] of x rows, ``fut`` [D * H, C] of FP32 g rows) reads both. Values are copied,
never computed, so their bits are the sender's.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_rows", "C", "so", "sl", "sr"])
def cake_halo_gather_kernel(out_ptr, map_ptr, local_ptr, recv_ptr, n_rows, C, so, sl, sr,
                            HAS_RECV: tl.constexpr, RB: tl.constexpr, BC: tl.constexpr):
    """out[i] <- local[map[i]] / recv[-2 - map[i]] / 0 (see the module docstring).

    Grid: (cdiv(n_rows, RB), cdiv(C, BC)). so, sl, sr: row strides (elements) of out, local and
    recv; channel stride 1.
    """
    i = tl.program_id(0) * RB + tl.arange(0, RB)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    imask = i < n_rows
    cmask = (cols < C)[None, :]
    m = tl.load(map_ptr + i, mask=imask, other=-1).to(tl.int64)
    from_local = (m >= 0)[:, None] & cmask
    v = tl.load(local_ptr + tl.maximum(m, 0)[:, None] * sl + cols[None, :], mask=from_local, other=0.0)
    if HAS_RECV:
        from_recv = (m <= -2)[:, None] & cmask
        r = tl.load(recv_ptr + tl.maximum(-2 - m, 0)[:, None] * sr + cols[None, :], mask=from_recv, other=0.0)
        v = tl.where(from_recv, r, v)
    tl.store(out_ptr + i.to(tl.int64)[:, None] * so + cols[None, :], v.to(out_ptr.dtype.element_ty),
             mask=imask[:, None] & cmask)
