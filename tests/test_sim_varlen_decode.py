"""Varlen batches and decode in fa4sim: the packed batch's launch, split-KV and its combine, the
memory-bound regime, FlashAttention-3's implementation file, and the bad input they refuse."""
import dataclasses
import math

import pytest

from fa4sim import simulate
from fa4sim.cli import main
from fa4sim.errors import InputError
from fa4sim.hardware import load as load_hw
from fa4sim.model import setup
from fa4sim.params import Problem
from fa4sim import implementation, split_kv

H200 = "h200"


def test_varlen_of_equal_sequences_is_the_batched_problem():
    # non-causal: the same tiles, K/V and order (heads outer), so the same launch exactly
    for impl in ("flash-attn-3", "flash-attn-4"):
        a = simulate(H200, None, Problem(4, 16, 2048, 2048, 128), impl=impl)
        b = simulate(H200, None, Problem.varlen(16, 128, [2048] * 4), impl=impl)
        assert b.time_us == pytest.approx(a.time_us, rel=1e-9)
        assert b.problem.flops == a.problem.flops
    # causal: within 1 %; the varlen scheduler orders the tiles sequence by sequence (each its own
    # L2 sections of heads, longest tile first), the batched LPT order over all batch x heads
    a = simulate(H200, None, Problem(4, 16, 2048, 2048, 128, True), impl="flash-attn-4")
    b = simulate(H200, None, Problem.varlen(16, 128, [2048] * 4, causal=True), impl="flash-attn-4")
    assert b.time_us == pytest.approx(a.time_us, rel=0.01)


def test_varlen_batch_counts_each_sequence():
    lens = [100, 3000, 800]
    p = Problem.varlen(8, 128, lens, causal=True)
    assert (p.batch, p.seqlen_q, p.seqlen_k) == (3, 3000, 3000)
    assert p.flops == sum(Problem(1, 8, n, n, 128, True).flops for n in lens)
    r = simulate(H200, None, p, impl="flash-attn-4")
    # flash-attn-4's 128-row Q tiles of each sequence, per head: 1 + 24 + 7
    assert r.kernel.units == 8 * (1 + 24 + 7)
    assert any("varlen" in n for n in r.notes)


def test_an_implementation_without_varlen_is_refused_in_one_line(monkeypatch):
    from dataclasses import replace

    from fa4sim import implementation

    real = implementation.load
    monkeypatch.setattr(implementation, "load",
                        lambda name, *a, **k: replace(real(name, *a, **k), varlen=False)
                        if name.startswith("fa4kernel") else real(name, *a, **k))
    with pytest.raises(InputError) as e:
        simulate(H200, None, Problem.varlen(8, 128, [100, 200]), impl="fa4kernel")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("impl: fa4kernel has no varlen forward; allowed impls: ")
    assert "flash-attn-3-sm90" in msg and "flash-attn-4-sm90" in msg
    # the backward's own: only an implementation whose "bwd" section says it runs varlen batches
    with pytest.raises(InputError, match="^impl: flash-attn-4 has no varlen backward; allowed impls: fa4kernel-sm90$"):
        simulate(H200, None, Problem.varlen(8, 128, [100, 200]), impl="flash-attn-4", pass_="bwd")


