"""The layout the SM90 backward's varlen build (FlashBwdSm90Varlen in sm90/bwd.py) keeps its
per-query-block data in, and its host side: three launches, as the dense backward's.

A packed batch holds its sequences one after the other, so a query block of one sequence would
share rows with the next. The kernels read Q, dO, O, K and V where they lie (rows past a sequence
belong to the next one: their LSE is +inf, so P and dS are 0 there, and keys past the sequence
are masked) and store dQ, dK and dV row by row inside the sequence, but what is kept per query
block (LSE_log2, D, the fp32 dQ accumulator) lies in a layout in which each sequence starts on a
whole block: sequence i's first padded row is

    (cu_seqlens_q[i] + i * tile_m) // tile_m * tile_m        (padded_start)

at least cu_seqlens_q[i] + i * tile_m - (tile_m - 1), so sequence i + 1 starts more than len_i
rows later: every sequence owns whole blocks, and all of them fit in total_q + sequences x tile_m
rows (padded_length). The preprocess (sm90/bwd_preprocess.py, BwdPreprocessVarlen), the main
kernel and the postprocess (sm90/bwd_postprocess.py, BwdPostprocessVarlen) compute the same
starts from cu_seqlens on the device: nothing waits for the host. Rows past the last sequence
(a tail the packed tensors may carry; it must hold finite values) get zero gradients.
"""

from __future__ import annotations

from .bwd_config import BwdConfig


def padded_start(start, seq, block: int):
    """Sequence seq's first row in the padded layout, from its first packed row `start` (Python
    ints here and in the tests, DSL integers in the kernels)."""
    return (start + seq * block) // block * block


def padded_length(total: int, sequences: int, block: int) -> int:
    """Rows of the padded layout: every sequence's whole blocks (a multiple of 128)."""
    return -(-(total + sequences * block) // 128) * 128


def backward(cfg: BwdConfig, launch, dout, q, k, v, out, lse, cu_q, cu_k, max_seqlen_q: int, max_seqlen_k: int,
             softmax_scale: float, use_tvm_ffi: bool = False):
    """dq, dk, dv (packed like q, k, v) of the varlen build: its preprocess, launch (sm90/bwd.py
    run_bwd_varlen's kernel call, given the padded tensors) and postprocess. lse (heads, total_q):
    the forward's natural-log LSE (-inf where a row saw no key)."""
    import torch

    from .bwd_postprocess import postprocess_varlen
    from .bwd_preprocess import preprocess_varlen

    tq, h, d = q.shape
    sqp = padded_length(tq, cu_q.numel() - 1, cfg.tile_m)
    # written (the accumulator zeroed) by the preprocess over every sequence's query blocks
    dpsum = torch.empty((1, h, sqp), dtype=torch.float32, device=q.device)
    lse_log2 = torch.empty((1, h, sqp), dtype=torch.float32, device=q.device)
    dq_accum = torch.empty((1, h, sqp, d), dtype=torch.float32, device=q.device)
    # deterministic: a semaphore per query block, its turns (sm90/bwd.py _dq_turn) per sequence
    dq_sem = torch.empty((1, h, sqp // cfg.tile_m), dtype=torch.int32, device=q.device) if cfg.deterministic else None
    preprocess_varlen(cfg, dout, out, lse, dpsum, lse_log2, dq_accum, dq_sem, cu_q, max_seqlen_q, use_tvm_ffi)
    dk, dv = torch.empty_like(k), torch.empty_like(v)  # every row written by the kernel (a tail's: 0)
    launch(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), dout.unsqueeze(0), lse_log2, dpsum, dq_accum, dq_sem,
           dk.unsqueeze(0), dv.unsqueeze(0), cu_q, cu_k, max_seqlen_k, softmax_scale)
    dq = torch.empty_like(q)
    postprocess_varlen(cfg, dq_accum, dq, cu_q, max_seqlen_q, use_tvm_ffi)
    return dq, dk, dv
