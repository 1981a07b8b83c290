"""FA4 backward on SM100 (B200), as flash-attn-4's flash_bwd_sm100.py runs it
(docs/reference/fa4-backward-and-solvers.md).

A CTA owns one KV tile (tile_n keys; a CTA pair 2 tile_n) and iterates over the Q blocks
(m_blocks of tile_m rows) that see it; one CTA per KV tile, no persistence. 16 warps; roles
(names as in flash_bwd_sm100.py):
  load      warp 13: TMA of K and V once per tile, then per Q block Q (+ LSE) and dO (+ dPsum);
            a CTA pair also loads its halves of the transposed Q^T and dO^T and K^T for dQ
  mma       warp 12: one thread issues the five tcgen05.mma per Q block, software-pipelined:
              1-CTA:  S(j), dK(j-1), dQ(j-1), dP(j), dV(j)
              2-CTA:  S(j), dK(j-1), dP(j), dQ(j-1), dV(j)
            S^T = K Q^T and dP^T = V dO^T (SS), dV += P^T dO and dK += dS^T Q (P, dS from
            TMEM), dQ = dS K (SS, dS from shared memory)
  compute   warps 4-11 (two warpgroups, one key row per TMEM lane): P = exp2(S scale - LSE)
            -> TMEM (over S), then dS = P (dP - dPsum) -> TMEM (over dP) and shared memory; a
            pair sends half of dS to the peer (a bulk copy into its shared memory); at the end
            of the tile dK and dV TMEM -> bf16 -> TMA store
  reduce    warps 0-3 (dQ reduce): dQ TMEM -> registers (frees dQ's TMEM), then column stages
            -> fp32 shared memory -> TMA bulk reduce-add into the fp32 dQ accumulator in global
            memory, through sdQaccum_stage staging slots; deterministic: each Q block's adds
            between a semaphore read and a release, after they have landed
  relay     warp 14 (pair only): waits for the peer's half of dS, tells the MMA warp
TMEM (1-CTA, hd128): S/P 0-127, dV 128-255, dP/dS 256-383 (dQ over dP), dK 384-511; a pair puts
dQ (half its columns per SM) over the tail of S, so S(j+1) waits for dQ(j-1) to be read out and
dQ(j) waits until the compute warps have read S(j+1) (their dS commit is deferred past that).
"""
from __future__ import annotations

from dataclasses import replace

from ..engine import Edge, Op, Schedule
from ..errors import InputError
from ..feeds import bwd_gemms
from ..params import Knob, Problem
from ..softmax import add, beside_gemm, exp2_phase, mix_limits, phase
from ..tensor_core import BYTES, check_shape
from . import kernel_bwd

NAME = "fa4"
ARCH = "sm100"
PASS = "bwd"
DESCRIPTION = ("FlashAttention-4 backward (SM100: five tcgen05 MMAs per Q block, TMEM accumulators, dQ "
               "reduce-added through fp32 shared memory, optional CTA pair)")
DEFAULT_IMPL = "flash-attn-4"

PIECES = 8
COMPUTE_WARPS = 8

