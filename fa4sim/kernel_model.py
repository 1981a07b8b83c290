"""Whole-kernel model: batch x heads x Q tiles over the SMs, waves and tail, L2/HBM check.

A work unit is one CTA tile: `rows_per_cta` query rows of one (batch, head) against its KV
blocks (a CTA pair takes twice the rows on two SMs); the last tile of a length may have fewer
rows (a schedule may then run it with fewer warpgroups). Non-causal units have equal KV blocks,
causal ones up to the diagonal. A persistent kernel hands the units, in its order, to the slot
predicted free first (fa4kernel's host tile schedule; equal units thus go round-robin); a
kernel that is not persistent launches one CTA per tile and the hardware hands each to the
first SM that frees up. A slot's time is its first tile alone (T1) plus, per
further tile, what one more tile costs a persistent CTA (T2 - T1, prologue overlapped), after
the launch's cold start (the first wave's first loads from HBM). The order of the tiles is the
kernel's own (tile_order.py).
Tiles of one kind do not all take the same cycles (the profile's tile_jitter_q_loads, measured
from fa4kernel's tile log at 1k tokens: about one Q load's transfer time, not more for longer
tiles). The hardware's block scheduler absorbs most of that: a one-CTA-per-tile launch hands the
next tile to whichever SM frees up. A table fixed on the host before the launch cannot: each
CTA's jitter adds up over its tiles, and the launch ends with the expected slowest CTA, E[max]
over CTAs of load + jitter (expected_max), not the slowest load.
The kernel takes the slowest slot, unless moving its bytes through L2 or HBM takes longer.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from .params import Problem
from .tile_order import host_estimate, host_table, tile_order


@dataclass(frozen=True)
class WorkUnit:
    n_kv: int            # KV blocks this tile visits
    masked: int          # of which need masking (diagonal or a partial last block)
    rows: int = 0        # query rows with data (the last tile of a length may be partial); 0 = all


@dataclass(frozen=True)
class SeqUnit(WorkUnit):
    """A work unit of a varlen or split-KV launch: which sequence of the packed batch, and which
    chunk of its Q tile's KV blocks (0: the only one without splits); zero_rows: the key rows of
    its first block (the last, where the tile starts) past the sequence's keys, where it holds the
    sequence's last block (a build that zeroes V there pays for them: fa4kernel)."""
    split: int = 0
    seq: int = 0
    zero_rows: int = 0


def work_units(p: Problem, rows: int, tile_n: int, pack: int = 1) -> list[WorkUnit]:
    """One (batch, head)'s Q tiles; the caller multiplies by batch*heads.

    pack > 1 (flash-attn-4's pack_gqa, pack = the q heads per K/V head): one (batch, K/V head)'s
    tiles, whose rows are the group's q heads of each token in turn (row r: token r // pack, q
    head r % pack), so a tile of `rows` rows holds rows / pack tokens of every q head of the
    group; the caller multiplies by batch*heads_kv. Its KV blocks are those of its tokens."""
    out = []
    offset = p.seqlen_k - p.seqlen_q  # causal is bottom-right aligned (flash_attn convention)
    for m0 in range(0, p.seqlen_q * pack, rows):
        r_first, r_last = m0, min(m0 + rows, p.seqlen_q * pack) - 1
        t_first, t_last = r_first // pack, r_last // pack  # the tokens of its first and last rows
        if p.causal:
            keys = min(p.seqlen_k, t_last + 1 + offset)
            n_kv = max(1, math.ceil(keys / tile_n))
            full = max(0, min(p.seqlen_k, t_first + 1 + offset)) // tile_n  # blocks no row masks
            masked = max(1, n_kv - full) if keys > 0 else 1
        else:
            n_kv = math.ceil(p.seqlen_k / tile_n)
            masked = 1 if p.seqlen_k % tile_n else 0
        out.append(WorkUnit(n_kv, masked, r_last - r_first + 1))
    return out


