"""Split-KV (FlashDecoding): how many chunks of the KV cache a kernel gives each Q tile, and the
combine launch that merges their partial outputs.

A split launch runs num_splits work units per Q tile, each over ceil(blocks / num_splits) of its
KV blocks, each writing its partial O (fp32) and LSE; a second launch (the combine) reads them
and writes O. Each kernel picks num_splits its own way:

- FlashAttention-3 (hopper/heuristics.h `num_splits_heuristic`, called by flash_api.cpp
  `get_num_splits` with pack-GQA rows, max_splits 128): with at least 0.8 x SMs Q tiles, one split
  (or, non-causal with a K/V head bigger than 50 MB of L2 and at least 2 x SMs Q tiles per head,
  ceil(head bytes / 50 MB)); with 4 KV blocks or fewer, one; else the fewest splits whose wave
  efficiency (tiles / ceil(tiles / SMs) / SMs) is at least 0.85 of the best for 1..min(128, SMs,
  blocks) splits. A varlen batch counts as batch 1 (its splits are then set per sequence on the
  device; fa4sim gives every sequence that bound).
- flash-attn-4 (flash_attn/cute/interface.py `num_splits_heuristic`, only when the caller passes
  num_splits < 1; flash_attn_func's default is 1): max(1, min(SMs // Q tiles, 128, blocks)); its
  SM90 forward has none ("SplitKV not supported on SM 9.0").
"""
from __future__ import annotations

import math

FA3_L2_BYTES = 50 * 1024 * 1024  # heuristics.h: "we assume that L2 size is 50MB"
MAX_SPLITS = 128


def fa3_num_splits(p, num_sms: int, tile_m: int, tile_n: int) -> int:
    """FlashAttention-3's num_splits_heuristic for this problem (pack-GQA rows, as get_num_splits)."""
    m_blocks = math.ceil(p.seqlen_q * p.heads_per_kv / tile_m)
    n_blocks = math.ceil(p.seqlen_k / tile_n)
    total = (1 if p.is_varlen else p.batch) * p.heads_kv * m_blocks
    head_bytes = p.seqlen_k * (p.hdim + p.hdim_v) * 2
    if total >= 0.8 * num_sms:
        if head_bytes > FA3_L2_BYTES and m_blocks >= 2 * num_sms and not p.causal:
            return min(math.ceil(head_bytes / FA3_L2_BYTES), MAX_SPLITS)
        return 1
    if n_blocks <= 4:
        return 1
    most = min(MAX_SPLITS, num_sms, n_blocks)
    eff = []
    for s in range(1, most + 1):
        waves = total * s / num_sms
        eff.append(waves / math.ceil(waves))
    best = max(eff)
    return next(s for s in range(1, most + 1) if eff[s - 1] >= 0.85 * best)


