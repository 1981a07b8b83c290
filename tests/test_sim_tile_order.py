"""The whole launch in fa4sim: the kernels' own tile orders (tile_order.py), the first wave's cold
start from HBM, Q loads sharing HBM with the launch, and the O store's size."""
import math
from dataclasses import replace

import pytest

from fa4sim import hardware, simulate
from fa4sim.errors import InputError
from fa4sim.kernel_model import WorkUnit, cold_start_bytes, expected_max, kv_hbm_reads, work_units
from fa4sim.params import Problem
from fa4sim.tile_order import (FA4_SECTION_BYTES, HOST_LIVE_WG_COST, HOST_TILE_OVERHEAD_BLOCKS,
                               SECTION_FRACTION_OF_L2, TAIL_WAVES, host_estimate, host_table, tile_order)


def test_host_constants_are_fa4kernels():
    """The model's copy of fa4kernel's host-schedule constants (tile_order.py) must not drift."""
    ts = pytest.importorskip("fa4kernel.tile_schedule")
    assert HOST_TILE_OVERHEAD_BLOCKS == ts.TILE_OVERHEAD_BLOCKS
    assert HOST_LIVE_WG_COST == ts.LIVE_WG_COST
    assert SECTION_FRACTION_OF_L2 == ts.SECTION_FRACTION_OF_L2
    assert TAIL_WAVES == ts.TAIL_WAVES


@pytest.mark.parametrize("hd,seqlen,tile_m,tile_n,grid", [(256, 1024, 128, 64, 132), (128, 1024, 128, 128, 132),
                                                          (64, 1000, 192, 128, 132), (128, 4096, 128, 128, 1e9)])