def launch_heads(p: Problem, pack: int = 1) -> tuple[int, int]:
    """(the launch's (batch, head) pairs, how many of them share one K/V head): one pair per q
    head, pack-many q heads sharing each; with pack (= heads_per_kv, packed GQA) one per K/V
    head. The pairs of one K/V head are adjacent: hb // share is its (batch, K/V head)."""
    return p.batch * p.heads // pack, p.heads_per_kv // pack


@dataclass
class KernelTime:
    cycles: float            # slowest slot, in cycles
    slots: int               # concurrent CTAs (or CTA pairs)
    units: int               # work units in all
    waves: float             # units / slots
    tiles_on_slowest: int
    cold_start_us: float     # the first wave's Q and first K/V blocks from HBM, before any loop
    compute_us: float
    l2_us: float
    hbm_us: float
    l2_bytes: float
    hbm_bytes: float
    time_us: float
    limiter: str             # "compute", "L2" or "HBM"
    jitter_cycles: float = 0.0  # expected slowest CTA beyond the slowest load (a host-fixed table)


def _erf(x):
    """erf of a numpy array (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7)."""
    import numpy as np  # here, not at the top: only a host-fixed tile table needs it (importing it takes long)
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-z * z))


def expected_max(loads: list[float], sigmas: list[float], points: int = 512) -> float:
    """E[max_c (loads[c] + sigmas[c] * Z_c)], Z_c independent standard normals: when the
    slowest of several CTAs finishes if each one's time varies independently around its load.
    Deterministic: the integral of 1 - prod_c Phi((x - load_c) / sigma_c) on a grid (cycles)."""
    import numpy as np  # see _erf
    mu = np.asarray(loads, dtype=float)
    sd = np.asarray(sigmas, dtype=float)
    if not sd.any():
        return float(mu.max())
    live = sd > 0
    # below lo the max is (almost) never: the slowest load alone exceeds lo with probability
    # 1 - 1e-15, and a CTA without jitter always takes its load
    lo = max(mu.max() - 8.0 * sd.max(), mu[~live].max(initial=-np.inf))
    hi = float((mu + 8.0 * sd).max())
    x = np.linspace(lo, hi, points)
    cdf = np.prod(0.5 * (1.0 + _erf((x[:, None] - mu[live]) / (sd[live] * math.sqrt(2.0)))), axis=1)
    above = 1.0 - cdf
    return float(lo + (above[1:] + above[:-1]).sum() * (x[1] - x[0]) / 2.0)  # trapezoid rule


def assign(costs: list[tuple[float, float]], slots: int, persistent: bool = True,
           cta_launch: float = 0.0, start: float = 0.0) -> tuple[float, int]:
    """(T1, further-tile cost) per unit, in the order the kernel hands them out (tile_order.py)
    -> (slowest slot's cycles, tiles on it).

    persistent: a CTA per slot loops over tiles, so a further tile costs T2 - T1 (its prologue
    overlaps the previous epilogue); each tile in turn goes to the slot predicted free first
    (fa4kernel's host tile schedule, fa4kernel/tile_schedule.py, does this list scheduling
    before the launch; equal tiles thus go round-robin, as a static scheduler would).
    Not persistent: one CTA per tile, launched in order onto whichever SM frees up first, each
    paying its whole T1 and, after the first on its SM, the CTA turnover `cta_launch`.
    start: cycles every slot waits before its first tile (the first wave's cold start).
    """
    slots = max(1, min(slots, len(costs)))
    heap = [(start, i, 0) for i in range(slots)]
    for t1, extra in costs:
        load, i, n = heapq.heappop(heap)
        step = (extra if n else t1) if persistent else t1 + (cta_launch if n else 0.0)
        heapq.heappush(heap, (load + step, i, n + 1))
    load, _, n = max(heap)
    return load, n


