"""FA4 forward on SM100 (B200), as docs/reference/fa4-schedules.md describes it.

One CTA per SM, 16 warps. Warp roles (names as in flash_fwd_sm100.py):
  softmax{s}  warpgroup s owns Q tile s (128 rows; one thread per row, S and P in TMEM)
  correction  warpgroup 2: conditional O rescale in TMEM, final 1/row_sum, O -> smem
  mma         warp 12: one elected thread issues every tcgen05.mma, in the ping-pong order
              PV0(j-1), QK0(j), PV1(j-1), QK1(j): the tensor core runs tile 1's MMAs while
              softmax0 works on S0(j), and vice versa
  load        warp 14: TMA of Q0, Q1 once per tile, then K and V through one ring of kv_stages
  epilogue    warp 13: TMA store of O
Split P: softmax signals "P 3/4 written" after 3 of 4 column chunks; the MMA warp starts PV on
the first 3/4 of the k-steps and waits for the last quarter before the final ones.
KV blocks run from last to first, so the masked (diagonal) blocks of a causal tile come first.
"""
from __future__ import annotations

from dataclasses import replace

from ..engine import Edge, Op, Schedule
from ..errors import InputError
from ..params import Knob, Problem
from ..rescale import rescale_rate
from ..softmax import add, exp2_phase, phase, scaled, warp_issue
from ..tensor_core import BYTES, check_shape, mma_cost

NAME = "fa4"
ARCH = "sm100"
DESCRIPTION = "FlashAttention-4 forward (SM100: tcgen05 + TMEM, 2 Q tiles in ping-pong, correction WG)"


def _default_two_cta(p: Problem, k: dict) -> bool:
    # FA4 pairs CTAs for hd128 non-causal (fa4-schedules.md, "2-CTA mode")
    return p.hdim == 128 and not p.causal


