"""FA4 (SM100) and FA3-style (SM90) schedules: invariants in the trace, and the knobs' effects."""
import collections

import pytest

from fa4sim import InputError, Problem, hardware, simulate
from fa4sim.engine import _Resolver, program, simulate as run_schedule
from fa4sim.model import build_cta, setup
from fa4sim.schedules import SCHEDULES
from fa4sim.softmax import phase
from fa4sim.steady_state import tile_times

CASES = [("b200", "fa4", 128, False), ("b200", "fa4", 64, True), ("b200", "fa4", 128, True),
         ("h100-datasheet", "fa3", 128, False), ("h100-datasheet", "fa3", 64, True), ("h200-datasheet", "fa3", 256, False)]


def build(hw_name, sched, hdim, causal, n_kv=12, masked=0, **knobs):
    """One CTA's schedule with the default implementation's choices and `knobs` as what-ifs."""
    return build_cta(hw_name, Problem(1, 4, 4096, 4096, hdim, causal), knobs, n_kv, masked, schedule=sched)


def knobs_for(hw, sched, problem, **given):
    return setup(hw, sched, problem, given, None)[4]


@pytest.mark.parametrize("case", CASES)
def test_trace_invariants(case):
    s = build(*case, masked=2 if case[3] else 0)
    tiles = [7, 5]
    tr = run_schedule(s, tiles)
    # every op instance of every iteration runs exactly once
    expected = collections.Counter()
    for role in s.roles:
        for idx, t, it in program(s, role, tiles):
            expected[(s.ops[idx].name, t, it)] += 1
    got = collections.Counter((r.name, r.tile, r.iter) for r in tr.ops)
    assert got == expected and max(got.values()) == 1
    # no capacity-1 unit is ever busy with two things at once (never over 100%)
    by_unit = collections.defaultdict(list)
    for b in tr.busy:
        by_unit[b.unit].append((b.start, b.end))
    for unit, spans in by_unit.items():
        spans.sort()
        for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
            assert s1 >= e0 - 1e-9, unit
    assert all(0 <= v <= 1 + 1e-9 for v in tr.utilization().values())
    # every dependency holds: dst issued no earlier than src completed + lag
    when = {(r.name, r.tile, r.iter): r for r in tr.ops}
    res = _Resolver(s, tiles)
    for e in s.edges:
        for (name, t, it), rec in when.items():
            if name != e.dst:
                continue
            src = res.src_instance(e, t, it)
            if src is not None:
                assert rec.issue >= when[(e.src, *src)].end + e.lag - 1e-9, (e, t, it)
    # ops start no earlier than they issue, and complete after they start
    assert all(r.issue - 1e-9 <= r.start <= r.end + 1e-9 for r in tr.ops)


@pytest.mark.parametrize("case", CASES[:4])
def test_same_input_same_trace(case):
    a = run_schedule(build(*case), [9])
    b = run_schedule(build(*case), [9])
    assert a.ops == b.ops and a.busy == b.busy


@pytest.mark.parametrize("case", CASES)
def test_steady_state_extrapolation_is_exact(case):
    s = build(*case, n_kv=130)
    t1, t2, _, period = tile_times(s, 130, cap=40)
    assert period is not None
    assert t1 == pytest.approx(run_schedule(s, [130]).end, abs=1e-6)
    assert t2 == pytest.approx(run_schedule(s, [130, 130]).end, abs=1e-6)


def prob(hdim=128, seqlen=8192, causal=False, batch=2, heads=16):
    return Problem(batch, heads, seqlen, seqlen, hdim, causal)


def test_fa4_pingpong_of_two_q_tiles_beats_one():
    # at one clock: the schedule's overlap, not the power model's answer to it
    on = simulate("b200", "fa4", prob(), {"two_cta": "false", "clock_ghz": 1.86})
    off = simulate("b200", "fa4", prob(), {"two_cta": "false", "q_tiles": "1", "s_stages": "1", "clock_ghz": 1.86})
    assert on.tflops > 1.5 * off.tflops
    assert on.utilization["tensor"] > off.utilization["tensor"]