KNOBS = [
    Knob("tile_m", 128, "rows", "Q rows per Q block (the N of S^T and dP^T)", choices=(64, 128)),
    Knob("tile_n", 128, "keys", "keys per KV tile per SM (the M of S^T, dP^T, dV, dK)", choices=(64, 128)),
    Knob("two_cta", False, "", "CTA pair (cluster of 2): S, dP, dV, dK as M = 256 MMAs over 2 KV tiles, dQ as "
         "M = 128 over the pair's keys, half of dS exchanged through distributed shared memory", kind="bool"),
    Knob("deterministic", False, "", "dQ reduce-adds of a Q block in a fixed KV-tile order, held by per-block "
         "semaphores (the adds land before the next CTA's)", kind="bool"),
    Knob("q_stages", lambda c, k: 1 if k["two_cta"] else 2, "slots", "shared-memory stages of Q (flash-attn-4: 2; "
         "1 on a CTA pair, which also keeps Q^T)", minimum=1, maximum=2),
    Knob("dq_reduce_cols", lambda c, k: (16 if k["deterministic"] else 8) if k["two_cta"] else 32, "columns",
         "dQ columns per TMA reduce-add stage", choices=(8, 16, 24, 32)),
    Knob("dq_stages", lambda c, k: (2 if k["deterministic"] else 4) if k["two_cta"] else 64 // k["dq_reduce_cols"],
         "slots", "fp32 dQ staging slots in shared memory (sdQaccum_stage)", minimum=1, maximum=8),
    Knob("gqa_dkv", "reduce", "", "grouped K/V heads (heads_kv < heads): reduce = one CTA per KV tile of each q "
         "head, dK and dV reduce-added in fp32 into per-K/V-head accumulators (zeroed before, converted to 16 bit "
         "after: flash-attn-4); loop = one CTA per KV tile of each K/V head walking the Q blocks of every q head "
         "of its group, dK and dV summed in registers (fa4kernel); no effect without grouped heads",
         kind="choice", choices=("reduce", "loop")),
]


def facts(ctx, k: dict) -> dict:
    return {}


def rows_per_cta(k: dict) -> int:
    """Keys per CTA (the backward's rows)."""
    return k["tile_n"]


def tmem_columns(p: Problem, k: dict) -> int:
    """S (tile_m fp32 columns) + dV (hdim_v) + dP (tile_m) + dK (hdim); dQ overlaps dP (1-CTA)
    or the tail of S (pair); P and dS overlay S and dP."""
    return 2 * k["tile_m"] + p.hdim + p.hdim_v


def smem_bytes(p: Problem, k: dict) -> int:
    """K, V, Q (q_stages), dO, dS, the fp32 dQ staging, dK/dV epilogue staging (reused), per CTA;
    a pair keeps half of Q and dO plus their transposed halves, K^T and the dS exchange half."""
    d, dv, m, n = p.hdim, p.hdim_v, k["tile_m"], k["tile_n"]
    two = k["two_cta"]
    q = k["q_stages"] * m * d * BYTES  # a pair: its halves of Q and of Q^T
    do = m * dv * BYTES                # a pair: its halves of dO and of dO^T
    kv = n * (d + dv) * BYTES + (n * d * BYTES if two else 0)
    ds = n * m * BYTES
    dq = m * k["dq_reduce_cols"] * 4 * k["dq_stages"]
    return int(q + do + kv + ds + dq) + 2048  # + mbarriers, LSE, dPsum