def test_fa4kernel_varlen_sequence_order():
    """fa4kernel's varlen build counts the batch's tiles sequence by sequence, heads in turn, Q
    tiles fastest; causal, the Q tiles from the last down with the sequence's heads inner. No
    empty CTA: a short sequence beside a long one adds only its own tiles."""
    from fa4sim.kernel_model import sequence_order, varlen_units

    units = varlen_units(Problem.varlen(2, 128, [100, 300]), 128, 128)
    assert [u.seq for u in units] == [0, 1, 1, 1]
    assert sequence_order(units, 2, False) == [(0, 0), (1, 0), (2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (3, 3)]
    assert sequence_order(units, 1, True) == [(0, 0), (1, 3), (1, 2), (1, 1)]
    assert sequence_order(units, 2, True) == [(0, 0), (1, 0), (2, 3), (3, 3), (2, 2), (3, 2), (2, 1), (3, 1)]


def test_fa4kernel_varlen_is_persistent_where_the_dense_forward_is():
    """Its varlen forward is modelled as it ships: persistent at every head dim (the dense
    forward at hd256 is not), tile order sequence; a one-row sequence beside a long one adds its
    own tile per head and no empty CTA."""
    p = Problem.varlen(16, 128, [4000, 1], causal=True)
    r = simulate(H200, None, p, impl="fa4kernel")
    assert r.knobs["persistent"] is True and r.knobs["tile_order"] == "sequence"
    assert any("varlen" in n for n in r.notes)
    alone = simulate(H200, None, Problem.varlen(16, 128, [4000], causal=True), impl="fa4kernel")
    assert (r.kernel.units, alone.kernel.units) == (16 * 33, 16 * 32)  # 4000 rows: 32 tiles of 128
    assert r.kernel.time_us >= alone.kernel.time_us
    wide = simulate(H200, None, Problem.varlen(8, 256, [4000, 1], causal=True), impl="fa4kernel")
    assert wide.knobs["persistent"] is True and wide.knobs["tile_order"] == "sequence"  # the dense: False
    dense = simulate(H200, None, Problem(1, 16, 4000, 4000, 128, True), impl="fa4kernel")
    assert dense.knobs["persistent"] is True  # the dense launch keeps its host table
    assert dense.knobs["tile_order"] == "fa4kernel"


def test_fa4kernel_varlen_knobs_come_from_its_file():
    """The varlen launch's tile order is fa4kernel-sm90.json's choice (a rule on is_varlen), not a
    name test in the model, and so is its persistence (a rule on is_varlen)."""
    from fa4sim import implementation

    impl = implementation.load("fa4kernel-sm90")
    assert impl.varlen and "FlashFwdSm90Varlen" in impl.knobs["tile_order"]["source"]
    rules = impl.knobs["tile_order"]["value"]["rules"]
    assert rules[0]["when"] == {"is_varlen": True} and rules[0]["value"] == "sequence"
    rules = impl.knobs["persistent"]["value"]["rules"]
    assert rules[0] == {"when": {"is_varlen": True}, "value": True} and "source" in impl.knobs["persistent"]
    # flash-attn-3 / -4 keep their own schedulers' orders for varlen
    for name in ("flash-attn-3", "flash-attn-4"):
        knobs = setup(H200, None, Problem.varlen(8, 128, [100, 300]), {}, name)[4]
        assert knobs["tile_order"] != "sequence"


def test_persistent_varlen_ctas_take_the_next_tile_when_free():
    """fa4kernel's persistent varlen CTAs (tile counter): with 2 CTAs, a long first tile's CTA
    takes no other while the other runs the five short ones (each further tile costs its T2 - T1)."""
    from fa4sim.kernel_model import kernel_time_tiles, sequence_order, varlen_units

    hw = load_hw(H200).with_values(num_sms=2)
    p = Problem.varlen(1, 128, [128, 640])
    units = varlen_units(p, 128, 128)
    order = sequence_order(units, 1, False)
    assert order == [(0, 0), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]
    costs = {0: (10000.0, 9000.0)}
    kt = kernel_time_tiles(p, hw, units, order, lambda u: costs.get(units.index(u), (1000.0, 500.0)), 128, False,
                           True, 128, 1)
    cold = kt.cold_start_us * hw.clock_ghz * 1e3
    assert kt.cycles == pytest.approx(cold + 10000.0)  # the short CTA: 1000 + 4 x 500 = 3000 < 10000


def test_fa4kernel_varlen_note_names_its_ctas():
    r = simulate(H200, None, Problem.varlen(16, 128, [100, 300]), impl="fa4kernel")
    assert r.kernel.units == 16 * (1 + 3)
    note = next(n for n in r.notes if n.startswith("sequence:"))
    assert "64 tiles" in note and "64 persistent CTAs" in note  # fewer tiles than SMs: one CTA each


def test_tile_order_sequence_of_a_dense_launch():
    """tile_order sequence on a dense launch: head by head, Q tile fastest, causal each head's from the last."""
    from fa4sim.tile_order import tile_order

    cost = [1.0, 2.0, 3.0]
    assert tile_order("sequence", 2, cost, 0.0, 0.0, 132, True) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert tile_order("sequence", 2, cost, 0.0, 0.0, 132, True, causal=True) == [(0, 2), (0, 1), (0, 0), (1, 2),
                                                                                (1, 1), (1, 0)]
    r = simulate(H200, None, Problem(2, 8, 1000, 1000, 128, True), {"tile_order": "sequence", "persistent": False},
                 impl="fa4kernel")
    assert r.time_us > 0


def test_bench_varlen_predicts_fa4kernel_for_every_batch(tmp_path, capsys):
    """lab/tools/bench_varlen_sm90.py --predict: a prediction of fa4kernel.varlen for each of its batches."""
    import json

    from lab.tools import bench_varlen_sm90 as bench

    out = tmp_path / "pred.json"
    assert bench.main(["--predict", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["kernel"] == "fa4kernel.varlen"]
    assert [r["point"] for r in rows] == [b.name for b in bench.BATCHES]
    for r in rows:
        assert "not_modelled" not in r and r["us"] > 0 and 0 < r["tflops"] < 989, r
    assert "not modelled" not in capsys.readouterr().out


def test_python_m_fa4sim_runs_fa4kernel_varlen():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "fa4sim", "run", "--hw", H200, "--impl", "fa4kernel",
                          "--seqlens", "100,300"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "persistent=True" in run.stdout and "tile_order=sequence" in run.stdout
    assert "varlen: 2 sequences" in run.stdout and "sequence: 64 tiles" in run.stdout
    assert subprocess.run([sys.executable, "-m", "fa4sim", "--help"], capture_output=True,
                          timeout=60).returncode == 0


def _decode(seqlen_k, impl="flash-attn-3", batch=1, heads=32, kv=8, **over):
    return simulate(H200, None, Problem(batch, heads, 1, seqlen_k, 128, heads_kv=kv), over or None, impl=impl)


def test_decode_scales_with_cache_bytes_and_approaches_hbm_bandwidth():
    hw = load_hw(H200)
    times = {n: _decode(n) for n in (16384, 65536, 262144)}
    for n, r in times.items():
        floor = r.problem.kv_bytes / (hw.hbm_bandwidth_tbps * 1e6)  # us
        assert r.time_us >= floor
    big = times[262144]
    assert big.kernel.limiter == "HBM" and big.bottleneck.startswith("HBM-bound")
    assert "HBM bandwidth" in big.bottleneck
    floor = big.problem.kv_bytes / (hw.hbm_bandwidth_tbps * 1e6)
    assert big.time_us / floor < 1.06          # K/V at the HBM bandwidth, plus the fixed costs
    assert big.kv_read_gbps > 0.94 * hw.hbm_bandwidth_tbps * 1e3
    # 4x the cache, about 4x the time (the fixed costs are a smaller share)
    ratio = times[262144].time_us / times[65536].time_us
    assert 3.6 < ratio < 4.05


def test_split_kv_helps_a_batch_one_long_cache_and_its_combine_shows():
    auto = _decode(131072)
    one = _decode(131072, num_splits=1)
    hw = load_hw(H200)
    assert auto.knobs["num_splits"] == 15  # heuristics.h: 8 Q tiles x 15 = 120 CTAs, wave efficiency 0.91
    assert auto.kernel.units == 120 and one.kernel.units == 8 < hw.num_sms
    assert auto.time_us < one.time_us / 5
    assert auto.combine_us > hw.launch_gap_us
    assert auto.time_us == pytest.approx(auto.kernel.time_us + auto.combine_us)
    assert any("combine launch" in n for n in auto.notes)
    # the combine's bytes: 15 partial O (fp32) and LSE per q head, O written
    assert split_kv.combine_bytes(auto.problem, 15) == 32 * (15 * (128 * 4 + 4) + 128 * 2)


def test_the_combine_is_its_bytes_or_its_rows_chain_of_round_trips():
    """A row's splits in a chain of dependent L2 round trips (its kernel's loop, as the
    implementation's params describe it), or the bytes where they take longer."""
    assert split_kv.combine_round_trips(29, (2, 32, 1)) == 2 + 29  # fa4kernel: two LSE passes, a split at a time
    assert split_kv.combine_round_trips(29, (1, 128, 3)) == 1 + 10  # FA3: every LSE, then 3 splits in flight
    assert split_kv.combine_round_trips(64, (2, 32, 1)) == 4 + 64
    hw = load_hw(H200)
    mqa = Problem(4, 8, 1, 65536, 128, heads_kv=1)
    ours = split_kv.combine_us(mqa, hw, 29, (2, 32, 1))
    assert ours == pytest.approx(31 * hw.l2_latency / (hw.clock_ghz * 1e3) + hw.launch_gap_us)
    assert ours > split_kv.combine_us(mqa, hw, 29, (1, 128, 3)) > split_kv.combine_us(mqa, hw, 29)
    # many rows and two splits: the bytes are longer than the chain
    wide = Problem(128, 64, 1, 8192, 128, heads_kv=8)
    stream = split_kv.combine_bytes(wide, 2) / (hw.hbm_bandwidth_tbps * 1e6)
    assert split_kv.combine_us(wide, hw, 2, (2, 32, 1)) == pytest.approx(stream + hw.launch_gap_us)
    assert split_kv.combine_us(mqa, hw, 1, (2, 32, 1)) == 0.0


def test_a_combine_launched_as_a_dependent_launch_adds_the_pdl_gap():
    """fa4kernel launches its combine as a programmatic dependent launch (its param combine_pdl):
    the combine then adds the profile's pdl_launch_gap_us instead of launch_gap_us; an
    implementation that names no combine_pdl keeps the plain gap."""
    from fa4sim.implementation import load

    hw = load_hw(H200).with_values(pdl_launch_gap_us=0.5)
    mqa = Problem(4, 8, 1, 65536, 128, heads_kv=1)
    plain, pdl = (split_kv.combine_us(mqa, hw, 29, (2, 32, 1), pdl=x) for x in (False, True))
    assert plain - pdl == pytest.approx(hw.launch_gap_us - 0.5)
    assert split_kv.combine_pdl(load("fa4kernel", "sm90"), None, {}) is True
    assert split_kv.combine_pdl(load("flash-attn-4", "sm90"), None, {}) is False
    # end to end: the same split launch, its combine shorter by the gaps' difference
    knobs = {"num_splits": 29, "pdl_launch_gap_us": 0.5}
    base = simulate(H200, problem=mqa, impl="fa4kernel", overrides=knobs)
    without = simulate(H200, problem=mqa, impl="fa4kernel", overrides={**knobs, "combine_pdl": False})
    assert without.combine_us - base.combine_us == pytest.approx(hw.launch_gap_us - 0.5, rel=0.05)


def test_each_implementation_names_its_combines_shape():
    from fa4sim.implementation import load

    from fa4sim.params import Context

    shapes = {}
    for name in ("fa4kernel", "flash-attn-3", "flash-attn-4"):
        impl = load(name, "sm90")
        shapes[name] = tuple(impl.params[n]["value"] for n in split_kv.COMBINE_SHAPE)
    # fa4kernel's partials in flight as its SASS counts them (combine_sass), per head dim
    assert shapes["fa4kernel"][:2] == (3, 32) and "compiled" in shapes["fa4kernel"][2]
    assert {k: v for k, v in shapes.items() if k != "fa4kernel"} == {"flash-attn-3": (1, 128, 3),
                                                                    "flash-attn-4": (1, 128, 3)}
    impl = load("fa4kernel", "sm90")
    for hd in (64, 128, 256):
        ctx = Context(Problem(1, 8, 1, 65536, hd, heads_kv=1), None, impl)
        assert 1 <= split_kv.combine_shape(impl, ctx, {})[2] <= 8  # at most the source's SPLIT_UNROLL
    r = _decode(131072, batch=1, heads=8, kv=1, impl="fa4kernel", num_splits=29)
    assert any("dependent L2 round trips per row" in n for n in r.notes)


def test_the_launch_fixed_costs_show_in_a_short_decode():
    r = _decode(256, batch=1, heads=8, kv=8)  # 2 KV blocks: no split, the gap a fifth of the time
    assert "the launch's fixed costs (launch gap" in r.bottleneck
    r = _decode(2048, batch=1, heads=8, kv=8)  # split: the combine launch among them
    assert r.knobs["num_splits"] > 1 and "combine launch" in r.bottleneck


def test_fa3_split_and_pack_heuristics():
    p = Problem(1, 32, 1, 131072, 128, heads_kv=8)
    assert split_kv.fa3_num_splits(p, 132, 64, 176) == 15
    assert split_kv.fa3_num_splits(Problem(64, 64, 1, 4096, 128, heads_kv=8), 132, 64, 176) == 1  # 512 tiles
    assert split_kv.fa3_num_splits(Problem(1, 32, 1, 512, 128, heads_kv=8), 132, 64, 176) == 1   # 3 KV blocks
    assert split_kv.fa3_pack_gqa(Problem(2, 32, 4096, 4096, 128, heads_kv=8), 128, 1) is False
    assert split_kv.fa3_pack_gqa(Problem(2, 32, 3, 4096, 128, heads_kv=8), 128, 1) is True
    assert split_kv.fa3_pack_gqa(Problem(2, 32, 3, 4096, 128), 128, 1) is False   # no grouped heads
    assert split_kv.fa4_num_splits(p, 148, 128, 128, True) == 18


def test_flash_attn_4_sm90_has_no_split_kv():
    r = _decode(131072, impl="flash-attn-4")
    assert r.knobs["num_splits"] == 1 and r.kernel.units == 8 and r.combine_us == 0
    assert "occupancy: 8 work units" in r.bottleneck


def test_decode_power_under_the_cap_runs_at_the_ceiling():
    hw = load_hw(H200)
    r = _decode(131072, impl="flash-attn-4")  # 8 CTAs: little power
    assert r.power_w < 0.5 * hw.power_cap_w and not r.power_limited
    assert r.clock_ceiling and r.clock_ghz == pytest.approx(hw.clock_tensor_ghz)
    # an HBM-bound launch's time hardly follows the clock: K/V take their bytes at the HBM rate
    a = _decode(262144)
    b = _decode(262144, clock_ghz=hw.clock_tensor_ghz)
    assert b.time_us == pytest.approx(a.time_us, rel=0.01)
    assert a.power_by_part["hbm"] > 100  # the memory-bound load is in the power model


FA3_TILES = {  # hopper/tile_size.h: (hdim, hdim_v, causal) -> (tile_m, tile_n, P in registers)
    (64, 64, False): (192, 192, False), (64, 64, True): (192, 128, True),
    (96, 96, False): (192, 144, False), (96, 96, True): (192, 144, False),
    (128, 128, False): (128, 176, True), (128, 128, True): (128, 128, True),
    (192, 192, False): (128, 112, True), (192, 128, False): (128, 128, True),
    (256, 256, False): (128, 80, True), (256, 256, True): (128, 80, True),
}


@pytest.mark.parametrize("shape", sorted(FA3_TILES))
def test_fa3_implementation_loads_with_its_tiles(shape):
    d, dv, causal = shape
    # the tile table of every head dim FA3 has, as a build with all of them compiled picks it
    every = dataclasses.replace(implementation.load("flash-attn-3-sm90"), kernel_head_dims=())
    _, schedule, _, impl, knobs = setup(H200, None, Problem(2, 16, 4096, 4096, d, causal, dv), None, every)
    assert impl.name == "flash-attn-3-sm90" and schedule == "fa3"
    assert (knobs["tile_m"], knobs["tile_n"], knobs["p_in_registers"]) == FA3_TILES[shape]
    assert knobs["persistent"] and knobs["intra_wg_overlap"] and knobs["num_splits"] == 1
    for name, entry in impl.knobs.items():
        assert entry["source"] and entry["confidence"] in ("H", "M", "L")


@pytest.mark.parametrize("asked,runs", [((96, 96), (128, 128)), ((192, 128), (192, 192))])
def test_fa3_package_runs_a_head_dim_it_lacks_in_the_next_kernel(asked, runs):
    """The package timed has no hd96 or 192/128 kernel: the prediction is the larger kernel's
    (its tiles and time), while TFLOP/s count the asked head dim's FLOPs and a note says so."""
    fa3 = implementation.load("flash-attn-3-sm90")
    assert asked not in fa3.kernel_head_dims and runs in fa3.kernel_head_dims
    p = Problem(2, 16, 4096, 4096, asked[0], False, asked[1])
    r = simulate(H200, problem=p, impl="flash-attn-3")
    big = simulate(H200, problem=Problem(2, 16, 4096, 4096, runs[0], False, runs[1]), impl="flash-attn-3")
    assert (r.knobs["tile_m"], r.knobs["tile_n"]) == (big.knobs["tile_m"], big.knobs["tile_n"])
    assert r.time_us == pytest.approx(big.time_us, rel=1e-9)
    assert (r.problem.hdim, r.problem.hdim_v) == asked
    assert r.tflops == pytest.approx(p.flops / (r.time_us * 1e-6) / 1e12)
    assert any(f"runs the hd{runs[0]}" in n for n in r.notes)
    # fa4kernel has an hd96 kernel of its own: no padding there
    ours = simulate(H200, problem=Problem(2, 16, 4096, 4096, 96, False), impl="fa4kernel")
    assert not any("kernel in its build" in n for n in ours.notes)


def test_fa3_decode_tile_is_one_mma_warpgroup():
    _, _, _, _, k = setup(H200, None, Problem(1, 32, 1, 131072, 128, heads_kv=8), None, "flash-attn-3")
    assert (k["tile_m"], k["tile_n"], k["pack_gqa"], k["persistent"]) == (64, 176, True, False)


def test_bad_lengths_are_refused_in_one_line():
    for bad, match in (([], "empty"), ([100, -3], "sequence 1: a length must be >= 1"), ([100, 0], ">= 1"),
                       ([100, 2.5], "positive integer"), ("100", "a list of lengths")):
        with pytest.raises(InputError, match=match) as e:
            Problem.varlen(8, 128, bad)
        assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="seqlens_k"):
        Problem.varlen(8, 128, [100, 200], [100])
    with pytest.raises(InputError, match="seqlen_k"):
        Problem(1, 8, 1, -5, 128)
    with pytest.raises(InputError, match="batch"):
        Problem(3, 8, 100, 100, 128, seqlens=((100, 100),))


def test_causal_cache_shorter_than_the_new_tokens_runs():
    # bottom-right aligned: the first seqlen_q - seqlen_k rows see no key (zeros); possible, so allowed
    r = simulate(H200, None, Problem(1, 8, 256, 64, 128, True), impl="flash-attn-4")
    assert r.time_us > 0 and any("see no key" in n for n in r.notes)


@pytest.mark.parametrize("args, text", [
    (["--seqlens", "512,abc"], "'abc' is not a whole number"),
    (["--seqlens", ""], "a comma list of lengths"),
    (["--seqlens", "512,-3", "--impl", "flash-attn-4"], ">= 1 token"),
    (["--seqlens-k", "512"], "only with --seqlens"),
    (["--seqlens", "512,300", "--seqlens-k", "512", "--impl", "flash-attn-4"], "one per sequence"),
])
def test_cli_bad_varlen_input_exits_2(args, text, capsys):
    assert main(["run", "--hw", H200, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert text in err and len(err.splitlines()) == 1


def test_cli_varlen_and_decode_run(capsys):
    assert main(["run", "--hw", H200, "--impl", "flash-attn-4", "--seqlens", "512,3000,100", "--causal",
                 "--heads", "8"]) == 0
    out = capsys.readouterr().out
    assert "varlen: 3 sequences" in out
    assert main(["run", "--hw", H200, "--impl", "fa4kernel", "--seqlens", "512,3000,100", "--causal"]) == 0
    assert "varlen: 3 sequences" in capsys.readouterr().out
    assert main(["run", "--hw", H200, "--impl", "flash-attn-3", "--seqlen", "1", "--seqlen-k", "131072",
                 "--batch", "1", "--heads", "32", "--heads-kv", "8"]) == 0
    out = capsys.readouterr().out
    assert "split-KV 15 chunks" in out and "HBM-bound" in out