def test_fa4_s_pingpong_overlaps_one_q_tiles_softmax_with_its_next_s():
    """With one Q tile, two S slots (flash-attn-4's S ping-pong) let the MMA warp issue S(j)
    before PV(j-1), while the softmax works on S(j-1): most of what a second Q tile buys, at
    half the rows in flight. S(j) waits for PV(j-2) to have read the slot it overwrites."""
    one = simulate("b200", "fa4", prob(), {"two_cta": "false", "q_tiles": "1", "s_stages": "1", "clock_ghz": 1.86})
    two_s = simulate("b200", "fa4", prob(), {"two_cta": "false", "q_tiles": "1", "s_stages": "2", "clock_ghz": 1.86})
    assert two_s.tflops > 1.3 * one.tflops
    sched = build("b200", "fa4", 128, False, q_tiles=1, s_stages=2, two_cta=False)
    mma = [o.name for o in sched.ops if o.role == "mma"]
    assert mma.index("QK0") < mma.index("PVa0")
    assert any(e.src == "PVb0" and e.dst == "QK0" and e.distance == 2 and e.kind == "anti" for e in sched.edges)
    with pytest.raises(InputError, match="s_stages"):
        simulate("b200", "fa4", prob(), {"q_tiles": 2, "s_stages": 2})


def test_fa3_pingpong_on_beats_off():
    # hd64, 3 consumer warpgroups: without the named-barrier ping-pong their GEMMs interleave,
    # they finish together and do softmax together while the tensor core idles
    on = simulate("h100-datasheet", "fa3", prob(64), {"rescale_threshold": None})
    off = simulate("h100-datasheet", "fa3", prob(64), {"rescale_threshold": None, "pingpong": "false"})
    assert off.tflops < 0.9 * on.tflops
    assert off.utilization["tensor"] < on.utilization["tensor"]


def test_emulation_moves_time_from_mufu_to_fma():
    off = simulate("b200", "fa4", prob(), {"exp_emulation": "0"})
    on = simulate("b200", "fa4", prob(), {"exp_emulation": "0.25"})
    assert on.utilization["mufu"] < off.utilization["mufu"] * on.interval / off.interval
    assert on.utilization["fma"] * on.interval > off.utilization["fma"] * off.interval
    assert on.tflops > off.tflops  # on B200 exp2 is a co-bottleneck: moving work off MUFU helps


def test_faster_mufu_shrinks_what_emulation_buys():
    def gain(mufu):
        a = simulate("b200", "fa4", prob(), {"mufu_ex2_per_clk": mufu, "exp_emulation": "0"})
        b = simulate("b200", "fa4", prob(), {"mufu_ex2_per_clk": mufu, "exp_emulation": "0.25"})
        return b.tflops / a.tflops
    assert gain("16") > gain("32") > 0.97


def test_conditional_rescaling_cuts_correction_work():
    always = simulate("b200", "fa4", prob(), {"rescale_threshold": "none"})
    tau8 = simulate("b200", "fa4", prob(), {"rescale_threshold": "8"})
    busy = lambda r, kind: sum(b.end - b.start for b in r.trace.busy if r.trace.ops[b.rec].kind == kind)
    assert busy(tau8, "correction") < 0.5 * busy(always, "correction")
    assert tau8.tflops >= always.tflops


def test_one_kv_stage_exposes_load_latency():
    one = simulate("h100-datasheet", "fa3", prob(), {"kv_stages": "1"})
    two = simulate("h100-datasheet", "fa3", prob(), {"kv_stages": "2"})
    assert one.tflops < two.tflops
    assert any(cause.startswith("L") for cause in one.tensor_waits)


def test_causal_halves_flops_and_costs_less_time():
    full = simulate("b200", "fa4", prob(causal=False))
    causal = simulate("b200", "fa4", prob(causal=True))
    s = causal.problem.seqlen_q  # the exact triangle, s (s + 1) / 2 pairs (fa4sim/flops.py)
    assert causal.problem.flops == full.problem.flops * (s + 1) / (2 * s)
    assert causal.time_us < full.time_us


def test_wave_quantisation_shows_in_small_problems():
    # 133 tiles on 132 SMs: two waves for barely more work than one (one head: K/V stay in L2)
    r132 = simulate("h100-datasheet", "fa3", Problem(1, 1, 132 * 128, 4096, 128))
    r133 = simulate("h100-datasheet", "fa3", Problem(1, 1, 133 * 128, 4096, 128))
    assert r133.time_us > 1.6 * r132.time_us
    assert "wave" in r133.bottleneck


def test_result_json_has_the_contract_fields():
    j = simulate("b200", "fa4", prob()).to_json()
    for key in ("tflops", "time_us", "cycles", "utilization", "bottleneck"):
        assert key in j
    assert set(j["utilization"]) >= {"tensor", "mufu", "fma", "alu", "smem", "tmem", "tma"}
    assert 0 < j["tflops"] <= j["peak_tflops"]