def check(hw, p: Problem, k: dict, impl=None) -> None:
    if hw.arch != ARCH:
        raise InputError("schedule", f"the fa4 backward is the SM100 schedule; hw {hw.name} is {hw.arch} "
                                     f"(use --schedule fa3)")
    two = k["two_cta"]
    m_mma = k["tile_n"] * (2 if two else 1)
    check_shape(ARCH, m_mma, k["tile_m"], p.hdim, two)
    check_shape(ARCH, m_mma, p.hdim_v, k["tile_m"], two)
    if p.hdim % 32 or p.hdim_v % 32 or p.hdim > 128 or p.hdim_v > 128:
        raise InputError("hdim", f"the modelled SM100 backward runs head dims that are multiples of 32 up to 128 "
                                 f"(hd192 and hd256 take other schedules); got {p.hdim}/{p.hdim_v}")
    if two and (k["tile_m"] != 128 or k["tile_n"] != 128):
        raise InputError("two_cta", "the CTA pair's pipelined schedule runs 128 x 128 tiles")
    cols = tmem_columns(p, k)
    if cols > hw.tmem_columns:
        raise InputError("tmem", f"S + dP ({2 * k['tile_m']}) + dK + dV ({p.hdim + p.hdim_v}) = {cols} TMEM columns; "
                                 f"at most {hw.tmem_columns}")
    per_cta = (p.hdim // (2 if two else 1))
    if per_cta % k["dq_reduce_cols"]:
        raise InputError("dq_reduce_cols", f"{k['dq_reduce_cols']} does not divide the {per_cta} dQ columns per SM")
    need = smem_bytes(p, k)
    if need > hw.smem_capacity_bytes:
        raise InputError("smem", f"shared memory {need} B exceeds {hw.smem_capacity_bytes} B of {hw.name}; "
                                 f"lower dq_stages or q_stages")


def dq_hold(hw, p: Problem, k: dict) -> float:
    """Cycles a CTA holds a Q block's deterministic dQ order (kernel_bwd.dq_order_wait)."""
    return kernel_bwd.dq_order_wait(hw, k["tile_m"] * p.hdim // (2 if k["two_cta"] else 1) * 4)


def build(hw, p: Problem, k: dict, n_kv: int, masked_blocks: int, impl=None, hbm_busy: float = 0.0) -> Schedule:
    """One CTA's schedule for a KV tile that visits n_kv Q blocks, `masked_blocks` of them masked
    (iterations are Q blocks)."""
    d, dv, m, n = p.hdim, p.hdim_v, k["tile_m"], k["tile_n"]
    two, det = k["two_cta"], k["deterministic"]
    half = 2 if two else 1
    mbar, nbar = hw.mbarrier_latency, hw.named_barrier_latency
    tmem = lambda nbytes: nbytes / hw.tmem_bytes_per_clk  # noqa: E731
    smem = lambda nbytes: nbytes / hw.smem_bytes_per_clk  # noqa: E731
    tma = lambda nbytes: nbytes / hw.tma_bytes_per_clk    # noqa: E731
    elems = n * m  # scores of this CTA's S^T per Q block
    g = bwd_gemms(hw, d, dv, m, n, two)

    ops: list[Op] = []
    edges: list[Edge] = []

    # load warp: K, V (and K^T on a pair) once per tile; Q (+ LSE) and dO (+ dPsum) per Q block
    # the order of flash_bwd_sm100.py's load warp: K and V first; then per Q block (a pair:
    # Q^T of the previous block first), Q (+ LSE), dO (+ dPsum; a pair: dO^T with it)
    ops.append(Op("LK", "load", (("tma", tma(n * d * BYTES * (2 if two else 1))),), hw.hbm_latency, "load",
                  asynchronous=True, issue_cycles=1, when="first", label="TMA K tile" + (" and K^T" if two else "")))
    ops.append(Op("LV", "load", (("tma", tma(n * dv * BYTES)),), hw.hbm_latency, "load",
                  asynchronous=True, issue_cycles=1, when="first", label="TMA V tile"))
    if two:
        ops.append(Op("LQt", "load", (("tma", tma(m * d * BYTES / half)),), hw.l2_latency, "load",
                      asynchronous=True, issue_cycles=1, skew=1, label="TMA Q^T of the previous block, its half"))
    ops.append(Op("LQ", "load", (("tma", tma(m * d * BYTES / half + m * 4)),), hw.l2_latency, "load",
                  asynchronous=True, issue_cycles=1, label="TMA Q block (+ LSE)" + (", its half" if two else "")))
    ops.append(Op("LdO", "load", (("tma", tma(m * dv * BYTES + m * 4)),), hw.l2_latency,
                  "load", asynchronous=True, issue_cycles=1,
                  label="TMA dO block (+ dPsum)" + (", halves of dO and dO^T" if two else "")))

    def mma(name, cost, kdim, skew, label):
        steps = kdim // 16
        return Op(name, "mma", (("tensor", cost.tensor_cycles), ("smem", cost.smem_cycles)), cost.latency, "mma",
                  asynchronous=True, issue_cycles=steps * hw.mma_issue_cycles, chunks=steps, skew=skew, label=label)

    s_op = mma("S", g["S"], d, 0, "S^T = K Q^T")
    dk_op = mma("dK", g["dK"], m, 1, "dK += dS^T Q")
    dq_op = mma("dQ", g["dQ"], n * half, 1, "dQ = dS K")
    dp_op = mma("dP", g["dP"], dv, 0, "dP^T = V dO^T")
    dv_op = mma("dV", g["dV"], m, 0, "dV += P^T dO")
    ops += [s_op, dk_op, dp_op, dq_op, dv_op] if two else [s_op, dk_op, dq_op, dp_op, dv_op]

    # compute warpgroups
    r = "compute"
    ops.append(Op("LDS", r, (("tmem", tmem(elems * 4)),), hw.tmem_latency, "softmax", label="tcgen05.ld S"))
    if two:  # the previous dS's commit also says S was read: dQ overwrites the tail of S
        ops.append(Op("DSC", r, (), 0.0, "sync", skew=1, label="commit dS (deferred past the next S read)"))
    if masked_blocks:
        ops.append(Op("MASK", r, tuple(phase(hw, "mask", elems * masked_blocks).items()), 0.0, "softmax",
                      when="first", label=f"causal/length mask, {masked_blocks} Q block(s)"))
    exp = add(phase(hw, "scale", elems), exp2_phase(hw, elems, 0.0), phase(hw, "convert", elems),
              {"tmem": tmem(elems * BYTES)})
    ops.append(Op("EXP", r, tuple(exp.items()), hw.tmem_latency + nbar, "exp",
                  label="P = exp2(S scale - LSE), tcgen05.st P"))
    # dS = P (dP - dPsum): a packed subtract and a packed multiply per pair ("rescale" = FMUL2)
    ds = add({"tmem": tmem(elems * 4)}, phase(hw, "rescale", 2 * elems), phase(hw, "convert", elems),
             {"tmem": tmem(elems * BYTES)}, {"smem": smem(elems * BYTES)})
    ops.append(Op("DS", r, tuple(ds.items()), hw.tmem_latency + nbar, "softmax",
                  label="tcgen05.ld dP, dS = P (dP - dPsum), tcgen05.st dS, dS -> smem"))
    if two:
        # the bulk copy of half of dS to the peer: its read here and, symmetrically, the peer's
        # half arriving here
        ops.append(Op("XCHG", r, (("tma", tma(elems * BYTES / 2)), ("smem", smem(elems * BYTES))), mbar, "load",
                      asynchronous=True, issue_cycles=1, label="dS half -> peer (DSMEM bulk copy)"))
        ops.append(Op("RELAY", "relay", (), mbar, "sync", label="peer's dS arrived -> MMA warp"))
    epi = add({"tmem": tmem(n * (d + dv) * 4)}, phase(hw, "convert", n * (d + dv)), {"smem": smem(n * (d + dv) * BYTES)})
    ops.append(Op("EPI", r, tuple(epi.items()), hw.tmem_latency + hw.smem_latency, "correction", when="last",
                  label="dK, dV: TMEM -> bf16 -> smem"))
    ops.append(Op("STKV", r, (("tma", tma(n * (d + dv) * BYTES)),), hw.l2_latency, "store", asynchronous=True,
                  issue_cycles=1, when="last", label="TMA store dK, dV"))

    # dQ reduce warps: TMEM -> registers, then stages through the fp32 staging slots
    cols = d // half
    ncol, slots = k["dq_reduce_cols"], k["dq_stages"]
    stages = cols // ncol
    stage_bytes = m * ncol * 4  # 128 TMEM lanes x ncol fp32 columns
    q = "reduce"
    ops.append(Op("RDQ", q, (("tmem", tmem(m * cols * 4)),), hw.tmem_latency, "correction",
                  label="tcgen05.ld dQ (frees its TMEM)"))
    for s in range(stages):
        ops.append(Op(f"STQ{s}", q, (("smem", smem(stage_bytes)),), hw.smem_latency + nbar, "correction",
                      label=f"dQ stage {s} -> fp32 smem"))
        if det and s == 0:  # after the first stage's store, before its add
            ops.append(Op("SEMA", q, (), hw.l2_latency, "sync", label="deterministic: read the Q block's semaphore"))
        ops.append(Op(f"ADDQ{s}", q, (("tma", tma(stage_bytes)), ("smem", smem(stage_bytes))), 0.0, "store",
                      asynchronous=True, issue_cycles=1, label=f"TMA reduce-add dQ stage {s}"))
    if det:
        ops.append(Op("SEMR", q, (), hw.l2_latency, "sync", label="deterministic: adds landed, release semaphore"))

    # dependencies
    lq_s = k["q_stages"]
    edges += [Edge("LK", "S", lag=mbar), Edge("LQ", "S", lag=mbar), Edge("LV", "dP", lag=mbar),
              Edge("LdO", "dP", lag=mbar), Edge("LdO", "dV", lag=mbar),
              Edge("S", "LDS", lag=mbar),
              Edge("EXP", "dV", lag=mbar),               # P in TMEM
              Edge("dP", "DS", lag=mbar),
              Edge("DS", "dK", lag=mbar),                # dS in TMEM
              Edge("dQ", "DS", distance=1, kind="anti", lag=mbar),  # sdS read by the last dQ
              Edge("dQ", "RDQ", lag=mbar),
              Edge("dV", "LdO", distance=1, kind="anti", lag=mbar),  # one dO stage
              Edge("dK", "EPI", lag=mbar), Edge("dV", "EPI", lag=mbar), Edge("EPI", "STKV", lag=nbar),
              Edge("EPI", "dV", distance=1, per="tile", kind="anti"), Edge("EPI", "dK", distance=1, per="tile",
                                                                         kind="anti"),
              Edge("dQ", "LK", distance=1, per="tile", kind="anti", lag=mbar),
              Edge("dP", "LV", distance=1, per="tile", kind="anti", lag=mbar)]
    if two:
        edges += [Edge("LQt", "dK", lag=mbar), Edge("dK", "LQt", distance=1, kind="anti", lag=mbar),
                  Edge("S", "LQ", distance=lq_s, kind="anti", lag=mbar),
                  Edge("DS", "XCHG", lag=nbar), Edge("XCHG", "RELAY"), Edge("RELAY", "dQ", lag=mbar),
                  Edge("dQ", "XCHG", distance=1, kind="anti", lag=mbar),  # the peer's sdS is free
                  Edge("DSC", "dQ", lag=mbar),
                  Edge("RDQ", "S", distance=2, lag=mbar)]  # dQ sits over the tail of S
    else:
        edges += [Edge("DS", "dQ", lag=mbar),
                  Edge("dK", "LQ", distance=lq_s, kind="anti", lag=mbar),
                  Edge("RDQ", "dP", distance=1, lag=mbar)]  # dQ sits over dP
    for s in range(stages):
        edges.append(Edge(f"STQ{s}", f"ADDQ{s}", lag=nbar))
        if s >= slots:
            edges.append(Edge(f"ADDQ{s - slots}", f"STQ{s}", kind="anti"))
        elif stages - slots + s >= 0:
            edges.append(Edge(f"ADDQ{stages - slots + s}", f"STQ{s}", distance=1, kind="anti"))
    if det:  # the release waits for every add of the Q block to have landed in L2
        edges += [Edge(f"ADDQ{s}", "SEMR", lag=hw.l2_latency) for s in range(stages)]

    compute_roles = {"compute": COMPUTE_WARPS, "reduce": 4}
    ops = [mix_limits(hw, o, compute_roles[o.role]) if o.role in compute_roles else o for o in ops]
    ops = [replace(o, chunks=PIECES) if not o.asynchronous and o.uses else o for o in ops]
    units = {"tensor": 1, "smem": 1, "tmem": 1, "mufu": 1, "fma": 1, "alu": 1, "issue": 1, "tma": 1,
             **{f"issue:{r}": 1 for r in compute_roles}}
    roles = ["load", "mma", "compute", "reduce"] + (["relay"] if two else [])
    flops = 2.0 * m * n * (3 * d + 2 * dv)
    return Schedule(f"{NAME}-bwd", units, roles, ops, edges, marker="S",
                    issue_depth={"tensor": int(hw.mma_queue_depth)},
                    interference=beside_gemm(hw, compute_roles),
                    meta={"flops_per_iter": flops, "dq_hold": dq_hold(hw, p, k) if det else 0.0})
