"""The layout the SM90 backward's varlen build (FlashBwdSm90Varlen in sm90/bwd.py, its three
launches: run_bwd_varlen) keeps its per-query-block data in.

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


def padded_start(start, seq, block: int):
    """Sequence seq's first row in the padded layout, from its first packed row `start` (Python
    ints here and in the tests, DSL integers in the kernels)."""
    return (start + seq * block) // block * block


def padded_length(total: int, sequences: int, block: int) -> int:
    """Rows of the padded layout: every sequence's whole blocks (a multiple of 128)."""
    return -(-(total + sequences * block) // 128) * 128
