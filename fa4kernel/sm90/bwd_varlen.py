"""The host side of the SM90 backward's varlen build (FlashBwdSm90Varlen in sm90/bwd.py): the
layouts padded per sequence, the torch pre- and postprocess around the one launch.

A packed batch holds its sequences one after the other, so a query block of one sequence would
share rows with the next. The kernel reads Q, dO, K and V where they lie (rows past a sequence
belong to the next one: their LSE is +inf, so P and dS are 0 there, and keys past the sequence are
masked), but everything it accumulates or stores per block goes to a layout in which each
sequence starts on a whole block: sequence i's first padded row is

    (cu_seqlens[i] + i * block) // block * block        (padded_starts)

which is at least cu_seqlens[i] + i * block - (block - 1), so sequence i + 1 starts more than
len_i rows later: every sequence owns whole blocks. Queries pad to tile_m (LSE_log2, D, the fp32 dQ
accumulator), keys to the CTA (pair)'s key blocks (dK, dV: a pair's second CTA past the keys
stores into its own sequence's padding). The kernel computes the same starts from cu_seqlens
(FlashBwdSm90._varlen_views); nothing here waits for the device.
"""

from __future__ import annotations

import math

from .bwd_config import BwdConfig, cluster_ctas


def padded_starts(cu, block: int):
    """Each sequence's first row in the padded layout (int64, on cu's device)."""
    import torch

    i = torch.arange(cu.numel() - 1, device=cu.device, dtype=torch.int64)
    return (cu[:-1].long() + i * block) // block * block


def padded_rows(cu, total: int, block: int):
    """(rows, padded, tail): for each of the tensor's `total` rows its row in the layout padded to
    `block`, that layout's length (a multiple of 128, room for every sequence's whole blocks), and
    which rows lie past the last sequence (cu[-1] <= r: no sequence's, their gradients 0)."""
    import torch

    n = cu.numel() - 1
    r = torch.arange(total, device=cu.device, dtype=torch.int64)
    cu64 = cu.long()
    seq = torch.searchsorted(cu64[1:], r, right=True).clamp_max(n - 1)  # the sequence of row r
    rows = r - cu64[seq] + padded_starts(cu, block)[seq]
    return rows, -(-(total + n * block) // 128) * 128, r >= cu64[-1]


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
    tk, hkv = k.shape[0], k.shape[1]
    rows_q, sqp, tail_q = padded_rows(cu_q, tq, cfg.tile_m)
    rows_k, skp, tail_k = padded_rows(cu_k, tk, cfg.tile_n * cluster_ctas(cfg))
    dev = q.device
    dq_accum = torch.zeros((1, h, sqp, d), dtype=torch.float32, device=dev)
    dense_rows = -(-tq // 64) * 64
    if cfg.preprocess == "kernel":
        d_rows, lse_rows = preprocess_kernel(cfg, dout.unsqueeze(0), out.unsqueeze(0), lse.unsqueeze(0), dense_rows,
                                             use_tvm_ffi, dq_accum)
    else:
        d_rows, lse_rows = preprocess_torch(cfg, dout.unsqueeze(0), out.unsqueeze(0), lse.unsqueeze(0), dense_rows)
    # the padding +inf (P = 0) and 0; a tail's rows map into the last sequence's padding: the same
    lse_log2 = torch.full((1, h, sqp), math.inf, dtype=torch.float32, device=dev)
    lse_log2[0][:, rows_q] = torch.where(tail_q, math.inf, lse_rows[0, :, :tq])
    dpsum = torch.zeros((1, h, sqp), dtype=torch.float32, device=dev)
    dpsum[0][:, rows_q] = torch.where(tail_q, 0.0, d_rows[0, :, :tq])
    dk = torch.empty((1, skp, hkv, d), dtype=k.dtype, device=dev)
    dv = torch.empty((1, skp, hkv, d), dtype=v.dtype, device=dev)
    launch(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), dout.unsqueeze(0), lse_log2, dpsum, dq_accum, dk, dv,
           cu_q, cu_k, max_seqlen_k, softmax_scale)
    if cfg.postprocess == "kernel":
        dq = postprocess_kernel(cfg, dq_accum, sqp, q.dtype, use_tvm_ffi)
    else:
        dq = dq_postprocess(dq_accum, cfg, sqp, q.dtype)
    dq = dq[0].index_select(0, rows_q)
    dk, dv = dk[0].index_select(0, rows_k), dv[0].index_select(0, rows_k)
    # rows past the last sequence (a tail the packed tensors may carry; it must hold finite values)
    return dq.masked_fill_(tail_q[:, None, None], 0), dk.masked_fill_(tail_k[:, None, None], 0), \
        dv.masked_fill_(tail_k[:, None, None], 0)
