"""FA3-style backward on SM90 (H100/H200), as flash-attn-4's flash_bwd_sm90.py runs it
(docs/reference/fa4-backward-and-solvers.md).

A CTA owns one KV tile (tile_n keys) and iterates over the Q blocks (tile_m rows) that see it;
one CTA per KV tile. Roles (warps as in flash_bwd_sm90.py):
  load      producer warpgroup, warp 0: TMA of K and V once, then per Q block Q (+ LSE) and
            dO (+ dPsum) through q_stages and do_stages slots
  dq_store  producer warpgroup, warp 1: per Q block, for each warpgroup's share of dQ, a TMA bulk
            reduce-add from fp32 shared memory into the fp32 dQ accumulator in global memory
  wg{w}     two MMA warpgroups; each issues its part of the five wgmmas per Q block and keeps
            its part of the dK and dV accumulators in registers:
              S = Q K^T, dP = dO V^T (async), P = exp2(S scale - LSE) while dP runs, dS = P (dP
              - dPsum), dS -> shared memory (and P, where dV takes it from there), a barrier of
              both warpgroups, dV += P^T dO, dQ = dS K, dK += dS^T Q, dQ -> fp32 shared memory,
              then a wait for all of its wgmmas
How the two warpgroups split each GEMM (AtomLayout*, *_swapAB) and whether dV and dK take P
and dS from registers come from the implementation (flash-attn-4's _tile_size_bwd_sm90).
A warpgroup that computes M = 128 rows issues two m64 wgmmas, each reading the whole B operand.
"""
from __future__ import annotations

from dataclasses import replace

from ..engine import Edge, Op, Schedule
from ..errors import InputError
from ..params import Knob, Problem
from ..softmax import add, exp2_phase, phase, warp_issue
from ..tensor_core import BYTES, check_shape
from . import kernel_bwd

NAME = "fa3"
ARCH = "sm90"
PASS = "bwd"
DESCRIPTION = ("FA3-style backward (SM90: producer warpgroup, two MMA warpgroups issuing five wgmmas per Q "
               "block, dQ reduce-added through fp32 shared memory)")
DEFAULT_IMPL = "fa4kernel"  # as the forward; its bwd section mirrors flash-attn-4 until its own exists

PIECES = 8
WGS = 2

KNOBS = [
    Knob("tile_m", 64, "rows", "Q rows per Q block", minimum=16, maximum=256),
    Knob("tile_n", 128, "keys", "keys per KV tile", minimum=16, maximum=256),
    Knob("q_stages", 2, "slots", "shared-memory stages of Q (+ LSE)", minimum=1, maximum=2),
    Knob("do_stages", 2, "slots", "shared-memory stages of dO (+ dPsum)", minimum=1, maximum=2),
    Knob("pds_stages", 2, "slots", "shared-memory stages of P and dS", minimum=1, maximum=2),
    Knob("sdp_swapab", True, "", "S and dP computed transposed (keys on the wgmma's M)", kind="bool"),
    Knob("dkv_swapab", False, "", "dK and dV computed transposed (head dim on M)", kind="bool"),
    Knob("dq_swapab", False, "", "dQ computed transposed (head dim on M)", kind="bool"),
    Knob("atom_sdp", 1, "WGs", "warpgroups along M of S and dP (the rest along N)", choices=(1, 2)),
    Knob("atom_dkv", 2, "WGs", "warpgroups along M of dK and dV", choices=(1, 2)),
    Knob("atom_dq", 1, "WGs", "warpgroups along M of dQ", choices=(1, 2)),
    Knob("dq_single_wg", False, "", "only warpgroup 0 computes dQ", kind="bool"),
    Knob("deterministic", False, "", "dQ reduce-adds of a Q block in a fixed KV-tile order (semaphores)",
         kind="bool"),
]


def facts(ctx, k: dict) -> dict:
    return {}


def rows_per_cta(k: dict) -> int:
    return k["tile_n"]


def dkv_in_registers(k: dict) -> bool:
    """dV and dK take P and dS from registers (RS): flash_bwd_sm90.py's mma_dkv_is_rs."""
    return k["atom_sdp"] == 1 and k["atom_dkv"] == WGS and k["sdp_swapab"] and not k["dkv_swapab"]