def test_one_cta_per_tile_pays_turnover_persistent_does_not():
    from fa4sim.kernel_model import assign
    costs = [(1000.0, 800.0)] * 6  # (T1, further-tile cost) of six equal tiles on 2 SMs
    assert assign(costs, 2, persistent=True) == (1000.0 + 2 * 800.0, 3)
    assert assign(costs, 2, persistent=False, cta_launch=0.0) == (3000.0, 3)
    assert assign(costs, 2, persistent=False, cta_launch=450.0) == (3000.0 + 2 * 450.0, 3)
    assert assign(costs, 2, persistent=False, cta_launch=450.0, start=700.0) == (700.0 + 3000.0 + 2 * 450.0, 3)


def test_persistent_causal_tiles_are_list_scheduled_longest_first():
    """fa4kernel's host schedule: causal tiles longest first, each to the CTA free first. Tiles
    of 8, 7, 2, 1 blocks on 2 CTAs: {8, 1} and {7, 2} (9 each), where round-robin gives {8, 2}."""
    from fa4sim.kernel_model import assign
    from fa4sim.tile_order import tile_order
    cost = [float(n) for n in (1, 2, 7, 8)]  # one head's tiles, m = 0..3
    order = tile_order("lpt", 1, cost, 1.0, 1e9, 2, sorted_launch=True)
    assert [m for _, m in order] == [3, 2, 1, 0]
    assert assign([(cost[m], cost[m]) for _, m in order], 2, persistent=True) == (9.0, 2)


def test_fa3_consumers_meet_at_the_epilogue_barrier():
    """Every consumer WG's O -> smem waits for every WG's finalize (fa4kernel/FA3 named barrier),
    so a persistent CTA's tiles cost more than their KV blocks (the ping-pong stagger restarts)."""
    hw = hardware.load("h100-datasheet")
    sched = build_cta(hw, Problem(1, 1, 256, 1024, 128, False), {}, 8, 0)
    osm = {(e.src, e.dst) for e in sched.edges if e.dst.startswith("OSM") and e.src.startswith("FIN")}
    assert osm == {(f"FIN{v}", f"OSM{w}") for v in range(2) for w in range(2)}
    one = simulate(hw.with_values(num_sms=1), "fa3", Problem(1, 1, 128, 1024, 128, False)).cycles
    two = simulate(hw.with_values(num_sms=1), "fa3", Problem(1, 1, 256, 1024, 128, False)).cycles
    steady = simulate("h100-datasheet", "fa3", Problem(1, 1, 128, 8192, 128, False)).interval
    assert two - one > 8 * steady  # a tile costs its 8 blocks plus a tile transition


def test_fa3_ablate_what_ifs():
    """ablate=max / exp / sum remove a phase's cost (fa4kernel's ablation builds of the same names)."""
    p = Problem(1, 1, 128, 8192, 128, False)
    base = simulate("h100-datasheet", "fa3", p).interval
    for phase in ("exp", "max", "sum"):
        assert simulate("h100-datasheet", "fa3", p, {"ablate": phase}).interval <= base
    everything = {"ablate": "sum,max,exp", "rescale_rate": 0.0}
    assert simulate("h100-datasheet", "fa3", p, everything).interval == pytest.approx(2048.0)  # tensor-bound
    assert knobs_for("h100-datasheet", "fa3", p, ablate="sum,max,exp")["ablate"] == "exp,max,sum"
    with pytest.raises(InputError, match="ablate"):
        simulate("h100-datasheet", "fa3", p, {"ablate": "rescale"})


def test_cta_prologue_is_paid_once_per_cta():
    """The implementation's CTA prologue (CTA start to first TMA): a persistent launch pays it once
    per SM, a one-CTA-per-tile launch once per tile (here 4 tiles on one SM)."""
    hw = hardware.load("h100-datasheet").with_values(num_sms=1)
    p = Problem(1, 1, 512, 1024, 128, False)

    def cycles(persistent, prologue):
        return simulate(hw, "fa3", p, {"persistent": persistent, "cta_prologue_cycles": prologue}).cycles

    assert cycles(True, 1000.0) - cycles(True, 0.0) == pytest.approx(1000.0)
    assert cycles(False, 1000.0) - cycles(False, 0.0) == pytest.approx(4000.0)


