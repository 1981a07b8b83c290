"""FA3-style forward on SM90 (H100/H200), as flash-attn-4's Hopper path (flash_fwd_sm90.py) does it.

Warp roles:
  load      producer warpgroup: TMA of Q once per tile, then K and V through their own rings
  wg{w}     consumer warpgroup w (tile_m/64 of them): 64 query rows each, issues its own wgmma
            (M=64), keeps S, P and O in registers; a row is spread over the 4 threads of a quad
  epilogue  the thread that TMA-stores O after all consumers wrote it to smem

Per KV block j, consumer w (intra-warpgroup overlap on): issue S(j) = Q K(j)^T, issue
O += P(j-1) V(j-1), wait S(j), softmax(j) while PV(j-1) runs on the tensor core, wait PV(j-1),
rescale O, convert P(j). (Head dims > 128, and fa4kernel with conditional rescaling, knob
rescale_before_pv: O is rescaled by block j-1's scale between issuing S(j) and PV(j-1) instead,
as flash-attn-4 does.) As compiled (ptxas, CUDA 13.0), the PV wait sits after the row max:
only the max overlaps PV(j-1), the exp2s and the row sum wait for it (knob exp_overlaps_pv; knobs
max/fma/mufu_before_pv split the softmax at the wait per pipe, and schedules/pv_wait_sm90.py has
where ptxas put it in each build). Issue slots: beside a running GEMM the softmax phases get the
softmax mix's share of the SM's issue rate (issue_under_mma), the O rescale, a burst of
independent FMULs, the share measured for such bursts (dense_issue_under_mma, bench_bursts.py);
instructions added to the mix (an emulated exp2's polynomial, tau's test) fill its idle slots at
mix_fill_slots of a slot each (bench_bursts.py --mma-gaps).
Shared memory: the GEMMs' operand fetch (unit smem) goes first; the warps' stores of P (P via
smem) and O (unit smem:lsu) get the bandwidth it leaves while a GEMM runs (bench_bursts.py stsm).
Overlap off: issue S(j), wait, softmax, rescale, convert, issue PV(j), and the
next S waits for it. Inter-warpgroup ping-pong (named barriers): WG w issues its GEMMs only after
WG w-1 issued its own, so one WG's softmax overlaps the other's GEMMs.
Tile boundary (persistent CTAs, fa4kernel): every consumer spends tile_prologue_cycles before the
next tile's first S GEMM; Q is handed back after the tile's last QK GEMM (early_q_release) or its
last block; the O store lasts o_store_cycles and, unless its wait is deferred to the next tile's
epilogue (defer_o_store_wait), holds warpgroup 0, whose first warp issues it.
Tile defaults per head dim: the SM90 table of docs/reference/fa4-schedules.md.
"""
from __future__ import annotations

from dataclasses import replace

from ..engine import Edge, Op, Schedule
from ..errors import InputError
from ..tile_order import ORDERS
from ..params import Knob, Problem
from ..rescale import rescale_rate
from ..softmax import add, exp2_phase, phase, scaled, warp_issue
from ..tensor_core import BYTES, check_shape, mma_cost

NAME = "fa3"
ARCH = "sm90"
DESCRIPTION = "FA3-style forward (SM90: producer WG + tile_m/64 consumer WGs, wgmma, ping-pong, intra-WG overlap)"

# hdim -> (tile_m, tile_n, P in registers, ping-pong): fa4-schedules.md, SM90 table
TABLE = {64: (192, 128, True, True), 96: (192, 144, False, True), 128: (128, 128, True, True),
         192: (128, 128, True, False), 256: (128, 80, True, False)}


def _row(p: Problem):
    if p.hdim in TABLE:
        tm, tn, rs, pp = TABLE[p.hdim]
        if p.hdim == 96 and p.causal:
            tn = 128
        return tm, tn, rs, pp
    return 128, 128, True, p.hdim <= 128


PIECES = 8  # modelling granularity of warpgroup compute ops (instructions interleave finer)

