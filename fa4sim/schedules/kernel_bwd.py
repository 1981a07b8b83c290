"""The backward's launch: KV tiles over the SMs, its memory traffic, the deterministic dQ order,
and the pre- and post-kernels. Shared by the SM100 and SM90 backward schedules.

A backward CTA (a CTA pair with 2-CTA) owns one KV tile and visits the Q blocks (m_blocks) that
see it: all of them without a mask, from the diagonal down with a causal one (bottom-right
aligned, as flash_attn). fa4sim's kernel model (kernel_model.py) spreads such units over the SMs
as it spreads forward Q tiles, on the transposed problem (keys as rows, Q blocks as blocks);
what differs is counted here: the traffic (Q, dO, LSE and dPsum per visit, K and V once, dQ
reduce-added in fp32 per visit) and, in deterministic mode, the wait of each CTA for the CTAs
before it in the dQ order.

A varlen batch (fa4kernel's varlen build) is one launch of one CTA per (key block, launch head,
sequence) up to the longest sequence's key blocks, in blockIdx order (varlen_grid): each
sequence's units are those of the dense backward of its lengths (varlen_units), a CTA past its
sequence's keys exits at once; its traffic is the sum of the sequences' (traffic_of) and the
varlen preprocess and postprocess kernels around it run over the packed and padded rows
(varlen_passes); its deterministic build's dQ turns are the dense build's, per (sequence, launch
head), in its grid's order (deterministic_grid).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

from ..errors import InputError
from ..kernel_model import KernelTime, WorkUnit
from ..params import Problem


@dataclass(frozen=True)
class KvUnit(WorkUnit):
    """One backward CTA (or CTA pair): n_kv = Q blocks it visits, masked = of which masked,
    rows = its keys; first = its first Q block; rank = its KV tile's index in the head."""

    first: int = 0
    rank: int = 0


@dataclass(frozen=True)
class SeqKvUnit(KvUnit):
    """A KvUnit of a varlen launch: seq = its sequence in the packed batch (split: always 0, the
    chunk kernel_model.kernel_time_tiles keys K/V reads by)."""

    split: int = 0
    seq: int = 0


def sequence(p: Problem, s: int) -> Problem:
    """Sequence s of a varlen batch as a dense problem of its own lengths (batch 1)."""
    q, k = p.sequences[s]
    return Problem(1, p.heads, q, k, p.hdim, p.causal, p.hdim_v, p.heads_kv)


def varlen_units(p: Problem, keys: int, tile_m: int, knobs: dict, units_of) -> tuple[list, list]:
    """(every sequence's units as SeqKvUnits, [(the sequence's dense Problem, its units)] per
    sequence). A sequence's units are the dense backward's of its lengths (units_of(problem, keys,
    tile_m, knobs): kv_units, in 2-CTA clusters with dq_sum "pair"; then grouped): fa4kernel's
    varlen build walks a CTA's (q head, query block) pairs as the dense kernel does, causal
    bottom-right aligned per sequence."""
    out, parts = [], []
    for s in range(len(p.sequences)):
        one = sequence(p, s)
        us = grouped(units_of(one, keys, tile_m, knobs), loops_group(one, knobs))
        parts.append((one, us))
        out += [SeqKvUnit(u.n_kv, u.masked, u.rows, u.first, u.rank, 0, s) for u in us]
    return out, parts