def gemms(hw, p: Problem, k: dict) -> dict:
    """Per warpgroup: name -> (tensor cycles, smem cycles, latency, k-steps). A GEMM's M x N is
    split over the warpgroups by its atom layout (atom along M, the rest along N); each m64
    wgmma of a warpgroup reads its A rows and the warpgroup's whole B."""
    d, dv, m, n = p.hdim, p.hdim_v, k["tile_m"], k["tile_n"]
    rs = dkv_in_registers(k)
    shapes = {  # name: (M, N, K, A in smem, atom along M, warpgroups)
        "S": ((n, m) if k["sdp_swapab"] else (m, n)) + (d, True, k["atom_sdp"], WGS),
        "dP": ((n, m) if k["sdp_swapab"] else (m, n)) + (dv, True, k["atom_sdp"], WGS),
        "dV": ((dv, n) if k["dkv_swapab"] else (n, dv)) + (m, k["dkv_swapab"] or not rs, k["atom_dkv"], WGS),
        "dK": ((d, n) if k["dkv_swapab"] else (n, d)) + (m, k["dkv_swapab"] or not rs, k["atom_dkv"], WGS),
        "dQ": ((d, m) if k["dq_swapab"] else (m, d)) + (n, True, 1 if k["dq_single_wg"] else k["atom_dq"],
                                                         1 if k["dq_single_wg"] else WGS),
    }
    out = {}
    for name, (M, N, K, a_smem, atom_m, wgs) in shapes.items():
        mw, nw = M // atom_m, N // (wgs // atom_m)
        instr = max(1, mw // 64)
        tensor = 2.0 * mw * nw * K / hw.tensor_flops_per_clk
        smem = ((mw * K * BYTES if a_smem else 0) + instr * nw * K * BYTES) / hw.smem_bytes_per_clk
        out[name] = (tensor, smem, hw.mma_latency_ss if a_smem else hw.mma_latency_rs, K // 16)
    return out


def smem_bytes(p: Problem, k: dict) -> int:
    """Q, dO (stages, + LSE, dPsum), K, V, P and dS (stages), the fp32 dQ staging, bytes."""
    d, dv, m, n = p.hdim, p.hdim_v, k["tile_m"], k["tile_n"]
    pds = (1 if dkv_in_registers(k) else 2) * m * n * BYTES * k["pds_stages"]
    return int(k["q_stages"] * m * (d * BYTES + 4) + k["do_stages"] * m * (dv * BYTES + 4) + n * (d + dv) * BYTES
               + pds + m * d * 4) + 1024


def check(hw, p: Problem, k: dict, impl=None) -> None:
    if hw.arch != ARCH:
        raise InputError("schedule", f"the fa3 backward is the SM90 schedule; hw {hw.name} is {hw.arch} "
                                     f"(use --schedule fa4)")
    for name, kdim in (("tile_m", k["tile_m"]), ("tile_n", k["tile_n"])):
        if kdim % 16:
            raise InputError(name, f"{kdim} must be a multiple of 16 (the K of dV, dK and dQ wgmmas)")
    rows, cols = (k["tile_n"], k["tile_m"]) if k["sdp_swapab"] else (k["tile_m"], k["tile_n"])
    check_shape(ARCH, rows // k["atom_sdp"], cols // (WGS // k["atom_sdp"]), p.hdim)  # a warpgroup's part of S
    need = smem_bytes(p, k)
    if need > hw.smem_capacity_bytes:
        raise InputError("smem", f"shared memory {need} B exceeds {hw.smem_capacity_bytes} B of {hw.name}; "
                                 f"lower q_stages, do_stages or tile_n")


def dq_hold(hw, p: Problem, k: dict) -> float:
    return kernel_bwd.dq_order_wait(hw, k["tile_m"] * p.hdim * 4)


def build(hw, p: Problem, k: dict, n_kv: int, masked_blocks: int, impl=None, hbm_busy: float = 0.0) -> Schedule:
    """One CTA's schedule for a KV tile that visits n_kv Q blocks (iterations), `masked_blocks`
    of them masked."""
    d, dv, m, n = p.hdim, p.hdim_v, k["tile_m"], k["tile_n"]
    mbar, nbar = hw.mbarrier_latency, hw.named_barrier_latency
    smem = lambda nbytes: nbytes / hw.smem_bytes_per_clk  # noqa: E731
    tma = lambda nbytes: nbytes / hw.tma_bytes_per_clk    # noqa: E731
    rs = dkv_in_registers(k)
    g = gemms(hw, p, k)
    dq_wgs = 1 if k["dq_single_wg"] else WGS
    elems = m * n // WGS  # scores per warpgroup per Q block
    det = k["deterministic"]

    ops: list[Op] = [
        Op("LK", "load", (("tma", tma(n * d * BYTES)),), hw.hbm_latency, "load", asynchronous=True, issue_cycles=1,
           when="first", label="TMA K tile"),
        Op("LV", "load", (("tma", tma(n * dv * BYTES)),), hw.hbm_latency, "load", asynchronous=True, issue_cycles=1,
           when="first", label="TMA V tile"),
        Op("LQ", "load", (("tma", tma(m * d * BYTES + m * 4)),), hw.l2_latency, "load", asynchronous=True,
           issue_cycles=1, label="TMA Q block (+ LSE)"),
        Op("LdO", "load", (("tma", tma(m * dv * BYTES + m * 4)),), hw.l2_latency, "load", asynchronous=True,
           issue_cycles=1, label="TMA dO block (+ dPsum)"),
    ]
    edges: list[Edge] = [Edge("LK", f"S{w}", lag=mbar) for w in range(WGS)]

    def wgmma(name, w, label):
        tensor, sm, lat, steps = g[name]
        return Op(f"{name}{w}", f"wg{w}", (("tensor", tensor), ("smem", sm)), lat, "mma", asynchronous=True,
                  issue_cycles=steps * hw.mma_issue_cycles, chunks=steps, label=label)

    for w in range(WGS):
        r = f"wg{w}"
        ops.append(wgmma("S", w, "S = Q K^T (its part)"))
        ops.append(wgmma("dP", w, "dP = dO V^T (its part)"))
        if masked_blocks:
            ops.append(Op(f"MASK{w}", r, tuple(phase(hw, "mask", elems * masked_blocks).items()), 0.0, "softmax",
                          when="first", label=f"causal/length mask, {masked_blocks} Q block(s)"))
        exp = add(phase(hw, "scale", elems), exp2_phase(hw, elems, 0.0), phase(hw, "convert", elems),
                  {} if rs else {"smem": smem(elems * BYTES)})
        ops.append(Op(f"EXP{w}", r, tuple(exp.items()), hw.mufu_latency, "exp",
                      label="P = exp2(S scale - LSE), to bf16" + ("" if rs else ", P -> smem")))
        # dS = P (dP - dPsum): a subtract and a multiply per element ("rescale" = one FMUL each)
        ds = add(phase(hw, "rescale", 2 * elems), phase(hw, "convert", elems), {"smem": smem(elems * BYTES)})
        ops.append(Op(f"DS{w}", r, tuple(ds.items()), hw.smem_latency + nbar, "softmax",
                      label="dS = P (dP - dPsum), dS -> smem, barrier of both WGs"))
        ops.append(wgmma("dV", w, "dV += P^T dO" + (" (P in registers)" if rs else "")))
        if w < dq_wgs:
            ops.append(wgmma("dQ", w, "dQ = dS K (its part)"))
        ops.append(wgmma("dK", w, "dK += dS^T Q" + (" (dS in registers)" if rs else "")))
        if w < dq_wgs:
            ops.append(Op(f"DQW{w}", r, (("smem", smem(m * d * 4 / dq_wgs)),), hw.smem_latency + nbar, "correction",
                          label="dQ (fp32) -> smem"))
        ops.append(Op(f"WAIT{w}", r, (), 0.0, "sync", label="wait for its wgmmas, release Q"))
        ops.append(Op(f"EPI{w}", r, (("smem", smem(n * (d + dv) * BYTES / WGS)),), hw.smem_latency, "correction",
                      when="last", label="dK, dV -> bf16 -> smem"))
        edges += [Edge("LQ", f"S{w}", lag=mbar), Edge("LdO", f"dP{w}", lag=mbar), Edge("LV", f"dP{w}", lag=mbar),
                  Edge(f"S{w}", f"MASK{w}" if masked_blocks else f"EXP{w}"),
                  Edge(f"dP{w}", f"DS{w}"),
                  Edge(f"dV{w}", f"WAIT{w}"), Edge(f"dK{w}", f"WAIT{w}"),
                  Edge(f"dK{w}", "LQ", distance=k["q_stages"], kind="anti", lag=mbar),
                  Edge(f"dV{w}", "LdO", distance=k["do_stages"], kind="anti", lag=mbar),
                  Edge(f"dK{w}", f"EPI{w}"), Edge(f"dV{w}", f"EPI{w}"),
                  Edge(f"EPI{w}", f"dV{w}", distance=1, per="tile", kind="anti"),
                  Edge(f"EPI{w}", f"dK{w}", distance=1, per="tile", kind="anti")]
        if masked_blocks:
            edges.append(Edge(f"MASK{w}", f"EXP{w}"))
        for v in range(WGS):  # the P/dS barrier: both warpgroups' dS (and P) are in smem
            edges += [Edge(f"DS{v}", f"dK{w}", lag=nbar)]
            if v < dq_wgs:
                edges.append(Edge(f"DS{w}", f"dQ{v}", lag=nbar))
            if not rs:
                edges.append(Edge(f"EXP{v}", f"dV{w}", lag=nbar))
            # the next P/dS into a slot waits for the GEMMs that read it
            if v < dq_wgs:
                edges.append(Edge(f"dQ{v}", f"DS{w}", distance=k["pds_stages"], kind="anti", lag=nbar))
            edges.append(Edge(f"dK{v}", f"DS{w}", distance=k["pds_stages"], kind="anti", lag=nbar))
        if w < dq_wgs:
            edges += [Edge(f"dQ{w}", f"DQW{w}"), Edge(f"dQ{w}", f"WAIT{w}"),
                      Edge(f"DQW{w}", f"ADDQ{w}", lag=nbar),
                      Edge(f"ADDQ{w}", f"DQW{w}", distance=1, kind="anti", lag=nbar)]
    ops.append(Op("STKV", "wg0", (("tma", tma(n * (d + dv) * BYTES)),), hw.l2_latency, "store", asynchronous=True,
                  issue_cycles=1, when="last", label="TMA store dK, dV"))
    edges += [Edge(f"EPI{w}", "STKV", lag=nbar) for w in range(WGS)]
    edges += [Edge("dQ0", "LK", distance=1, per="tile", kind="anti", lag=mbar),
              Edge("dP0", "LV", distance=1, per="tile", kind="anti", lag=mbar)]

    # dQ store warp: one bulk reduce-add per dQ warpgroup; deterministic: inside the semaphore
    if det:
        ops.append(Op("SEMA", "dq_store", (), hw.l2_latency, "sync", label="deterministic: read the semaphore"))
    for w in range(dq_wgs):
        part = m * d * 4 / dq_wgs
        ops.append(Op(f"ADDQ{w}", "dq_store", (("tma", tma(part)), ("smem", smem(part))), 0.0, "store",
                      asynchronous=True, issue_cycles=1, label=f"TMA reduce-add dQ (WG{w}'s part)"))
    if det:
        ops.append(Op("SEMR", "dq_store", (), hw.l2_latency, "sync", label="deterministic: adds landed, release"))
        edges += [Edge(f"ADDQ{w}", "SEMR", lag=hw.l2_latency) for w in range(dq_wgs)]

    compute_roles = [f"wg{w}" for w in range(WGS)]
    softmax_ops = tuple(f"{x}{w}" for x in ("MASK", "EXP", "DS") for w in range(WGS))
    ops = [replace(o, uses=tuple(warp_issue(hw, dict(o.uses), o.role).items())) if o.name in softmax_ops else o
           for o in ops]
    ops = [replace(o, chunks=PIECES) if not o.asynchronous and o.uses else o for o in ops]
    units = {"tensor": 1, "smem": 1, "mufu": 1, "fma": 1, "alu": 1, "issue": 1, "tma": 1,
             **{f"issue:{r}": 1 for r in compute_roles}}
    roles = ["load", "dq_store"] + compute_roles
    flops = 2.0 * m * n * (3 * d + 2 * dv)
    return Schedule(f"{NAME}-bwd", units, roles, ops, edges, marker="S0",
                    issue_depth={"tensor": int(hw.mma_queue_depth)},
                    interference={"mufu": ("tensor", hw.mufu_under_mma), "issue": ("tensor", hw.issue_under_mma),
                                  **{f"issue:{r}": ("tensor", hw.warp_issue_under_mma) for r in compute_roles}},
                    meta={"flops_per_iter": flops, "dq_hold": dq_hold(hw, p, k) if det else 0.0})