def test_persistent_tiles_of_unequal_cost_are_list_scheduled():
    """Non-causal tiles differ in cost when the last tile of a head idles warpgroups (fa4kernel):
    the host schedule list-schedules them too, costliest first. Tiles of 8, 8, 3, 3, 8 (index
    order) on 2 CTAs: {8, 8} = 16 and {8, 3, 3} = 14; a static round-robin gives {8, 3, 8} = 19."""
    from fa4sim.kernel_model import assign
    from fa4sim.tile_order import tile_order
    cost = [float(n) for n in (8, 8, 3, 3, 8)]
    order = tile_order("lpt", 1, cost, 1.0, 1e9, 2, sorted_launch=True)
    assert assign([(cost[m], cost[m]) for _, m in order], 2, persistent=True) == (16.0, 2)


def test_fa3_idle_warpgroups_skip_their_work():
    """skip_idle_wgs (fa4kernel): the last tile of a head with 64 of 192 rows runs as a one-warpgroup
    tile. hd64, 1000 tokens: 5 full tiles + one with 40 rows; the launch gets faster, and a length
    that is a multiple of the tile (960) does not change."""
    fa3 = SCHEDULES["fa3"]
    k = knobs_for("h100-datasheet", "fa3", Problem(1, 1, 1000, 1000, 64, False), skip_idle_wgs=True)
    assert fa3.unit_knobs(k, 40)["tile_m"] == 64 and fa3.unit_knobs(k, 130)["tile_m"] == 192
    assert fa3.unit_knobs(k, 192) is k
    hw = hardware.load("h100-datasheet").with_values(num_sms=1)

    def cycles(s, skip):
        return simulate(hw, "fa3", Problem(1, 2, s, 1000, 64, False), {"skip_idle_wgs": skip}).cycles

    assert cycles(1000, True) < cycles(1000, False)
    assert cycles(960, True) == cycles(960, False)


def test_fa3_rescale_before_pv_moves_the_rescale_ahead_of_pv():
    """rescale_before_pv (default for head dims > 128, as flash-attn-4): in the consumer's program
    the O rescale comes right after the S GEMM is issued, before PV, and rescales the previous
    block's O (skew 1); otherwise it follows the softmax."""
    for hd, before in ((256, True), (128, False)):
        sched = build("h100-datasheet", "fa3", hd, False, rescale_threshold=None)
        names = [o.name for o in sched.ops if o.role == "wg0"]
        assert (names.index("RESC0") < names.index("PV0")) == before, names
        assert {o.name: o.skew for o in sched.ops}["RESC0"] == (1 if before else 0)
    assert knobs_for("h100-datasheet", "fa3", Problem(1, 1, 128, 128, 256, False),
                     intra_wg_overlap=False)["rescale_before_pv"] is False


def test_fa3_early_q_release_frees_q_after_the_last_qk():
    """early_q_release: the next tile's Q load waits for the last QK GEMM, not for the whole last
    block; short tiles (one CTA walking many) then run faster, long ones hardly change."""
    sched = build("h100-datasheet", "fa3", 128, False, rescale_threshold=None)
    srcs = {e.src for e in sched.edges if e.dst == "LQ" and e.per == "tile"}
    assert srcs == {"QK0", "QK1"}
    late = build("h100-datasheet", "fa3", 128, False, rescale_threshold=None, early_q_release=False)
    assert {e.src for e in late.edges if e.dst == "LQ" and e.per == "tile"} == {"RESC0", "RESC1"}
    hw = hardware.load("h100").with_values(num_sms=1)
    short = Problem(1, 1, 128 * 16, 1024, 128, False)  # 16 tiles of 8 blocks on one SM
    # (with the O store's wait deferred the model has warpgroup 0 start each tile with warpgroup 1,
    # their first S GEMMs share the tensor core and Q is off the critical path; so compare with the
    # wait right after the store, as the kernel had it when it got early_q_release)
    t = {e: simulate(hw, "fa3", short, {"rescale_threshold": None, "early_q_release": e, "persistent": True,
                                        "defer_o_store_wait": False}).cycles
         for e in (True, False)}
    assert t[True] < t[False]


