"""FA4 forward on SM100 (B200), as flash-attn-4's flash_fwd_sm100.py runs it (docs/reference/fa4-schedules.md).

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
The tile, stage count, 2-CTA choice and emulated fraction per head dim come from the
implementation (fa4sim/implementations/flash-attn-4-sm100.json).
"""
from __future__ import annotations

from dataclasses import replace

from .. import paged_kv
from ..engine import Edge, Op, Schedule
from ..errors import InputError
from ..params import Context, Knob, Problem
from ..softmax import add, beside_gemm, exp2_phase, mix_limits, phase, scaled
from ..tensor_core import BYTES, check_shape, mma_cost

NAME = "fa4"
ARCH = "sm100"
DESCRIPTION = "FlashAttention-4 forward (SM100: tcgen05 + TMEM, 2 Q tiles in ping-pong, correction WG)"
DEFAULT_IMPL = "flash-attn-4"  # simulated unless --impl says otherwise


def _layout(ctx: Context, k: dict) -> dict:
    """The implementation's smem layout choices: O staged in Q's buffer (o_over_q), K/V ring
    slots sized for K and V each (uneven) instead of for the larger of the two."""
    impl = ctx.impl
    if impl is None:
        return {"o_over_q": False, "uneven": False}
    return {"o_over_q": bool(impl.value("o_reuses_q_smem", ctx, k)),
            "uneven": bool(impl.value("uneven_kv_slots", ctx, k)) if "uneven_kv_slots" in impl.params else False}


