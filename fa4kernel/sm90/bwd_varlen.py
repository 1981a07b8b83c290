"""The host side of the SM90 backward's varlen build (FlashBwdSm90Varlen in sm90/bwd.py): the
query layouts padded per sequence, the pre- and postprocess around the one launch.

A packed batch holds its sequences one after the other, so a query block of one sequence would
share rows with the next. The kernel reads Q, dO, K and V where they lie (rows past a sequence
belong to the next one: their LSE is +inf, so P and dS are 0 there, and keys past the sequence
are masked) and stores dK and dV row by row inside the sequence, but what it accumulates per query
block (the fp32 dQ) and reads per query block (LSE_log2, D) lies in a layout in which each
sequence starts on a whole block: sequence i's first padded row is

    (cu_seqlens_q[i] + i * tile_m) // tile_m * tile_m        (padded_starts)

at least cu_seqlens_q[i] + i * tile_m - (tile_m - 1), so sequence i + 1 starts more than len_i
rows later: every sequence owns whole blocks. The kernel computes the same starts from cu_seqlens
(FlashBwdSm90._varlen_views); nothing here waits for the device. Rows past the last sequence (a
tail the packed tensors may carry; it must hold finite values) get zero gradients.
"""

from __future__ import annotations

import math

from .bwd_config import BwdConfig


def padded_starts(cu, block: int):
    """Each sequence's first row in the padded layout (int64, on cu's device)."""
    import torch

    i = torch.arange(cu.numel() - 1, device=cu.device, dtype=torch.int64)
    return (cu[:-1].long() + i * block) // block * block


def padded_rows(cu, total: int, block: int):
    """(rows, padded, tail): for each of the tensor's `total` rows its row in the layout padded to
    `block`; that layout's length (a multiple of 128, room for every sequence's whole blocks and
    one row after them); and which rows lie past the last sequence (cu[-1] <= r, a tail the packed
    tensors may carry: no sequence's), whose row is that last one, which no block reaches."""
    import torch

    n = cu.numel() - 1
    r = torch.arange(total, device=cu.device, dtype=torch.int64)
    cu64 = cu.long()
    seq = torch.searchsorted(cu64[1:], r, right=True).clamp_max(n - 1)  # the sequence of row r
    padded = -(-(total + n * block + 1) // 128) * 128
    tail = r >= cu64[-1]
    rows = torch.where(tail, padded - 1, r - cu64[seq] + padded_starts(cu, block)[seq])
    return rows, padded, tail


def backward(cfg: BwdConfig, launch, dout, q, k, v, out, lse, cu_q, cu_k, max_seqlen_k: int, softmax_scale: float,
             use_tvm_ffi: bool = False):
    """dq, dk, dv (packed like q, k, v) of one launch of the varlen build. lse (heads, total_q):
    the forward's natural-log LSE (-inf where a row saw no key). launch: sm90/bwd.run_bwd_varlen's
    kernel call, given the padded tensors. The preprocess (cfg.preprocess) runs on the packed rows
    as on one dense sequence, its D and LSE_log2 then scattered to the padded rows; the dQ
    postprocess (cfg.postprocess) runs over the padded accumulator, its rows then gathered."""
    import torch

    from .bwd_postprocess import dq_postprocess, postprocess_kernel
    from .bwd_preprocess import preprocess_kernel, preprocess_torch

    tq, h, d = q.shape
    rows_q, sqp, tail_q = padded_rows(cu_q, tq, cfg.tile_m)
    dev = q.device
    dq_accum = torch.zeros((1, h, sqp, d), dtype=torch.float32, device=dev)
    dense_rows = -(-tq // 64) * 64
    if cfg.preprocess == "kernel":
        # (dq_zero "torch": the kernel leaves the accumulator alone; its argument needs the rows' shape)
        d_rows, lse_rows = preprocess_kernel(cfg, dout.unsqueeze(0), out.unsqueeze(0), lse.unsqueeze(0), dense_rows,
                                             use_tvm_ffi, dq_accum[:, :, :dense_rows])
    else:
        d_rows, lse_rows = preprocess_torch(cfg, dout.unsqueeze(0), out.unsqueeze(0), lse.unsqueeze(0), dense_rows)
    # the padding +inf (P = 0) and 0, a tail's row too
    lse_log2 = torch.full((1, h, sqp), math.inf, dtype=torch.float32, device=dev)
    lse_log2[0][:, rows_q] = torch.where(tail_q, math.inf, lse_rows[0, :, :tq])
    dpsum = torch.zeros((1, h, sqp), dtype=torch.float32, device=dev)
    dpsum[0][:, rows_q] = torch.where(tail_q, 0.0, d_rows[0, :, :tq])
    dk, dv = torch.empty_like(k), torch.empty_like(v)  # every row written by the kernel (a tail's: 0)
    launch(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), dout.unsqueeze(0), lse_log2, dpsum, dq_accum,
           dk.unsqueeze(0), dv.unsqueeze(0), cu_q, cu_k, max_seqlen_k, softmax_scale)
    if cfg.postprocess == "kernel":
        dq = postprocess_kernel(cfg, dq_accum, sqp, q.dtype, use_tvm_ffi)
    else:
        dq = dq_postprocess(dq_accum, cfg, sqp, q.dtype)
    return dq[0].index_select(0, rows_q), dk, dv
