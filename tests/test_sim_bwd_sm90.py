"""The SM90 backward's implementation choices (fa4sim/schedules/fa3_sm90_bwd.py with
implementations/*.json "bwd"): each is reflected in the schedule with the numbers the kernels'
own code and SASS give. No timing is asserted."""
import collections
import math
import re

import pytest

from fa4sim import Problem, hardware
from fa4sim.errors import InputError
from fa4sim.model import build_cta, setup
from fa4sim.schedules import fa3_sm90_bwd as bwd
from fa4sim.schedules import kernel_bwd

H100 = hardware.load("h100")


def knobs_of(problem, impl, overrides=None):
    return setup("h100", None, problem, overrides or {}, impl, "bwd")[4]


def schedule(problem, impl, overrides=None, n_kv=4, masked=0):
    return build_cta("h100", problem, overrides or {}, n_kv=n_kv, masked=masked, impl=impl, pass_="bwd")


def hgmma_tally(problem, impl, overrides=None):
    """{'64xNx16': count} of one warpgroup pair's wgmmas per Q block, from the schedule's shapes."""
    tally = collections.Counter()
    for mw, nw, k, _, wgs in bwd.gemm_shapes(problem, knobs_of(problem, impl, overrides)).values():
        tally[f"64x{nw}x16"] += math.ceil(mw / 64) * (k // 16) * wgs
    return dict(tally)


# ---------------------------------------------------------------- the GEMMs, against the SASS
@pytest.mark.parametrize("hdim,causal,want", [
    # flash-attn-4 4.0.0b36's SM90 backward compiled for sm_90a (fake tensors), HGMMA per
    # consumer thread in its Q-block loop, times the two warpgroups: hd64 S^T and dP^T as one
    # m64n128 per warpgroup (the atom layout swapped with the GEMM), hd128 80-row tile, hd256
    # dK^T and dV^T as two m64n48 per warpgroup
    (64, False, {"64x128x16": 16, "64x64x16": 48}),
    (128, False, {"64x80x16": 48, "64x128x16": 20}),
    (128, True, {"64x64x16": 48, "64x128x16": 16}),
    (256, False, {"64x24x16": 64, "64x48x16": 32, "64x128x16": 6}),
])
def test_flash_attn_4_wgmma_shapes_are_its_sass(hdim, causal, want):
    assert hgmma_tally(Problem(1, 8, 2048, 2048, hdim, causal), "flash-attn-4") == want


@pytest.mark.parametrize("hdim,want", [
    # fa4kernel's compiled backward (tests/test_kernel_sm90_bwd_compile.py): S^T and dP^T 64 keys x
    # 64 queries per warpgroup, dV and dK 64 keys x head dim, dQ 64 x head dim / dq_wgs
    (64, {"64x128x16": 16, "64x64x16": 48}),  # 128-row blocks: S^T, dP^T 64 x 128; dQ split by rows
    (96, {"64x64x16": 24, "64x96x16": 24}),
    (128, {"64x64x16": 48, "64x128x16": 16}),
    # kv_split (its SASS, HGMMA per consumer thread x 2 warpgroups): S^T and dP^T 64 keys x 32
    # queries per warpgroup (K = head dim), dV, dK and dQ head dim / 2 columns each (K = 64)
    (192, {"64x32x16": 48, "64x96x16": 24}),
    (256, {"64x32x16": 64, "64x128x16": 24}),
])
def test_fa4kernel_wgmma_shapes_are_its_sass(hdim, want):
    assert hgmma_tally(Problem(1, 8, 2048, 2048, hdim), "fa4kernel") == want


def test_a_swapped_gemm_swaps_its_atom_layout_too():
    # flash-attn-4 hd64: S^T = K Q^T, keys on M, the two warpgroups along the keys: each reads its
    # 64 keys (A, 8 KB) and all 128 queries (B, 16 KB) per k-step chain of K = 64
    g = bwd.gemms(H100, Problem(1, 8, 2048, 2048, 64), knobs_of(Problem(1, 8, 2048, 2048, 64), "flash-attn-4"))
    tensor, smem, _, steps, _ = g["S"]
    assert steps == 4
    assert smem * H100.smem_bytes_per_clk == pytest.approx(64 * 64 * 2 + 128 * 64 * 2)
    assert tensor * H100.tensor_flops_per_clk == pytest.approx(2 * 64 * 128 * 64)
    # dK and dV take P and dS from registers: only B (dO^T, Q^T) comes from shared memory
    assert g["dV"][1] * H100.smem_bytes_per_clk == pytest.approx(64 * 128 * 2)
    # ... and their A bytes (64 keys x 128 queries) reach the power model as register operands
    assert g["dV"][4] * H100.smem_bytes_per_clk == pytest.approx(64 * 128 * 2) and g["S"][4] == 0.0


# ---------------------------------------------------------------- fa4kernel's file against its code
def test_fa4kernel_bwd_section_is_its_bwd_config():
    cfgmod = pytest.importorskip("fa4kernel.sm90.bwd_config")
    for hdim in cfgmod.BWD_HEAD_DIMS:
        for causal in (False, True):
            p = Problem(1, 8, 2048, 2048, hdim, causal)
            cfg = cfgmod.make_bwd_config("bfloat16", hdim, causal)
            # a kernel that predates dq_smem stages dQ in a buffer of its own ("own")
            k = knobs_of(p, "fa4kernel", {} if hasattr(cfg, "dq_smem") else {"dq_smem": "own"})
            assert k["dq_smem"] == getattr(cfg, "dq_smem", "own")
            assert (k["tile_m"], k["tile_n"], k["q_stages"], k["do_stages"]) == (cfg.tile_m, cfg.tile_n,
                                                                                cfg.q_stages, cfg.q_stages)
            assert (1 if k["dq_single_wg"] else 2) == cfg.dq_wgs
            assert k["dq_reduce"] == cfg.dq_reduce and k["deterministic"] == cfg.deterministic
            # the knobs of the backward with stats / mma_order / preprocess (their defaults before)
            assert (k["stats"], k["mma_order"], k["preprocess"]) == (getattr(cfg, "stats", "thread"),
                                                                    getattr(cfg, "mma_order", "dv_dk_dq"),
                                                                    getattr(cfg, "preprocess", "torch"))
            assert k["sdp_swapab"]  # S^T, dP^T keys on M
            # dV, dK RS up to head dim 128; kv_split: P^T and dS^T from smem (stored together)
            assert bwd.dkv_in_registers(k) == (not getattr(cfg, "kv_split", False))
            if getattr(cfg, "kv_split", False):
                assert k["p_with_ds"] and (k["atom_sdp"], k["atom_dkv"], k["atom_dq"]) == (2, 1, 1)
            # the other dQ path keeps its own stage count (2 at head dim 256 with red)
            red = cfgmod.make_bwd_config("bfloat16", hdim, causal, dq_reduce="red")
            kr = knobs_of(p, "fa4kernel", {"dq_reduce": "red"})
            assert (kr["q_stages"], kr["do_stages"]) == (red.q_stages, red.q_stages)
    impl = setup("h100", None, Problem(1, 8, 2048, 2048, 128), {}, "fa4kernel", "bwd")[3]
    assert sorted({d for d, _ in impl.head_dims}) == sorted(cfgmod.BWD_HEAD_DIMS)


# ---------------------------------------------------------------- fa4kernel's kv_split (head dims 192, 256)
P256 = Problem(1, 8, 2048, 2048, 256)


def test_kv_split_gemms_per_warpgroup_and_tensor_cycles_per_q_block():
    k = knobs_of(P256, "fa4kernel")
    # dQ staged over the Q/dO stage (dq_smem qdo): room for two stages; one with its own dQ buffer
    assert (k["tile_m"], k["tile_n"], k["dq_smem"], k["q_stages"]) == (64, 64, "qdo", 2)
    assert knobs_of(P256, "fa4kernel", {"dq_smem": "own"})["q_stages"] == 1
    shapes = bwd.gemm_shapes(P256, k)
    assert shapes["S"] == shapes["dP"] == (64, 32, 256, True, 2)
    assert shapes["dV"] == shapes["dK"] == (64, 128, 64, True, 2)  # SS: P^T, dS^T from smem
    assert shapes["dQ"] == (64, 128, 64, True, 2)
    # one Q block: 2 x 64 x 64 x (3 x 256 + 2 x 256) FLOPs; every k-step (16 cycles for S, dP
    # at N = 32, 64 for the rest) above the wgmma floor, so the tensor core needs them at 4096 / clock
    g = bwd.gemms(H100, P256, k)
    tensor = sum(g[x][0] * 2 for x in ("S", "dP", "dV", "dK", "dQ"))
    assert tensor == pytest.approx(2 * 64 * 64 * 1280 / 4096) == pytest.approx(2560)
    # S^T per k-step reads 64 x 16 keys and 32 x 16 queries: 3072 B
    assert g["S"][1] * H100.smem_bytes_per_clk == pytest.approx(16 * (64 + 32) * 16 * 2)


def test_kv_split_stores_p_and_ds_together_behind_one_barrier():
    s = schedule(P256, "fa4kernel")
    elems = 64 * 64 // 2
    # both read 8 queries' LSE (EXP) or dPsum (DS) per thread from smem; DS also stores P^T and dS^T
    stats = 128 * 8 * 4
    assert uses(s, "EXP0")["smem:lsu"] * H100.smem_bytes_per_clk == pytest.approx(stats)
    assert uses(s, "DS0")["smem:lsu"] * H100.smem_bytes_per_clk == pytest.approx(stats + 2 * elems * 2)
    edges = {(e.src, e.dst, e.kind) for e in s.edges}
    for v in range(2):
        for w in range(2):
            assert (f"DS{v}", f"dV{w}", "flow") in edges and (f"EXP{v}", f"dV{w}", "flow") not in edges
            assert (f"dV{v}", f"DS{w}", "anti") in edges  # P^T's buffer waits for its reader


@pytest.mark.parametrize("reduce", ["bulk", "red"])
def test_kv_split_reduce_adds_64_x_256_fp32_per_q_block(reduce):
    s = schedule(P256, "fa4kernel", {"dq_reduce": reduce, "dq_sum": "cta"})  # the pair: test_sim_bwd_dq_sum.py
    l2_red = bwd.l2_shares(H100)[1]
    ops = [o for o in s.ops if o.name.startswith("ADDQ" if reduce == "bulk" else "DQR")]
    assert len(ops) == 2  # one per dQ warpgroup, head_dim / 2 columns each
    assert sum(dict(o.uses)["l2"] for o in ops) * l2_red == pytest.approx(64 * 256 * 4)


# ---------------------------------------------------------------- each choice in the schedule
P64 = Problem(1, 8, 2048, 2048, 64)
P128 = Problem(1, 8, 2048, 2048, 128)


def uses(sched, name):
    return dict(sched.op(name).uses)


def test_stat_shuffle_is_one_shuffle_per_score_row_and_statistic():
    # flash-attn-4 hd64: a thread holds 2 keys x 32 queries of S^T; per query row one shuffle for
    # LSE (before the exp2s) and one for dPsum (before dS), and ceil(32 / 8) = 4 of each loaded
    # from smem two at a time, where without shuffles it loads all 32, two at a time
    on, off = (schedule(P64, "flash-attn-4", {"stat_shuffle": s}) for s in (True, False))
    stsm = 128 * 128 // 2 * 2 / 512  # DS0 also stores dS: stmatrix .x4, 512 bytes per warp instruction
    for op, more in (("EXP0", 0), ("DS0", stsm)):
        assert uses(on, op)["lsu"] == pytest.approx(4 * 32 + 4 * 2 + more)   # per warpgroup: 4 warps
        assert uses(off, op)["lsu"] == pytest.approx(4 * 16 + more)
        # issue: 32 more shuffles and 14 fewer loads per thread
        extra = (32 - 14) * 128 / 32 / H100.issue_per_clk
        assert uses(on, op)["issue"] - uses(off, op)["issue"] == pytest.approx(extra)


def test_a_branchless_mask_runs_inside_the_exp_a_branched_one_on_masked_blocks():
    # flash-attn-4 masks every Q block without a branch, its compares and selects interleaved
    # with the exp2 in its SASS: the mask's ALU work is part of the exp op, and adds no op
    for causal, per_el in ((False, 1), (True, 2)):
        p = Problem(1, 8, 2048, 2048, 64, causal)
        s, bare = schedule(p, "flash-attn-4"), schedule(p, "flash-attn-4", {"mask_every_block": False})
        assert "MASK0" not in {o.name for o in s.ops}
        elems = knobs_of(p, "flash-attn-4")["tile_m"] * knobs_of(p, "flash-attn-4")["tile_n"] // 2
        alu = (uses(s, "EXP0")["alu"] - uses(bare, "EXP0")["alu"]) * H100.alu_lanes_per_clk
        assert alu == pytest.approx(per_el * elems), causal
        assert ("S0", "EXP0") in {(e.src, e.dst) for e in s.edges}
    # fa4kernel branches past its mask (test_kernel_sm90_bwd_compile): one op at a tile's first
    # blocks when some are masked (3 ALU instructions per element when causal), none otherwise
    p = Problem(1, 8, 2048, 2048, 64, True)
    s = schedule(p, "fa4kernel", masked=2)
    m = s.op("MASK0")
    elems = knobs_of(p, "fa4kernel")["tile_m"] * knobs_of(p, "fa4kernel")["tile_n"] // 2
    assert m.when == "first" and ("S0", "MASK0") in {(e.src, e.dst) for e in s.edges}
    assert dict(m.uses)["alu"] * H100.alu_lanes_per_clk == pytest.approx(3 * 2 * elems)
    assert "MASK0" not in {o.name for o in schedule(p, "fa4kernel", masked=0).ops}


# fa4kernel's first design (its defaults were these; the knobs still select them)
FIRST = {"dq_reduce": "red", "stats": "thread", "mma_order": "dv_dk_dq", "preprocess": "torch", "tile_m": 64}


def test_dq_by_red_from_registers():
    # fa4kernel hd128: each warpgroup adds its 64 x 64 fp32 part of dQ, 16 RED.ADD.F32x2 per thread
    s = schedule(P128, "fa4kernel", FIRST)
    u = uses(s, "DQR0")
    part = 64 * 128 * 4 / 2
    assert u["red"] * H100.reduce_bytes_per_clk == pytest.approx(part)
    assert u["lsu"] == pytest.approx(part / 256)  # warp instructions of 256 bytes
    assert "dq_store" not in s.roles and not any(o.name.startswith("ADDQ") for o in s.ops)
    # hd64: warpgroup 0 alone computes and adds dQ
    s64 = schedule(P64, "fa4kernel", FIRST)
    assert {o.name for o in s64.ops if o.name.startswith(("DQR", "dQ"))} == {"DQR0", "dQ0"}


def test_dq_by_bulk_reduce_through_smem():
    s = schedule(P128, "fa4kernel", {**FIRST, "dq_reduce": "bulk"})
    part = 64 * 128 * 4 / 2
    assert uses(s, "DQW0")["smem:lsu"] * H100.smem_bytes_per_clk == pytest.approx(part)
    assert uses(s, "ADDQ0")["tma"] * H100.reduce_bytes_per_clk == pytest.approx(part)
    assert "dq_store" in s.roles
    names = [o.name for o in s.ops if o.role == "wg0"]
    assert names.index("WAIT0") < names.index("DQW0")  # dv_dk_dq: dQ leaves after all three GEMMs
    now = schedule(P128, "fa4kernel")  # its defaults: bulk, dv_dq_dk: dQ leaves while dK runs
    names = [o.name for o in now.ops if o.role == "wg0"]
    assert "dq_store" in now.roles and names.index("DQW0") < names.index("WAIT0")
    fa4 = schedule(P128, "flash-attn-4")
    names = [o.name for o in fa4.ops if o.role == "wg0"]
    assert names.index("DQW0") < names.index("WAIT0")  # flash-attn-4: while dK runs


def test_mma_order_and_its_barrier():
    fa4 = schedule(P128, "flash-attn-4")
    ours = schedule(P128, "fa4kernel", FIRST)
    edges = lambda s: {(e.src, e.dst) for e in s.edges}  # noqa: E731
    # flash-attn-4: dV (P in registers) issues right after its own dS, before the barrier; dK only
    # once dV is done (dQ issued with wait_group 1)
    assert ("DS1", "dV0") not in edges(fa4) and ("dV0", "dK0") in edges(fa4)
    assert [o.name for o in fa4.ops if o.role == "wg0" and o.kind == "mma"] == ["S0", "dP0", "dV0", "dQ0", "dK0"]
    # fa4kernel: one barrier, then dV, dK, dQ
    assert ("DS1", "dV0") in edges(ours) and ("dV0", "dK0") not in edges(ours)
    assert [o.name for o in ours.ops if o.role == "wg0" and o.kind == "mma"] == ["S0", "dP0", "dV0", "dK0", "dQ0"]
    # its variant: flash-attn-4's order (the two orders the kernel builds; no other)
    fa3 = schedule(P128, "fa4kernel", {**FIRST, "mma_order": "dv_dq_dk"})
    assert [o.name for o in fa3.ops if o.role == "wg0" and o.kind == "mma"] == ["S0", "dP0", "dV0", "dQ0", "dK0"]
    with pytest.raises(InputError) as ei:
        schedule(P128, "fa4kernel", {**FIRST, "mma_order": "dv_early"})
    assert str(ei.value) == "mma_order: must be one of dv_dk_dq, dv_dq_dk, got 'dv_early'"


def test_statistics_from_global_memory():
    # fa4kernel (stats "thread"): 16 Q columns per thread, LSE and dPsum each: 32 LDG per thread
    # per Q block; Q and dO come by TMA without them
    s = schedule(P128, "fa4kernel", FIRST)
    assert uses(s, "STAT0")["lsu"] == pytest.approx(4 * 32)
    assert s.op("STAT0").latency == H100.l2_latency
    assert uses(s, "LQ")["tma"] * H100.tma_bytes_per_clk == pytest.approx(64 * 128 * 2)
    fa4 = schedule(P128, "flash-attn-4")
    assert uses(fa4, "LQ")["tma"] * H100.tma_bytes_per_clk == pytest.approx(80 * 128 * 2 + 80 * 4)
    assert not any(o.name.startswith("STAT") for o in fa4.ops)
    # stats "tma": with Q and dO, then 16 LDS per thread (two Q columns per 64-bit load)
    tma = schedule(P128, "fa4kernel", {**FIRST, "stats": "tma"})
    assert not any(o.name.startswith("STAT") for o in tma.ops)
    assert uses(tma, "LQ")["tma"] * H100.tma_bytes_per_clk == pytest.approx(64 * 128 * 2 + 64 * 4)


def test_loop_instructions_counted_in_the_sass_take_issue_slots():
    # flash-attn-4 hd64: (32 HGMMA + 94 uniform) / 32 per k-step, 52 more per thread and Q block
    s = schedule(P64, "flash-attn-4")
    per_kstep = (32 + 94) / 32
    assert uses(s, "S0")["issue"] == pytest.approx(4 * round(per_kstep, 2) * 4 / H100.issue_per_clk)
    bare = schedule(P64, "flash-attn-4", {"loop_instr_fixed": 0, "loop_instr_per_kstep": 0})
    assert "issue" not in uses(bare, "S0")
    fixed = 52 * 128 / 32 / H100.issue_per_clk
    for op in ("EXP0", "DS0"):
        assert uses(s, op)["issue"] - uses(bare, op)["issue"] == pytest.approx(fixed / 2)


def test_deterministic_holds_the_order_by_semaphore():
    p = Problem(1, 8, 2048, 2048, 128, True)
    assert not any(o.name.startswith("SEM") for o in schedule(p, "fa4kernel").ops)
    for impl in ("fa4kernel", "flash-attn-4"):  # both ship the semaphore
        k = knobs_of(p, impl, {"deterministic": True})
        assert k["deterministic_by"] == "semaphore" and bwd.dq_hold(H100, p, k) > 0
        assert {"SEMA", "SEMR"} <= {o.name for o in schedule(p, impl, {"deterministic": True}).ops}


def test_fa4kernels_deterministic_launch_is_heads_outer():
    """fa4kernel's deterministic builds launch heads_outer at every mask (bwd_config.make_bwd_config)."""
    for causal in (False, True):
        p = Problem(1, 8, 2048, 2048, 128, causal)
        assert knobs_of(p, "fa4kernel", {"deterministic": True})["grid_order"] == "heads_outer"
    assert knobs_of(Problem(1, 8, 2048, 2048, 128, True), "fa4kernel")["grid_order"] == "tail_lpt"


# ---------------------------------------------------------------- the launches around it
def test_fa4kernels_torch_pre_and_postprocess():
    # fa4kernel/sm90/bwd.py run_bwd with preprocess "torch": per (row, head) 28 d + 58 bytes in 12
    # kernels (D scaled by the softmax scale in one of them), the zeroed dQ accumulator in one more; after it one copy to 16 bit (6 d), the same
    # when deterministic (one accumulator)
    p = Problem(2, 4, 1000, 1000, 64)
    rows, d, bw, gap = 2 * 4 * 1000, 64, H100.hbm_bandwidth_tbps * 1e6, H100.launch_gap_us
    k = {"preprocess": "torch", "tile_n": 128}
    pre, post = kernel_bwd.pre_post_us(p, H100, k)
    assert pre == pytest.approx(rows * (28 * d + 58 + 4 * d) / bw + 13 * gap)
    assert post == pytest.approx(rows * 6 * d / bw + gap)
    assert kernel_bwd.pre_post_us(p, H100, {**k, "deterministic": True}) == (pre, post)
    # one preprocess kernel (flash-attn-4's, fa4kernel's preprocess "kernel"): O and dO read once
    pre, post = kernel_bwd.pre_post_us(p, H100, {"preprocess": "kernel"})
    assert (pre, post) == pytest.approx(kernel_bwd.pre_post_us(p, H100))
    assert pre == pytest.approx(rows * (4 * d + 12 + 4 * d) / bw + gap)


def test_the_l2_check_takes_reduce_adds_at_the_reduce_add_rate():
    from fa4sim.kernel_model import KernelTime
    p = Problem(1, 2, 1024, 1024, 256)
    units = kernel_bwd.kv_units(p, 64, 64)
    visits = sum(u.n_kv for u in units)
    assert visits == 16 * 16
    red = 2 * visits * 64 * 256 * 4  # 64 x 256 fp32 per visit, 2 heads
    assert kernel_bwd.reduce_add_bytes(p, units, 64) == red
    l2, _ = kernel_bwd.traffic(p, H100, units, 64, False)
    kt = KernelTime(1.0, 1, 1, 1.0, 1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, "compute")
    kt = kernel_bwd.with_traffic(kt, p, H100, units, 64, False)
    assert kt.l2_us == pytest.approx(((l2 - red) / (H100.l2_bandwidth_tbps * 1e6)
                                      + red / (H100.l2_reduce_bandwidth_tbps * 1e6)) * H100.l2_mixed_time_fraction)


def test_deterministic_moves_the_same_bytes():
    """One dQ accumulator in both modes: the same L2 and HBM traffic (the order costs time, not bytes)."""
    p = Problem(1, 2, 1024, 1024, 64)
    units = kernel_bwd.kv_units(p, 128, 64)
    assert kernel_bwd.traffic(p, H100, units, 64, False) == \
        kernel_bwd.traffic(p, H100, units, 64, False, {"deterministic": True, "deterministic_by": "semaphore"})


# ---------------------------------------------------------------- fa4kernel's loop counts, from its SASS
def _loop_counts(sass: str):
    """(HGMMA, uniform datapath, other, pointwise) instructions in the innermost loop with HGMMA
    and MUFU.EX2: 'other' excludes the pointwise opcodes fa4sim counts itself."""
    pointwise = {"FFMA", "FADD", "FMUL", "MUFU", "F2FP", "FSEL", "SHFL", "LDS", "STSM", "STS", "REDG", "LDG"}
    lines, labels = sass.splitlines(), {}
    for i, line in enumerate(lines):
        if re.match(r"^\.L_x_\d+:", line):
            labels[line.strip()[:-1]] = i
    best = None
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)]:i + 1]
            if any("HGMMA" in x for x in body) and any("MUFU.EX2" in x for x in body):
                if best is None or len(body) < len(best):
                    best = body
    c = collections.Counter()
    for line in best:
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]*)?", line)
        if not m:
            continue
        op, full = m.group(2), m.group(2) + (m.group(3) or "")
        if op == "HGMMA":
            c["hgmma"] += 1
        elif (op.startswith("U") and not op.startswith(("UTMA", "UBLK"))) or op in ("S2UR", "R2UR"):
            c["uniform"] += 1
        elif op in pointwise and not (op == "MUFU" and not full.startswith("MUFU.EX2")):
            c["pointwise"] += 1
        else:
            c["other"] += 1
    return c