def varlen_grid(units: list, n_h: int, pair: bool, reverse: bool = False) -> list[tuple[int, int]]:
    """(g, m) CTAs of fa4kernel's varlen backward in blockIdx order (x: key block, fastest; y:
    launch head; z: sequence), g = seq * n_h + head, m an index into `units` (varlen_units). x
    runs to the longest sequence's key blocks, rounded up to even with `pair` (dq_sum "pair":
    clusters of 2 adjacent key blocks); m = -1: a CTA whose key block (a pair's first) starts at
    or past its sequence's keys, which exits at once (it costs its launch only). reverse (the
    deterministic build with a causal mask, sm90/bwd.py _cta_work): each sequence's key blocks
    (pairs) last first, its empty CTAs after them."""
    by_seq: dict[int, list[int]] = {}
    for m, u in enumerate(units):
        by_seq.setdefault(u.seq, []).append(m)
    num_x = max(len(ms) for ms in by_seq.values())
    num_x += num_x % 2 if pair else 0
    if reverse:
        c = 2 if pair else 1
        by_seq = {s: [m for i in reversed(range(0, len(ms), c)) for m in ms[i:i + c]] for s, ms in by_seq.items()}
    return [(s * n_h + h, ms[x] if x < len(ms) else -1)
            for s, ms in sorted(by_seq.items()) for h in range(n_h) for x in range(num_x)]


def check_varlen(knobs: dict) -> None:
    """A varlen backward's knobs: fa4kernel's varlen build launches in blockIdx order, with its
    preprocess kernel."""
    if knobs.get("grid_order", "heads_outer") != "heads_outer":
        raise InputError("grid_order", f"{knobs['grid_order']}: the varlen backward launches in blockIdx order; "
                                       f"allowed with a varlen batch: heads_outer")
    if knobs.get("preprocess", "kernel") != "kernel":
        raise InputError("preprocess", f"{knobs['preprocess']}: fa4sim models the varlen backward's preprocess "
                                       f"kernel on the packed rows; allowed with a varlen batch: kernel")


