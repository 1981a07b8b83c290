"""The order in which a kernel hands out its Q tiles: which tiles run together, which run last.

Which tiles run at the same time decides what the first wave loads from HBM (kernel_model's
cold start) and which K/V blocks hit L2; the order decides the tail. A tile is (hb, m): the
(batch * heads + head) pair and its Q tile index; cost[m] is one head's tile costs (cycles).
Orders (the fa3 schedule's knob `tile_order`):

  lpt           costliest first over all tiles, as an ideal scheduler would (causal or persistent
                launches; others in launch-index order)
  fa4kernel     fa4kernel's host table (fa4kernel/tile_schedule.py) for causal or persistent
                launches: heads grouped into sections whose K + V fit in a sixteenth of L2,
                costliest first within a section (equal costs head by head), the last section at
                least 2 waves long; otherwise launch-index order
  flash-attn-4  flash-attn-4 SM90's SingleTileLPTScheduler for causal launches: sections of 2^k
                heads whose K + V fit in 50 MiB, Q tiles from the last (longest) down, heads inner;
                otherwise launch-index order (SingleTileScheduler)
  index         blockIdx order: head by head, m ascending
  sequence      fa4kernel's varlen build (sm90/fwd.py _varlen_seek): the batch's tiles counted on
                the device sequence by sequence, heads in turn, each head's Q tiles fastest (with a
                causal mask the Q tiles from the last, the longest, down, the sequence's heads
                inner); persistent CTAs take them in that order as they free up (its tile
                counter), else one CTA per tile (kernel_model.sequence_order)
  tail_lpt      fa4kernel's SM90 backward with a causal mask (grid_order "tail_lpt"): blockIdx order,
                but the last heads, at least TAIL_WAVES waves of clusters, go unit by unit across
                them (m ascending: the longest causal KV tile first), the `cluster` units of one
                cluster together; otherwise blockIdx order

A persistent fa4kernel launch also fixes, before it starts, which CTA runs which tiles: list
scheduling in that order by the host's own cost estimate (host_table), not by what the tiles
will really cost; at hd256 that estimate is off and the table unbalanced, which the model keeps.

This module knows tile costs and head sizes, nothing about how a tile runs.
"""
from __future__ import annotations

import heapq

ORDERS = ("fa4kernel", "flash-attn-4", "lpt", "index", "sequence", "tail_lpt")
SECTION_FRACTION_OF_L2 = 16   # fa4kernel: section = L2 / 16 of K + V
TAIL_WAVES = 2                # fa4kernel: the last section holds >= 2 waves of tiles (the
                              # backward's tail_lpt: its last heads >= 2 waves of clusters)
FA4_SECTION_BYTES = 50 * 1024 * 1024  # flash-attn-4: heads per section = 2^floor(log2(50 MiB / head))
# fa4kernel's host estimate of a tile (fa4kernel/tile_schedule.py: tile_cost, TILE_OVERHEAD_BLOCKS,
# LIVE_WG_COST; tests/test_sim_tile_order.py checks these against it): KV blocks x the share of a
# tile whose consumer warpgroups are not all live, plus 0.8 blocks of fixed cost
HOST_TILE_OVERHEAD_BLOCKS = 0.8
HOST_LIVE_WG_COST = {(3, 1): 0.60, (3, 2): 0.82, (2, 1): 0.75}


def host_estimate(n_kv: int, wgs: int, live: int) -> float:
    """fa4kernel's host estimate of one tile, in KV blocks."""
    share = 1.0 if live >= wgs else HOST_LIVE_WG_COST.get((wgs, live), live / wgs)
    return n_kv * share + HOST_TILE_OVERHEAD_BLOCKS


def host_table(tiles: list[tuple[int, int]], estimate: list[float], ctas: int) -> list[list[int]]:
    """fa4kernel's persistent table: the tiles in order, each to the CTA whose estimated finish
    is earliest; returns each CTA's positions into `tiles`."""
    rows: list[list[int]] = [[] for _ in range(max(1, ctas))]
    free = [(0.0, c) for c in range(len(rows))]
    for i, (_, m) in enumerate(tiles):
        at, c = heapq.heappop(free)
        rows[c].append(i)
        heapq.heappush(free, (at + estimate[m], c))
    return [r for r in rows if r]


def _sections(n_hb: int, per: int) -> list[list[int]]:
    per = max(1, min(per, n_hb))
    return [list(range(first, min(first + per, n_hb))) for first in range(0, n_hb, per)]


def tail_heads(units_per_head: int, n_hb: int, slots: int) -> int:
    """tail_lpt: how many of the n_hb heads end the launch unit by unit: TAIL_WAVES waves of the
    `slots` clusters that run at once, at least 1, at most all (fa4kernel/sm90/bwd_config.py
    tail_heads, for the SMs of the profile)."""
    return min(n_hb, max(1, -(-TAIL_WAVES * slots // max(1, units_per_head))))


def tile_order(kind: str, n_hb: int, cost: list[float], kv_bytes_per_head: float, l2_bytes: float,
               slots: int, sorted_launch: bool, cluster: int = 1, causal: bool = False) -> list[tuple[int, int]]:
    """All (hb, m) tiles in the order the kernel hands them out. sorted_launch: the launch
    takes a cost-ordered schedule (causal, or persistent CTAs); else blockIdx order. cluster:
    units per cluster (tail_lpt), `slots` counting SMs. causal: the launch has a causal mask
    (sequence: each head's tiles from the last down)."""
    if kind not in ORDERS:
        raise ValueError(f"tile_order={kind!r}; allowed: {', '.join(ORDERS)}")
    num_m = len(cost)
    if kind == "sequence":  # the order the CTAs count the tiles in, whatever the launch
        ms = list(range(num_m - 1, -1, -1)) if causal else list(range(num_m))
        return [(hb, m) for hb in range(n_hb) for m in ms]
    if kind == "index" or not sorted_launch:
        return [(hb, m) for hb in range(n_hb) for m in range(num_m)]
    if kind == "tail_lpt":
        tail = tail_heads(num_m // cluster, n_hb, slots // cluster)
        head = [(hb, m) for hb in range(n_hb - tail) for m in range(num_m)]
        return head + [(hb, j * cluster + r) for j in range(num_m // cluster)
                       for hb in range(n_hb - tail, n_hb) for r in range(cluster)]
    if kind == "lpt":
        return sorted(((hb, m) for hb in range(n_hb) for m in range(num_m)), key=lambda t: (-cost[t[1]], t[0], -t[1]))
    if kind == "fa4kernel":
        per = int(l2_bytes // SECTION_FRACTION_OF_L2 // max(kv_bytes_per_head, 1))
        sections = _sections(n_hb, per)
        while len(sections) > 1 and len(sections[-1]) * num_m < TAIL_WAVES * slots:
            last = sections.pop()
            sections[-1] += last
        key = lambda t: (-cost[t[1]], t[0], -t[1])  # noqa: E731
    else:  # flash-attn-4: block index reversed (longest causal tile first), heads inner
        fit = int(FA4_SECTION_BYTES // max(kv_bytes_per_head, 1))
        sections = _sections(n_hb, 1 << (fit.bit_length() - 1) if fit >= 1 else 1)
        key = lambda t: (-t[1], t[0])  # noqa: E731
    return [t for hbs in sections for t in sorted(((hb, m) for hb in hbs for m in range(num_m)), key=key)]
