"""The band a prediction's parameter ranges put on it (fa4sim/uncertainty.py): ranges from the
profile or from confidence, the band's ends against direct predictions at those ends, and the
CLI's --uncertainty."""
import json
from dataclasses import replace

import pytest

from fa4sim import hardware, steady_state, uncertainty
from fa4sim.cli import main
from fa4sim.errors import InputError
from fa4sim.model import simulate
from fa4sim.params import Problem

P = Problem(1, 16, 1024, 1024, 128)


def two_ranges():
    """The b200 profile with every value exact but two: the MUFU rate and the L2 latency."""
    b = hardware.load("b200")
    return replace(b, confidence={k: "-" for k in b.confidence},
                   ranges={"mufu_ex2_per_clk": (8.0, 32.0), "l2_latency": (400.0, 1600.0)})


def test_range_rules():
    b = hardware.load("h100")
    b = replace(b, confidence={**b.confidence, "mufu_latency": "L", "fma_latency": "H", "smem_latency": "M"},
                ranges={"hbm_latency": (100.0, 5000.0)})
    assert uncertainty.range_of(b, "hbm_latency")[:2] == (100.0, 5000.0)
    lo, hi, why = uncertainty.range_of(b, "mufu_latency")
    assert (lo, hi) == pytest.approx((0.75 * b.mufu_latency, 1.25 * b.mufu_latency)) and "L" in why
    assert uncertainty.range_of(b, "fma_latency")[:2] == pytest.approx((0.99 * b.fma_latency, 1.01 * b.fma_latency))
    assert uncertainty.range_of(b, "smem_latency")[1] == pytest.approx(1.05 * b.smem_latency)
    n = uncertainty.range_of(b, "num_sms")  # a count: exact
    assert n[0] == n[1] == b.num_sms and "count" in n[2]
    assert "not modelled" in uncertainty.range_of(b, "tmem_bytes_per_clk")[2]  # 0 on SM90
    # a fraction at the top of its span stays inside it
    assert uncertainty.range_of(replace(b, confidence={**b.confidence, "cap_held_fraction": "L"}),
                                "cap_held_fraction")[1] <= hardware.PARAMS["cap_held_fraction"].hi
    # --set makes a value exact
    assert uncertainty.range_of(b.with_values(hbm_latency=900), "hbm_latency")[:2] == (900, 900)


def test_profile_ranges_checked_and_kept():
    data = hardware.load("b200").to_json()
    data["params"]["l2_latency"]["range"] = [500, 1200]
    assert hardware.from_json(data).ranges["l2_latency"] == (500, 1200)
    assert hardware.from_json(hardware.from_json(data).to_json()).ranges["l2_latency"] == (500, 1200)
    for bad, words in (([900, 1200], "does not hold its value"), ([500], "two numbers"), ("wide", "two numbers"),
                       ([-5, 1200], "allowed"), ([500, None], "allowed")):
        data["params"]["l2_latency"]["range"] = bad
        with pytest.raises(InputError, match=words) as e:
            hardware.from_json(data)
        assert e.value.param == "l2_latency" and "\n" not in str(e.value)


def test_band_ends_are_the_predictions_there():
    prof = two_ranges()
    nominal = simulate(prof, None, P)
    b = uncertainty.band(prof, None, P, jobs=1, nominal=nominal)
    assert [d.name for d in b.deviations] == sorted(["mufu_ex2_per_clk", "l2_latency"],
                                                     key=lambda n: [d.name for d in b.deviations].index(n))
    assert len(b.deviations) == 2 and len(b.exact) == len(hardware.PARAMS) - 2
    for d in b.deviations:  # each end as a prediction of its own, without the shared memo
        for end, rel in ((d.lo, d.time_at_lo), (d.hi, d.time_at_hi)):
            alone = simulate(prof.with_values(**{d.name: end}), None, P)
            assert alone.time_us / nominal.time_us - 1 == pytest.approx(rel, rel=1e-9, abs=1e-12)
    mufu = next(d for d in b.deviations if d.name == "mufu_ex2_per_clk")
    assert mufu.time_at_lo > 0 >= mufu.time_at_hi  # half the exp2 rate is slower, twice it no slower
    slow = sum(d.slower ** 2 for d in b.deviations) ** 0.5
    assert b.time_high_us == pytest.approx(nominal.time_us * (1 + slow))
    assert b.tflops_low <= nominal.tflops <= b.tflops_high and b.tflops_low < b.tflops_high
    assert b.clock_low_ghz <= nominal.clock_ghz <= b.clock_high_ghz
    assert b.dominant[0][0] == b.deviations[0].name and sum(s for _, s in b.dominant) == pytest.approx(1.0)