def transposed(p: Problem, knobs: dict | None = None) -> Problem:
    """The problem seen from the keys: the kernel model's rows are keys, its blocks Q blocks, its
    heads the launch's (batch, head) pairs per batch (launch_heads)."""
    return Problem(p.batch, launch_heads(p, knobs) // p.batch, p.seqlen_k, p.seqlen_q, p.hdim, p.causal, p.hdim_v)


def loops_group(p: Problem, knobs: dict | None) -> int:
    """Q heads one CTA walks: the group (heads_per_kv) with grouped K/V heads and knob gqa_dkv
    "loop" (fa4kernel: one CTA per KV tile of a K/V head), else 1."""
    return p.heads_per_kv if p.heads_per_kv > 1 and (knobs or {}).get("gqa_dkv") == "loop" else 1


def reduces_dkv(p: Problem, knobs: dict | None) -> bool:
    """dK and dV reduce-added in fp32 by every q head's CTAs (grouped K/V heads, gqa_dkv "reduce")."""
    return p.heads_per_kv > 1 and loops_group(p, knobs) == 1


def launch_heads(p: Problem, knobs: dict | None = None) -> int:
    """The launch's (batch, head) pairs, each with one set of KV-tile units: q heads, or K/V heads
    where a CTA walks its group's q heads (loops_group)."""
    return p.batch * p.heads // loops_group(p, knobs)


def grouped(units: list, group: int) -> list:
    """A K/V head's units when each CTA walks the Q blocks of `group` q heads in turn (fa4kernel's
    sm90/bwd.py: query blocks fastest, then the q heads of the group): group x the blocks, group x
    the masked ones (each q head's pass crosses the same diagonal)."""
    if group == 1:
        return units
    return [replace(u, n_kv=u.n_kv * group, masked=u.masked * group) for u in units]


def dkv_reduce_cycles(hw, p: Problem, k: dict) -> float:
    """Cycles a CTA's epilogue adds where its dK and dV go out as fp32 bulk reduce-adds
    (reduces_dkv): tile_n x (hdim + hdim_v) x 4 bytes at reduce_bytes_per_clk, in place of the
    16-bit TMA stores the schedule's epilogue models; the CTA ends once they have read its shared
    memory (flash_bwd_sm90.py, flash_bwd_sm100.py: cp_async_bulk_wait_group(0, read=True) between
    dK and dV, which share V's buffer)."""
    if not reduces_dkv(p, k):
        return 0.0
    n = k["tile_n"]
    return n * (p.hdim + p.hdim_v) * (4 / hw.reduce_bytes_per_clk - 2 / hw.tma_bytes_per_clk)


def kv_units(p: Problem, keys: int, tile_m: int, pair: bool = False) -> list[KvUnit]:
    """One (batch, head)'s backward units: KV tiles of `keys` keys, each with the Q blocks of
    tile_m rows that see it (causal: rows i >= key - (seqlen_k - seqlen_q)) and how many of them
    need a mask (the causal diagonal, a partial last Q block, a partial KV tile).

    pair (SM90 dq_sum "pair"): KV tiles in 2-CTA clusters, their count padded to an even one (the
    extra CTA lies past seqlen_k: zero keys, every Q block masked); both CTAs of a cluster walk
    the Q blocks of its first KV tile (causal: the second walks one block more than alone)."""
    offset = p.seqlen_k - p.seqlen_q
    m_total = math.ceil(p.seqlen_q / tile_m)
    starts = list(range(0, p.seqlen_k, keys))
    if pair and len(starts) % 2:
        starts.append(starts[-1] + keys)
    out = []
    for rank, c0 in enumerate(starts):
        c1 = min(c0 + keys, p.seqlen_k) - 1
        lead = c0 - keys if (pair and rank % 2) else c0  # whose Q blocks it walks
        first = max(0, lead - offset) // tile_m if p.causal else 0
        n = m_total - first
        # causal: Q blocks whose first row misses some of the tile's keys (row i sees key j iff
        # j <= i + offset), then a partial last Q block, then a partial KV tile (all of them)
        masked = max(0, min(m_total, -(-(c1 - offset) // tile_m)) - first) if p.causal else 0
        if p.seqlen_q % tile_m and m_total - 1 >= first + masked:
            masked += 1
        if c1 - c0 + 1 < keys:
            masked = n
        out.append(KvUnit(n, min(n, masked), max(c1 - c0 + 1, 0) or keys, first, rank))
    return out


def traffic(p: Problem, hw, units: list[KvUnit], tile_m: int, two_cta: bool,
            knobs: dict | None = None) -> tuple[float, float]:
    """(bytes between L2 and the SMs, bytes to or from HBM) of a backward launch, bf16 inputs.

    Per visit of a Q block a CTA loads Q, dO (a CTA pair once for both SMs), LSE and dPsum, and
    reduce-adds its dQ in fp32 (a pair: one tile for both); per unit K and V come in once and
    dK, dV go out once (grouped K/V heads, reduces_dkv: K and V in per q head, dK and dV
    reduce-added in fp32 per q head). HBM sees Q, K, V, O-sized dO, dK, dV, LSE, dPsum once and the fp32 dQ
    accumulator once, plus the Q-side re-reads when the Q, dO and dQ accumulator of the heads
    in flight do not fit in L2."""
    bh = launch_heads(p, knobs)                    # (batch, head) pairs with one set of units
    q_per = loops_group(p, knobs)                  # q heads one of them walks
    bkv = p.batch * p.heads_kv
    d, dv = p.hdim, p.hdim_v
    visits = sum(u.n_kv for u in units)
    per_visit = tile_m * ((d + dv) * 2 + 8)       # Q + dO, LSE + dPsum
    dq_add = tile_m * d * 4 / _adders(knobs)       # the fp32 reduce-add (a pair: one for both)
    kv = p.seqlen_k * (d + dv) * 2 * 2             # K, V in; dK, dV out, per unit set
    bq = p.batch * p.heads
    kv_unique = kv                                 # per q head: each K/V head's once
    if reduces_dkv(p, knobs):                      # K, V in per q head; dK, dV reduce-added in fp32
        kv = p.seqlen_k * (d + dv) * (2 + 4)
        kv_unique = p.seqlen_k * (d + dv) * (2 + 4 + 4)  # K, V; the accumulators in and out
    if bkv != bq:
        kv_unique = kv_unique * bkv / bq
    l2 = bh * (visits * (per_visit + dq_add) + kv)
    acc = d * 4                                    # the shared accumulator, per row
    unique = bq * (p.seqlen_q * ((d + dv) * 2 + 8 + acc) + kv_unique)
    slots = hw.num_sms // (2 if two_cta else 1)
    heads_in_flight = min(bh, math.ceil(slots / max(1, len(units))) + 1)
    # a CTA walking its group's q heads (loops_group): the CTAs of a K/V head walk them in step
    # without a mask (one q head's Q side in flight), with a causal mask they drift apart (a KV
    # tile near the end sees fewer Q blocks per head and reaches the next head sooner): the group's
    walking = q_per if p.causal else 1
    working_set = heads_in_flight * walking * p.seqlen_q * ((d + dv) * 2 + 8 + acc)
    hit = min(1.0, hw.l2_bytes / max(working_set, 1.0))
    hbm = unique + max(0.0, l2 - unique) * (1.0 - hit)
    return float(l2), float(hbm)


def _adders(knobs: dict | None) -> int:
    """CTAs whose dQ one reduce-add carries: 2 with SM90's dq_sum "pair" (summed in the cluster first)."""
    return 2 if (knobs and knobs.get("dq_sum") == "pair") else 1


def reduce_add_bytes(p: Problem, units: list[KvUnit], tile_m: int, knobs: dict | None = None) -> float:
    """Bytes of the launch's fp32 reduce-adds (part of traffic's L2 bytes): tile_m x head dim
    x 4 per visit of a Q block (half that with dq_sum "pair"); with reduces_dkv also every q
    head's dK and dV, seqlen_k x (hdim + hdim_v) x 4."""
    dkv = p.batch * p.heads * p.seqlen_k * (p.hdim + p.hdim_v) * 4 if reduces_dkv(p, knobs) else 0
    return float(launch_heads(p, knobs) * sum(u.n_kv for u in units) * tile_m * p.hdim * 4 / _adders(knobs) + dkv)


def traffic_of(parts: list, hw, tile_m: int, two_cta: bool, knobs: dict | None = None) -> tuple[float, float, float]:
    """(L2 bytes, HBM bytes, reduce-add bytes) of a launch of `parts`, [(Problem, its units)]: the
    dense launch one part, a varlen batch's each sequence's (varlen_units), summed: each
    sequence's Q side re-read from HBM as its own launch would (traffic)."""
    l2_b = hbm_b = red_b = 0.0
    for p, units in parts:
        l2, hbm = traffic(p, hw, units, tile_m, two_cta, knobs)
        l2_b, hbm_b, red_b = l2_b + l2, hbm_b + hbm, red_b + reduce_add_bytes(p, units, tile_m, knobs)
    return l2_b, hbm_b, red_b


def with_traffic(kt: KernelTime, p: Problem, hw, units: list[KvUnit], tile_m: int, two_cta: bool,
                 cycles: float | None = None, knobs: dict | None = None, parts: list | None = None) -> KernelTime:
    """The launch's KernelTime with the backward's own traffic (and, given, its own cycles);
    parts: a varlen batch's [(sequence, its units)] (traffic_of), in place of (p, units)."""
    cycles = kt.cycles if cycles is None else cycles
    # the L2 serves the fp32 dQ reduce-adds at its reduce-add rate, the rest at its load rate,
    # the two together in l2_mixed_time_fraction of their times alone
    l2_b, hbm_b, red_b = traffic_of(parts or [(p, units)], hw, tile_m, two_cta, knobs)
    compute_us = cycles / (hw.clock_ghz * 1e3)
    l2_us = ((l2_b - red_b) / (hw.l2_bandwidth_tbps * 1e6) + red_b / (hw.l2_reduce_bandwidth_tbps * 1e6)) * (
        hw.l2_mixed_time_fraction if red_b > 0 else 1.0)
    hbm_us = hbm_b / (hw.hbm_bandwidth_tbps * 1e6)
    body = max(compute_us, l2_us, hbm_us)
    limiter = "compute" if body == compute_us else ("L2" if body == l2_us else "HBM")
    return replace(kt, cycles=cycles, compute_us=compute_us, l2_us=l2_us, hbm_us=hbm_us, l2_bytes=l2_b,
                   hbm_bytes=hbm_b, time_us=body + hw.launch_gap_us, limiter=limiter)


def dq_order_wait(hw, dq_bytes: float) -> float:
    """Cycles one CTA holds the deterministic dQ order of a Q block (its critical section): it
    reads the semaphore (an L2 round trip), reduce-adds its dQ tile and waits for the adds to land
    (dq_bytes at the reduce-add rate: one SM's 32 KB bulk reduce-add completes in 1339 cycles on an
    H200, 1280 of them the bytes at reduce_bytes_per_clk, bench_bwd_units.py), and releases the
    semaphore (another L2 round trip); the next CTA in the order sees the release when its own
    read returns (counted in its section)."""
    return 2 * hw.l2_latency + dq_bytes / hw.reduce_bytes_per_clk


def deterministic_cycles(units: list[KvUnit], costs: list[tuple[float, float]], n_hb: int, slots: int,
                         hold: float, start: float, cta_launch: float, causal: bool,
                         copies: int = 1, cluster: int = 1) -> tuple[float, int]:
    """(launch cycles, CTAs on the busiest slot) of a deterministic backward, one CTA per unit,
    heads outer (flash-attn-4 and fa4kernel: the dQ of a Q block added by KV tile index; causal:
    shortest first, from the last KV tile down, dispatched in that order): deterministic_grid of
    that grid, with `copies` of the accumulator (dq_copy)."""
    order = list(range(len(units)))
    if causal:
        order.reverse()
    return deterministic_grid([(hb, m) for hb in range(n_hb) for m in order], units, costs, slots, hold, start,
                              cta_launch, copies, cluster)


def dq_copy(rank: int, units_in_head: int, copies: int, cluster: int = 1) -> int:
    """The accumulator copy the KV tile `rank` of a head adds into (fa4kernel's dq_slices,
    sm90/bwd.py _dq_slice): the head's `units_in_head` tiles in clusters of `cluster` (dq_sum
    "pair": 2), cut into `copies` runs of ceil(clusters / copies); run r adds into copy r, in an
    order of its own."""
    if copies <= 1:
        return 0
    run = max(-(-(-(-units_in_head // cluster)) // copies), 1)
    return rank // cluster // run


def deterministic_grid(grid: list[tuple[int, int]], units: list, costs: list[tuple[float, float]], slots: int,
                       hold: float, start: float, cta_launch: float, copies: int = 1,
                       cluster: int = 1) -> tuple[float, int]:
    """(launch cycles, CTAs on the busiest slot) of a deterministic backward launched as `grid`:
    (g, m) CTAs in dispatch order, m an index into units (-1: a CTA that exits at once, its
    launch only), the CTAs of one g (a launch head of one sequence) in the dQ order of their Q
    blocks, per accumulator copy (dq_copy; one copy: one order per g). A CTA reduces its Q blocks
    at R + j P (R its first reduction, P its cycles per Q block), and may not reduce a Q block
    before the CTA before it in its order has held that block's order for `hold` cycles:
    R >= R_prev + hold - (first Q block both share - its own first) P. A CTA that has to wait runs
    that much longer. CTAs go to the slot that frees first."""
    heap = [(start, i, 0) for i in range(max(1, slots))]
    end, busiest = start, 0
    in_head: dict[int, int] = {}  # g -> its units (a sequence's KV tiles)
    for g, m in grid:
        in_head[g] = in_head.get(g, 0) + (m >= 0)
    prev: dict[tuple, tuple[float, int]] = {}  # (g, copy) -> (R, first Q block) of its previous CTA in the order
    for g, m in grid:
        load, i, n = heapq.heappop(heap)
        begin = load + (cta_launch if n else 0.0)
        if m < 0:
            heapq.heappush(heap, (begin, i, n + 1))
            continue
        u, (t1, _) = units[m], costs[m]
        chain = (g, dq_copy(u.rank, in_head[g], copies, cluster))
        per_block = t1 / max(1, u.n_kv)
        r = begin
        if chain in prev:
            shared = max(prev[chain][1], u.first)
            r = max(r, prev[chain][0] + hold - (shared - u.first) * per_block)
        finish = t1 + r
        prev[chain] = (r, u.first)
        heapq.heappush(heap, (finish, i, n + 1))
        if finish > end:
            end, busiest = finish, n + 1
    return end, busiest


# fa4kernel's launches around its main kernel (sm90/bwd.py run_bwd, bwd_preprocess.py preprocess_torch,
# bwd_postprocess.py dq_postprocess):
# eager torch operations, one kernel each, as (what, bytes read and written per row of one head,
# as a constant + per head-dim element + per head-dim element and dQ slice). Rows are seqlen_q
# rows of each (batch, head) (the padding to tile_m is left out); d = head dim; the last number
# counts per head-dim element of the fp32 dQ accumulator.
TORCH_PRE = (
    ("dpsum = zeros (fp32)", 4, 0, 0),
    ("dout.float()", 0, 2 + 4, 0),
    ("out.float()", 0, 2 + 4, 0),
    ("dout * out (fp32)", 0, 8 + 4, 0),
    (".sum(-1)", 4, 4, 0),
    ("* softmax_scale", 4 + 4, 0, 0),
    ("dpsum[..., :sq] = (copy)", 8, 0, 0),
    ("lse_log2 = full(inf)", 4, 0, 0),
    ("lse == -inf", 4 + 1, 0, 0),
    ("lse * log2(e)", 4 + 4, 0, 0),
    ("where(...)", 1 + 4 + 4, 0, 0),
    ("lse_log2[..., :sq] = (copy)", 8, 0, 0),
)
TORCH_ZERO = (("dq_accum = zeros (fp32)", 0, 0, 4),)
POST = (("dQ fp32 -> 16 bit (one pass)", 0, 4 + 2, 0),)
def varlen_passes(p: Problem, knobs: dict) -> tuple[tuple, tuple]:
    """passes() of a varlen batch (fa4kernel/sm90/bwd.py run_bwd_varlen): its preprocess kernel reads O,
    dO and LSE over the packed rows (total_q of each head) and writes dPsum and LSE_log2 and zeroes
    the fp32 dQ accumulator over every sequence's whole query blocks (the padded rows, about
    total_q + sequences x tile_m / 2 of each head); its postprocess reads those blocks of the
    accumulator and writes dQ's packed rows. The kernel writes dK and dV itself, or, with
    reduces_dkv, adds them into fp32 accumulators zeroed before and turned into 16 bit after."""
    total_q = sum(q for q, _ in p.sequences)
    tile_m = knobs["tile_m"]
    blocks = sum(-(-q // tile_m) * tile_m for q, _ in p.sequences)  # each sequence's whole query blocks
    packed, padded = p.heads * total_q, p.heads * blocks
    pre = (("preprocess kernel (varlen)", packed * (2 * p.hdim_v * 2 + 4) + padded * (8 + p.hdim * 4)),)
    post = (("postprocess kernel (varlen)", padded * p.hdim * 4 + packed * p.hdim * 2),)
    pre, post = pre + copies_passes(padded, p, knobs)[0], copies_passes(padded, p, knobs)[1] + post
    if reduces_dkv(p, knobs):  # fp32 dK, dV accumulators over the packed keys, as the dense launch's (passes)
        pre, post = pre + dkv_accum_passes(p, knobs)[0], post + dkv_accum_passes(p, knobs)[1]
    return pre, post


def copies_passes(rows: int, p: Problem, knobs: dict) -> tuple[tuple, tuple]:
    """The launches the deterministic build's dq_slices copies add (fa4kernel/sm90/bwd.py
    _zero_copies, _sum_copies), `rows` the accumulator's rows of one copy (every head's): the
    copies past the first, and their semaphores (one per Q block), zeroed after the preprocess
    (which zeroes the first); all copies read and their sum written by one reduction before the
    postprocess. None with one copy."""
    s = knobs.get("dq_slices", 1)
    if s <= 1:
        return (), ()
    acc = rows * p.hdim * 4
    return ((("dQ accumulator copies = zeros (fp32)", (s - 1) * acc),
             ("their semaphores = zeros", (s - 1) * -(-rows // knobs["tile_m"]) * 4)),
            (("dQ copies summed (fp32)", (s + 1) * acc),))


def dkv_accum_passes(p: Problem, knobs: dict) -> tuple[tuple, tuple]:
    """The launches around a backward with reduces_dkv: the fp32 dK and dV accumulators (K/V rows:
    batch x heads_kv x seqlen_k, a packed batch's keys) zeroed before and turned into 16 bit
    after; knob dkv_accum "split" (flash-attn-4's interface.py _flash_attn_bwd): a launch each
    per accumulator; "joint" (fa4kernel/sm90/bwd.py: one allocation for both): one launch each."""
    kv_rows = p.heads_kv * sum(k for _, k in p.sequences)
    if knobs.get("dkv_accum", "split") == "joint":
        n = p.hdim + p.hdim_v
        return ((("dkv_accum = zeros (fp32)", kv_rows * n * 4),), (("dK, dV fp32 -> 16 bit", kv_rows * n * (4 + 2)),))
    return (tuple((f"{w}_accum = zeros (fp32)", kv_rows * n * 4) for w, n in (("dk", p.hdim), ("dv", p.hdim_v))),
            tuple((f"{w} fp32 -> 16 bit", kv_rows * n * (4 + 2)) for w, n in (("dK", p.hdim), ("dV", p.hdim_v))))


def passes(p: Problem, knobs: dict | None = None) -> tuple[tuple, tuple]:
    """(preprocess, postprocess) launches around a backward: each (what, bytes). knobs preprocess
    "kernel" (the default; flash-attn-4, and fa4kernel's preprocess kernel): one kernel reads O and
    dO and LSE, writes dPsum and LSE in log2 units (fp32) and zeroes the fp32 dQ accumulator
    (fa4kernel zeroes it in a torch launch of its own: 1.7 us more, left out); "torch": fa4kernel's
    eager torch operations (TORCH_PRE, then TORCH_ZERO). After it: dQ from fp32 to 16 bit in one
    pass (flash-attn-4's postprocess kernel, fa4kernel's one torch copy_). A varlen batch:
    varlen_passes."""
    knobs = knobs or {}
    if p.is_varlen:
        return varlen_passes(p, knobs)
    rows = p.batch * p.heads * p.seqlen_q
    each = lambda ops: tuple((what, rows * (c + e * p.hdim + s * p.hdim)) for what, c, e, s in ops)  # noqa: E731
    if knobs.get("preprocess") == "torch":
        pre = each(TORCH_PRE + TORCH_ZERO)
    else:
        pre = (("preprocess kernel", rows * (2 * p.hdim_v * 2 + 4 + 8 + p.hdim * 4)),)
    post = each(POST)
    pre, post = pre + copies_passes(rows, p, knobs)[0], copies_passes(rows, p, knobs)[1] + post
    if reduces_dkv(p, knobs):  # per-K/V-head fp32 accumulators
        extra_pre, extra_post = dkv_accum_passes(p, knobs)
        pre, post = pre + extra_pre, post + extra_post
    return pre, post


def pre_post_us(p: Problem, hw, knobs: dict | None = None) -> tuple[float, float]:
    """Times (us) of the launches around the backward (passes): each its bytes at the HBM
    bandwidth plus a launch gap."""
    bw = hw.hbm_bandwidth_tbps * 1e6  # bytes per us
    return tuple(sum(b / bw + hw.launch_gap_us for _, b in ops) for ops in passes(p, knobs))