@pytest.mark.compile
@pytest.mark.parametrize("hdim,causal,knobs", [(128, False, {}), (64, False, {}),
                                              (64, True, {"dq_reduce": "bulk", "stats": "tma", "mma_order": "dv_dq_dk"}),
                                              (64, True, {"tile_m": 64}),
                                              (256, False, {}), (192, True, {"dq_reduce": "red"}), (256, True, {}),
                                              (192, False, {"dq_smem": "qdo"})])
def test_fa4kernel_loop_instruction_counts_are_its_sass(hdim, causal, knobs):
    pytest.importorskip("cutlass")
    import inspect

    import fa4kernel
    from fa4kernel import make_bwd_config
    from fa4sim.params import Context

    if "mma_order" not in inspect.signature(make_bwd_config).parameters:
        pytest.skip("this backward predates its stats / mma_order knobs, whose builds the counts are of")
    if "dq_smem" in knobs and "dq_smem" not in inspect.signature(make_bwd_config).parameters:
        pytest.skip("this backward predates its dq_smem knob")
    cfg = make_bwd_config("bfloat16", hdim, causal, False, **knobs)
    c = _loop_counts(fa4kernel.compile_bwd_sass(cfg))
    p = Problem(1, 8, 2048, 2048, hdim, causal)
    knobs = {**knobs, "dq_smem": getattr(cfg, "dq_smem", "own"),  # a kernel before dq_smem: its own dQ buffer
             "dq_sum": getattr(cfg, "dq_sum", "cta")}  # before dq_sum: each CTA its own
    k = knobs_of(p, "fa4kernel", knobs)
    impl = setup("h100", None, p, knobs, "fa4kernel", "bwd")[3]
    value = lambda name: impl.value(name, Context(p, H100, impl), k)  # noqa: E731
    assert value("loop_instr_per_kstep") == pytest.approx((c["hgmma"] + c["uniform"]) / c["hgmma"], abs=0.006)
    # the rest, less the pointwise instructions the schedule counts: 5 per score element, the
    # mask's (1, or 3 causal), the statistics' loads (32 LDG, or 16 LDS), 4 stmatrix, the dQ stores
    # (kv_split: 16 scores per thread, P^T and dS^T both stored, dQ over both warpgroups)
    e, hd_part = k["tile_m"] * k["tile_n"] // 2 // 128, 64 * hdim * 4 / (2 if hdim >= 128 else 1)
    dq = hd_part / 16 / 128 if k["dq_reduce"] == "bulk" else hd_part / 8 / 128
    stsm = e * 2 * (2 if hdim > 128 else 1) // 16
    counted = 5 * e + (3 if causal else 1) * e + (e if k["stats"] == "thread" else e // 2) + stsm + dq
    if k["dq_sum"] == "pair":  # both branches in the loop: the owner's LDS.128 and FADDs, the sender's STAS.128
        counted += dq + 4 * dq + dq
    total = c["hgmma"] + c["uniform"] + c["other"] + c["pointwise"]
    assert value("loop_instr_fixed") == round(total - c["hgmma"] - c["uniform"] - counted)


# ---------------------------------------------------------------- a CTA's start and end
@pytest.mark.parametrize("impl", ["fa4kernel", "flash-attn-4"])
def test_the_tile_ends_after_the_dkv_store_has_read_shared_memory(impl):
    """The CTA waits for its dK / dV TMA store's smem read before it exits: the store's fixed
    part is on the tile's critical path, cycle for cycle."""
    from fa4sim.steady_state import tile_times

    p = Problem(batch=2, heads=16, seqlen_q=2048, seqlen_k=2048, hdim=128, causal=False)
    t1 = [tile_times(schedule(p, impl, {"dkv_store_fixed_cycles": f}, n_kv=8), 8, pair=False)[0]
          for f in (480.0, 4480.0)]
    assert t1[1] - t1[0] == pytest.approx(4000.0, abs=1.0)


def test_every_backward_cta_pays_the_cta_prologue():
    """One CTA per KV tile: the slowest SM's tiles (512 tiles on 132 SMs: 4) each pay
    cta_prologue_cycles once."""
    from fa4sim import simulate

    p = Problem(batch=2, heads=16, seqlen_q=2048, seqlen_k=2048, hdim=128, causal=False)
    runs = [simulate("h100", problem=p, impl="fa4kernel", pass_="bwd",
                     overrides={"cta_prologue_cycles": c, "clock_ghz": 1.7}) for c in (0.0, 10000.0)]
    assert runs[1].cycles - runs[0].cycles == pytest.approx(4 * 10000.0, abs=1.0)
