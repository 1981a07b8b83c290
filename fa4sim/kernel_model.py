"""Whole-kernel model: batch x heads x Q tiles over the SMs, waves and tail, L2/HBM check.

A work unit is one CTA tile: `rows_per_cta` query rows of one (batch, head) against its KV
blocks (a CTA pair takes twice the rows on two SMs); the last tile of a length may have fewer
rows (a schedule may then run it with fewer warpgroups). Non-causal units have equal KV blocks,
causal ones up to the diagonal. A persistent kernel hands the units costliest first to the slot
predicted free first (FA4's LPT scheduler, fa4kernel's host tile schedule; equal units thus go
round-robin); a kernel that is not persistent launches one CTA per tile and the hardware hands
each to the first SM that frees up. A slot's time is its first tile alone (T1) plus, per
further tile, what one more tile costs a persistent CTA (T2 - T1, prologue overlapped).
The kernel takes the slowest slot, unless moving its bytes through L2 or HBM takes longer.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from .params import Problem


@dataclass(frozen=True)
class WorkUnit:
    n_kv: int            # KV blocks this tile visits
    masked: int          # of which need masking (diagonal or a partial last block)
    rows: int = 0        # query rows with data (the last tile of a length may be partial); 0 = all


def work_units(p: Problem, rows: int, tile_n: int) -> list[WorkUnit]:
    """One (batch, head)'s Q tiles; the caller multiplies by batch*heads."""
    out = []
    offset = p.seqlen_k - p.seqlen_q  # causal is bottom-right aligned (flash_attn convention)
    for m0 in range(0, p.seqlen_q, rows):
        r_first, r_last = m0, min(m0 + rows, p.seqlen_q) - 1
        if p.causal:
            keys = min(p.seqlen_k, r_last + 1 + offset)
            n_kv = max(1, math.ceil(keys / tile_n))
            full = max(0, min(p.seqlen_k, r_first + 1 + offset)) // tile_n  # blocks no row masks
            masked = max(1, n_kv - full) if keys > 0 else 1
        else:
            n_kv = math.ceil(p.seqlen_k / tile_n)
            masked = 1 if p.seqlen_k % tile_n else 0
        out.append(WorkUnit(n_kv, masked, r_last - r_first + 1))
    return out


@dataclass
class KernelTime:
    cycles: float            # slowest slot, in cycles
    slots: int               # concurrent CTAs (or CTA pairs)
    units: int               # work units in all
    waves: float             # units / slots
    tiles_on_slowest: int
    compute_us: float
    l2_us: float
    hbm_us: float
    l2_bytes: float
    hbm_bytes: float
    time_us: float
    limiter: str             # "compute", "L2" or "HBM"


def assign(costs: list[tuple[float, float]], slots: int, causal: bool, persistent: bool = True,
           cta_launch: float = 0.0) -> tuple[float, int]:
    """(T1, further-tile cost) per unit -> (slowest slot's cycles, tiles on it).

    persistent: a CTA per slot loops over tiles, so a further tile costs T2 - T1 (its prologue
    overlaps the previous epilogue); tiles go costliest first, each to the slot predicted free
    first (fa4kernel's host tile schedule, fa4kernel/tile_schedule.py, does this list
    scheduling before the launch; equal tiles thus go round-robin, as a static scheduler would).
    Not persistent: one CTA per tile, launched in order (causal: longest first) onto whichever
    SM frees up first, each paying its whole T1 and, after the first on its SM, the CTA turnover
    `cta_launch`.
    """
    slots = max(1, min(slots, len(costs)))
    heap = [(0.0, i, 0) for i in range(slots)]
    if not persistent:
        for t1, _ in (sorted(costs, key=lambda c: -c[0]) if causal else costs):
            load, i, n = heapq.heappop(heap)
            heapq.heappush(heap, (load + t1 + (cta_launch if n else 0.0), i, n + 1))
    else:
        for t1, extra in sorted(costs, key=lambda c: -c[0]):
            load, i, n = heapq.heappop(heap)
            heapq.heappush(heap, (load + (extra if n else t1), i, n + 1))
    load, _, n = max(heap)
    return load, n


def traffic(p: Problem, hw, units: list[WorkUnit], tile_n: int, two_cta: bool,
            elem_bytes: int = 2) -> tuple[float, float]:
    """(bytes from L2 into SMs, bytes from HBM) for the whole problem.

    Every tile loads its Q and its KV blocks from L2 (a CTA pair loads each K/V block once for
    both SMs). HBM sees each tensor once, plus K/V re-reads when the K/V of the heads in flight
    do not fit in L2.
    """
    bh = p.batch * p.heads
    d = p.hdim
    kv_per_unit = sum(u.n_kv for u in units) * tile_n * d * elem_bytes * 2 / (2 if two_cta else 1)
    l2 = bh * (p.seqlen_q * d * elem_bytes + kv_per_unit)
    unique = bh * d * elem_bytes * (2 * p.seqlen_q + 2 * p.seqlen_k)  # Q, O, K, V once
    heads_in_flight = min(bh, math.ceil(hw.num_sms / max(1, len(units))) + 1)
    working_set = heads_in_flight * 2 * p.seqlen_k * d * elem_bytes
    hit = min(1.0, hw.l2_bytes / max(working_set, 1.0))
    hbm = unique + max(0.0, l2 - unique) * (1.0 - hit)
    return l2, hbm


def kernel_time(p: Problem, hw, units: list[WorkUnit], cost_of, tile_n: int,
                two_cta: bool, persistent: bool = True) -> KernelTime:
    """cost_of(WorkUnit) -> (T1, T2 - T1) in cycles."""
    per_head = [cost_of(u) for u in units]
    all_costs = per_head * (p.batch * p.heads)
    slots = hw.num_sms // (2 if two_cta else 1)
    cycles, n_tiles = assign(all_costs, slots, p.causal, persistent, hw.cta_launch_cycles)
    compute_us = cycles / (hw.clock_ghz * 1e3)
    l2_b, hbm_b = traffic(p, hw, units, tile_n, two_cta)
    l2_us = l2_b / (hw.l2_bandwidth_tbps * 1e6)
    hbm_us = hbm_b / (hw.hbm_bandwidth_tbps * 1e6)
    body = max(compute_us, l2_us, hbm_us)
    limiter = "compute" if body == compute_us else ("L2" if body == l2_us else "HBM")
    return KernelTime(cycles, min(slots, len(all_costs)), len(all_costs), len(all_costs) / slots,
                      n_tiles, compute_us, l2_us, hbm_us, l2_b, hbm_b, body + hw.launch_gap_us, limiter)