def test_shared_memo_changes_nothing():
    prof = hardware.load("b200")
    alone = [simulate(prof.with_values(**kv), None, replace(P, causal=True)).time_us
             for kv in ({}, {"energy_tensor_pj_per_flop": 0.4}, {"l2_latency": 900})]
    with steady_state.shared():
        shared = [simulate(prof.with_values(**kv), None, replace(P, causal=True)).time_us
                  for kv in ({}, {"energy_tensor_pj_per_flop": 0.4}, {"l2_latency": 900})]
    assert shared == alone


def test_no_ranges_no_band():
    b = hardware.load("b200")
    exact = replace(b, confidence={k: "-" for k in b.confidence}, ranges={})
    band = uncertainty.band(exact, None, P, jobs=1)
    assert band.deviations == [] and band.tflops_low == band.tflops_high == band.tflops


def test_a_set_clock_leaves_the_power_model_out():
    prof = replace(two_ranges(), ranges={"energy_tensor_pj_per_flop": (0.3, 0.7)})
    band = uncertainty.band(prof, None, P, {"clock_ghz": 1.5}, jobs=1)
    assert band.deviations == [] and ("energy_tensor_pj_per_flop", "exact (no power model: the clock is set)") in band.exact


def test_cli_json(tmp_path, capsys):
    path = tmp_path / "b200-two.json"
    path.write_text(json.dumps(two_ranges().to_json()))
    assert main(["run", "--hw", str(path), "--seqlen", "1024", "--batch", "1", "--uncertainty", "--jobs", "1",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tflops_low"] <= d["tflops"] <= d["tflops_high"]
    assert {p["name"] for p in d["dominant_params"]} <= {"mufu_ex2_per_clk", "l2_latency"}
    assert len(d["uncertainty"]["params"]) == 2
    assert main(["run", "--hw", str(path), "--seqlen", "1024", "--batch", "1", "--uncertainty", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "band " in out and "TFLOP/s" in out.split("band", 1)[1]


@pytest.mark.parametrize("args,words", [(["--jobs", "2"], "only with --uncertainty"),
                                        (["--uncertainty", "--jobs", "0"], "--jobs")])
def test_cli_bad_jobs(args, words, capsys):
    assert main(["run", "--seqlen", "1024", "--batch", "1", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_sustained_points_get_their_bands(tmp_path, capsys):
    """validate --uncertainty on a settled file: each kernel-point's band holds its prediction, and
    `covered` says whether the measured TFLOP/s fall inside it."""
    from pathlib import Path
    src = Path(__file__).resolve().parents[1] / "lab/campaigns/sustained-settled/sustained_asked_h200_2026-11-29.json"
    doc = json.loads(src.read_text())
    doc["points"] = doc["points"][:1]
    path = tmp_path / "one.json"
    path.write_text(json.dumps(doc))
    assert main(["validate", str(path), "--uncertainty", "--jobs", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    rows = [r for r in res["points"] if r["predicted_tflops"] is not None]
    assert rows and res["summary"]["band"]["banded"] == len(rows)
    for r in rows:
        assert r["tflops_low"] < r["predicted_tflops"] < r["tflops_high"]
        assert r["covered"] == (r["tflops_low"] <= r["measured_tflops"] <= r["tflops_high"])
    assert main(["validate", str(path), "--uncertainty", "--jobs", "1"]) == 0
    assert "inside their bands (--uncertainty):" in capsys.readouterr().out


def test_card_power_ranges_are_the_cards_measured():
    for name in ("h100", "h200"):
        hw = hardware.load(name)
        lo, hi = hw.ranges["card_power_w"]
        assert lo <= hw.card_power_w <= hi and hi - lo > 20  # the measured cards span tens of watts