KNOBS = [
    Knob("tile_m", lambda p, k: _row(p)[0], "rows", "query rows per CTA tile (tile_m/64 consumer warpgroups)", minimum=64, maximum=256),
    Knob("tile_n", lambda p, k: _row(p)[1], "keys", "keys per KV block", minimum=8, maximum=256),
    Knob("kv_stages", 2, "slots", "smem stages of K and of V (each its own ring)", minimum=1),
    Knob("pingpong", lambda p, k: _row(p)[3], "", "inter-warpgroup ping-pong of GEMM issue (named barriers)", kind="bool"),
    Knob("intra_wg_overlap", True, "", "softmax(j) overlaps PV(j-1) inside a warpgroup", kind="bool"),
    Knob("p_in_registers", lambda p, k: _row(p)[2], "", "PV takes P from registers (RS wgmma); false: P staged through smem (SS)", kind="bool"),
    Knob("exp_overlaps_pv", False, "", "intra-WG overlap reaches the exp2s: they run while the previous block's PV GEMM "
         "does. False = as compiled: ptxas (CUDA 13.0) puts the PV wait right after the row max, so only the max "
         "overlaps PV (SASS of fa4kernel, every head dim; tests/test_kernel_sm90_compile.py)", kind="bool"),
    Knob("persistent", lambda p, k: _o_fits(p, k), "", "one CTA per SM looping over tiles (else one CTA per tile); "
         "default: where O gets its own smem buffer (fa4kernel)", kind="bool"),
    Knob("tile_order", "fa4kernel", "", "the order the kernel hands out its Q tiles (fa4sim/tile_order.py): "
         "fa4kernel's host table (L2 sections of heads, costliest first), flash-attn-4's LPT scheduler (2^k-head "
         "sections, longest first), an ideal costliest-first order (lpt), or blockIdx order (index)",
         kind="choice", choices=ORDERS),
    Knob("early_q_release", lambda p, k: k["intra_wg_overlap"] and consumer_warpgroups(k) == 2 and _o_fits(p, k),
         "", "the next tile's Q load waits only for this tile's last QK GEMM (each consumer hands Q back right "
         "after it; fa4kernel's default with 2 consumer warpgroups, intra-WG overlap and O in its own buffer); "
         "false: for the whole last KV block (softmax, P convert, O rescale)", kind="bool"),
    Knob("defer_o_store_wait", lambda p, k: _o_fits(p, k), "", "O in its own smem buffer: the warp that issues "
         "the O store (warpgroup 0's first) waits for its smem read only before the next tile's O (fa4kernel's "
         "default); false: right after issuing it, so warpgroup 0 starts its next tile after the store", kind="bool"),
    Knob("skip_idle_wgs", False, "", "consumer warpgroups whose 64 rows all lie past seqlen_q (the last tile of a "
         "length that is not a multiple of tile_m) skip their GEMMs and softmax (fa4kernel); false: they compute "
         "padding rows like the others (flash-attn-4)", kind="bool"),
    Knob("exp_emulation", 0.0, "fraction", "fraction of each row's exp2 done by the polynomial on the FMA pipe (FA4 trick; off in FA3)", kind="fraction"),
    Knob("rescale_threshold", None, "log2 units", "conditional rescaling threshold tau; none = always rescale (FA3)", kind="float_or_none", minimum=0.0),
    Knob("rescale_before_pv", lambda p, k: (p.hdim > 128 or k["rescale_threshold"] is not None)
         and k["intra_wg_overlap"], "", "intra-WG overlap: O *= the previous block's scale while S(j) is computed, "
         "before PV(j-1) is issued (FA4's RescaleOBeforeGemm, default for head dims > 128 in flash-attn-4 and "
         "fa4kernel, and in fa4kernel at every head dim with rescale_threshold: there its branch after the PV "
         "wait cost the loop as much as the FMULs it skips); false: after the PV wait", kind="bool"),
    Knob("rescale_rate", None, "fraction", "override: fraction of (warp, KV block) pairs that rescale (none = derive)", kind="float_or_none", minimum=0.0, maximum=1.0),
    Knob("tau_test_instr", lambda p, k: TAU_TEST_INSTR_BUILDS.get((p.hdim, p.causal), TAU_TEST_INSTR), "warp-instr",
         "with rescale_threshold: the instructions its test adds per warp and KV block, paid whether or not a "
         "rescale is skipped (fa4kernel's SASS: 12, 13 at hd256; TAU_TEST_INSTR)",
         kind="float", minimum=0.0),
    Knob("max_before_pv", 1.0, "fraction", "intra-WG overlap: share of the row max's FMNMX issued before the "
         "wait for the previous block's PV GEMM (the rest waits for it). Default: the whole max before, the "
         "exp2s and row sum after (the order validated so far); each build's compiled position is in "
         "schedules/pv_wait_sm90.py (fa4sim validate --pv-wait sass)", kind="fraction"),
    Knob("fma_before_pv", 0.0, "fraction", "the same for the FMA-pipe softmax work (scale FFMAs, row-sum FADDs, "
         "an emulated exp2's polynomial)", kind="fraction"),
    Knob("mufu_before_pv", 0.0, "fraction", "the same for the MUFU.EX2s", kind="fraction"),
    Knob("cta_prologue_cycles", 1570.0, "cycles", "a CTA's start-up before its first TMA (mbarrier init, descriptor "
         "prefetch, setmaxnreg, tile math): measured in fa4kernel on H100, first K load issued 1572 cycles after CTA "
         "start (benchmarks/results/timeline_h100_2026-11-22/timeline_hd128.json.gz)", kind="float", minimum=0.0),
    Knob("tile_prologue_cycles", 434.0, "cycles", "a consumer warpgroup's start of every tile before it issues "
         "the tile's first S GEMM (next tile id -> coordinates and KV range, O zeroed, Q and K waits): measured in "
         "fa4kernel's trace build on H100, hd128 1k, warpgroup 1's normalise end -> next S issue at the traced "
         "CTA's tile boundaries, 433-461 cycles, median 434 (benchmarks/results/timeline_h100_2026-11-22/"
         "timeline_hd128_1k.json.gz; its stamps may add to it)", kind="float", minimum=0.0),
    Knob("o_store_cycles", lambda p, k: O_STORE_FIXED + k["tile_m"] * p.hdim * BYTES / O_STORE_BYTES_PER_CLK,
         "cycles", "a tile's O store from its TMA issue to the bulk wait_group.read returning (the smem read "
         "done): 480 + bytes / 36 per clock, from fa4kernel's trace build on H100 (O_STORE_* below)",
         kind="float", minimum=0.0),
    Knob("o_store_issue_cycles", 0.0, "cycles", "what-if: warpgroup 0's time to issue a tile's O store (its first "
         "warp: fence, TMA store, commit, the deferred wait for the previous store) before it starts the next tile. "
         "fa4kernel's trace build stamps 213-244 cycles (O_STORE_ISSUE below). With that, ping-pong's per-tile "
         "cost appears (+276 cycles at 2 blocks; measured +321), but short tiles come out 7-9 % fast: another "
         "per-tile cost is still missing, so the default stays 0 (benchmarks/calibrate/README.md, eleventh "
         "session)", kind="float", minimum=0.0),
    Knob("hbm_busy", None, "fraction", "share of HBM bandwidth the rest of the chip takes while a CTA loads "
         "its Q tile (Q is read once, from HBM): the load gets the rest of the TMA rate. None = derived from "
         "the launch (the kernel model's HBM bytes over its time, one refinement pass)",
         kind="float_or_none", minimum=0.0, maximum=0.95),
    Knob("loop_overhead_fixed", 51.0, "warp-instr", "per consumer warp and KV block, the loop's instructions "
         "besides the softmax phases that do not scale with the GEMMs (pipeline waits and arrives, barriers, loop "
         "control, row statistics, partial-sum merges): they take SM issue slots the other warpgroups' softmax "
         "needs. Counted in fa4kernel's SASS (see BOOKKEEPING below); flash-attn-4: 60", kind="float", minimum=0.0),
    Knob("loop_overhead_per_kstep", 3.4, "warp-instr", "the same, per wgmma k-step of the block's two GEMMs "
         "(hdim/16 + tile_n/16): the HGMMA and its uniform-datapath descriptor arithmetic. fa4kernel's SASS; "
         "flash-attn-4: 2.5", kind="float", minimum=0.0),
    Knob("free_row_max", False, "", "what-if: the row max costs nothing (fa4kernel's ablate='max' build)", kind="bool"),
    Knob("free_exp2", False, "", "what-if: exp2 costs nothing, P = scaled S (fa4kernel's ablate='exp' build)", kind="bool"),
    Knob("free_row_sum", False, "", "what-if: the row sum costs nothing (fa4kernel's ablate='sum' build)", kind="bool"),
    Knob("score_std", 1.0, "nats", "std of softmax_scale*q.k for the rescale-rate model (randn inputs: 1)", kind="float", minimum=1e-3),
]