def test_fa4kernel_order_and_table_match_the_kernels_host_schedule(hd, seqlen, tile_m, tile_n, grid):
    """tile_order("fa4kernel") and host_table give fa4kernel.tile_schedule.make_schedule's rows
    (causal; persistent with 132 CTAs, or one CTA per tile)."""
    ts = pytest.importorskip("fa4kernel.tile_schedule")
    b, h, l2 = 16384 // seqlen, 2048 // hd, 50 * 1024 * 1024
    p = Problem(b, h, seqlen, seqlen, hd, True)
    units = work_units(p, tile_m, tile_n)
    grid = int(min(grid, b * h * len(units)))
    cost = [ts.tile_cost(m, tile_m, tile_n, seqlen, seqlen) for m in range(len(units))]
    order = tile_order("fa4kernel", b * h, cost, 2 * seqlen * hd * 2, l2, min(grid, 132), sorted_launch=True)
    want = ts.make_schedule(b, h, seqlen, seqlen, hd, tile_m, tile_n, grid, l2 // ts.SECTION_FRACTION_OF_L2, True, sms=132)
    flat = [m + len(units) * hb for hb, m in order]
    if grid >= len(flat):
        assert [[t] for t in flat] == want
    else:
        est = [host_estimate(u.n_kv, tile_m // 64, -(-u.rows // 64)) for u in units]
        assert est == pytest.approx(cost)
        rows = [[flat[i] for i in r] for r in host_table(order, est, grid)]
        assert rows == want


def test_flash_attn_4_order_is_longest_first_in_power_of_two_head_sections():
    """flash-attn-4's SingleTileLPTScheduler: 3 heads of 2 MB K+V -> 50 MiB holds 25 -> sections of
    16 (here all 3 heads: one section); Q tiles from the last down, heads inner."""
    order = tile_order("flash-attn-4", 3, [1.0, 2.0], 2e6, 0, 132, sorted_launch=True)
    assert order == [(0, 1), (1, 1), (2, 1), (0, 0), (1, 0), (2, 0)]
    # heads of 20 MiB: 2 per section (50 MiB // 20 MiB = 2), 3 heads -> sections {0, 1}, {2}
    order = tile_order("flash-attn-4", 3, [1.0, 2.0], FA4_SECTION_BYTES / 2.5, 0, 132, sorted_launch=True)
    assert order == [(0, 1), (1, 1), (0, 0), (1, 0), (2, 1), (2, 0)]
    # not causal and not persistent: blockIdx order
    assert tile_order("flash-attn-4", 2, [1.0, 1.0], 2e6, 0, 132, sorted_launch=False) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_cold_start_bytes_count_each_heads_first_block_once():
    """Non-causal tiles of one head all start at the same (last) KV block: one K+V block per head.
    Causal tiles start at their own diagonal: one per tile."""
    p = Problem(1, 2, 256, 256, 128, False)
    wave = [(hb, WorkUnit(2, 0, 128)) for hb in range(2) for _ in range(2)]
    q, kv = 4 * 128 * 128 * 2, 2 * (2 * 128 * 128 * 2)
    assert cold_start_bytes(p, wave, 128, 128) == q + kv
    pc = Problem(1, 2, 256, 256, 128, True)
    wave = [(hb, WorkUnit(n, 1, 128)) for hb in range(2) for n in (1, 2)]
    assert cold_start_bytes(pc, wave, 128, 128) == q + 4 * (2 * 128 * 128 * 2)


def test_cold_start_takes_the_first_waves_bytes_at_hbm_bandwidth():
    hw = hardware.load("h100")
    p = Problem(16, 8, 1024, 1024, 256, True)
    r = simulate(hw, "fa3", p, {"tile_n": 64, "persistent": False})
    # 132 Q tiles of 128 x 256 and 132 distinct diagonal K+V blocks of 64 x 256, bf16
    b = 132 * 128 * 256 * 2 + 132 * 2 * 64 * 256 * 2
    assert r.kernel.cold_start_us == pytest.approx(b / (hw.hbm_bandwidth_tbps * 1e6))
    fast = simulate(hw.with_values(hbm_bandwidth_tbps=2 * hw.hbm_bandwidth_tbps), "fa3", p,
                    {"tile_n": 64, "persistent": False})
    assert fast.kernel.cold_start_us == pytest.approx(r.kernel.cold_start_us / 2)
    assert fast.time_us < r.time_us


def test_tile_order_knob_changes_the_tail_and_rejects_unknown_orders():
    hw = hardware.load("h100")
    p = Problem(16, 8, 1024, 1024, 256, True)
    lpt = simulate(hw, "fa3", p, {"tile_n": 64, "persistent": False, "tile_order": "lpt"})
    ours = simulate(hw, "fa3", p, {"tile_n": 64, "persistent": False, "tile_order": "fa4kernel"})
    # costliest-first over all heads puts a tile of every head in every wave: 128 heads' K/V
    # (128 MB) do not fit in L2, so each wave reads them again from HBM; fa4kernel's sections
    # keep a few heads' K/V in L2 and read each once
    assert lpt.kernel.hbm_bytes > 2 * ours.kernel.hbm_bytes
    assert ours.kernel.hbm_bytes == pytest.approx(16 * 8 * 1024 * 256 * 2 * 4)  # Q, O, K, V once
    assert ours.time_us < lpt.time_us
    with pytest.raises(InputError, match="tile_order"):
        simulate(hw, "fa3", p, {"tile_order": "random"})


def test_q_loads_share_hbm_with_the_launch():
    """The HBM share the rest of the launch takes while a CTA loads its Q tile: derived from the
    launch's HBM bytes over its time where it matters (short tiles); a busier HBM slows the Q
    loads and so the launch (a faster HBM makes the launch faster)."""
    hw = hardware.load("h100")
    short = Problem(16, 8, 1024, 1024, 256, True)
    r = simulate(hw, "fa3", short, {"tile_n": 64, "persistent": False})
    assert 0.3 < r.hbm_busy < 0.9 and r.to_json()["kernel"]["hbm_busy"] == pytest.approx(r.hbm_busy, abs=1e-4)
    wide = simulate(hw, "fa3", short, {"tile_n": 64, "persistent": False, "hbm_bandwidth_tbps": 100.0})
    assert wide.hbm_busy < r.hbm_busy and wide.time_us < r.time_us
    long = simulate(hw, "fa3", Problem(2, 16, 8192, 8192, 128, False))
    assert long.hbm_busy == 0.0  # the refinement could add < 0.5 %: skipped


def test_o_store_grows_with_its_bytes():
    """fa4kernel's O store: 480 + bytes / 36 cycles (trace build: 32 KB ~1390, 64 KB ~2300)."""
    from fa4sim.model import build_cta

    for hd in (128, 256):
        st = build_cta("h100-datasheet", Problem(1, 1, 1024, 1024, hd, False), {"tile_m": 128}).op("ST")
        assert st.occupancy + st.latency == pytest.approx(480 + 128 * hd * 2 / 36)


def test_expected_max_of_jittered_loads():
    """expected_max: no jitter -> the slowest load; two equal loads -> mu + sigma / sqrt(pi); many
    CTAs -> the known E[max] of 132 standard normals (2.606); a CTA far ahead does not count."""
    assert expected_max([3.0, 5.0], [0.0, 0.0]) == 5.0
    assert expected_max([10.0, 10.0], [1.0, 1.0]) == pytest.approx(10 + 1 / math.sqrt(math.pi), abs=1e-6)
    assert expected_max([0.0] * 132, [1.0] * 132) == pytest.approx(2.606, abs=2e-3)
    assert expected_max([100.0, 0.0], [1.0, 1.0]) == pytest.approx(100.0, abs=1e-6)
    # a CTA without jitter is a floor: E[max(5, 3 + Z)] = 5 + E[(Z - 2)+]
    assert expected_max([5.0, 3.0], [0.0, 1.0]) == pytest.approx(5.0085, abs=1e-4)


def test_tile_jitter_costs_only_a_table_fixed_before_the_launch():
    """tile_jitter_q_loads: a persistent fa4kernel launch (host table) ends with the expected
    slowest CTA, later than its slowest load; more jitter, later still. A launch of one CTA per
    tile (the hardware balances) and one with the jitter off are unchanged."""
    hw = hardware.load("h100")
    assert hw.tile_jitter_q_loads > 0
    off = hw.with_values(tile_jitter_q_loads=0.0)
    p = Problem(16, 8, 1024, 1024, 256, True)
    knobs = {"tile_n": 64, "persistent": True, "tile_order": "fa4kernel"}
    r, r0 = simulate(hw, "fa3", p, knobs), simulate(off, "fa3", p, knobs)
    assert r0.kernel.jitter_cycles == 0.0
    assert r.kernel.jitter_cycles > 0 and r.kernel.cycles > r0.kernel.cycles
    more = simulate(hw.with_values(tile_jitter_q_loads=2 * hw.tile_jitter_q_loads), "fa3", p, knobs)
    assert more.kernel.jitter_cycles > r.kernel.jitter_cycles
    one = {**knobs, "persistent": False}
    assert simulate(hw, "fa3", p, one).kernel.cycles == simulate(off, "fa3", p, one).kernel.cycles
    assert hardware.load("h100-datasheet").tile_jitter_q_loads == 0.0  # not a datasheet quantity


def test_kv_reads_from_hbm_once_per_wave_unless_l2_holds_them():
    block = 1000.0  # bytes of one K + V block pair
    # two heads, 4 tiles each of 10 blocks; 4 slots: a wave holds one head's tiles, read once
    head_by_head = [(hb, m) for hb in range(2) for m in range(4)]
    assert kv_hbm_reads(head_by_head, [10] * 4, block, l2_bytes=5e3, slots=4) == 2 * 10 * block
    # interleaved, 2 slots: each wave holds both heads; L2 (15 blocks) keeps only the head used
    # last, so every later wave reads the other one again
    interleaved = [(hb, m) for m in range(4) for hb in range(2)]
    assert kv_hbm_reads(interleaved, [10] * 4, block, l2_bytes=15e3, slots=2) == (2 + 3) * 10 * block
    # an L2 that holds both heads reads each once, whatever the order
    assert kv_hbm_reads(interleaved, [10] * 4, block, l2_bytes=20e3, slots=2) == 2 * 10 * block
    # causal: a wave reads as far as its longest tile of the head; later waves only the rest
    assert kv_hbm_reads([(0, 0), (0, 1), (0, 2)], [1, 2, 3], block, l2_bytes=1e9, slots=1) == 3 * block


def test_chunked_prefill_reads_k_and_v_once_in_head_order():
    """1k queries against 16k keys, 64 heads: in flash-attn-4's order a head's 8 Q tiles run in
    one wave and share its K/V stream, so HBM sees each tensor once although the 16 heads of a
    wave hold 128 MB of K/V, more than L2. fa4kernel's last section (33 heads, costliest tile
    first) spreads every head over two waves, and the second reads its K/V again."""
    hw = hardware.load("h100")
    p = Problem(4, 16, 1024, 16384, 128, True)
    once = 4 * 16 * 128 * 2 * (2 * 1024 + 2 * 16384)
    fa4 = simulate(hw, "fa3", p, {"clock_ghz": 1.5}, impl="flash-attn-4")
    assert fa4.kernel.hbm_bytes == pytest.approx(once, rel=0.01)
    ours = simulate(hw, "fa3", p, {"clock_ghz": 1.5}, impl="fa4kernel")
    head_kv = 16384 * 128 * 2 * 2
    assert once + 33 * head_kv <= ours.kernel.hbm_bytes < once + 2 * 33 * head_kv


# ---- the backward's launch orders (fa4kernel's SM90 backward, grid_order)


@pytest.mark.parametrize("hd,seqlen,heads,batch", [(256, 1024, 8, 16), (256, 999, 12, 2), (128, 4096, 16, 4),
                                                   (64, 1000, 16, 4), (128, 333, 2, 1)])
@pytest.mark.parametrize("grid_order", ["heads_outer", "tail_lpt"])
def test_bwd_launch_orders_are_fa4kernels(hd, seqlen, heads, batch, grid_order):
    """tile_order's backward orders give fa4kernel's own launch order (bwd_config.launch_order,
    the kernel's block-index decode in plain Python), pairs included, on 132 SMs."""
    cfgmod = pytest.importorskip("fa4kernel.sm90.bwd_config")
    from fa4sim.schedules.fa3_sm90_bwd import launch_order as sim_order
    from fa4sim.tile_order import TAIL_WAVES as SIM_WAVES

    assert (cfgmod.TAIL_WAVES, cfgmod.TAIL_SLOTS) == (SIM_WAVES, 132)
    cfg = cfgmod.make_bwd_config("bfloat16", hd, True, grid_order=grid_order)
    kind, cluster = sim_order({"grid_order": grid_order, "dq_sum": cfg.dq_sum})
    c = cfgmod.cluster_ctas(cfg)
    assert cluster == c
    n_units = -(-seqlen // (cfg.tile_n * c)) * c
    got = tile_order(kind, batch * heads, [1.0] * n_units, 0, 50 * 1024 * 1024, 132, sorted_launch=True,
                     cluster=cluster)
    want = [(b * heads + h, n) for n, h, b in cfgmod.launch_order(cfg, seqlen, heads, batch)]
    assert got == want


def test_bwd_tail_lpt_ends_on_the_shortest_ctas():
    """Causal hd256 4k on the H200: heads_outer ends on the last head's CTAs, whose longest (64
    query blocks) starts 64 CTAs before the end; tail_lpt ends on every tail head's shortest,
    and the model's main kernel is faster by the tail it saves (4 % here; the probe build measured
    4.6 %: lab/campaigns/kernel-sm90-backward/bwd_ctas_h200_2026-11-27.json). Without the mask every CTA costs
    the same and the order changes nothing (at equal loop instruction counts: each order's build
    has its own compiled counts)."""
    p = Problem(4, 8, 4096, 4096, 256, True)
    run = lambda go, causal=True, **o: simulate("h200", "fa3", replace(p, causal=causal), impl="fa4kernel",  # noqa: E731
                                                pass_="bwd", overrides={"grid_order": go, **o})
    ho, tl = run("heads_outer"), run("tail_lpt")
    assert tl.main_us < 0.98 * ho.main_us
    same = {"loop_instr_per_kstep": 4.84, "loop_instr_fixed": 211}
    assert run("heads_outer", False, **same).main_us == run("tail_lpt", False, **same).main_us


def test_bwd_launch_orders_are_the_kernels_two():
    """grid_order takes the kernel's two launch orders (bwd_config.GRID_ORDERS), no other: the
    simulator's knob, the kernel's config and tile_order each say what is allowed in one line."""
    cfgmod = pytest.importorskip("fa4kernel.sm90.bwd_config")
    from fa4sim.schedules import fa3_sm90_bwd

    knob = next(k for k in fa3_sm90_bwd.KNOBS if k.name == "grid_order")
    assert set(knob.choices) == set(cfgmod.GRID_ORDERS) == {"heads_outer", "tail_lpt"}
    p = Problem(1, 8, 2048, 2048, 128, True)
    with pytest.raises(InputError) as ei:
        simulate("h100", "fa3", p, {"grid_order": "blocks_outer"}, impl="fa4kernel", pass_="bwd")
    assert str(ei.value) == "grid_order: must be one of heads_outer, tail_lpt, got 'blocks_outer'"
    with pytest.raises(ValueError) as ei:
        cfgmod.make_bwd_config("bfloat16", 128, True, grid_order="blocks_outer")
    assert str(ei.value) == "grid_order='blocks_outer' not supported; allowed: heads_outer, tail_lpt"
    with pytest.raises(ValueError, match="tile_order='blocks_outer'; allowed: "):
        tile_order("blocks_outer", 4, [1.0] * 4, 0, 50 * 1024 * 1024, 132, sorted_launch=True)