def fa3_pack_gqa(p, tile_m: int, num_splits: int) -> bool:
    """FlashAttention-3's get_pack_gqa: always with splits or varlen queries (should_pack_gqa's
    varlen_q), never without grouped heads; else when one head's tiles fill less than 0.9 of
    what the packed ones do (should_pack_gqa in hopper/heuristics.h)."""
    if num_splits > 1:
        return True
    if p.heads == p.heads_kv:
        return False
    if p.is_varlen:
        return True
    up = lambda a: -(-a // tile_m) * tile_m  # noqa: E731
    g = p.heads_per_kv
    return p.seqlen_q / up(p.seqlen_q) < 0.9 * (p.seqlen_q * g / up(p.seqlen_q * g))


def fa4_num_splits(p, num_sms: int, tile_m: int, tile_n: int, pack: bool) -> int:
    """flash-attn-4's num_splits_heuristic (its API's num_splits < 1)."""
    m_blocks = math.ceil(p.seqlen_q * (p.heads_per_kv if pack else 1) / tile_m)
    total = p.batch * p.heads_kv * (1 if pack else p.heads_per_kv) * m_blocks
    n_blocks = math.ceil(p.seqlen_k / tile_n)
    if n_blocks <= 4:
        return 1
    return max(1, min(num_sms // total, MAX_SPLITS, n_blocks))


def partial_bytes(p, num_splits: int) -> float:
    """What a split launch writes besides O: per split, per query row and q head, O in fp32 and
    the LSE (fp32), in place of the bf16 O."""
    rows = sum(q for q, _ in p.sequences) * p.heads
    return num_splits * rows * (p.hdim_v * 4 + 4) - rows * p.hdim_v * 2


def combine_bytes(p, num_splits: int) -> float:
    """The combine launch's HBM bytes: every split's partial O and LSE read, O (bf16) written."""
    rows = sum(q for q, _ in p.sequences) * p.heads
    return num_splits * rows * (p.hdim_v * 4 + 4) + rows * p.hdim_v * 2


# an implementation's combine kernel, as its params name it: how its rows walk the splits
COMBINE_SHAPE = ("combine_lse_passes", "combine_lse_splits_per_round", "combine_partial_splits_per_round")
# and, where a row's splits are shared by several warps (fa4kernel), how: split s to warp s % warps
# within each chunk of splits whose weights the lanes hold at once
COMBINE_SPREAD = ("combine_warps_per_row", "combine_splits_per_chunk")


def combine_shape(impl, ctx, knobs) -> tuple | None:
    """(passes over the splits' LSEs, splits whose LSE a row loads per round trip, splits whose
    partial O a warp has in flight per round trip, warps per row, splits per chunk or None) from
    the implementation's params; None where it names none (its combine is then its bytes alone).
    Without COMBINE_SPREAD's params: one warp (or thread block) walks all of a row's splits."""
    if not all(n in impl.params for n in COMBINE_SHAPE):
        return None
    passes, lse, partial = (impl.value(n, ctx, knobs) for n in COMBINE_SHAPE)
    warps, chunk = ((int(impl.value(n, ctx, knobs)) for n in COMBINE_SPREAD)
                    if all(n in impl.params for n in COMBINE_SPREAD) else (1, None))
    return int(passes), int(lse), float(partial), warps, chunk  # partials in flight as counted: 2.5


def combine_pdl(impl, ctx, knobs) -> bool:
    """Whether the implementation launches its combine as a programmatic dependent launch behind
    the split launch (its param combine_pdl; False where it names none): its CTAs are resident
    and waiting when the split launch ends, so the gap between the two is the profile's
    pdl_launch_gap_us instead of launch_gap_us."""
    return bool(impl.value("combine_pdl", ctx, knobs)) if "combine_pdl" in impl.params else False


def combine_round_trips(num_splits: int, shape: tuple) -> int:
    """The dependent memory round trips of one row of the combine: each pass over the LSEs takes
    ceil(splits / per round) of them; the partials, chunk by chunk, those of the warp with the
    most of the chunk's splits (ceil(chunk's splits / warps)) at its in-flight count a trip."""
    passes, lse_per_round, partial_per_round, *spread = shape
    warps, chunk = spread if spread else (1, None)
    chunk = chunk or num_splits
    partial = sum(math.ceil(math.ceil(min(chunk, num_splits - c) / warps) / partial_per_round)
                  for c in range(0, num_splits, chunk))
    return passes * math.ceil(num_splits / lse_per_round) + partial


def combine_us(p, hw, num_splits: int, shape: tuple | None = None, pdl: bool = False) -> float:
    """The combine launch, us: its bytes at the HBM bandwidth or, where longer, one row's chain of
    dependent round trips to L2 (the split launch has just written the partials; the TMA's L2-hit
    latency, l2_latency, stands in for a load's), plus a launch gap (as the backward's
    memory-bound launches around its main kernel; pdl: the shorter gap of a programmatic
    dependent launch, pdl_launch_gap_us). Every row runs at once: the combine has a
    warp (fa4kernel) or a CTA's share of threads (FlashAttention-3, flash-attn-4) per row, and a
    decode batch's rows fit the GPU in one wave."""
    if num_splits <= 1:
        return 0.0
    stream = combine_bytes(p, num_splits) / (hw.hbm_bandwidth_tbps * 1e6)
    chain = combine_round_trips(num_splits, shape) * hw.l2_latency / (hw.clock_ghz * 1e3) if shape else 0.0
    return max(stream, chain) + (hw.pdl_launch_gap_us if pdl else hw.launch_gap_us)