# BOOKKEEPING (knobs loop_overhead_fixed, loop_overhead_per_kstep): the KV loop's SASS holds
# 25-45 % more instructions than the softmax phases (softmax.py) count: per consumer warp and KV block,
# fa4kernel 415 / 464 / 400 instructions (467 at hd128 since the ninth session's unpeeled loop, which
# tests its block number for the Q hand-back; hd64 192 x 128, hd128 128 x 128, hd256 128 x 64; CUDA 13.0
# ptxas via nvidia-cutlass-dsl 4.8.1, fa4kernel.sass.kv_loop) against 328 / 359 / 278 modelled:
# HGMMA plus 2-4 uniform-datapath ops per wgmma k-step (descriptor offsets), pipeline waits, arrives
# and state, barriers, the loop test, row statistics. A line through 6 configurations (hd 64 / 128 /
# 256, tile_n 64 / 128, ping-pong on and off; residuals within 4.3): 51 + 3.4 per k-step (before the
# seventh session's kernel change, base descriptors built once: 427 / 480 / 419, 53 + 4.4).
# flash-attn-4 4.0.0b36 (compiled for sm_90a on a CPU): 420 / 457 / 429 (hd 256 with tile_n 80),
# 60 + 2.5 per k-step. Charged as SM issue slots where they are issued: per k-step inside the QK / PV
# ops, the fixed part with the row max.
# O store (knob o_store_cycles), from fa4kernel's trace build on H100 (op ST: TMA issue -> bulk
# wait_group.read done): 32 KB tiles (hd128, 128 rows) 1290-1422 cycles over 16 stores of 4 traces,
# median 1390; 64 KB (hd256, 128 rows, one CTA per tile, 1k causal) 2293 / 2307 (two CTAs):
# 480 + bytes / 36 per clock. (hd64's 24 KB 192-row tiles took 1540-1574, which this puts at 1163:
# not explained.) benchmarks/results/timeline_h100_2026-11-22/timeline_*.json.gz (32 KB, 24 KB) and
# benchmarks/results/tile_traces_h100_2026-11-22/hd256_1k_causal_cta*.json.gz (64 KB)
# O_STORE_ISSUE: warp 4's stamps around the O store's issue in fa4kernel's trace build, persistent
# walks of 2-block hd128 tiles with and without ping-pong (H100, 8 issues: 213-244 cycles, median 229;
# benchmarks/results/timeline_h100_2026-11-22/timeline_hd128_walk_2blocks*.json.gz). Not the default of
# knob o_store_issue_cycles (see its description).
O_STORE_ISSUE = 229.0
O_STORE_FIXED = 480.0
O_STORE_BYTES_PER_CLK = 36.0
# rescale_threshold's test in the KV loop: fa4kernel's SASS (CUDA 13.0 ptxas) with tau = 8 has
# 12 / 12 / 13 more instructions per warp and block than without (hd64 / 128 / 256, non-causal:
# FSETP +4, VOTE +1, BRA +1, FSEL +2, and the scale's FMUL/FADD +2 each; causal 12 / 12 / 12).
# Until the ninth session the causal hd128 build was the exception, 67 more: with the loop's last
# block peeled (early_q_release) ptxas moved the wgmma descriptor arithmetic from the uniform
# datapath to the vector one (R2UR +32, IMAD +29, IADD3 +16, UIADD3 -23), and one CTA's loop ran
# 2.9 % slower than without tau (benchmarks/results/knobs_loop_causal_h100_2026-11-22_peeled_loop.json); the
# unpeeled loop keeps it uniform (knobs_loop_causal_*_2026-11-22_tau_after_pv_wait.json: +0.7 %). flash-attn-4's
# test is not counted.
TAU_TEST_INSTR = 12.0
TAU_TEST_INSTR_BUILDS = {(256, False): 13.0}  # (hdim, causal) -> count, else 12
# P_STORE_ORDER: P via smem (p_in_registers false) with intra-WG overlap, fa4kernel's KV loop as
# compiled (CUDA 13.0 ptxas, hd128, causal and not): 7 of the 8 STSM.16.M88.4 per warp lie between
# the PV wait and the last MUFU.EX2 (the 8th right after it), the fence (MEMBAR.ALL.CTA,
# FENCE.VIEW.ASYNC.S) follows them, then the O rescale's 64 FMULs, then the warpgroup's BAR.SYNC
# ending the block (tests/test_kernel_sm90_compile.py checks the order)
# smem:lsu's share beside an SS wgmma whose fetch takes the whole bandwidth (N = 64, measured 0.024)
LSU_SHARE_FLOOR = 0.024
# what `fa4sim run` says with exp_emulation on SM90: where the model's emulation cost is known to miss
EMULATION_NOTE = ("exp_emulation on SM90: an emulated exp2 is its 8 SASS instructions, the 7 added ones at "
                  "mix_fill_slots = {fill:g} of a softmax issue slot each (measured 0.2 on H100 and H200 beside a "
                  "wgmma, bench_bursts.py --mma-gaps). Per SM that matches fa4kernel's hd128 loop within 3 pp; at "
                  "hd64 (three consumer warpgroups) and hd256 the kernel loses 2-6x more "
                  "(benchmarks/calibrate/README.md, twelfth session)")