def stages_that_fit(ctx: Context, k: dict, budget: int | None = None) -> int:
    """K/V ring slots that fit beside Q and O in `budget` bytes for the two (default: the
    profile's smem less the barriers' 1 KiB), at most 32."""
    budget = ctx.hw.smem_capacity_bytes - 1024 if budget is None else budget
    q_and_o = smem_bytes(ctx.problem, {**k, "kv_stages": 0}, **_layout(ctx, k)) - 1024
    return max(1, min(32, (budget - q_and_o) // _slot_bytes(ctx.problem, k)))


def facts(ctx: Context, k: dict) -> dict:
    """What an implementation's rules may test or take besides the problem and the knobs."""
    out = {"compute_capability": ctx.hw.capability,  # B200 10.0, B300 10.3
           "heads_per_kv_divides_128": 128 % ctx.problem.heads_per_kv == 0}  # flash-attn-4's pack_gqa rule at hd256
    if "tile_n" in k:  # a paged cache whose pages are the KV blocks: TMA reads them (flash-attn-4)
        out["pages_are_blocks"] = ctx.problem.is_paged and ctx.problem.page_size == k["tile_n"]
    if all(n in k for n in ("tile_m", "tile_n", "q_tiles", "two_cta")):
        budget = ctx.impl.value("kv_smem_budget_bytes", ctx, k) if ctx.impl is not None else None
        out["kv_stages_in_budget"] = stages_that_fit(ctx, k, budget)
    return out


PIECES = 8  # modelling granularity of warpgroup compute ops (instructions interleave finer)

KNOBS = [
    Knob("tile_m", 128, "rows", "query rows per Q tile (one softmax warpgroup each)", choices=(64, 128)),
    Knob("tile_n", 128, "keys", "keys per KV block", minimum=16, maximum=256),
    Knob("q_tiles", 2, "tiles", "Q tiles per CTA in ping-pong (FA4: 2; 1 = no ping-pong)", minimum=1, maximum=4),
    Knob("two_cta", False, "", "CTA pair (cta_group::2): M=256 UMMA over 2 SMs, each stages half of K/V", kind="bool"),
    Knob("s_stages", 1, "slots", "TMEM S/P slots per Q tile; 2 = S ping-pong with one Q tile: the MMA warp issues "
         "S(j) = Q K(j)^T before PV(j-1), into the other slot, so the tensor core computes it while the softmax "
         "works on S(j-1) (flash-attn-4 with one Q tile)", minimum=1, maximum=2),
    Knob("kv_stages", lambda c, k: stages_that_fit(c, k), "slots", "slots of the shared K/V smem ring (K and V "
         "alternate; default: as many as fit)", minimum=1),
    Knob("kv_load", "tma", "", "how K and V blocks load: tma = the load warp's bulk tensor copies (a paged cache's "
         "page looked up per block); cp_async = the load warps' 16-byte cp.async, each key row's address from the "
         "page table (a paged cache whose pages are not the KV block: fa4sim/paged_kv.py; flash-attn-4: 2 load "
         "warps with 2 Q tiles, the second softmax warpgroup's 4 with one)", kind="choice", choices=("tma", "cp_async")),
    Knob("split_p", True, "", "signal 'P 3/4 written' so PV starts before the last P quarter", kind="bool"),
    Knob("exp_emulation", 0.0, "fraction", "fraction of each row's exp2 done by the polynomial on the FMA pipe", kind="fraction"),
    Knob("rescale_threshold", 8.0, "log2 units", "conditional rescaling threshold tau; none = always rescale (no threshold)", kind="float_or_none", minimum=0.0),
    Knob("rescale_rate", None, "fraction", "override: fraction of (warp, KV block) pairs that rescale (none = derive from score_std and tau)", kind="float_or_none", minimum=0.0, maximum=1.0),
    Knob("score_std", 1.0, "nats", "std of softmax_scale*q.k for the rescale-rate model (randn inputs: 1)", kind="float", minimum=1e-3),
    Knob("persistent", True, "", "one CTA per SM looping over tiles (else one CTA per tile, each paying its own "
         "start, Q load and epilogue)", kind="bool"),
    Knob("tile_order", "lpt", "", "the order the launch hands out its Q tiles (fa4sim/tile_order.py): "
         "flash-attn-4's LPT scheduler (2^k-head L2 sections, longest first, heads inner), an ideal costliest-first "
         "order (lpt), or blockIdx order (index)", kind="choice", choices=("flash-attn-4", "lpt", "index")),
    Knob("pack_gqa", False, "", "grouped K/V heads (heads_kv < heads): one tile packs the rows of every q head of "
         "a K/V head, token by token (flash-attn-4's pack_gqa: tile_m rows = tile_m / group tokens x the group's "
         "heads, one launch head per K/V head); false: one q head per tile, the group's tiles reading the same "
         "K/V (no effect without grouped heads)", kind="bool"),
    Knob("num_splits", 1, "chunks", "split-KV (FlashDecoding): each Q tile's KV blocks in this many work units, "
         "each writing a partial O and LSE in fp32, merged by a second launch (the combine); 1: none",
         minimum=1, maximum=128),
]


def _slot_bytes(p: Problem, k: dict, uneven: bool = False) -> float:
    """One K/V ring slot: a K or a V block (the larger; uneven slots: on average their mean),
    half of it per CTA of a pair."""
    width = (p.hdim + p.hdim_v) / 2 if uneven else max(p.hdim, p.hdim_v)
    return k["tile_n"] * width * BYTES / (2 if k["two_cta"] else 1)


def smem_bytes(p: Problem, k: dict, o_over_q: bool = False, uneven: bool = False) -> int:
    """Q tiles + the K/V ring + O staging (one buffer per Q tile, or Q's), bytes per CTA."""
    q = k["q_tiles"] * k["tile_m"] * p.hdim * BYTES
    o = k["q_tiles"] * k["tile_m"] * p.hdim_v * BYTES
    q_and_o = max(q, o) if o_over_q else q + o
    return int(q_and_o + k["kv_stages"] * _slot_bytes(p, k, uneven)) + 1024  # + mbarriers, softmax statistics


def tmem_columns(p: Problem, k: dict) -> int:
    """S_s (tile_n fp32 columns per S slot, P overlays its second half) + O_s (hdim_v columns) per Q tile."""
    return k["q_tiles"] * (k["s_stages"] * k["tile_n"] + p.hdim_v)


def check(hw, p: Problem, k: dict, impl=None) -> None:
    if hw.arch != ARCH:
        raise InputError("schedule", f"fa4 is the SM100 schedule; hw {hw.name} is {hw.arch} (use --schedule fa3)")
    m_mma = k["tile_m"] * (2 if k["two_cta"] else 1)
    check_shape(ARCH, m_mma, k["tile_n"], p.hdim, k["two_cta"])
    check_shape(ARCH, m_mma, p.hdim_v, k["tile_n"], k["two_cta"])
    if k["two_cta"] and k["tile_m"] != 128:
        raise InputError("tile_m", "two_cta needs tile_m=128 (M=256 across the pair)")
    if k["two_cta"] and k["kv_load"] == "cp_async":
        raise InputError("two_cta", "the CTA pair loads K and V by TMA (a paged cache: pages of tile_n keys); "
                                    "allowed with kv_load cp_async: two_cta false")
    if k["s_stages"] > 1 and k["q_tiles"] > 1:
        raise InputError("s_stages", "S ping-pong (s_stages=2) is the one-Q-tile schedule; with q_tiles > 1 the Q "
                                     "tiles ping-pong instead: set q_tiles=1 or s_stages=1")
    cols = tmem_columns(p, k)
    if cols > hw.tmem_columns:
        raise InputError("tmem", f"{k['q_tiles']} Q tiles x (tile_n {k['tile_n']} + hdim_v {p.hdim_v}) = {cols} TMEM "
                                 f"columns; at most {hw.tmem_columns}; "
                                 + ("fits with --set q_tiles=1" if k["q_tiles"] > 1 and k["tile_n"] + p.hdim_v
                                    <= hw.tmem_columns else "lower tile_n"))
    if k["kv_stages"] < 2:
        raise InputError("kv_stages", "FA4 needs >= 2 K/V slots: QK(j) is issued before PV(j-1) releases V(j-1), "
                                      "so K(j) must load while V(j-1) is still in use")
    layout = _layout(Context(p, hw, impl), k)
    need = smem_bytes(p, k, **layout)
    if need > hw.smem_capacity_bytes:
        fit = next((s for s in range(k["kv_stages"] - 1, 1, -1)
                    if smem_bytes(p, {**k, "kv_stages": s}, **layout) <= hw.smem_capacity_bytes), None)
        raise InputError("smem", f"shared memory {need} B (hdim {p.hdim}/{p.hdim_v}, tile_m {k['tile_m']}, tile_n "
                                 f"{k['tile_n']}, kv_stages {k['kv_stages']}) exceeds {hw.smem_capacity_bytes} B of "
                                 f"{hw.name}; " + (f"fits with --set kv_stages={fit}" if fit else "lower tile_n or q_tiles"))


def rows_per_cta(k: dict) -> int:
    return k["q_tiles"] * k["tile_m"]


def build(hw, p: Problem, k: dict, n_kv: int, masked_blocks: int, impl=None, hbm_busy: float = 0.0) -> Schedule:
    """The schedule of one CTA for tiles of n_kv KV blocks, `masked_blocks` of them masked (Q
    comes from L2 here: hbm_busy is not used)."""
    d, dv, m, n, T = p.hdim, p.hdim_v, k["tile_m"], k["tile_n"], k["q_tiles"]
    two = k["two_cta"]
    half = 2 if two else 1
    mbar, nbar = hw.mbarrier_latency, hw.named_barrier_latency
    tmem = lambda nbytes: nbytes / hw.tmem_bytes_per_clk
    elems = m * n  # score elements of one Q tile per KV block

    qk = mma_cost(hw, m, n, d, a_in_smem=True, two_cta=two)
    pv = mma_cost(hw, m, dv, n, a_in_smem=False, two_cta=two)  # P from TMEM (TS)
    split = 0.75 if k["split_p"] else 1.0
    f = k["exp_emulation"]
    # the first 3/4 of the row holds every emulated column (first/last fragments never are)
    f_a = min(1.0, f / split)
    f_b = max(0.0, (f - split) / (1 - split)) if split < 1 else 0.0

    rate = k["rescale_rate"]
    if rate is None:
        from ..rescale import rescale_rate  # here: it imports numpy, which only a derived rate needs
        rate = rescale_rate(n_kv, k["rescale_threshold"], k["score_std"], cols=n, rows=32)

    ops: list[Op] = []
    edges: list[Edge] = []

    # load warp: K(j), Q0, Q1 (first block only), V(j)
    k_bytes, v_bytes = n * d * BYTES / half, n * dv * BYTES / half
    paged = k["kv_load"] == "cp_async"  # flash-attn-4's load warps: 2 with two Q tiles, 4 with one
    loads = paged_kv.cp_async_loads(hw, n, d, dv, 64 if T > 1 else 128) if paged else None
    ops.append(loads[0] if paged else Op("LK", "load", (("tma", k_bytes / hw.tma_bytes_per_clk),), hw.l2_latency,
                                         "load", asynchronous=True, issue_cycles=1, label="TMA K block"))
    for s in range(T):
        ops.append(Op(f"LQ{s}", "load", (("tma", m * d * BYTES / hw.tma_bytes_per_clk),), hw.hbm_latency,
                      "load", asynchronous=True, issue_cycles=1, when="first", label=f"TMA Q tile {s}"))
    ops.append(loads[1] if paged else Op("LV", "load", (("tma", v_bytes / hw.tma_bytes_per_clk),), hw.l2_latency,
                                         "load", asynchronous=True, issue_cycles=1, label="TMA V block"))

    # MMA warp, in the ping-pong order PV_s(j-1) (skew 1), QK_s(j); with S ping-pong (one Q
    # tile, two S slots) QK(j) goes first, into the slot PV(j-2) has finished reading
    ksteps_qk, ksteps_pv = d // 16, n // 16  # K of QK is hdim, K of PV is tile_n
    s_pingpong = k["s_stages"] > 1
    qk_ops = [Op(f"QK{s}", "mma", (("tensor", qk.tensor_cycles), ("smem", qk.smem_cycles)), qk.latency,
                 "mma", asynchronous=True, issue_cycles=ksteps_qk * hw.mma_issue_cycles, chunks=ksteps_qk,
                 label=f"S{s} = Q{s} K^T") for s in range(T)]
    if s_pingpong:
        ops.extend(qk_ops)
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
        if not s_pingpong:
            ops.append(qk_ops[s])
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
    o_elems = m * dv
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
                  Edge(f"QK{s}", f"MAX{s}", lag=mbar),  # every block's row max reads its S
                  Edge(f"EXPa{s}", f"PVa{s}", lag=mbar),
                  Edge(f"MAX{s}", f"COR{s}", lag=nbar),
                  Edge(pv_done(s), f"COR{s}", distance=1, lag=mbar),
                  Edge(f"COR{s}", f"PVa{s}", lag=mbar),
                  Edge(pv_done(s), f"FIN{s}", lag=mbar), Edge(f"SUM{s}", f"FIN{s}", lag=nbar),
                  Edge(f"FIN{s}", f"ST{s}", lag=nbar),
                  Edge(f"ST{s}", f"FIN{s}", distance=1, per="tile", kind="anti"),
                  Edge(f"FIN{s}", f"PVa{s}", distance=1, kind="anti"),  # O_s TMEM reused by next tile
                  Edge(f"QK{s}", f"LQ{s}", distance=1, per="tile", kind="anti", lag=mbar)]
        if masked_blocks:  # the first block's mask reads S before its row max
            edges.append(Edge(f"QK{s}", f"MASK{s}", lag=mbar))
        if split < 1:
            edges.append(Edge(f"EXPb{s}", f"PVb{s}", lag=mbar))
        if s_pingpong:  # S(j) overwrites the slot of S/P(j-2): after PV(j-2) has read P
            edges.append(Edge(pv_done(s), f"QK{s}", distance=k["s_stages"], kind="anti", lag=mbar))
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
    ops = [mix_limits(hw, o) if o.role in compute_roles else o for o in ops]
    ops = [replace(o, chunks=PIECES) if not o.asynchronous and o.uses else o for o in ops]
    units = {"tensor": 1, "smem": 1, "tmem": 1, "mufu": 1, "fma": 1, "alu": 1, "issue": 1, "tma": 1,
             **({"lsu": 1} if paged else {}), **{f"issue:{r}": 1 for r in compute_roles}}
    roles = ["load", "mma"] + [f"softmax{s}" for s in range(T)] + ["correction", "epilogue"]
    return Schedule(NAME, units, roles, ops, edges, marker="QK0",
                    issue_depth={"tensor": int(hw.mma_queue_depth)},
                    interference=beside_gemm(hw, compute_roles),
                    meta={"rescale_rate": rate, "flops_per_iter": 2.0 * T * m * n * (d + dv)})
