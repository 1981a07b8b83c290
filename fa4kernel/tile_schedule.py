"""Which CTA runs which Q tile, in which order: computed on the host, read by the kernel.

Every persistent launch (and every causal one) takes its tiles from this table. Tiles differ in
cost: a causal tile of query rows m sees ~m+1 KV blocks, and the last tile of a length that is
not a multiple of tile_m has consumer warpgroups without rows, which the kernel idles (hd64's
192-row tiles at 1k tokens: the 6th tile of each head has 64 rows, one warpgroup's worth). A
short launch (1k tokens) has only ~16-24 tiles per SM, so the order matters twice over:
- balance: a CTA that draws more long tiles than the others ends the launch late (a static
  round-robin of non-causal tiles, m_block fastest, gave every partial tile to the same 22 of
  132 CTAs, since 132 is a multiple of 6);
- L2 reuse: every tile of one (batch, head) reads the same K and V. If the CTAs running at the
  same time work on few heads, those K/V blocks come from L2; if they spread over all heads, each
  tile streams its K/V from HBM again.
Measured (H100, 50 MiB L2, 16 x 1k tokens, causal, one CTA per SM; TFLOP/s of hd 128 / 64 / 256):
longest-first over all heads 286 / 274 / 277; sections of 48 MiB of K/V 417 / 289 / 377, of
12.5 MiB 475 / 301 / 432, of 6 MiB 477 / 297 / 442 (lab/tools/causal_sm90.py:
lab/campaigns/kernel-sm90-forward/, lab/findings/kernel-tiles-sm90.md).

The order here: (batch, head) pairs grouped into sections whose K + V take at most
`section_bytes` (default a sixteenth of L2: the section's K/V stays resident beside the Q and O
tiles streaming past and the neighbouring sections' loads), costliest tile first within a
section, the last section at least TAIL_WAVES x grid tiles. The assignment: list scheduling, as a
dynamic tile scheduler would do it: each tile in that order goes to the CTA that is predicted to
be free first (tile_cost). Equal tiles thus go round-robin. One CTA per tile (grid >= tiles)
keeps the order and lets the hardware's block scheduler balance.

Pure Python (no torch, no CUDA).
"""
from __future__ import annotations

import heapq
import math

from .block_info import kv_block_range

# A tile's fixed cost in KV-block units: start-up, first block without overlap, epilogue.
# Measured on H100 (hd128, one CTA walking tiles): ~1925 cycles beyond its blocks vs 2462 cycles
# per KV block (lab/campaigns/tile-costs/); only the ordering uses it.
TILE_OVERHEAD_BLOCKS = 0.8
# (consumer warpgroups, warpgroups with rows) -> a tile's cost relative to a full one. The idle
# warpgroups skip their GEMMs and softmax, but a lone warpgroup has no ping-pong partner to hide
# its softmax behind, so the saving is far from proportional. Measured on H100 (one CTA walking
# 16 tiles of 32 KV blocks; lab/tools/idle_wg_sm90.py, lab/campaigns/kernel-sm90-forward/): 1 of 3 live 0.59
# (hd64) / 0.61 (hd96), 2 of 3 0.85 / 0.79, 1 of 2 0.80 (hd128) / 0.71 (hd64); the means here.
LIVE_WG_COST = {(3, 1): 0.60, (3, 2): 0.82, (2, 1): 0.75}
# section_bytes = L2 size / 16, and the last section holds at least 2 waves of tiles. Measured
# (H100, same-run A/B over the benchmark's scheduled launches: the tile-table A/B of
# lab/campaigns/kernel-sm90-forward/, lab/findings/kernel-tiles-sm90.md): against the earlier
# L2 / 8 and 3 waves, hd256 1k causal +3.7 %, hd128 1k causal +2.7 %, hd256 4k causal +0.7 %,
# the others within -0.7..+0.1 %; longer last sections (5, 8 waves) lost 4-40 % (their heads'
# K/V no longer stay in L2). Without a merged last section the tail is unbalanced (predicted 12 %
# at hd256 with 132 CTAs).
SECTION_FRACTION_OF_L2 = 16
TAIL_WAVES = 2