PRODUCER_REGS = {2: 24, 3: 32}  # setmaxnreg of the producer WG (fa4-schedules.md)
SMEM_CAPACITY = 232448          # 227 KB per CTA on SM90 (the profiles' smem_capacity_bytes)
REG_OVERHEAD = 32               # addresses, loop state, row max/sum: an estimate


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
    """Q + K ring + V ring (+ P if staged); O's staging buffer is counted by separate_o()."""
    d, s = p.hdim, k["kv_stages"]
    b = k["tile_m"] * d * BYTES + 2 * s * k["tile_n"] * d * BYTES
    if not k["p_in_registers"]:
        b += k["tile_m"] * k["tile_n"] * BYTES
    return b + 1024


def _o_fits(p: Problem, k: dict) -> bool:
    """O's staging buffer fits beside Q, K and V (SM90's 227 KB); knobs not given take defaults."""
    tm, tn, rs, _ = _row(p)
    k = {"tile_m": tm, "tile_n": tn, "kv_stages": 2, "p_in_registers": rs, **k}
    return smem_bytes(p, k) + k["tile_m"] * p.hdim * BYTES <= SMEM_CAPACITY


def separate_o(hw, p: Problem, k: dict) -> bool:
    """O gets its own smem buffer when it fits beside Q, K, V (else it reuses Q's)."""
    return smem_bytes(p, k) + k["tile_m"] * p.hdim * BYTES <= hw.smem_capacity_bytes