def _default_stages(p: Problem, k: dict) -> int:
    # fa4-schedules.md: 3 (hd128 1-CTA), 6 (hd128 2-CTA, half tiles), 5 (hd96), 10 (hd64);
    # otherwise as many as fit beside Q and O
    known = {64: 10, 96: 5, 128: 6 if k.get("two_cta") else 3}
    if p.hdim in known and k.get("tile_n", 128) == 128 and k.get("q_tiles", 2) == 2:
        return known[p.hdim]
    per_stage = k.get("tile_n", 128) * p.hdim * 2 // (2 if k.get("two_cta") else 1)
    fixed = 2 * k.get("q_tiles", 2) * k.get("tile_m", 128) * p.hdim * 2 + 1024
    return max(1, (232448 - fixed) // per_stage)


def _default_emulation(p: Problem, k: dict) -> float:
    # 16/4/1 pattern = 12.5% of a row; hd128 2-CTA uses freq 10 = 18.75% (fa4-schedules.md)
    return 0.1875 if k.get("two_cta") else 0.125


PIECES = 8  # modelling granularity of warpgroup compute ops (instructions interleave finer)

KNOBS = [
    Knob("tile_m", 128, "rows", "query rows per Q tile (one softmax warpgroup each)", choices=(64, 128)),
    Knob("tile_n", 128, "keys", "keys per KV block", minimum=16, maximum=256),
    Knob("q_tiles", 2, "tiles", "Q tiles per CTA in ping-pong (FA4: 2; 1 = no ping-pong)", minimum=1, maximum=4),
    Knob("two_cta", _default_two_cta, "", "CTA pair (cta_group::2): M=256 UMMA over 2 SMs, each stages half of K/V", kind="bool"),
    Knob("kv_stages", _default_stages, "slots", "slots of the shared K/V smem ring (K and V alternate)", minimum=1),
    Knob("split_p", True, "", "signal 'P 3/4 written' so PV starts before the last P quarter", kind="bool"),
    Knob("exp_emulation", _default_emulation, "fraction", "fraction of each row's exp2 done by the polynomial on the FMA pipe", kind="fraction"),
    Knob("rescale_threshold", 8.0, "log2 units", "conditional rescaling threshold tau; none = always rescale (no threshold)", kind="float_or_none", minimum=0.0),
    Knob("rescale_rate", None, "fraction", "override: fraction of (warp, KV block) pairs that rescale (none = derive from score_std and tau)", kind="float_or_none", minimum=0.0, maximum=1.0),
    Knob("score_std", 1.0, "nats", "std of softmax_scale*q.k for the rescale-rate model (randn inputs: 1)", kind="float", minimum=1e-3),
]


def smem_bytes(p: Problem, k: dict) -> int:
    """Q tiles + the K/V ring + O staging (one buffer per Q tile), per CTA."""
    d = p.hdim
    half = 2 if k["two_cta"] else 1
    q = k["q_tiles"] * k["tile_m"] * d * BYTES
    kv = k["kv_stages"] * k["tile_n"] * d * BYTES // half
    o = k["q_tiles"] * k["tile_m"] * d * BYTES
    return q + kv + o + 1024  # + mbarriers and softmax statistics


def tmem_columns(p: Problem, k: dict) -> int:
    """S_s (tile_n fp32 columns, P overlays its second half) + O_s (hdim columns) per Q tile."""
    return k["q_tiles"] * (k["tile_n"] + p.hdim)


def check(hw, p: Problem, k: dict) -> None:
    if hw.arch != ARCH:
        raise InputError("schedule", f"fa4 is the SM100 schedule; hw {hw.name} is {hw.arch} (use --schedule fa3)")
    m_mma = k["tile_m"] * (2 if k["two_cta"] else 1)
    check_shape(ARCH, m_mma, k["tile_n"], p.hdim, k["two_cta"])
    check_shape(ARCH, m_mma, p.hdim, k["tile_n"], k["two_cta"])
    if k["two_cta"] and k["tile_m"] != 128:
        raise InputError("tile_m", "two_cta needs tile_m=128 (M=256 across the pair)")
    cols = tmem_columns(p, k)
    if cols > hw.tmem_columns:
        raise InputError("tmem", f"{k['q_tiles']} Q tiles x (tile_n {k['tile_n']} + hdim {p.hdim}) = {cols} TMEM columns; at most {hw.tmem_columns}")
    if k["kv_stages"] < 2:
        raise InputError("kv_stages", "FA4 needs >= 2 K/V slots: QK(j) is issued before PV(j-1) releases V(j-1), "
                                      "so K(j) must load while V(j-1) is still in use")
    need = smem_bytes(p, k)
    if need > hw.smem_capacity_bytes:
        raise InputError("smem", f"shared memory {need} B (hdim {p.hdim}, tile_m {k['tile_m']}, tile_n {k['tile_n']}, "
                                   f"kv_stages {k['kv_stages']}) exceeds {hw.smem_capacity_bytes} B (227 KB); lower kv_stages or tile_n")


def rows_per_cta(k: dict) -> int:
    return k["q_tiles"] * k["tile_m"]


def build(hw, p: Problem, k: dict, n_kv: int, masked_blocks: int) -> Schedule:
    """The schedule of one CTA for tiles of n_kv KV blocks, `masked_blocks` of them masked."""
    d, m, n, T = p.hdim, k["tile_m"], k["tile_n"], k["q_tiles"]
    two = k["two_cta"]
    half = 2 if two else 1
    mbar, nbar = hw.mbarrier_latency, hw.named_barrier_latency
    tmem = lambda nbytes: nbytes / hw.tmem_bytes_per_clk
    elems = m * n  # score elements of one Q tile per KV block

    qk = mma_cost(hw, m, n, d, a_in_smem=True, two_cta=two)
    pv = mma_cost(hw, m, d, n, a_in_smem=False, two_cta=two)  # P from TMEM (TS)
    split = 0.75 if k["split_p"] else 1.0
    f = k["exp_emulation"]
    # the first 3/4 of the row holds every emulated column (first/last fragments never are)
    f_a = min(1.0, f / split)
    f_b = max(0.0, (f - split) / (1 - split)) if split < 1 else 0.0

    rate = k["rescale_rate"]
    if rate is None:
        rate = rescale_rate(n_kv, k["rescale_threshold"], k["score_std"], cols=n, rows=32)

    ops: list[Op] = []
    edges: list[Edge] = []

    # load warp: K(j), Q0, Q1 (first block only), V(j)
    kv_bytes = n * d * BYTES / half
    ops.append(Op("LK", "load", (("tma", kv_bytes / hw.tma_bytes_per_clk),), hw.l2_latency, "load",
                  asynchronous=True, issue_cycles=1, label="TMA K block"))
    for s in range(T):
        ops.append(Op(f"LQ{s}", "load", (("tma", m * d * BYTES / hw.tma_bytes_per_clk),), hw.hbm_latency,
                      "load", asynchronous=True, issue_cycles=1, when="first", label=f"TMA Q tile {s}"))
    ops.append(Op("LV", "load", (("tma", kv_bytes / hw.tma_bytes_per_clk),), hw.l2_latency, "load",
                  asynchronous=True, issue_cycles=1, label="TMA V block"))

    # MMA warp, in the ping-pong order PV_s(j-1) (skew 1), QK_s(j)
    ksteps_qk, ksteps_pv = d // 16, n // 16
    for s in range(T):
        parts_a = (("tensor", pv.tensor_cycles * split), ("smem", pv.smem_cycles * split))
        ops.append(Op(f"PVa{s}", "mma", parts_a, 0.0 if split < 1 else pv.latency, "mma",
                      asynchronous=True, issue_cycles=ksteps_pv * split * hw.mma_issue_cycles, skew=1,
                      chunks=max(1, int(ksteps_pv * split)),
                      label=f"O{s} += P{s} V (first {int(split * 4)}/4 of k)"))
        if split < 1:
            ops.append(Op(f"PVb{s}", "mma", (("tensor", pv.tensor_cycles * (1 - split)),
                                             ("smem", pv.smem_cycles * (1 - split))), pv.latency, "mma",
                          asynchronous=True, issue_cycles=ksteps_pv * (1 - split) * hw.mma_issue_cycles, skew=1,
                          chunks=max(1, int(ksteps_pv * (1 - split))),
                          label=f"O{s} += P{s} V (last 1/4 of k)"))
        ops.append(Op(f"QK{s}", "mma", (("tensor", qk.tensor_cycles), ("smem", qk.smem_cycles)), qk.latency,
                      "mma", asynchronous=True, issue_cycles=ksteps_qk * hw.mma_issue_cycles, chunks=ksteps_qk,
                      label=f"S{s} = Q{s} K^T"))
    pv_done = (lambda s: f"PVb{s}") if split < 1 else (lambda s: f"PVa{s}")

    # softmax warpgroups
    for s in range(T):
        r = f"softmax{s}"
        if masked_blocks:
            ops.append(Op(f"MASK{s}", r, tuple(phase(hw, "mask", elems * masked_blocks).items()), 0.0,
                          "softmax", when="first", label=f"causal/length mask, {masked_blocks} block(s)"))
        ops.append(Op(f"MAX{s}", r, tuple(add({"tmem": tmem(elems * 4)}, phase(hw, "max", elems, m)).items()),
                      hw.tmem_latency, "softmax", label=f"tcgen05.ld S{s}, row max, acc_scale"))
        exp_a = add(phase(hw, "scale", elems * split), exp2_phase(hw, elems * split, f_a),
                    phase(hw, "convert", elems * split), {"tmem": tmem(elems * split * BYTES)})
        ops.append(Op(f"EXPa{s}", r, tuple(exp_a.items()), hw.mufu_latency, "exp",
                      label=f"exp2 + tcgen05.st P{s} ({'3/4' if split < 1 else 'all'})"))
        if split < 1:
            exp_b = add(phase(hw, "scale", elems * (1 - split)), exp2_phase(hw, elems * (1 - split), f_b),
                        phase(hw, "convert", elems * (1 - split)), {"tmem": tmem(elems * (1 - split) * BYTES)})
            ops.append(Op(f"EXPb{s}", r, tuple(exp_b.items()), hw.mufu_latency, "exp",
                          label=f"exp2 + tcgen05.st P{s} (last 1/4)"))
        ops.append(Op(f"SUM{s}", r, tuple(phase(hw, "sum", elems).items()), hw.fma_latency, "softmax",
                      label="row_sum = row_sum * acc_scale + sum(P)"))

    # correction warpgroup: conditional rescale of O_s (expected cost), final normalisation
    o_elems = m * d
    for s in range(T):
        cor = add(scaled(add({"tmem": tmem(o_elems * 4 * 2)}, phase(hw, "rescale", o_elems)), rate),
                  {"issue": 8 * 4 / 32 / hw.issue_per_clk})  # read acc_scale, ballot, arrive
        ops.append(Op(f"COR{s}", "correction", tuple(cor.items()), rate * 2 * hw.tmem_latency, "correction",
                      label=f"rescale O{s} if a row's max moved > tau (p={rate:.3g})"))
    for s in range(T):
        fin = add({"tmem": tmem(o_elems * 4)}, phase(hw, "normalize", o_elems),
                  {"smem": o_elems * BYTES / hw.smem_bytes_per_clk})
        ops.append(Op(f"FIN{s}", "correction", tuple(fin.items()), hw.tmem_latency + hw.smem_latency,
                      "correction", when="last", label=f"O{s} / row_sum -> smem"))
        ops.append(Op(f"ST{s}", "epilogue", (("tma", o_elems * BYTES / hw.tma_bytes_per_clk),), hw.l2_latency,
                      "store", asynchronous=True, issue_cycles=1, when="last", label=f"TMA store O{s}"))

    # dependencies
    for s in range(T):
        edges += [Edge(f"LQ{s}", f"QK{s}", lag=mbar), Edge("LK", f"QK{s}", lag=mbar),
                  Edge("LV", f"PVa{s}", lag=mbar),
                  Edge(f"QK{s}", f"MASK{s}" if masked_blocks else f"MAX{s}", lag=mbar),
                  Edge(f"EXPa{s}", f"PVa{s}", lag=mbar),
                  Edge(f"MAX{s}", f"COR{s}", lag=nbar),
                  Edge(pv_done(s), f"COR{s}", distance=1, lag=mbar),
                  Edge(f"COR{s}", f"PVa{s}", lag=mbar),
                  Edge(pv_done(s), f"FIN{s}", lag=mbar), Edge(f"SUM{s}", f"FIN{s}", lag=nbar),
                  Edge(f"FIN{s}", f"ST{s}", lag=nbar),
                  Edge(f"ST{s}", f"FIN{s}", distance=1, per="tile", kind="anti"),
                  Edge(f"FIN{s}", f"PVa{s}", distance=1, kind="anti"),  # O_s TMEM reused by next tile
                  Edge(f"QK{s}", f"LQ{s}", distance=1, per="tile", kind="anti", lag=mbar)]
        if split < 1:
            edges.append(Edge(f"EXPb{s}", f"PVb{s}", lag=mbar))
    # one K/V ring: items K(g)=2g, V(g)=2g+1; item i reuses the slot of item i - kv_stages
    S = k["kv_stages"]
    last_qk, last_pv = f"QK{T - 1}", pv_done(T - 1)
    if S % 2 == 0:
        edges += [Edge(last_qk, "LK", S // 2, kind="anti", lag=mbar), Edge(last_pv, "LV", S // 2, kind="anti", lag=mbar)]
    else:
        edges += [Edge(last_pv, "LK", (S + 1) // 2, kind="anti", lag=mbar),
                  Edge(last_qk, "LV", (S - 1) // 2, kind="anti", lag=mbar)]

    # each warpgroup's own issue limit, then pieces so two warpgroups on one pipe share it (engine)
    compute_roles = [f"softmax{s}" for s in range(T)] + ["correction"]
    ops = [replace(o, uses=tuple(warp_issue(hw, dict(o.uses), o.role).items())) if o.role in compute_roles else o
           for o in ops]
    ops = [replace(o, chunks=PIECES) if not o.asynchronous and o.uses else o for o in ops]
    units = {"tensor": 1, "smem": 1, "tmem": 1, "mufu": 1, "fma": 1, "alu": 1, "issue": 1, "tma": 1,
             **{f"issue:{r}": 1 for r in compute_roles}}
    roles = ["load", "mma"] + [f"softmax{s}" for s in range(T)] + ["correction", "epilogue"]
    return Schedule(NAME, units, roles, ops, edges, marker="QK0",
                    issue_depth={"tensor": int(hw.mma_queue_depth)},
                    interference={"mufu": ("tensor", hw.mufu_under_mma), "issue": ("tensor", hw.issue_under_mma),
                                  **{f"issue:{r}": ("tensor", hw.warp_issue_under_mma) for r in compute_roles}},
                    meta={"rescale_rate": rate, "flops_per_iter": 4.0 * T * m * n * d})
