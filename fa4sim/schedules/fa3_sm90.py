"""FA3-style forward on SM90 (H100/H200): the pipeline of fa4kernel's and flash-attn-4's Hopper forward.

Warp roles:
  load      producer warpgroup: TMA of Q once per tile, then K and V through their own rings
  wg{w}     consumer warpgroup w (tile_m/64 of them): 64 query rows each, issues its own wgmma
            (M=64), keeps S, P and O in registers; a row is spread over the 4 threads of a quad
  epilogue  the thread that TMA-stores O after all consumers wrote it to smem

Per KV block j, consumer w (intra-warpgroup overlap on): issue S(j) = Q K(j)^T, issue
O += P(j-1) V(j-1), wait S(j), softmax(j) while PV(j-1) runs on the tensor core, wait PV(j-1),
rescale O. P(j)'s conversion to bf16 issues among the exp2s (as compiled: the F2FPs interleave
with the MUFU.EX2s), so the rescale is the last work before the next GEMMs. With
rescale_before_pv, O is rescaled by block j-1's scale between
issuing S(j) and PV(j-1) instead (FA4's RescaleOBeforeGemm). Where the consumer waits for
PV(j-1) is knob pv_wait: as compiled (ptxas, CUDA 13.0) the wait sits after the row max, so only
the max overlaps PV(j-1) and the exp2s and the row sum wait for it (lab/findings/pv-wait-placement.md;
each build's compiled position is in its implementation's pv_wait_sass table).
Issue slots: beside a running GEMM the softmax phases get the softmax mix's share of the SM's
issue rate (issue_under_mma), the O rescale, a burst of independent FMULs, the share measured
for such bursts (dense_issue_under_mma); instructions added to the mix (an emulated exp2's
polynomial, tau's test) fill its idle slots at mix_fill_slots of a slot each.
Shared memory: the GEMMs' operand fetch (unit smem) goes first; the warps' stores of P (P via
smem) and O (unit smem:lsu) get the bandwidth it leaves while a GEMM runs.
Overlap off: issue S(j), wait, softmax, rescale, convert, issue PV(j), and the next S waits for
it. Inter-warpgroup ping-pong (named barriers): WG w issues its GEMMs only after WG w-1 issued
its own, so one WG's softmax overlaps the other's GEMMs.
Tile boundary (persistent CTAs): every consumer spends the implementation's tile_prologue_cycles
before the next tile's first S GEMM; Q is handed back after the tile's last QK GEMM
(early_q_release) or its last block; the O store lasts o_store_fixed_cycles + bytes /
o_store_bytes_per_clk and, unless its wait is deferred to the next tile's epilogue
(defer_o_store_wait), holds warpgroup 0, whose first warp issues it. O is staged in a buffer of
its own, in Q's (the next Q load waits for the store) or in V's ring (o_smem: FlashAttention-3's
union, where the next tile's V loads and the last warpgroup wait for it).
The tile per head dim and every constant measured on a kernel come from its implementation
(fa4sim/implementations/fa4kernel-sm90.json, flash-attn-4-sm90.json).
On an sm100 profile (`--hw b200 --schedule fa3`) it is the no-TMEM what-if: Blackwell's unit
rates with Hopper's register accumulators, the SM90 implementation's tile and constants.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..engine import Edge, Op, Schedule
from ..errors import InputError
from ..implementation import discrete
from ..tile_order import ORDERS
from ..params import Context, Knob, Problem
from .. import paged_kv, split_kv
from ..softmax import add, beside_gemm, exp2_phase, mix_limits, phase, scaled
from ..tensor_core import BYTES, check_shape, mma_cost

NAME = "fa3"
ARCH = "sm90"
RUNS_ON = ("sm90", "sm100")  # sm100: a Blackwell without TMEM (what-if), accumulators in registers
NO_TMEM_NOTE = ("{hw} is {arch}: the fa3 schedule runs it as a Blackwell without TMEM (S, P and O in "
                "registers as on Hopper, {impl}'s SM90 tile), a what-if no real kernel runs")
DESCRIPTION = "FA3-style forward (SM90: producer WG + tile_m/64 consumer WGs, wgmma, ping-pong, intra-WG overlap)"
DEFAULT_IMPL = "fa4kernel"  # simulated unless --impl says otherwise
Q_FROM_HBM = True  # Q tiles load from HBM while the launch streams K/V: their rate depends on it

PIECES = 8  # modelling granularity of warpgroup compute ops (instructions interleave finer)
PV_WAIT_PARTS = ("max", "fma", "mufu")
ABLATIONS = ("max", "exp", "sum")


def parse_pv_wait(text: str):
    """'after_max' | 'after_softmax' | 'compiled' | 'max=F,fma=F,mufu=F' -> its canonical form."""
    t = text.strip().lower().replace(" ", "")
    if t in ("after_max", "after_softmax", "compiled"):
        return t
    try:
        given = dict(item.split("=", 1) for item in t.split(","))
        frac = {part: float(given.pop(part, 0.0)) for part in PV_WAIT_PARTS}
    except ValueError:
        given, frac = {"?": text}, {}
    if given or not all(0.0 <= v <= 1.0 for v in frac.values()):
        raise InputError("pv_wait", f"must be after_max, after_softmax, compiled or fractions "
                                    f"max=F,fma=F,mufu=F in 0..1, got {text!r}")
    return ",".join(f"{part}={frac[part]:g}" for part in PV_WAIT_PARTS)


def parse_ablate(text: str) -> str:
    """'' (none) or a comma list of max, exp, sum -> its canonical (sorted) form."""
    parts = sorted({x for x in text.strip().lower().replace(" ", "").split(",") if x and x != "none"})
    bad = [x for x in parts if x not in ABLATIONS]
    if bad:
        raise InputError("ablate", f"unknown {', '.join(bad)}; allowed: none or a comma list of {', '.join(ABLATIONS)}")
    return ",".join(parts)


def _wgs(ctx: Context, k: dict) -> int:
    return k["tile_m"] // 64


KNOBS = [
    Knob("tile_m", 128, "rows", "query rows per CTA tile (tile_m/64 consumer warpgroups)", minimum=64, maximum=256),
    Knob("tile_n", 128, "keys", "keys per KV block", minimum=8, maximum=256),
    Knob("kv_stages", 2, "slots", "smem stages of K and of V (each its own ring)", minimum=1),
    Knob("kv_load", "tma", "", "how the producer warpgroup loads a K or V block: tma = one bulk tensor copy "
         "(a paged cache's page looked up per block); cp_async = its 128 threads' 16-byte cp.async, each key "
         "row's address from the page table (a paged cache whose pages do not hold whole blocks: "
         "fa4sim/paged_kv.py)", kind="choice", choices=("tma", "cp_async")),
    Knob("pingpong", lambda c, k: _wgs(c, k) >= 2 and c.problem.hdim <= 128, "",
         "inter-warpgroup ping-pong of GEMM issue (named barriers)", kind="bool"),
    Knob("intra_wg_overlap", True, "", "softmax(j) overlaps PV(j-1) inside a warpgroup", kind="bool"),
    Knob("p_in_registers", True, "", "PV takes P from registers (RS wgmma); false: P staged through smem (SS)", kind="bool"),
    Knob("persistent", lambda c, k: facts(c, k)["o_fits"], "", "one CTA per SM looping over tiles (else one CTA "
         "per tile)", kind="bool"),
    Knob("tile_order", "lpt", "", "the order the kernel hands out its Q tiles (fa4sim/tile_order.py): "
         "fa4kernel's host table (L2 sections of heads, costliest first), flash-attn-4's LPT scheduler (2^k-head "
         "sections, longest first), an ideal costliest-first order (lpt), blockIdx order (index), or a grid of one "
         "CTA per tile in blockIdx order, causal each head's tiles last first, varlen sequence outermost with the "
         "empty CTAs of the longest sequence's tile count (grid: fa4kernel's varlen build)",
         kind="choice", choices=ORDERS),
    Knob("pack_gqa", False, "", "grouped K/V heads (heads_kv < heads): one tile packs the rows of every q head of "
         "a K/V head, token by token (flash-attn-4's pack_gqa: tile_m rows = tile_m / group tokens x the group's "
         "heads, one launch head per K/V head); false: one q head per tile, the group's tiles reading the same "
         "K/V (no effect without grouped heads)", kind="bool"),
    Knob("early_q_release", False, "", "the next tile's Q load waits only for this tile's last QK GEMM (each "
         "consumer hands Q back right after it); false: for the whole last KV block (softmax, P convert, O "
         "rescale)", kind="bool"),
    Knob("defer_o_store_wait", False, "", "O in its own smem buffer: the warp that issues the O store (warpgroup "
         "0's first) waits for its smem read only before the next tile's O; false: right after issuing it, so "
         "warpgroup 0 starts its next tile after the store", kind="bool"),
    Knob("o_smem", lambda c, k: "own" if facts(c, k)["o_fits"] else "q", "", "where the epilogue stages O in smem "
         "for its TMA store: own = a buffer of its own (when it fits beside Q, K and V); q = Q's buffer (the next "
         "tile's Q load waits for the store to have read it); v = V's ring (FlashAttention-3's union: the next "
         "tile's V loads wait for it, and the consumer warp that issues the store, the last warpgroup's last, "
         "waits for it at once)", kind="choice", choices=("own", "q", "v")),
    Knob("skip_idle_wgs", False, "", "consumer warpgroups whose 64 rows all lie past seqlen_q (the last tile of a "
         "length that is not a multiple of tile_m) skip their GEMMs and softmax; false: they compute padding rows "
         "like the others", kind="bool"),
    Knob("exp_emulation", 0.0, "fraction", "fraction of each row's exp2 done by the polynomial on the FMA pipe (FA4 trick; off in FA3)", kind="fraction"),
    Knob("rescale_threshold", None, "log2 units", "conditional rescaling threshold tau; none = always rescale (FA3)", kind="float_or_none", minimum=0.0),
    Knob("rescale_before_pv", lambda c, k: c.problem.hdim_v > 128 and k["intra_wg_overlap"], "",
         "intra-WG overlap: O *= the previous block's scale while S(j) is computed, before PV(j-1) is issued "
         "(FA4's RescaleOBeforeGemm); false: after the PV wait", kind="bool"),
    Knob("pv_wait", "after_max", "", "intra-WG overlap: where a consumer waits for the previous block's PV GEMM. "
         "after_max: the row max overlaps PV(j-1), the exp2s and row sum wait for it (as ptxas compiles it; the "
         "order validated); after_softmax: the whole softmax overlaps it (the source order); compiled: where "
         "ptxas put it in this implementation's build (its pv_wait_sass table); max=F,fma=F,mufu=F: the share "
         "of each pipe's softmax instructions issued before the wait", kind="text", convert=parse_pv_wait),
    Knob("rescale_rate", None, "fraction", "override: fraction of (warp, KV block) pairs that rescale (none = derive)", kind="float_or_none", minimum=0.0, maximum=1.0),
    Knob("ablate", "", "", "what-if: softmax phases that cost nothing, a comma list of max (row max), exp (exp2: "
         "P = scaled S), sum (row sum); fa4kernel's ablation builds of the same names", kind="text",
         convert=parse_ablate),
    Knob("score_std", 1.0, "nats", "std of softmax_scale*q.k for the rescale-rate model (randn inputs: 1)", kind="float", minimum=1e-3),
    Knob("num_splits", 1, "chunks", "split-KV (FlashDecoding): each Q tile's KV blocks in this many work units, "
         "each writing a partial O and LSE in fp32, merged by a second launch (the combine); 1: none",
         minimum=1, maximum=128),
]

# rescale before PV: the S GEMM's k-steps issued ahead of the rescale's FMULs (as compiled)
QK_HEAD_KSTEPS = 1
# smem:lsu's share beside an SS wgmma whose fetch takes the whole bandwidth (N = 64, measured 0.024)
LSU_SHARE_FLOOR = 0.024
# what `fa4sim run` says with exp_emulation on SM90: where the model's emulation cost is known to miss
EMULATION_NOTE = ("exp_emulation on SM90: an emulated exp2 is its 8 SASS instructions, the 7 added ones at "
                  "mix_fill_slots = {fill:g} of a softmax issue slot each (measured 0.2 on H100 and H200 beside a "
                  "wgmma). Per SM that matches fa4kernel's hd128 loop within 3 pp; at hd64 (three consumer "
                  "warpgroups) and hd256 the kernel loses 2-6x more (lab/findings/emulation-cost.md)")
# what `fa4sim run` says where each warpgroup's softmax is long beside its own GEMMs (hd64)
LONG_SOFTMAX_NOTE = ("each of the {wgs} consumer warpgroups runs the softmax of {per:.0f} score elements per "
                     "cycle of its own GEMMs (hd128: 8). Warpgroups with that much softmax beside their own GEMMs "
                     "are where the rules for issue beside a GEMM run short (bench_contention's intra kernel: "
                     "the GEMMs of 3 warpgroups cost up to 4-5.5 % of a trip more than the rules give; fa4kernel's "
                     "hd64 loop 1 % short with 3 warpgroups, 7-8 % with 2): this time may be optimistic "
                     "(lab/findings/issue-rate-hd64-loop.md, 'The hd64 loop')")
LONG_SOFTMAX = 12.0  # score elements per tensor cycle and warpgroup from which the note is given
PRODUCER_REGS = {2: 24, 3: 32}  # setmaxnreg of the producer WG (docs/reference/fa4-schedules.md)
REG_OVERHEAD = 32               # addresses, loop state, row max/sum: an estimate
# the PV wait's position where a build is not in its implementation's SASS table
PV_WAIT_FALLBACK = {"max": 1.0, "fma": 0.0, "mufu": 0.0}


def pv_wait_fractions(impl, p: Problem, k: dict) -> dict | None:
    """{'max', 'fma', 'mufu'}: the share of each pipe's softmax issued before the PV wait; None =
    the whole softmax overlaps PV(j-1) (no wait before it)."""
    where = k["pv_wait"]
    if where == "after_softmax":
        return None
    if where == "after_max":
        return dict(PV_WAIT_FALLBACK)
    if where == "compiled":
        return dict(compiled_pv_wait(impl, p, k) or PV_WAIT_FALLBACK)
    return {part: float(v) for part, v in (item.split("=") for item in where.split(","))}


def compiled_pv_wait(impl, p: Problem, k: dict) -> dict | None:
    """The `before` of the implementation's pv_wait_sass row for this build: the first whose build
    has these values of all its keys, compared exactly (floats as the table writes them, %g; the
    model's rescale_threshold None is the kernel's 0: always rescale); else, for a variant not
    compiled, its head dim's default build (a row marked "default") of the same tile_n and
    rescale order; None: neither."""
    cfg = {"hdim": p.hdim, "causal": p.causal, **k}
    for name in ("exp_emulation", "rescale_threshold"):
        if name in cfg:
            cfg[name] = float(cfg[name] or 0.0)
    rows = impl.params.get("pv_wait_sass", {}).get("value", [])
    same = lambda row, keys: all(key in cfg and discrete(cfg[key]) == row["build"][key] for key in keys)  # noqa: E731
    row = next((r for r in rows if same(r, r["build"])), None)
    row = row or next((r for r in rows if r.get("default") and same(r, DEFAULT_BUILD_KEYS)), None)
    return row["before"] if row else None


# what a variant not compiled shares with its head dim's default build
DEFAULT_BUILD_KEYS = ("hdim", "causal", "tile_n", "rescale_before_pv")


def _unpaged_tile(ctx: Context) -> tuple[int, int]:
    """(tile_m, tile_n) the implementation takes for this problem with a contiguous cache."""
    plain = Context(replace(ctx.problem, page_size=0), ctx.hw, ctx.impl)
    knobs: dict = {}
    for knob in KNOBS[:2]:  # tile_m, tile_n
        chosen, value = ctx.impl.choose(knob.name, plain, knobs)
        knobs[knob.name] = value if chosen else knob.default
    return knobs["tile_m"], knobs["tile_n"]


def facts(ctx: Context, k: dict) -> dict:
    """What an implementation's rules may test besides the problem and the knobs."""
    p = ctx.problem
    out = {"consumer_wgs": k["tile_m"] // 64} if "tile_m" in k else {}
    out["q_rows_packed"] = p.seqlen_q * p.heads_per_kv
    # a paged cache (fa4sim/paged_kv.py): FlashAttention-3's TMA path, from its unpaged tile
    out["fa3_paged_tma"] = p.is_paged and paged_kv.fa3_paged_tma(p.page_size, out["q_rows_packed"],
                                                                 *_unpaged_tile(ctx))
    if "tile_n" in k:
        out["pages_are_blocks"] = p.is_paged and p.page_size == k["tile_n"]  # flash-attn-4's TMA path
    if "tile_m" in k and "tile_n" in k:  # FlashAttention-3's split-KV and pack-GQA rules (fa4sim/split_kv.py)
        splits = k["num_splits"] if "num_splits" in k else split_kv.fa3_num_splits(p, ctx.hw.num_sms,
                                                                                   k["tile_m"], k["tile_n"])
        out["fa3_num_splits"] = splits
        # get_pack_gqa: always on its paged cp.async path
        out["fa3_pack_gqa"] = split_kv.fa3_pack_gqa(p, k["tile_m"], splits) or (p.is_paged and not out["fa3_paged_tma"])
    if all(n in k for n in ("tile_m", "tile_n", "kv_stages", "p_in_registers")):
        out["o_fits"] = o_fits(ctx.hw, ctx.problem, k)
    return out


def split_at_pv_wait(hw, part: dict, frac: dict) -> tuple[dict, dict]:
    """(before, after) the PV wait of a softmax op's unit cycles: each pipe by its fraction of
    instructions before the wait (ALU = the row max's FMNMX), the issue slots in proportion to
    the instructions (one lane-op each) on either side."""
    pipes = {"alu": frac["max"], "fma": frac["fma"], "mufu": frac["mufu"]}
    lanes = {"alu": hw.alu_lanes_per_clk, "fma": hw.fma_lanes_per_clk, "mufu": hw.mufu_ex2_per_clk}
    before = {u: c * pipes[u] for u, c in part.items() if u in pipes}
    instr = sum(c * lanes[u] for u, c in part.items() if u in pipes)
    share = sum(c * lanes[u] for u, c in before.items()) / instr if instr else 0.0
    before.update({u: c * share for u, c in part.items() if u not in pipes})
    return before, {u: c - before[u] for u, c in part.items()}


def consumer_warpgroups(k: dict) -> int:
    return k["tile_m"] // 64


def smem_bytes(p: Problem, k: dict) -> int:
    """Q + K ring + V ring (+ P if staged), bytes; O's staging buffer is counted by o_fits()."""
    s = k["kv_stages"]
    b = k["tile_m"] * p.hdim * BYTES + s * k["tile_n"] * (p.hdim + p.hdim_v) * BYTES
    if not k["p_in_registers"]:
        b += k["tile_m"] * k["tile_n"] * BYTES
    return b + 1024


def o_fits(hw, p: Problem, k: dict) -> bool:
    """O gets its own smem buffer when it fits beside Q, K, V (else it reuses Q's)."""
    return smem_bytes(p, k) + k["tile_m"] * p.hdim_v * BYTES <= hw.smem_capacity_bytes


def registers_needed(p: Problem, k: dict) -> int:
    """Per consumer thread: O (hdim_v/2 fp32), S (tile_n/2 fp32), P (tile_n/4 packed), overhead."""
    p_regs = k["tile_n"] // 4 if k["p_in_registers"] else 0
    return p.hdim_v // 2 + k["tile_n"] // 2 + p_regs + REG_OVERHEAD


def check(hw, p: Problem, k: dict, impl=None) -> None:
    if hw.arch not in RUNS_ON:
        raise InputError("schedule", f"fa3 runs on {', '.join(RUNS_ON)}; hw {hw.name} is {hw.arch} (use --schedule fa4)")
    check_shape(ARCH, k["tile_m"], k["tile_n"], p.hdim)
    check_shape(ARCH, 64, p.hdim_v, k["tile_n"])
    wgs = consumer_warpgroups(k)
    if wgs not in (1, 2, 3):
        raise InputError("tile_m", f"tile_m/64 = {wgs} consumer warpgroups; allowed 1..3 (tile_m 64, 128, 192)")
    if k.get("o_smem") == "own" and not o_fits(hw, p, k):
        raise InputError("o_smem", f"O's own buffer ({k['tile_m'] * p.hdim_v * BYTES} B) does not fit beside Q, K "
                                   f"and V ({smem_bytes(p, k)} B of {hw.smem_capacity_bytes}); allowed here: q, v")
    need = smem_bytes(p, k)
    if need > hw.smem_capacity_bytes:
        raise InputError("smem", f"shared memory {need} B (hdim {p.hdim}/{p.hdim_v}, tile_m {k['tile_m']}, tile_n "
                                 f"{k['tile_n']}, kv_stages {k['kv_stages']}) exceeds {hw.smem_capacity_bytes} B of "
                                 f"{hw.name}; {_fits_with(p, k, lambda kk: smem_bytes(p, kk) <= hw.smem_capacity_bytes)}")
    prod = PRODUCER_REGS.get(wgs, 24)
    avail = min(240, ((hw.registers_per_sm - 128 * prod) // (128 * wgs)) // 8 * 8)
    regs = registers_needed(p, k)
    if regs > avail:
        raise InputError("registers", f"a consumer thread needs ~{regs} registers (hdim_v {p.hdim_v}, tile_n "
                                      f"{k['tile_n']}); {wgs} consumer WGs get at most {avail}; "
                                      f"{_fits_with(p, k, lambda kk: registers_needed(p, kk) <= avail, stages=False)}")


def _fits_with(p: Problem, k: dict, fits, stages: bool = True) -> str:
    """The nearest knob change that makes a configuration fit, as a hint for its error."""
    tries = [{"kv_stages": s} for s in range(k["kv_stages"] - 1, 0, -1)] if stages else []
    tries += [{"tile_n": n} for n in range(k["tile_n"] - 16, 15, -16)]
    tries += [{"p_in_registers": False}] if k["p_in_registers"] else []
    for change in tries:
        if fits({**k, **change}):
            return "fits with " + ", ".join(f"--set {n}={str(v).lower()}" for n, v in change.items())
    return "no smaller kv_stages or tile_n fits: lower tile_m"


def rows_per_cta(k: dict) -> int:
    return k["tile_m"]


def unit_knobs(k: dict, rows: int) -> dict:
    """The knobs a tile with `rows` valid query rows runs with: with skip_idle_wgs, only its live
    consumer warpgroups (64 rows each) take part, as a tile of that many warpgroups would."""
    live = min(consumer_warpgroups(k), max(1, -(-rows // 64)))
    if not k["skip_idle_wgs"] or live == consumer_warpgroups(k):
        return k
    # the O store's TMA box stays the full tile's: its smem read (what the store's wait waits
    # for) covers every row of the box
    return {**k, "tile_m": 64 * live, "_o_box_rows": k["tile_m"]}


def v_zero_cycles(hw, p: Problem, k: dict, impl, zero_rows: int) -> tuple[float, float]:
    """(wait, work): cycles a tile of fa4kernel's varlen or decode build spends before its first S
    GEMM setting the V rows past its sequence's keys to 0 (sm90/fwd.py _zero_v_past_keys: they
    may hold anything, and 0 x NaN in the PV GEMM is NaN). wait: for the first block's V beyond
    its K (the V tile at the TMA rate; a persistent CTA's further tile finds it loaded during the
    tile before). work: every consumer thread's trips of the zeroing (v_zero_elems_per_trip
    elements each: 1 for a loop of 2-byte stores; a trip the longer of its dependent chain at the
    FMA latency and its instructions' issue, the consumer warps sharing the schedulers; the
    implementation's v_zero_sass, counted in its SASS), then the barrier of all consumers. (0, 0)
    without zero rows or for an implementation whose loads zero-fill (no v_zero_sass)."""
    if zero_rows <= 0 or "v_zero_loop_instr" not in impl.params:
        return 0.0, 0.0
    ctx = Context(p, hw, impl)
    instr, chain, elems = (float(impl.value(n, ctx, k))
                           for n in ("v_zero_loop_instr", "v_zero_loop_chain", "v_zero_elems_per_trip"))
    warps = 4 * consumer_warpgroups(k)
    trips = math.ceil(zero_rows * p.hdim_v / (32 * warps * elems))
    trip = max(chain * hw.fma_latency, instr * warps / hw.issue_per_clk)
    return k["tile_n"] * p.hdim_v * BYTES / hw.tma_bytes_per_clk, trips * trip + hw.named_barrier_latency


def _with_issue(uses: tuple, issue: float) -> tuple:
    return uses + (("issue", issue),) if issue > 0 else uses


def build(hw, p: Problem, k: dict, n_kv: int, masked_blocks: int, impl, hbm_busy: float = 0.0) -> Schedule:
    """One CTA's schedule for tiles of n_kv KV blocks, `masked_blocks` of them masked; `impl`
    gives the kernel's measured constants; hbm_busy is the share of HBM bandwidth the rest of the
    launch takes while this CTA loads its Q tile (the kernel model derives it)."""
    d, dv, n, W = p.hdim, p.hdim_v, k["tile_n"], consumer_warpgroups(k)
    ctx = Context(p, hw, impl)
    const = lambda name: float(impl.value(name, ctx, k))  # noqa: E731
    mbar, nbar = hw.mbarrier_latency, hw.named_barrier_latency
    overlap, pp, rs = k["intra_wg_overlap"], k["pingpong"] and W > 1, k["p_in_registers"]
    before = overlap and k["rescale_before_pv"]  # O rescaled before the PV GEMM
    elems, rows = 64 * n, 64  # per consumer warpgroup per KV block
    f = k["exp_emulation"]
    rate = k["rescale_rate"]
    if rate is None:
        from ..rescale import rescale_rate  # here: it imports numpy, which only a derived rate needs
        rate = rescale_rate(n_kv, k["rescale_threshold"], k["score_std"], cols=n, rows=16)  # 16 rows per warp

    qk = mma_cost(hw, 64, n, d, a_in_smem=True)
    pv = mma_cost(hw, 64, dv, n, a_in_smem=not rs)
    # Shared memory serves the wgmma's operand fetch first: the warps' own stores (P and O to
    # smem, unit smem:lsu) get the share of its cycles the fetch leaves while a GEMM runs, and do
    # not delay the GEMM (bench_bursts.py stsm, H100 = H200: STSM bursts beside SS wgmma of N = 64 /
    # 128 / 256 run at 0.024 / 0.277 / 0.392 of their rate alone, 1 - fetch / bandwidth gives
    # 0 / 0.25 / 0.375; the wgmma slows 1-3 %). The fetch share here: this block's two GEMMs.
    fetch = (qk.smem_cycles + pv.smem_cycles) / (qk.tensor_cycles + pv.tensor_cycles)
    lsu_share = max(1.0 - fetch, LSU_SHARE_FLOOR)
    ops: list[Op] = []
    edges: list[Edge] = []

    k_load, v_load = n * d * BYTES / hw.tma_bytes_per_clk, n * dv * BYTES / hw.tma_bytes_per_clk
    # Q is read once per tile, from HBM: its bytes get the TMA rate the rest of the chip leaves
    # (trace, hd256 1k causal, one CTA per tile: Q issue -> first S GEMM 2980 cycles for 64 KB,
    # 2040 for 32 KB at hd128, where one SM alone loads 64 KB from HBM in 1513)
    q_rate = hw.tma_bytes_per_clk * (1.0 - hbm_busy)
    ops.append(Op("LQ", "load", (("tma", k["tile_m"] * d * BYTES / q_rate),), hw.hbm_latency, "load",
                  asynchronous=True, issue_cycles=1, when="first", label="TMA Q tile (HBM)"))
    if k["kv_load"] == "cp_async":
        ops += paged_kv.cp_async_loads(hw, n, d, dv, paged_kv.PRODUCER_THREADS)
    else:
        ops += [Op("LK", "load", (("tma", k_load),), hw.l2_latency, "load", asynchronous=True, issue_cycles=1,
                   label="TMA K block"),
                Op("LV", "load", (("tma", v_load),), hw.l2_latency, "load", asynchronous=True, issue_cycles=1,
                   label="TMA V block")]

    # the loop's bookkeeping instructions (the implementation's loop_overhead_*: counted in its
    # SASS), as SM issue slots (4 warps per warpgroup):
    # per wgmma k-step beside the GEMM's tensor work, piece by piece as its HGMMAs issue (the issuing
    # warp's own time for them is in mma_issue_cycles, measured on a wgmma chain with its
    # descriptor math); the fixed part with the row max, around which the waits, barriers and row
    # statistics sit
    per_kstep = 4 * const("loop_overhead_per_kstep") / hw.issue_per_clk
    # conditional rescaling's own test: per block, the rows' max-change compares, a warp vote, the
    # branch around the rescale and the scale's select (tau_test_instr): instructions it adds
    # whether or not a rescale is skipped; like an emulated exp2's, they fill the softmax's idle
    # issue slots (mix_fill_slots of a slot each)
    tau_test = const("tau_test_instr") * hw.mix_fill_slots if k["rescale_threshold"] is not None else 0.0
    fixed = 4 * (const("loop_overhead_fixed") + tau_test) / hw.issue_per_clk
    free = set(k["ablate"].split(","))
    pv_wait = pv_wait_fractions(impl, p, k) if overlap else None
    for w in range(W):
        r = f"wg{w}"
        ops.append(Op(f"TS{w}", r, (), const("tile_prologue_cycles"), "sync", when="first",
                      label="tile start: coordinates, KV range, O = 0, Q/K waits"))
        # before: ptxas puts the rescale's FMULs among the S GEMM's first HGMMAs (fa4kernel hd256
        # SASS: 5 before the 1st, 64 between the 1st and 2nd, 59 between the 2nd and 3rd), so the
        # rescale issues as the GEMM starts, not after the wgmma queue has taken all of it: the
        # GEMM's first k-steps (QKH), the rescale, then its other k-steps (QK)
        ksteps = d // 16
        head = QK_HEAD_KSTEPS if before and ksteps > QK_HEAD_KSTEPS else 0
        qk_uses = _with_issue((("tensor", qk.tensor_cycles), ("smem", qk.smem_cycles)), per_kstep * (d // 16))
        qk_part = lambda steps: qk_uses if steps == ksteps else tuple(  # noqa: E731
            (u, c * steps / ksteps) for u, c in qk_uses)
        qk_ops = [Op(f"QKH{w}", r, qk_part(head), qk.latency, "mma", asynchronous=True,
                     issue_cycles=head * hw.mma_issue_cycles, chunks=head,
                     label=f"S = Q K^T, its first {head} k-step(s) (wgmma SS, WG{w})")] if head else []
        qk_ops.append(Op(f"QK{w}", r, qk_part(ksteps - head), qk.latency, "mma", asynchronous=True,
                         issue_cycles=(ksteps - head) * hw.mma_issue_cycles, chunks=ksteps - head,
                         label=f"S = Q K^T{', the rest' if head else ''} (wgmma SS, WG{w})"))
        pv_op = Op(f"PV{w}", r, _with_issue((("tensor", pv.tensor_cycles), ("smem", pv.smem_cycles)), per_kstep * (n // 16)), pv.latency, "mma",
                   asynchronous=True, issue_cycles=n // 16 * hw.mma_issue_cycles, chunks=n // 16,
                   skew=1 if overlap else 0, work=(("rf_operand", pv.rf_operand_cycles),) if rs else (),
                   label=f"O += P V (wgmma {'RS' if rs else 'SS'}, WG{w})")
        # before: iteration j applies block j-1's scale (skew 1), while S(j) runs, ahead of PV(j-1);
        # issued between the warps' own HGMMAs it gets the rate bench_bursts --inline measured for
        # that placement (inline_issue_under_mma), else a separate burst's (dense_issue_under_mma)
        resc_issue = hw.inline_issue_under_mma if head else hw.dense_issue_under_mma
        resc = Op(f"RESC{w}", r, tuple(scaled(phase(hw, "rescale", rows * dv), rate).items()), 0.0,
                  "correction", skew=1 if before else 0, slowed=(("issue", resc_issue),),
                  label=f"O *= acc_scale (p={rate:.3g})" + (", before PV" if before else ""))
        ops += qk_ops[:-1]  # the GEMM's head (before only)
        if before:
            ops.append(resc)
        ops.append(qk_ops[-1])
        if overlap:
            ops.append(pv_op)
        if pp:
            ops.append(Op(f"PP{w}", r, (), nbar, "sync", label="ping-pong: let the next WG issue"))
        if masked_blocks:
            ops.append(Op(f"MASK{w}", r, tuple(phase(hw, "mask", elems * masked_blocks).items()), 0.0, "softmax",
                          when="first", label=f"causal/length mask, {masked_blocks} block(s)"))
        mx = {} if "max" in free else phase(hw, "max", elems, rows)
        exp = add(phase(hw, "scale", elems), {} if "exp" in free else exp2_phase(hw, elems, f),
                  {} if "sum" in free else phase(hw, "sum", elems))
        exa = {}
        if pv_wait is not None:
            # what ptxas issues before the PV wait overlaps PV(j-1), the rest waits for it
            mx, mx_after = split_at_pv_wait(hw, mx, pv_wait)
            exa, exp = split_at_pv_wait(hw, exp, pv_wait)
            exp = add(mx_after, exp)
        if fixed > 0:
            mx = add(mx, {"issue": fixed})
        ops.append(Op(f"MAX{w}", r, tuple(mx.items()), hw.fma_latency * 4, "softmax",
                      label="row max (quad shuffles), acc_scale"))
        if any(v > 0 for v in exa.values()):
            ops.append(Op(f"EXA{w}", r, tuple(exa.items()), 0.0, "exp",
                          label="scale, exp2, row sum: the part issued before the PV wait"))
        # P via smem, as compiled (fa4kernel hd128, causal and not: 7 of the 8 STSM per warp lie
        # between the PV wait and the last MUFU.EX2, the fence after them, then the O rescale): its
        # stores issue among the exp2s and the fence's wait overlaps the O rescale. No barrier is
        # left at the end: a warp's rows of the PV GEMM's A operand are the P rows it stored, so
        # fa4kernel, flash-attn-4 and FA3 all end with a warp sync (no BAR in their KV loops for it)
        p_store = {"smem:lsu": elems * BYTES / hw.smem_bytes_per_clk} if not rs else {}
        p_in_exp = bool(p_store) and overlap and not before
        if p_in_exp:
            exp = add(exp, p_store)
        # P's conversion to bf16 (overlap on): both kernels' sources convert P after the softmax
        # and before the O rescale, and ptxas interleaves the F2FPs with the MUFU.EX2s and the row
        # sum's FADDs (every build of both, hd 64 / 128 / 256, P in registers or smem); fa4kernel's
        # rescale FMULs (after the PV wait) follow the last of them. So the conversion is code of
        # the exp2 phase, whose mix bench_contention measured with it (one F2FP per two elements),
        # and the rescale is the warpgroup's last work before its next GEMMs (flash-attn-4's and
        # fa4kernel's hd64 causal rescale lie among the exp2s: not taken, see
        # lab/findings/pv-wait-placement.md)
        cvt = phase(hw, "convert", elems)
        if overlap:
            exp, cvt = add(exp, cvt), {}
        ops.append(Op(f"EXP{w}", r, tuple(exp.items()), hw.mufu_latency, "exp", label="exp2, row sum"
                      + (", P -> bf16" if overlap else "") + (", P -> smem" if p_in_exp else "")))
        if not before:
            ops.append(resc)
        if not p_in_exp:
            cvt = add(cvt, p_store)
        hand_off = 0.0 if rs or p_in_exp else hw.smem_latency
        if cvt or hand_off:  # with overlap and P in registers nothing is left after the rescale
            what = ([] if overlap else ["P -> bf16"]) + ([] if rs or p_in_exp else ["P -> smem, fence"])
            ops.append(Op(f"CVT{w}", r, tuple(cvt.items()), hand_off, "softmax",
                          label=", ".join(what + ([] if rs else ["warp sync"]))))
        if not overlap:
            ops.append(pv_op)
        ops.append(Op(f"FIN{w}", r, tuple(phase(hw, "normalize", rows * dv).items()), 0.0, "correction",
                      when="last", skew=1 if overlap else 0, label="O / row_sum, convert"))
        # every consumer WG meets at a named barrier before O goes to smem (the O buffer is shared
        # and the previous tile's store must have read it): the WGs leave the tile together, so
        # the ping-pong stagger is rebuilt at the start of every tile
        ops.append(Op(f"OSM{w}", r, (("smem:lsu", rows * dv * BYTES / hw.smem_bytes_per_clk),), hw.smem_latency,
                      "correction", when="last", skew=1 if overlap else 0,
                      label="consumer barrier, O -> smem"))
    # the CTA waits for the TMA engine to have *read* O from smem (bulk wait_group ..., read=True):
    # in the kernel's own stamps that takes a fixed part plus the bytes at a rate far below the
    # TMA load rate, so the difference is the store's latency
    o_bytes = k.get("_o_box_rows", k["tile_m"]) * dv * BYTES
    st_tma = o_bytes / hw.tma_bytes_per_clk
    o_store = const("o_store_fixed_cycles") + o_bytes / const("o_store_bytes_per_clk")
    ops.append(Op("ST", "epilogue", (("tma", st_tma),), max(0.0, o_store - st_tma),
                  "store", asynchronous=True, issue_cycles=1, when="last", label="TMA store O (smem read)"))

    S = k["kv_stages"]
    for w in range(W):
        # where consumer w hands Q back: after the tile's last QK GEMM, or after its last block
        last = f"CVT{w}" if any(o.name == f"CVT{w}" for o in ops) else f"EXP{w}"  # a block's last softmax op
        q_free = f"QK{w}" if k["early_q_release"] else last if before else f"RESC{w}" if overlap else f"PV{w}"
        qk_first = f"QKH{w}" if any(o.name == f"QKH{w}" for o in ops) else f"QK{w}"  # its first HGMMA
        edges += [Edge("LQ", qk_first, lag=mbar), Edge("LK", qk_first, lag=mbar), Edge("LV", f"PV{w}", lag=mbar),
                  Edge(f"QK{w}", f"MAX{w}"),       # wgmma wait (S complete)
                  Edge(f"PV{w}", f"RESC{w}", distance=1),  # O of block j-1 is final before rescaling
                  Edge(f"PV{w}", f"FIN{w}"),
                  Edge(f"OSM{w}", "ST", lag=nbar),
                  Edge(f"QK{w}", "LK", S, kind="anti", lag=mbar),
                  Edge(f"PV{w}", "LV", S, kind="anti", lag=mbar),
                  Edge(q_free, "LQ", 1, per="tile", kind="anti", lag=mbar)]
        if masked_blocks:  # the masked blocks (a tile's first) wait for S before their mask
            edges.append(Edge(f"QK{w}", f"MASK{w}"))
        if not overlap:  # wait_group 0 before softmax: the previous PV has completed too
            edges.append(Edge(f"PV{w}", f"MAX{w}", distance=1))
        elif pv_wait is not None:  # as compiled: the PV wait sits between row max and exp2s
            edges.append(Edge(f"PV{w}", f"EXP{w}", distance=1))
        if pp:  # a tile's first S GEMMs are issued without the hand-off (fa4kernel, FA3)
            prev = f"PP{(w - 1) % W}"
            edges.append(Edge(prev, qk_first, distance=0 if w > 0 else 1, lag=nbar, skip_first=overlap))
    edges += [Edge(f"FIN{v}", f"OSM{w}", lag=nbar) for v in range(W) for w in range(W)]  # the barrier
    if k["o_smem"] == "own":  # O has its own smem buffer: the next tile's O waits for this store
        edges += [Edge("ST", f"OSM{w}", 1, per="tile", kind="anti", lag=mbar) for w in range(W)]
        if not k["defer_o_store_wait"]:
            # the warp that issues the store waits for its smem read right away, and it is
            # warpgroup 0's first (fa4kernel's warp 4): warpgroup 0's next tile starts after it
            edges.append(Edge("ST", "TS0", 1, per="tile"))
    elif k["o_smem"] == "v":
        # O lies over V's ring: the producer's first V load of the next tile waits for the store's
        # smem read (the later ones follow it), and the last warpgroup's last warp, which issues
        # the store, waits for that read before its next tile
        edges += [Edge("ST", "LV", 1, per="tile", kind="anti", lag=mbar), Edge("ST", f"TS{W - 1}", 1, per="tile")]
    else:  # O is staged in Q's buffer: the next Q load waits for this tile's store
        edges.append(Edge("ST", "LQ", 1, per="tile", kind="anti", lag=mbar))

    per_tensor_cycle = elems / (qk.tensor_cycles + pv.tensor_cycles)  # one warpgroup's softmax per its GEMMs
    # each warpgroup's own issue limit, then pieces so two warpgroups on one pipe share it (engine)
    compute_roles = [f"wg{w}" for w in range(W)]
    # (measured on the softmax-like mix, so it binds the softmax phases, not the plain FMUL/F2FP
    # streams of the rescale and convert, which the H100 timeline shows near full issue rate)
    softmax_ops = tuple(f"{n}{w}" for n in ("MASK", "MAX", "EXA", "EXP") for w in range(W))
    ops = [mix_limits(hw, o) if o.name in softmax_ops else o for o in ops]
    ops = [replace(o, chunks=PIECES) if not o.asynchronous and o.uses else o for o in ops]
    units = {"tensor": 1, "smem": 1, "smem:lsu": 1, "mufu": 1, "fma": 1, "alu": 1, "issue": 1, "tma": 1,
             **({"lsu": 1} if k["kv_load"] == "cp_async" else {}), **{f"issue:{r}": 1 for r in compute_roles}}
    roles = ["load"] + [f"wg{w}" for w in range(W)] + ["epilogue"]
    return Schedule(NAME, units, roles, ops, edges, marker="QK0",
                    issue_depth={"tensor": int(hw.mma_queue_depth)},
                    interference={**beside_gemm(hw, compute_roles), "smem:lsu": ("tensor", lsu_share)},
                    meta={"rescale_rate": rate, "flops_per_iter": 2.0 * k["tile_m"] * n * (d + dv),
                          "notes": ([EMULATION_NOTE.format(fill=hw.mix_fill_slots)] if f > 0 else [])
                          + ([LONG_SOFTMAX_NOTE.format(per=per_tensor_cycle, wgs=W)]
                             if hw.arch == ARCH and W >= 2 and per_tensor_cycle >= LONG_SOFTMAX else [])
                          + ([NO_TMEM_NOTE.format(hw=hw.name, arch=hw.arch, impl=impl.name if impl else DEFAULT_IMPL)]
                             if hw.arch != ARCH else [])})