def registers_needed(p: Problem, k: dict) -> int:
    """Per consumer thread: O (hdim/2 fp32), S (tile_n/2 fp32), P (tile_n/4 packed), overhead."""
    p_regs = k["tile_n"] // 4 if k["p_in_registers"] else 0
    return p.hdim // 2 + k["tile_n"] // 2 + p_regs + REG_OVERHEAD


def check(hw, p: Problem, k: dict) -> None:
    if hw.arch != ARCH:
        raise InputError("schedule", f"fa3 is the SM90 schedule; hw {hw.name} is {hw.arch} (use --schedule fa4)")
    check_shape(ARCH, k["tile_m"], k["tile_n"], p.hdim)
    check_shape(ARCH, 64, p.hdim, k["tile_n"])
    wgs = consumer_warpgroups(k)
    if wgs not in (1, 2, 3):
        raise InputError("tile_m", f"tile_m/64 = {wgs} consumer warpgroups; allowed 1..3 (tile_m 64, 128, 192)")
    need = smem_bytes(p, k)
    if need > hw.smem_capacity_bytes:
        raise InputError("smem", f"shared memory {need} B (hdim {p.hdim}, tile_m {k['tile_m']}, tile_n {k['tile_n']}, "
                                   f"kv_stages {k['kv_stages']}) exceeds {hw.smem_capacity_bytes} B (227 KB); lower kv_stages or tile_n")
    prod = PRODUCER_REGS.get(wgs, 24)
    avail = min(240, ((hw.registers_per_sm - 128 * prod) // (128 * wgs)) // 8 * 8)
    regs = registers_needed(p, k)
    if regs > avail:
        raise InputError("registers", f"a consumer thread needs ~{regs} registers (hdim {p.hdim}, tile_n {k['tile_n']}); "
                                   f"{wgs} consumer WGs get at most {avail}")


def rows_per_cta(k: dict) -> int:
    return k["tile_m"]


def unit_knobs(k: dict, rows: int) -> dict:
    """The knobs a tile with `rows` valid query rows runs with: with skip_idle_wgs, only its live
    consumer warpgroups (64 rows each) take part, as a tile of that many warpgroups would."""
    live = min(consumer_warpgroups(k), max(1, -(-rows // 64)))
    if not k["skip_idle_wgs"] or live == consumer_warpgroups(k):
        return k
    return {**k, "tile_m": 64 * live}


def _with_issue(uses: tuple, issue: float) -> tuple:
    return uses + (("issue", issue),) if issue > 0 else uses


def build(hw, p: Problem, k: dict, n_kv: int, masked_blocks: int) -> Schedule:
    d, n, W = p.hdim, k["tile_n"], consumer_warpgroups(k)
    mbar, nbar = hw.mbarrier_latency, hw.named_barrier_latency
    overlap, pp, rs = k["intra_wg_overlap"], k["pingpong"] and W > 1, k["p_in_registers"]
    before = overlap and k["rescale_before_pv"]  # O rescaled before the PV GEMM
    elems, rows = 64 * n, 64  # per consumer warpgroup per KV block
    f = k["exp_emulation"]
    rate = k["rescale_rate"]
    if rate is None:
        rate = rescale_rate(n_kv, k["rescale_threshold"], k["score_std"], cols=n, rows=16)  # 16 rows per warp

    qk = mma_cost(hw, 64, n, d, a_in_smem=True)
    pv = mma_cost(hw, 64, d, n, a_in_smem=not rs)
    # Shared memory serves the wgmma's operand fetch first: the warps' own stores (P and O to
    # smem, unit smem:lsu) get the share of its cycles the fetch leaves while a GEMM runs, and do
    # not delay the GEMM (bench_bursts.py stsm, H100 = H200: STSM bursts beside SS wgmma of N = 64 /
    # 128 / 256 run at 0.024 / 0.277 / 0.392 of their rate alone, 1 - fetch / bandwidth gives
    # 0 / 0.25 / 0.375; the wgmma slows 1-3 %). The fetch share here: this block's two GEMMs.
    fetch = (qk.smem_cycles + pv.smem_cycles) / (qk.tensor_cycles + pv.tensor_cycles)
    lsu_share = max(1.0 - fetch, LSU_SHARE_FLOOR)
    ops: list[Op] = []
    edges: list[Edge] = []

    kv = n * d * BYTES / hw.tma_bytes_per_clk
    # Q is read once per tile, from HBM: its bytes get the TMA rate the rest of the chip leaves
    # (trace, hd256 1k causal, one CTA per tile: Q issue -> first S GEMM 2980 cycles for 64 KB,
    # 2040 for 32 KB at hd128, where one SM alone loads 64 KB from HBM in 1513)
    q_rate = hw.tma_bytes_per_clk * (1.0 - (k.get("hbm_busy") or 0.0))
    ops += [Op("LQ", "load", (("tma", k["tile_m"] * d * BYTES / q_rate),), hw.hbm_latency, "load",
               asynchronous=True, issue_cycles=1, when="first", label="TMA Q tile (HBM)"),
            Op("LK", "load", (("tma", kv),), hw.l2_latency, "load", asynchronous=True, issue_cycles=1, label="TMA K block"),
            Op("LV", "load", (("tma", kv),), hw.l2_latency, "load", asynchronous=True, issue_cycles=1, label="TMA V block")]

    # the loop's bookkeeping instructions (BOOKKEEPING), as SM issue slots (4 warps per warpgroup):
    # per wgmma k-step beside the GEMM's tensor work, piece by piece as its HGMMAs issue (the issuing
    # warp's own time for them is in mma_issue_cycles, measured on a wgmma chain with its
    # descriptor math); the fixed part with the row max, around which the waits, barriers and row
    # statistics sit
    per_kstep = 4 * k["loop_overhead_per_kstep"] / hw.issue_per_clk
    # conditional rescaling's own test: per block, the rows' max-change compares, a warp vote, the
    # branch around the rescale and the scale's select (TAU_TEST_INSTR): instructions it adds
    # whether or not a rescale is skipped; like an emulated exp2's, they fill the softmax's idle
    # issue slots (mix_fill_slots of a slot each)
    tau_test = k["tau_test_instr"] * hw.mix_fill_slots if k["rescale_threshold"] is not None else 0.0
    fixed = 4 * (k["loop_overhead_fixed"] + tau_test) / hw.issue_per_clk
    for w in range(W):
        r = f"wg{w}"
        ops.append(Op(f"TS{w}", r, (), k["tile_prologue_cycles"], "sync", when="first",
                      label="tile start: coordinates, KV range, O = 0, Q/K waits"))
        ops.append(Op(f"QK{w}", r, _with_issue((("tensor", qk.tensor_cycles), ("smem", qk.smem_cycles)), per_kstep * d // 16), qk.latency, "mma",
                      asynchronous=True, issue_cycles=d // 16 * hw.mma_issue_cycles, chunks=d // 16, label=f"S = Q K^T (wgmma SS, WG{w})"))
        pv_op = Op(f"PV{w}", r, _with_issue((("tensor", pv.tensor_cycles), ("smem", pv.smem_cycles)), per_kstep * n // 16), pv.latency, "mma",
                   asynchronous=True, issue_cycles=n // 16 * hw.mma_issue_cycles, chunks=n // 16,
                   skew=1 if overlap else 0,
                   label=f"O += P V (wgmma {'RS' if rs else 'SS'}, WG{w})")
        # before: iteration j applies block j-1's scale (skew 1), while S(j) runs, ahead of PV(j-1)
        resc = Op(f"RESC{w}", r, tuple(scaled(phase(hw, "rescale", rows * d), rate).items()), 0.0,
                  "correction", skew=1 if before else 0, slowed=(("issue", hw.dense_issue_under_mma),),
                  label=f"O *= acc_scale (p={rate:.3g})" + (", before PV" if before else ""))
        if before:
            ops.append(resc)
        if overlap:
            ops.append(pv_op)
        if pp:
            ops.append(Op(f"PP{w}", r, (), nbar, "sync", label="ping-pong: let the next WG issue"))
        if masked_blocks:
            ops.append(Op(f"MASK{w}", r, tuple(phase(hw, "mask", elems * masked_blocks).items()), 0.0, "softmax",
                          when="first", label=f"causal/length mask, {masked_blocks} block(s)"))
        mx = {} if k["free_row_max"] else phase(hw, "max", elems, rows)
        exp = add(phase(hw, "scale", elems), {} if k["free_exp2"] else exp2_phase(hw, elems, f),
                  {} if k["free_row_sum"] else phase(hw, "sum", elems))
        exa = {}
        if overlap and not k["exp_overlaps_pv"]:
            # as compiled: what ptxas issues before the PV wait overlaps PV(j-1), the rest waits
            frac = {"max": k["max_before_pv"], "fma": k["fma_before_pv"], "mufu": k["mufu_before_pv"]}
            mx, mx_after = split_at_pv_wait(hw, mx, frac)
            exa, exp = split_at_pv_wait(hw, exp, frac)
            exp = add(mx_after, exp)
        if fixed > 0:
            mx = add(mx, {"issue": fixed})
        ops.append(Op(f"MAX{w}", r, tuple(mx.items()), hw.fma_latency * 4, "softmax",
                      label="row max (quad shuffles), acc_scale"))
        if any(v > 0 for v in exa.values()):
            ops.append(Op(f"EXA{w}", r, tuple(exa.items()), 0.0, "exp",
                          label="scale, exp2, row sum: the part issued before the PV wait"))
        # P via smem, as compiled (fa4kernel hd128, causal and not; P_STORE_ORDER): its
        # stores issue among the exp2s and the fence's wait overlaps the O rescale, so only the
        # warpgroup barrier is left at the end
        p_store = {"smem:lsu": elems * BYTES / hw.smem_bytes_per_clk} if not rs else {}
        p_in_exp = bool(p_store) and overlap and not before
        if p_in_exp:
            exp = add(exp, p_store)
        ops.append(Op(f"EXP{w}", r, tuple(exp.items()), hw.mufu_latency, "exp", label="exp2, row sum"
                      + (", P -> smem" if p_in_exp else "")))
        if not before:
            ops.append(resc)
        cvt = phase(hw, "convert", elems)
        if not p_in_exp:
            cvt = add(cvt, p_store)
        hand_off = 0.0 if rs else nbar if p_in_exp else hw.smem_latency + nbar
        ops.append(Op(f"CVT{w}", r, tuple(cvt.items()), hand_off, "softmax",
                      label="P -> bf16" + ("" if rs else ", barrier" if p_in_exp else " -> smem, fence, barrier")))
        if not overlap:
            ops.append(pv_op)
        ops.append(Op(f"FIN{w}", r, tuple(phase(hw, "normalize", rows * d).items()), 0.0, "correction",
                      when="last", skew=1 if overlap else 0, label="O / row_sum, convert"))
        # every consumer WG meets at a named barrier before O goes to smem (the O buffer is shared
        # and the previous tile's store must have read it): the WGs leave the tile together, so
        # the ping-pong stagger is rebuilt at the start of every tile
        ops.append(Op(f"OSM{w}", r, (("smem:lsu", rows * d * BYTES / hw.smem_bytes_per_clk),), hw.smem_latency,
                      "correction", when="last", skew=1 if overlap else 0,
                      label="consumer barrier, O -> smem"))
        if w == 0 and k["o_store_issue_cycles"] > 0:
            # the O store is issued by warpgroup 0's first warp (fa4kernel's warp 4): fence, TMA
            # store, commit, and the deferred wait for the previous store; warpgroup 0 starts its
            # next tile after it (O_STORE_ISSUE)
            ops.append(Op("OSI", r, (), k["o_store_issue_cycles"], "correction", when="last",
                          skew=1 if overlap else 0, label="warp 4: issue the O store"))
    # the CTA waits for the TMA engine to have *read* O from smem (bulk wait_group ..., read=True):
    # in the kernel's own stamps that takes o_store_cycles, far longer than the bytes at the TMA
    # load rate, so the difference is the store's latency
    st_tma = k["tile_m"] * d * BYTES / hw.tma_bytes_per_clk
    ops.append(Op("ST", "epilogue", (("tma", st_tma),), max(0.0, k["o_store_cycles"] - st_tma),
                  "store", asynchronous=True, issue_cycles=1, when="last", label="TMA store O (smem read)"))

    S = k["kv_stages"]
    for w in range(W):
        # where consumer w hands Q back: after the tile's last QK GEMM, or after its last block
        q_free = f"QK{w}" if k["early_q_release"] else f"CVT{w}" if before else f"RESC{w}" if overlap else f"PV{w}"
        edges += [Edge("LQ", f"QK{w}", lag=mbar), Edge("LK", f"QK{w}", lag=mbar), Edge("LV", f"PV{w}", lag=mbar),
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
        elif not k["exp_overlaps_pv"]:  # as compiled: the PV wait sits between row max and exp2s
            edges.append(Edge(f"PV{w}", f"EXP{w}", distance=1))
        if pp:  # a tile's first S GEMMs are issued without the hand-off (fa4kernel, FA3)
            prev = f"PP{(w - 1) % W}"
            edges.append(Edge(prev, f"QK{w}", distance=0 if w > 0 else 1, lag=nbar, skip_first=overlap))
    edges += [Edge(f"FIN{v}", f"OSM{w}", lag=nbar) for v in range(W) for w in range(W)]  # the barrier
    if k["o_store_issue_cycles"] > 0:
        edges.append(Edge("OSI", "ST"))
    if separate_o(hw, p, k):  # O has its own smem buffer: the next tile's O waits for this store
        edges += [Edge("ST", f"OSM{w}", 1, per="tile", kind="anti", lag=mbar) for w in range(W)]
        if not k["defer_o_store_wait"]:
            # the warp that issues the store waits for its smem read right away, and it is
            # warpgroup 0's first (fa4kernel's warp 4): warpgroup 0's next tile starts after it
            edges.append(Edge("ST", "TS0", 1, per="tile"))
    else:  # O is staged in Q's buffer: the next Q load waits for this tile's store
        edges.append(Edge("ST", "LQ", 1, per="tile", kind="anti", lag=mbar))

    # each warpgroup's own issue limit, then pieces so two warpgroups on one pipe share it (engine)
    compute_roles = [f"wg{w}" for w in range(W)]
    # (measured on the softmax-like mix, so it binds the softmax phases, not the plain FMUL/F2FP
    # streams of the rescale and convert, which the H100 timeline shows near full issue rate)
    softmax_ops = tuple(f"{n}{w}" for n in ("MASK", "MAX", "EXA", "EXP") for w in range(W))
    ops = [replace(o, uses=tuple(warp_issue(hw, dict(o.uses), o.role).items())) if o.name in softmax_ops else o
           for o in ops]
    ops = [replace(o, chunks=PIECES) if not o.asynchronous and o.uses else o for o in ops]
    units = {"tensor": 1, "smem": 1, "smem:lsu": 1, "mufu": 1, "fma": 1, "alu": 1, "issue": 1, "tma": 1,
             **{f"issue:{r}": 1 for r in compute_roles}}
    roles = ["load"] + [f"wg{w}" for w in range(W)] + ["epilogue"]
    return Schedule(NAME, units, roles, ops, edges, marker="QK0",
                    issue_depth={"tensor": int(hw.mma_queue_depth)},
                    interference={"mufu": ("tensor", hw.mufu_under_mma), "issue": ("tensor", hw.issue_under_mma),
                                  "smem:lsu": ("tensor", lsu_share),
                                  **{f"issue:{r}": ("tensor", hw.warp_issue_under_mma) for r in compute_roles}},
                    meta={"rescale_rate": rate, "flops_per_iter": 4.0 * k["tile_m"] * n * d,
                          "notes": [EMULATION_NOTE.format(fill=hw.mix_fill_slots)] if f > 0 else []})