def test_fa3_tile_start_and_o_store_wait():
    """Each consumer pays tile_prologue_cycles before a tile's first S GEMM; with
    defer_o_store_wait=False warpgroup 0 (whose first warp issues the O store and then waits for
    its smem read) starts its next tile after that store. One CTA walking one-block tiles pays the
    prologue once per tile, exactly."""
    sched = build("h100-datasheet", "fa3", 128, False)
    ts = {o.name: o for o in sched.ops if o.name.startswith("TS")}
    assert set(ts) == {"TS0", "TS1"} and all(o.when == "first" and o.latency == 434.0 for o in ts.values())
    assert not any(e.src == "ST" and e.dst == "TS0" for e in sched.edges)  # the store's wait is deferred
    waits = build("h100-datasheet", "fa3", 128, False, defer_o_store_wait=False)
    assert any(e.src == "ST" and e.dst == "TS0" and e.per == "tile" for e in waits.edges)
    hw = hardware.load("h100").with_values(num_sms=1)

    def per_tile(prologue):
        c = {n: simulate(hw, "fa3", Problem(1, 1, 128 * n, 128, 128, False),
                         {"persistent": True, "tile_prologue_cycles": prologue}).cycles for n in (1, 9)}
        return (c[9] - c[1]) / 8
    assert per_tile(1000.0) - per_tile(0.0) == pytest.approx(1000.0, abs=1.0)


def test_fa3_o_staged_in_v_holds_the_next_v_load_and_the_last_warpgroup():
    """o_smem: O in its own buffer holds the next tile's O; in Q's buffer the next Q load; in V's
    ring (FlashAttention-3) the next tile's first V load and the last warpgroup, whose last warp
    issues the store and waits for its smem read. O's own buffer where it does not fit is refused."""
    def tile_edges(**kw):
        return {(e.src, e.dst) for e in build("h100-datasheet", "fa3", 128, False, **kw).edges
                if e.src == "ST" and e.per == "tile"}
    assert tile_edges(o_smem="own") == {("ST", "OSM0"), ("ST", "OSM1")}
    assert tile_edges(o_smem="q") == {("ST", "LQ")}
    assert tile_edges(o_smem="v") == {("ST", "LV"), ("ST", "TS1")}
    hw = hardware.load("h100").with_values(num_sms=1)
    p = Problem(1, 1, 128 * 9, 128, 128, False)  # one-block tiles: the store sits between them
    t = {c: simulate(hw, "fa3", p, {"persistent": True, "o_smem": "v", "o_store_fixed_cycles": c}).cycles
         for c in (500.0, 3000.0)}
    assert t[3000.0] > t[500.0]
    with pytest.raises(InputError, match="o_smem"):
        simulate(hw, "fa3", Problem(1, 1, 1024, 1024, 256, False), {"o_smem": "own", "kv_stages": 2})


def test_fa3_o_store_takes_its_measured_cycles():
    """The O store (issue -> smem read done) lasts the implementation's o_store_fixed_cycles +
    bytes / o_store_bytes_per_clk (the kernel's stamps), however few bytes it moves at the TMA
    load rate; the wait right after it then holds warpgroup 0 that long."""
    o_bytes = 128 * 128 * 2
    for fixed, rate in ((500.0, 1e9), (480.0, 36.0), (3000.0, 1e9)):
        sched = build("h100-datasheet", "fa3", 128, False, o_store_fixed_cycles=fixed, o_store_bytes_per_clk=rate)
        st = sched.op("ST")
        assert st.occupancy + st.latency == pytest.approx(max(fixed + o_bytes / rate, st.occupancy))
    hw = hardware.load("h100").with_values(num_sms=1)
    p = Problem(1, 1, 128 * 9, 128, 128, False)  # one-block tiles: the store dominates the turnover
    t = {c: simulate(hw, "fa3", p, {"persistent": True, "defer_o_store_wait": False, "o_store_fixed_cycles": c}).cycles
         for c in (500.0, 3000.0)}
    assert t[3000.0] > t[500.0]