def cold_start_bytes(p: Problem, first_wave: list[tuple[int, WorkUnit]], rows: int, tile_n: int,
                     elem_bytes: int = 2, share: int = 1) -> float:
    """Bytes the first wave needs from HBM before any tile can start its loop: every tile's Q
    and the first K and V block it reads (the kernel walks a tile's KV blocks from its last, the
    causal diagonal, down), each (K/V head, block) once (share: launch heads per K/V head).
    Nothing is in L2 yet when the launch starts."""
    d = p.hdim
    q = sum((u.rows or rows) for _, u in first_wave) * d * elem_bytes
    kv = len({(hb // share, u.n_kv - 1) for hb, u in first_wave}) * 2 * tile_n * d * elem_bytes
    return q + kv


def traffic(p: Problem, hw, units: list[WorkUnit], tile_n: int, two_cta: bool,
            tiles: list[tuple[int, int]] | None = None, slots: int = 0,
            elem_bytes: int = 2, pack: int = 1) -> tuple[float, float]:
    """(bytes from L2 into SMs, bytes from HBM) for the whole problem.

    Every tile loads its Q and its KV blocks from L2 (a CTA pair loads each K/V block once for
    both SMs). HBM sees Q and O once, and K/V once per wave that needs them and does not find
    them in L2 (kv_hbm_reads), by K/V head: the tiles of q heads sharing a K/V head (GQA) that
    run in one wave read its blocks once. pack: launch_heads.
    """
    bh, share = launch_heads(p, pack)
    kv_block = tile_n * (p.hdim + p.hdim_v) * elem_bytes  # one K and one V block
    # a unit is one CTA's tile, or one CTA pair's (its rows span both SMs): it loads its blocks once
    kv_per_unit = sum(u.n_kv for u in units) * kv_block
    l2 = bh * (p.seqlen_q * pack * p.hdim * elem_bytes + kv_per_unit)
    if tiles is None:  # blockIdx order, one CTA per SM
        tiles = [(hb, m) for hb in range(bh) for m in range(len(units))]
    if share > 1:
        tiles = [(hb // share, m) for hb, m in tiles]
    kv = kv_hbm_reads(tiles, [u.n_kv for u in units], kv_block, hw.l2_bytes, slots or hw.num_sms)
    return l2, p.batch * p.heads * p.seqlen_q * (p.hdim + p.hdim_v) * elem_bytes + kv


def kv_hbm_reads(tiles: list[tuple[int, int]], n_kv: list[int], kv_block: float, l2_bytes: float,
                 slots: int) -> float:
    """Bytes of K/V read from HBM when `tiles` (hb, m) run `slots` at a time, in that order; hb
    names the K/V head a tile reads (GQA: its q head's).

    The tiles of one head that run together walk its K/V blocks in the same order within a few
    blocks of each other, so a wave reads each of its heads' blocks from HBM once, however many
    of the head's tiles it holds. A later wave finds a head's blocks still in L2 if they were
    used recently enough: L2 keeps the most recently streamed heads, up to its size (LRU by
    head). Bytes: kv_block per K and V block pair.
    """
    resident: dict[int, float] = {}  # hb -> bytes of its K/V in L2, least recent first
    hbm = 0.0
    for w in range(0, len(tiles), max(1, slots)):
        wave: dict[int, float] = {}
        for hb, m in tiles[w:w + slots]:
            wave[hb] = max(wave.get(hb, 0.0), n_kv[m] * kv_block)
        for hb, need in wave.items():
            held = resident.pop(hb, 0.0)
            hbm += max(0.0, need - held)
            resident[hb] = max(need, held)
        while sum(resident.values()) > l2_bytes and len(resident) > 1:
            resident.pop(next(iter(resident)))
    return hbm


def _kernel_time(hw, cycles: float, slots: int, n_units: int, n_tiles, cold_cycles: float, l2_b: float,
                 hbm_b: float, jitter: float) -> "KernelTime":
    """A launch's time from its compute cycles and its L2 and HBM bytes: the slowest of the three
    (each at its bandwidth), plus the launch gap."""
    compute_us = cycles / (hw.clock_ghz * 1e3)
    l2_us = l2_b / (hw.l2_bandwidth_tbps * 1e6)
    hbm_us = hbm_b / (hw.hbm_bandwidth_tbps * 1e6)
    body = max(compute_us, l2_us, hbm_us)
    limiter = "compute" if body == compute_us else ("L2" if body == l2_us else "HBM")
    return KernelTime(cycles, min(slots, n_units), n_units, n_units / slots, n_tiles,
                      cold_cycles / (hw.clock_ghz * 1e3), compute_us, l2_us, hbm_us, l2_b, hbm_b,
                      body + hw.launch_gap_us, limiter, jitter)


def kernel_time(p: Problem, hw, units: list[WorkUnit], cost_of, tile_n: int,
                two_cta: bool, persistent: bool = True, order: str = "lpt", rows: int = 0,
                cluster: int = 1, pack: int = 1) -> KernelTime:
    """cost_of(WorkUnit) -> (T1, T2 - T1) in cycles; order: tile_order.ORDERS; rows: a full
    unit's query rows (for the cold start's Q bytes); cluster: units launched together (a
    backward's 2-CTA clusters: tile_order's tail_lpt keeps them side by side); pack: the q heads
    one tile packs (launch_heads; the units are then one (batch, K/V head)'s).

    The launch starts cold: the first wave's Q tiles and first K/V blocks all come from HBM at
    once (measured per CTA with fa4kernel's CTA log: the first CTA on every SM takes 3-13k cycles
    longer than the same tile later, in proportion to 1 / HBM bandwidth between H100 and H200;
    lab/campaigns/launch-jitter/cta_log_*), so every slot starts after cold_start_bytes / HBM bandwidth.
    """
    n_hb, share = launch_heads(p, pack)
    costs = [cost_of(u) for u in units]
    kv_head = p.seqlen_k * (p.hdim + p.hdim_v) * 2  # one head's K and V, bf16
    slots = hw.num_sms // (2 if two_cta else 1)
    tiles = tile_order(order, n_hb, [c[0] for c in costs], kv_head, hw.l2_bytes, slots,
                       sorted_launch=persistent or p.causal, cluster=cluster, causal=p.causal)
    rows = rows or max(u.rows for u in units)
    wave = [(hb, units[m]) for hb, m in tiles[:slots]]
    cold_cycles = cold_start_bytes(p, wave, rows, tile_n, share=share) / (hw.hbm_bandwidth_tbps * 1e12) * hw.clock_ghz * 1e9
    if persistent and order == "fa4kernel":
        # the host fixed each CTA's tiles before the launch, by its own estimate
        wgs = max(1, rows // 64)
        est = [host_estimate(u.n_kv, wgs, -(-(u.rows or rows) // 64)) for u in units]
        table = host_table(tiles, est, slots)
        loads = [cold_cycles + costs[tiles[r[0]][1]][0] + sum(costs[tiles[i][1]][1] for i in r[1:]) for r in table]
        slowest = max(range(len(table)), key=loads.__getitem__)
        n_tiles = len(table[slowest])
        # each tile's own jitter, independent from tile to tile, adds up over a CTA's row
        sigma = hw.tile_jitter_q_loads * rows * p.hdim * 2 / hw.tma_bytes_per_clk
        cycles = expected_max(loads, [sigma * math.sqrt(len(r)) for r in table])
        jitter = cycles - loads[slowest]
    else:
        cycles, n_tiles = assign([costs[m] for _, m in tiles], slots, persistent, hw.cta_launch_cycles, cold_cycles)
        jitter = 0.0
    l2_b, hbm_b = traffic(p, hw, units, tile_n, two_cta, [(hb, m) for hb, m in tiles], slots, pack=pack)
    return _kernel_time(hw, cycles, slots, len(tiles), n_tiles, cold_cycles, l2_b, hbm_b, jitter)


# ---- split-KV and varlen: launches whose tiles differ by sequence or KV chunk --------------------

def split_units(units: list[WorkUnit], num_splits: int) -> list[SeqUnit]:
    """Each Q tile's KV blocks in num_splits chunks, as FlashAttention's split-KV divides them
    (BlockInfo.get_n_block_min_max: ceil(blocks / num_splits) per chunk, chunk i from the first
    block up); the masked blocks (the causal diagonal, a partial last block) are the last ones, in
    the last chunks. A chunk with no block is no work unit (its CTA exits at once)."""
    if num_splits <= 1:
        return [u if isinstance(u, SeqUnit) else SeqUnit(u.n_kv, u.masked, u.rows) for u in units]
    out = []
    for u in units:
        per = -(-u.n_kv // num_splits)
        for i in range(num_splits):
            lo, hi = i * per, min((i + 1) * per, u.n_kv)
            if hi <= lo:
                continue
            masked = max(0, min(hi, u.n_kv) - max(lo, u.n_kv - u.masked))
            zero = getattr(u, "zero_rows", 0) if hi == u.n_kv else 0  # the chunk with the tile's last block
            out.append(SeqUnit(hi - lo, masked, u.rows, i, getattr(u, "seq", 0), zero))
    return out


def varlen_units(p: Problem, rows: int, tile_n: int, pack: int = 1, num_splits: int = 1) -> list[SeqUnit]:
    """Every sequence's Q tiles (each sequence its own causal diagonal), then split-KV chunks; the
    caller multiplies by the launch heads of one sequence (heads / pack)."""
    out = []
    for s, (q, k) in enumerate(p.sequences):
        one = Problem(1, p.heads, q, k, p.hdim, p.causal, p.hdim_v, p.heads_kv)
        out += [SeqUnit(u.n_kv, u.masked, u.rows, 0, s, past_keys(u.n_kv, k, tile_n))
                for u in work_units(one, rows, tile_n, pack)]
    return split_units(out, num_splits)


def past_keys(n_kv: int, keys: int, tile_n: int) -> int:
    """Rows of a tile's last KV block past the sequence's `keys` when that block is the sequence's
    last (0 otherwise): what fa4kernel's varlen and decode builds zero in V."""
    return n_kv * tile_n - keys if (n_kv - 1) * tile_n <= keys < n_kv * tile_n else 0


def decoder_order(units: list[WorkUnit], n_h: int, lpt: bool, kv_block: float, tile_m: int, tile_n: int,
                  pack: int = 1) -> list[tuple[int, int]]:
    """(g, m) tiles of a varlen or split launch in flash-attn-4's VarlenDecoder order
    (tile_scheduler.py, ported from FlashAttention-3's varlen scheduler), g = seq * n_h + launch head:
    sequences in the given order; within one, without a causal mask heads outer, each head's splits,
    Q tiles ascending; with one (lpt) sections of 16/8/4/2/1 heads whose KV blocks (estimated from
    the query length, as its code does) fit in 50 MiB, Q tiles from the last (longest) down, heads
    inner."""
    by_seq: dict[int, list[int]] = {}
    for m, u in enumerate(units):
        by_seq.setdefault(u.seq, []).append(m)
    max_blocks = (50 * 1024 * 1024) // max(1, int(kv_block))
    out = []
    for s in sorted(by_seq):
        ms = by_seq[s]
        if not lpt:
            out += [(s * n_h + h, m) for h in range(n_h) for m in sorted(ms, key=lambda m: (units[m].split, m))]
            continue
        tile_of, t = {}, -1
        for m in ms:  # a sequence's units: its Q tiles in turn, each tile's chunks together
            t += units[m].split == 0
            tile_of[m] = t
        n_blocks = (t + 1) * tile_m // max(1, pack) // tile_n
        per = min(next((c for c in (16, 8, 4, 2) if n_blocks * c <= max_blocks), 1), n_h)
        order = sorted(ms, key=lambda m: (-tile_of[m], units[m].split))  # Q tiles from the last down
        for h0 in range(0, n_h, per):
            out += [(s * n_h + h, m) for m in order for h in range(h0, min(h0 + per, n_h))]
    return out


def sequence_order(units: list[SeqUnit], n_h: int, causal: bool) -> list[tuple[int, int]]:
    """(g, m) tiles of fa4kernel's varlen build in the order its CTAs count them (sm90/fwd.py
    _varlen_seek, _varlen_coords): sequence by sequence; without a mask heads in turn, each
    head's Q tiles fastest; with a causal mask the Q tiles from the last (the longest) down, the
    sequence's heads inner. Persistent CTAs take them in this order as they free up (its tile
    counter), else one CTA per tile."""
    by_seq: dict[int, list[int]] = {}
    for m, u in enumerate(units):
        by_seq.setdefault(u.seq, []).append(m)
    if causal:
        return [(s * n_h + h, m) for s in sorted(by_seq) for m in reversed(by_seq[s]) for h in range(n_h)]
    return [(s * n_h + h, m) for s in sorted(by_seq) for h in range(n_h) for m in by_seq[s]]


def kernel_time_tiles(p: Problem, hw, units: list[WorkUnit], tiles: list[tuple[int, int]], cost_of, tile_n: int,
                      two_cta: bool, persistent: bool, rows: int, share: int, extra_hbm: float = 0.0,
                      cold_bytes=None) -> KernelTime:
    """kernel_time for a launch given as its tiles in launch order: (g, m), g a launch head of
    one sequence (g // share its K/V head), m an index into `units` (varlen: every sequence's Q
    tiles; split-KV: every chunk). A persistent launch hands each tile to the CTA predicted free
    first (a dynamic scheduler, or fa4kernel's varlen build's tile counter, does the same), else
    one CTA per tile. K/V come from HBM once per (sequence, K/V head, chunk) per wave that does
    not find them in L2 (kv_hbm_reads); Q and O once (extra_hbm: what else the launch writes,
    split-KV's fp32 partial O and LSE). m = -1: an empty CTA (the varlen backward's grid), which
    costs its launch on the SM it takes. cold_bytes: the first wave's [(g, unit)] -> its bytes
    from HBM before any loop (default: every tile's Q rows and the first K/V block of each (K/V
    head, chunk, sequence) it holds)."""
    costs = [cost_of(u) for u in units]
    slots = hw.num_sms // (2 if two_cta else 1)
    d = p.hdim
    kv_block = tile_n * (p.hdim + p.hdim_v) * 2
    launched = [(0.0, 0.0) if m < 0 else costs[m] for _, m in tiles]
    tiles = [(g, m) for g, m in tiles if m >= 0]
    wave = tiles[:slots]
    if cold_bytes is None:
        first = {(g // share, units[m].split, units[m].seq) for g, m in wave}
        cold = sum((units[m].rows or rows) for _, m in wave) * d * 2 + len(first) * kv_block
    else:
        cold = cold_bytes([(g, units[m]) for g, m in wave])
    cold_cycles = cold / (hw.hbm_bandwidth_tbps * 1e12) * hw.clock_ghz * 1e9
    cycles, n_tiles = assign(launched, slots, persistent, hw.cta_launch_cycles, cold_cycles)
    l2_b = sum((units[m].rows or rows) * d * 2 + units[m].n_kv * kv_block for _, m in tiles)
    keyed = [((g // share, units[m].split), m) for g, m in tiles]  # g already carries the sequence
    kv = kv_hbm_reads(keyed, [u.n_kv for u in units], kv_block, hw.l2_bytes, slots)
    q_o = sum(q for q, _ in p.sequences) * p.heads * (p.hdim + p.hdim_v) * 2
    hbm_b = q_o + kv + extra_hbm
    return _kernel_time(hw, cycles, slots, len(tiles), n_tiles, cold_cycles, l2_b, hbm_b, 0.0)