def kv_blocks(m_block: int, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int,
              causal: bool = True) -> int:
    """KV blocks a tile visits: the kernel's own range (block_info.kv_block_range)."""
    return kv_block_range(m_block, tile_m, tile_n, seqlen_q, seqlen_k, causal)[0]


def tile_cost(m_block: int, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int,
              causal: bool = True) -> float:
    """A tile's predicted cost in KV-block units: its blocks, times what a tile costs whose
    consumer warpgroups (64 rows each) are not all live (LIVE_WG_COST), plus the fixed cost."""
    wgs = tile_m // 64
    live = min(wgs, math.ceil((seqlen_q - m_block * tile_m) / 64))
    share = 1.0 if live >= wgs else LIVE_WG_COST.get((wgs, live), live / wgs)
    return kv_blocks(m_block, tile_m, tile_n, seqlen_q, seqlen_k, causal) * share + TILE_OVERHEAD_BLOCKS


def tile_order(num_m: int, num_hb: int, kv_bytes_per_head: int, section_bytes: int,
               tail_tiles: int = 0, cost=None) -> list[int]:
    """Flat tile ids (m_block + num_m * hb, hb = batch * heads + head) in run order: sections of
    (batch, head) pairs whose K/V fit in section_bytes (0 = one section); within a section the
    costliest tiles first (cost(m_block), default: the causal length m_block + 1), equal costs
    grouped by head (larger m_block first).
    The last sections merge until the last one has >= tail_tiles tiles: a small last section
    starts its long tiles late, on a few CTAs, while the others run out of work."""
    per = num_hb if section_bytes <= 0 else min(max(section_bytes // max(kv_bytes_per_head, 1), 1), num_hb)
    sections = [list(range(first, min(first + per, num_hb))) for first in range(0, num_hb, per)]
    while len(sections) > 1 and len(sections[-1]) * num_m < tail_tiles:
        last = sections.pop()
        sections[-1] += last
    cost = cost or (lambda m: m + 1)
    # equal costs: one head's tiles together (the CTAs running at once then read the same K/V
    # blocks at about the same time: non-causal hd128 1k measured 620 vs 604 TFLOP/s with the
    # rows of tiles spread over the section's heads instead; H100, lab/findings/kernel-tiles-sm90.md)
    return [m + num_m * hb for hbs in sections
            for m, hb in sorted(((m, hb) for hb in hbs for m in range(num_m)), key=lambda t: (-cost(t[0]), t[1], -t[0]))]


def make_schedule(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                  tile_m: int, tile_n: int, grid: int, section_bytes: int, causal: bool = True,
                  sms: int | None = None, dtype_bytes: int = 2) -> list[list[int]]:
    """Per CTA, the flat tile ids it runs in turn. grid >= number of tiles: one tile per CTA.
    sms: CTAs resident at once (the SM count; default grid), which sizes the last section."""
    if min(batch, heads, seqlen_q, seqlen_k, head_dim, tile_m, tile_n, grid) < 1:
        raise ValueError("make_schedule: batch, heads, seqlens, head_dim, tiles and grid must be >= 1")
    num_m = math.ceil(seqlen_q / tile_m)
    cost = [tile_cost(m, tile_m, tile_n, seqlen_q, seqlen_k, causal) for m in range(num_m)]
    order = tile_order(num_m, batch * heads, 2 * seqlen_k * head_dim * dtype_bytes, section_bytes,
                       TAIL_WAVES * min(grid, sms or grid), cost.__getitem__)
    if grid >= len(order):
        return [[t] for t in order]
    rows: list[list[int]] = [[] for _ in range(grid)]
    free = [(0.0, c) for c in range(grid)]  # (predicted finish in KV-block units, CTA)
    for t in order:
        at, c = heapq.heappop(free)
        rows[c].append(t)
        heapq.heappush(free, (at + cost[t % num_m], c))
    return rows


def as_table(rows: list[list[int]]) -> list[list[int]]:
    """Rows padded with -1 to one common length + 1 (every row ends in -1: the kernel's stop)."""
    width = max(len(r) for r in rows) + 1
    return [r + [-1] * (width - len(r)) for r in rows]