def test_fa3_loop_bookkeeping_takes_issue_slots():
    """The KV loop's bookkeeping instructions (the implementation's loop_overhead_*, counted in its SASS) take SM
    issue slots, 4 warps per warpgroup: loop_overhead_per_kstep per wgmma k-step inside the QK and
    PV GEMM ops (issued piece by piece with their HGMMAs), loop_overhead_fixed with the row max.
    Without them the loop is no slower; with more it is no faster."""
    hw = hardware.load("h100")
    always = dict(rescale_threshold=None)  # the loop's structure without conditional rescaling
    sched = build("h100", "fa3", 128, False, **always, loop_overhead_fixed=50.0, loop_overhead_per_kstep=4.0)
    none = build("h100", "fa3", 128, False, **always, loop_overhead_fixed=0.0, loop_overhead_per_kstep=0.0)
    assert dict(sched.op("QK0").uses)["issue"] == pytest.approx(4 * 4.0 * (128 // 16) / hw.issue_per_clk)
    assert dict(sched.op("PV0").uses)["issue"] == pytest.approx(4 * 4.0 * (128 // 16) / hw.issue_per_clk)
    assert "issue" not in dict(none.op("QK0").uses)
    extra = dict(sched.op("MAX0").uses)["issue"] - dict(none.op("MAX0").uses)["issue"]
    assert extra == pytest.approx(4 * 50.0 / hw.issue_per_clk)
    p = Problem(1, 1, 128, 8192, 128, False)
    t = [simulate("h100", "fa3", p, {**always, "loop_overhead_fixed": f, "loop_overhead_per_kstep": s}).interval
         for f, s in ((0.0, 0.0), (53.0, 4.4), (200.0, 10.0))]
    assert t[0] <= t[1] <= t[2] and t[0] < t[2]


def test_fa3_o_rescale_issues_at_the_dense_burst_rate_beside_a_gemm():
    """The O rescale is a burst of independent FMULs: beside a running wgmma it gets the issue rate
    bench_bursts measured for such bursts (dense_issue_under_mma), not the softmax mix's
    (issue_under_mma); the other softmax ops keep the mix's. A lower dense rate slows the loop.
    (Rescaled after the PV wait; before it, among the S GEMM's HGMMAs, see test_sim_rescale_placement.)"""
    hw = hardware.load("h100")
    sched = build("h100", "fa3", 256, False, rescale_before_pv=False)
    assert dict(sched.op("RESC0").slowed) == {"issue": hw.dense_issue_under_mma}
    assert not sched.op("EXP0").slowed and not sched.op("MAX0").slowed
    assert 0 < hw.dense_issue_under_mma <= 1 and hw.dense_issue_under_mma > hw.issue_under_mma
    p = Problem(1, 1, 128, 8192, 256, False)
    t = [simulate("h100", "fa3", p, {"dense_issue_under_mma": v, "rescale_before_pv": False}).interval
         for v in (0.2, 0.381, 1.0)]
    assert t[0] > t[1] >= t[2]


def test_fa3_warp_stores_to_smem_get_what_the_wgmma_fetch_leaves():
    """Shared memory serves the wgmma's operand fetch first (bench_bursts.py stsm): P and O going
    to smem (unit smem:lsu) run at 1 - fetch / bandwidth of their rate while a GEMM runs, and the
    GEMMs' own fetch (unit smem) is never queued behind them. hd128: QK^T reads Q and K (6 KB
    per 64 cycles of a 128 B/clk smem: 0.75); PV reads V only with P in registers (0.5), P and V
    with P in smem (0.75)."""
    hw = hardware.load("h100")
    for rs, fetch in ((True, (0.75 + 0.5) / 2), (False, 0.75)):
        sched = build("h100", "fa3", 128, False, rescale_threshold=None, p_in_registers=rs)
        unit, share = sched.interference["smem:lsu"]
        assert unit == "tensor"
        assert share == pytest.approx(1 - fetch * 128 / hw.smem_bytes_per_clk, abs=2e-3)
        assert "smem:lsu" not in dict(sched.op("QK0").uses) and "smem:lsu" not in dict(sched.op("PV0").uses)
        assert "smem:lsu" in dict(sched.op("OSM0").uses)
        # P's stores issue among the exp2s (as compiled): EXP takes them
        assert ("smem:lsu" in dict(sched.op("EXP0").uses)) == (not rs)
        assert all("smem:lsu" not in dict(o.uses) for o in sched.ops if o.name == "CVT0")
    # an SS wgmma whose fetch takes the whole bandwidth leaves the measured floor (N = 64: 0.024)
    mod, p = SCHEDULES["fa3"], Problem(1, 4, 4096, 4096, 128, False)
    slow = hw.with_values(smem_bytes_per_clk=96.0)  # 6 KB per 64 cycles is then all of it
    wide = build_cta(slow, p, {"p_in_registers": False})
    assert wide.interference["smem:lsu"][1] == pytest.approx(0.024)


def test_fa3_p_via_smem_follows_the_compiled_order():
    """With intra-WG overlap P's stores issue among the exp2s and the fence's wait overlaps the O
    rescale (as compiled): EXP carries the smem traffic and nothing is left after the rescale (a
    warp sync, no barrier: every kernel's loop has none there). Without overlap (or with the
    rescale before PV) CVT keeps the stores and the fence's latency. P via smem is never cheaper
    than P in registers (at hd128 without a mask its stores fit the exp2 phase: no slower)."""
    hw = hardware.load("h100")
    on = build("h100", "fa3", 128, False, rescale_threshold=None, p_in_registers=False)
    off = build("h100", "fa3", 128, False, rescale_threshold=None, p_in_registers=False, intra_wg_overlap=False)
    assert "CVT0" not in {o.name for o in on.ops} and "smem:lsu" in dict(on.op("EXP0").uses)
    assert off.op("CVT0").latency == pytest.approx(hw.smem_latency)
    assert "smem:lsu" in dict(off.op("CVT0").uses) and "smem:lsu" not in dict(off.op("EXP0").uses)
    p = Problem(1, 1, 128, 8192, 128, False)
    always = {"rescale_threshold": None}
    assert simulate(hw, "fa3", p, {**always, "p_in_registers": False}).interval >= simulate(hw, "fa3", p, always).interval
    assert (simulate(hw, "fa3", p, {**always, "p_in_registers": False, "intra_wg_overlap": False}).interval
            > simulate(hw, "fa3", p, {**always, "intra_wg_overlap": False}).interval)


def test_fa3_conversion_issues_among_the_exp2s_and_the_rescale_comes_last():
    """As compiled with intra-WG overlap (every fa4kernel build: the F2FPs interleave with the
    MUFU.EX2s, the O rescale's FMULs follow the last of them): P's conversion is work of the exp2
    phase, and with P in registers the rescale is a block's last op before the next GEMMs. Without
    overlap the conversion keeps its own op. Its work is the same either way."""
    hw = hardware.load("h100")
    on = build("h100", "fa3", 128, False, rescale_threshold=None)
    off = build("h100", "fa3", 128, False, rescale_threshold=None, intra_wg_overlap=False)
    per_block = [o.name for o in on.ops if o.role == "wg0" and o.when not in ("first", "last")]
    assert per_block[-2:] == ["EXP0", "RESC0"]
    cvt = phase(hw, "convert", 64 * 128)
    exp_on, exp_off = dict(on.op("EXP0").uses), dict(off.op("EXP0").uses)
    assert exp_on["alu"] - exp_off.get("alu", 0.0) == pytest.approx(cvt["alu"])
    assert dict(off.op("CVT0").uses)["alu"] == pytest.approx(cvt["alu"])


def test_fa3_softmax_split_at_the_pv_wait_keeps_its_work():
    """pv_wait splits the softmax at the wait for the previous PV GEMM: the part before it (EXA,
    and MAX) overlaps PV, the rest (EXP) waits; unit cycles are only moved, never created or
    lost. The default (after_max: max=1, fma=0, mufu=0) is the order the model was validated with;
    after_softmax is the source order (no wait before the exp2s)."""
    def total(sched, names):
        out = collections.Counter()
        for n in names:
            if any(o.name == n for o in sched.ops):
                out.update(dict(sched.op(n).uses))
        return out
    base = build("h100", "fa3", 128, False)
    assert not any(o.name == "EXA0" for o in base.ops)
    split = build("h100", "fa3", 128, False, pv_wait="max=0.6,fma=0.25,mufu=0.1")
    names = ("MAX0", "EXA0", "EXP0")
    a, b = total(base, names), total(split, names)
    assert set(a) == set(b) and all(a[u] == pytest.approx(b[u]) for u in a)
    exa = dict(split.op("EXA0").uses)
    mufu_all = dict(base.op("EXP0").uses)["mufu"]
    assert exa["mufu"] == pytest.approx(0.1 * mufu_all)
    # the PV wait still gates the part after it
    assert any(e.src == "PV0" and e.dst == "EXP0" and e.distance == 1 for e in split.edges)
    source = build("h100", "fa3", 128, False, pv_wait="after_softmax")
    assert not any(e.src == "PV0" and e.dst == "EXP0" for e in source.edges)
    with pytest.raises(InputError, match="pv_wait"):
        build("h100", "fa3", 128, False, pv_wait="max=2")


@pytest.mark.parametrize("kernel,hd,causal,knobs,want", [
    ("fa4kernel", 128, False, {"tile_n": 128, "rescale_before_pv": False, "exp_emulation": 0.0,
                               "rescale_threshold": None}, (1.0, 0.435, 0.152)),
    ("fa4kernel", 128, True, {"tile_n": 128, "rescale_before_pv": False, "exp_emulation": 0.0,
                              "rescale_threshold": None}, (1.0, 0.428, 0.152)),
    ("fa4kernel", 128, True, {"tile_n": 128, "exp_emulation": 0.125, "rescale_threshold": None}, (0.961, 0.263, 0.103)),
    ("fa4kernel", 128, False, {"tile_n": 64, "rescale_before_pv": False, "rescale_threshold": None},
     (1.0, 0.0, 0.0)),   # not compiled
    ("flash-attn-4", 256, True, {}, (1.0, 0.585, 0.333)),
])
def test_pv_wait_table_lookup(kernel, hd, causal, knobs, want):
    """pv_wait=compiled reads the implementation's SASS table (its pv_wait_sass): a variant's own
    row, else its head dim's default build, else the model's order (the max before, the rest after)."""
    from fa4sim import implementation
    from fa4sim.schedules.fa3_sm90 import pv_wait_fractions
    impl = implementation.load(kernel, "sm90")
    p = Problem(1, 1, 128, 128, hd, causal)
    k = knobs_for("h100-datasheet", "fa3", p, pv_wait="compiled", **knobs) if kernel == "fa4kernel" else \
        setup("h100-datasheet", "fa3", p, {"pv_wait": "compiled", **knobs}, kernel)[4]
    f = pv_wait_fractions(impl, p, k)
    assert (f["max"], f["fma"], f["mufu"]) == pytest.approx(want)


@pytest.mark.parametrize("knobs", [{}, {"intra_wg_overlap": False}, {"pingpong": False}])
def test_fa3_causal_loop_waits_for_its_s_gemm_like_a_non_causal_one(knobs):
    """A causal tile's masked block comes first; the softmax of every later block still waits for
    its own S GEMM. So past the masked block a causal tile runs the non-causal loop (same
    steady-state interval; a model that lost the wait after the first block would run the causal
    loop with overlap off at the overlapped rate)."""
    k = {"rescale_threshold": None, **knobs}
    nc = simulate("h100", "fa3", Problem(1, 1, 128, 32768, 128, False), k).interval
    c = simulate("h100", "fa3", Problem(1, 1, 128, 32768, 128, True), k).interval
    assert c == pytest.approx(nc)
    sched = build("h100", "fa3", 128, True, masked=1)
    assert {("QK0", "MASK0"), ("QK0", "MAX0")} <= {(e.src, e.dst) for e in sched.edges if e.distance == 0}


def test_a_loop_without_an_exact_period_still_reports_its_mean_interval():
    """hd64 (three warpgroups) with exp_emulation 0.1 never repeats exactly within the simulated
    blocks; the steady-state interval is then the mean over the tile's second half, between the
    fastest and the slowest block there."""
    r = simulate("h100", "fa3", Problem(1, 1, 192, 8192, 64, False), {"exp_emulation": 0.1, "rescale_threshold": None})
    assert r.period is None or r.period.period > 8
    starts = r.trace.starts(r.trace.schedule.marker)
    tail = [b - a for a, b in zip(starts[len(starts) // 2:], starts[len(starts) // 2 + 1:])]
    assert r.interval is not None and min(tail) <= r.interval <= max(tail)


def test_sm90_emulation_result_says_what_its_cost_is_known_to_miss():
    """The fa3 schedule's emulation cost is known to miss at some head dims on Hopper: a result
    with exp_emulation on says so, with the profile's mix_fill_slots (and one without does not)."""
    p = Problem(1, 1, 128, 2048, 128, False)
    on = simulate("h100", "fa3", p, {"exp_emulation": 0.25})
    off = simulate("h100", "fa3", p, {})
    assert any("exp_emulation on SM90" in n and "mix_fill_slots = 0.2" in n for n in on.notes)
    assert not any("exp_emulation" in n for n in off.notes)


def test_fa3_notes_where_a_long_softmax_beside_its_own_gemms_makes_the_time_optimistic():
    """hd64 on Hopper (16 score elements per tensor cycle and warpgroup, 2-3 warpgroups) is where the
    model's loop runs short of fa4kernel's; the result says so. hd128 (8) and the B200 what-if do not."""
    def notes(hw, hdim, **kw):
        return [n for n in simulate(hw, "fa3", Problem(2, 8, 2048, 2048, hdim, False), kw).notes
                if "own GEMMs" in n]
    hd64 = notes("h100", 64)
    assert len(hd64) == 1 and "16 score elements" in hd64[0] and "3 consumer warpgroups" in hd64[0]
    assert "2 consumer warpgroups" in notes("h200", 64, tile_m=128)[0]
    assert notes("h100", 128) == [] and notes("h100", 256) == [] and notes("b200", 64) == []
    assert notes("h100", 64, tile_m=64) == []  # one warpgroup: the rules hold there
