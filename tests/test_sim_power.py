"""The power model (fa4sim/power.py): power -> clock, its use in simulate(), and its fit
(lab/tools/calibrate/fit_power.py). No GPU."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fa4sim import Problem, hardware, power, simulate
from fa4sim.cli import main
from lab.tools.calibrate import fit_power

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = Problem(2, 16, 8192, 8192, 128)
SMALL = Problem(1, 4, 512, 512, 128)


@pytest.fixture(scope="module")
def h100_run():
    return simulate("h100", "fa3", PROBLEM)


def gemm_like(tensor_share: float, hw) -> dict:
    """Chip-wide rates per SM clock of a load keeping the tensor core `tensor_share` busy."""
    n = hw.num_sms
    return {"tensor": tensor_share * hw.tensor_flops_per_clk * n, "smem": tensor_share * 80.0 * n,
            "mufu": 0.0, "fma": 0.0, "alu": 0.0, "l2": 0.0, "hbm": 0.0}


def test_power_grows_with_the_clock(h100_run):
    hw = hardware.load("h100")
    fs = np.linspace(hw.clock_min_ghz, hw.clock_ghz, 60)
    for act in (h100_run.activity, gemm_like(0.8, hw)):
        p = [power.power_w(hw, act, f)[0] for f in fs]
        assert all(b > a for a, b in zip(p, p[1:]))
    total, parts = power.power_w(hw, h100_run.activity, 1.6)
    assert set(parts) == set(power.PARTS) and total == pytest.approx(sum(parts.values()))


def test_predicted_clock_sits_at_the_cap(h100_run):
    hw = hardware.load("h100")
    pred = power.predict_clock(hw, h100_run.activity)
    assert pred.limited and hw.clock_min_ghz <= pred.clock_ghz < hw.clock_ghz
    held = power.held_power(hw)  # the cap's controller holds a capped load a little below the limit
    assert held == pytest.approx(hw.power_cap_w * hw.cap_held_fraction) and held <= hw.power_cap_w
    assert pred.power_w <= held
    assert power.power_w(hw, h100_run.activity, pred.clock_ghz + 1e-3)[0] > held
    # simulate() reports that clock, the power there, and the time at it
    r = h100_run
    assert r.clock_source == "power model" and r.power_limited
    assert r.clock_ghz == pytest.approx(pred.clock_ghz, abs=2e-3)
    assert r.hw.clock_ghz == r.clock_ghz and r.power_w <= hw.power_cap_w
    assert r.hw.peak_tflops == pytest.approx(hw.peak_tflops * r.clock_ghz / hw.clock_ghz)
    assert r.activity.time_us(r.clock_ghz) == pytest.approx(r.time_us)
    assert power.dominant(r.power_by_part)[0] == "tensor"


def test_more_tensor_work_lowers_the_clock():
    hw = hardware.load("h100").with_values(clock_tensor_ghz=0)  # the cap alone
    clocks = [power.predict_clock(hw, gemm_like(share, hw)).clock_ghz for share in (0.5, 0.7, 0.85, 1.0)]
    assert all(b < a for a, b in zip(clocks, clocks[1:]))


def test_tensor_work_under_the_cap_holds_the_clock_at_the_ceiling():
    """Below the cap, a load with tensor work runs at clock_tensor_ghz (the clock the measured
    tensor loads hold while NVML reports the maximum); one without tensor work at the maximum."""
    hw = hardware.load("h100")
    assert 1.7 < hw.clock_tensor_ghz < hw.clock_ghz
    light = power.predict_clock(hw, gemm_like(0.3, hw))
    assert light.clock_ghz == hw.clock_tensor_ghz and light.ceiling and not light.limited
    assert light.power_w == pytest.approx(power.power_w(hw, gemm_like(0.3, hw), hw.clock_tensor_ghz)[0])
    fma = {"tensor": 0.0, "fma": 60.0 * hw.num_sms}
    assert power.predict_clock(hw, fma).clock_ghz == hw.clock_ghz
    # the cap below the ceiling still sets the clock
    full = power.predict_clock(hw, gemm_like(1.0, hw))
    assert full.limited and not full.ceiling and full.clock_ghz < hw.clock_tensor_ghz
    # a profile without a ceiling (0) runs such a load at the maximum
    none = power.predict_clock(hw.with_values(clock_tensor_ghz=0), gemm_like(0.3, hw))
    assert none.clock_ghz == hw.clock_ghz and not none.ceiling


def test_a_short_launch_below_the_cap_runs_at_the_ceiling(capsys):
    r = simulate("h100", "fa3", SMALL)
    hw = hardware.load("h100")
    assert r.clock_ghz == hw.clock_tensor_ghz and r.clock_ceiling and not r.power_limited
    assert r.clock_source == "power model" and r.power_w < r.hw.power_cap_w
    assert main(["run", "--hw", "h100", "--hdim", "128", "--seqlen", "512", "--batch", "1", "--heads", "4"]) == 0
    assert "the tensor core's clock ceiling (clock_tensor_ghz)" in capsys.readouterr().out
    off = simulate("h100", "fa3", SMALL, {"clock_tensor_ghz": 0})
    assert off.clock_ghz == hw.clock_ghz and not off.clock_ceiling


def test_even_the_lowest_clock_over_the_cap_says_so():
    hw = hardware.load("h100").with_values(power_cap_w=50)
    pred = power.predict_clock(hw, gemm_like(1.0, hw))
    assert pred.clock_ghz == hw.clock_min_ghz and pred.limited and "clock_min_ghz" in pred.note


def test_set_clock_forces_it(h100_run):
    r = simulate("h100", "fa3", PROBLEM, {"clock_ghz": 1.5})
    assert r.clock_ghz == 1.5 and r.hw.clock_ghz == 1.5 and r.clock_source == "--set" and not r.power_limited
    assert any("set with --set" in n for n in r.notes)
    # its power there, on the profile's own maximum clock
    assert r.power_w == pytest.approx(power.power_w(hardware.load("h100"), r.activity, 1.5)[0])
    # the predicted clock, forced, gives the same prediction: the model iterates to a fixed point
    same = simulate("h100", "fa3", PROBLEM, {"clock_ghz": h100_run.clock_ghz})
    assert same.time_us == pytest.approx(h100_run.time_us, rel=1e-9)
    assert same.cycles == pytest.approx(h100_run.cycles, rel=1e-9)


def test_no_power_model_keeps_the_profile_clock():
    r = simulate("h100-datasheet", "fa3", PROBLEM)
    assert r.clock_ghz == hardware.load("h100-datasheet").clock_ghz and r.clock_source == "profile"
    assert r.power_w is None and r.power_by_part == {} and not r.power_limited
    assert any("was not measured on this chip" in n for n in r.notes)
    off = simulate("h100", "fa3", PROBLEM, {"power_cap_w": 0})
    assert off.clock_ghz == hardware.load("h100").clock_ghz and off.clock_source == "profile"


def test_every_profile_gives_the_power_parameters():
    for name in hardware.available():
        hw = hardware.load(name)
        for k in hardware.POWER_PARAMS:
            assert k in hardware.PARAMS and hw.sources[k]
        if power.has_model(hw):
            assert 0 < hw.clock_min_ghz < hw.clock_ghz and 0 <= hw.voltage_slope <= 1
            assert all(hw.values[power.ENERGY[u]] > 0 for u in power.ENERGY)
            # the profiles' own clock, forced, predicts as before the power model (prediction grid)
            assert hw.confidence["power_cap_w"] == "H"


@pytest.mark.parametrize("name", ["b200", "h200"])
def test_other_profiles_predict_a_clock(name):
    r = simulate(name, problem=PROBLEM)
    hw = hardware.load(name)
    assert r.clock_source == "power model" and r.power_w <= hw.power_cap_w + 1e-6
    assert hw.clock_min_ghz <= r.clock_ghz <= hw.clock_ghz


def test_bad_power_parameters_are_refused():
    from fa4sim.errors import InputError
    with pytest.raises(InputError, match="voltage_slope"):
        simulate("h100", "fa3", SMALL, {"voltage_slope": 1.5})
    with pytest.raises(InputError, match="clock_min_ghz"):
        simulate("h100", "fa3", SMALL, {"clock_min_ghz": 2.5})
    with pytest.raises(InputError, match="clock_min_ghz"):  # a cap on a profile without a clock range
        simulate("h100-datasheet", "fa3", SMALL, {"power_cap_w": 500})


def test_cli_json_has_the_clock(capsys):
    code = main(["run", "--hw", "h100", "--impl", "flash-attn-4", "--hdim", "128", "--seqlen", "2048",
                 "--batch", "2", "--heads", "16", "--causal", "--json"])
    j = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {"time_us", "tflops", "clock_ghz", "power_w", "clock_source"} <= set(j)
    assert j["clock_source"] == "power model" and j["power_w"] > 0 and 0 < j["clock_ghz"] <= 1.98
    main(["run", "--hw", "h100", "--seqlen", "8192", "--batch", "2"])
    out = capsys.readouterr().out
    assert "clock     " in out and "W cap" in out and "set mostly by the tensor core" in out and "power     " in out


# --- the fit --------------------------------------------------------------------------------

TRUE = {"static_power_w": 80.0, "clock_power_w": 110.0, "voltage_slope": 0.42,
        "energy_tensor_pj_per_flop": 0.6, "energy_mufu_pj_per_op": 4.0, "energy_fma_pj_per_lane_op": 1.2,
        "energy_alu_pj_per_lane_op": 0.8, "energy_smem_pj_per_byte": 0.5, "energy_l2_pj_per_byte": 6.0,
        "energy_hbm_pj_per_byte": 30.0}


def synthetic(seed: int = 0, noise: float = 0.003) -> dict:
    """A calibration file the model itself generates: unit loads, each at the clock the true
    parameters predict under a 700 W cap (or a locked clock), power with relative noise."""
    rng = np.random.default_rng(seed)
    hw = hardware.load("h100").with_values(**TRUE)
    n = hw.num_sms
    mixes = []
    for share in (0.3, 0.5, 0.65, 0.8, 0.9, 1.0):
        mixes.append({"tensor_flops": share * 4096 * n, "smem_bytes": share * 80 * n})
    mixes += [{"mufu_ops": 16 * n}, {"fma_lane_ops": 128 * n}, {"alu_lane_ops": 64 * n},
              {"smem_bytes": 128 * n}, {"l2_bytes": 5000.0}, {"hbm_bytes": 1500.0},
              {"fma_lane_ops": 64 * n, "mufu_ops": 8 * n, "alu_lane_ops": 32 * n},
              {"tensor_flops": 0.7 * 4096 * n, "mufu_ops": 10 * n, "fma_lane_ops": 40 * n, "smem_bytes": 60 * n}]
    loads = []
    for i, mix in enumerate(mixes):
        rates = {u: float(mix.get(k, 0.0)) for k, u in power.CALIBRATION_KEYS.items()}
        for lock in (None, 1.41):  # as it runs, and at a locked clock
            f = power.predict_clock(hw, rates).clock_ghz if lock is None else lock
            p = power.power_w(hw, rates, f)[0] * (1 + noise * rng.standard_normal())
            loads.append({"name": f"load{i}{'' if lock is None else '@1.41'}", "what": "synthetic",
                          "clock_ghz": f, "clock_ghz_nvml": f, "power_w": p, "seconds": 2.0,
                          "temperature_c": 60,
                          "activity_per_clk": {k: float(mix.get(k, 0.0)) for k in power.CALIBRATION_KEYS}})
    return {"meta": {"device": "Test GPU", "date": "2026-11-23", "kind": "power"},
            "gpu": {"power_limit_w": 700.0, "clock_max_mhz": 1980, "supported_clocks_mhz": [1980, 1410, 345],
                    "idle_power_w": 70.0},
            "loads": loads}


def test_nnls_matches_a_known_solution():
    rng = np.random.default_rng(1)
    a = rng.random((30, 6))
    x_true = np.array([1.0, 0.0, 2.5, 0.0, 0.3, 4.0])
    x = fit_power.nnls(a, a @ x_true)
    assert np.allclose(x, x_true, atol=1e-8)
    # a negative unconstrained optimum is clipped to the boundary and still optimal (KKT)
    b = a @ np.array([1.0, -2.0, 1.0, 1.0, 1.0, 1.0])
    x = fit_power.nnls(a, b)
    grad = a.T @ (a @ x - b)
    assert (x >= 0).all() and np.all(grad[x > 1e-9] == pytest.approx(0.0, abs=1e-8)) and (grad >= -1e-8).all()


def test_fit_recovers_the_parameters(tmp_path):
    path = tmp_path / "power.json"
    path.write_text(json.dumps(synthetic()))
    gpu, loads, meta = fit_power.read(str(path))
    values, res, rows = fit_power.report(hardware.load("h100"), gpu, loads, 1.98)
    assert values["voltage_slope"] == pytest.approx(TRUE["voltage_slope"], abs=0.03)
    for k in ("static_power_w", "clock_power_w", "energy_tensor_pj_per_flop", "energy_mufu_pj_per_op",
              "energy_fma_pj_per_lane_op", "energy_hbm_pj_per_byte"):
        assert values[k] == pytest.approx(TRUE[k], rel=0.1), k
    assert res < 0.01
    for r in rows:  # and predicts every load's clock, fitted with and without it
        if not r["name"].endswith("@1.41"):
            assert r["predicted_clock_ghz"] == pytest.approx(r["clock_ghz"], abs=0.01)
            assert r["loo_clock_ghz"] == pytest.approx(r["clock_ghz"], abs=0.02)


def test_cap_held_is_the_median_power_of_the_capped_loads():
    loads = [{"power_w": 688.0, "capped": True}, {"power_w": 690.0, "capped": True},
             {"power_w": 692.0, "capped": True}, {"power_w": 300.0, "capped": False}]
    fraction, n = fit_power.cap_held(loads, 700.0)
    assert n == 3 and fraction == pytest.approx(690.0 / 700.0)
    assert fit_power.cap_held(loads[3:], 700.0) == (1.0, 0)  # none held: the limit itself


def test_a_lower_held_power_lowers_the_clock(h100_run):
    hw = hardware.load("h100")
    at_limit = power.predict_clock(hw.with_values(cap_held_fraction=1.0), h100_run.activity)
    held = power.predict_clock(hw.with_values(cap_held_fraction=0.98), h100_run.activity)
    assert held.clock_ghz < at_limit.clock_ghz and held.power_w == pytest.approx(0.98 * hw.power_cap_w, rel=1e-3)


def test_fit_writes_the_profile(tmp_path):
    path = tmp_path / "power.json"
    path.write_text(json.dumps(synthetic(noise=0.0)))
    prof = tmp_path / "h100.json"
    prof.write_text((ROOT / "fa4sim/profiles/h100.json").read_text())
    b200 = tmp_path / "b200.json"
    b200.write_text((ROOT / "fa4sim/profiles/b200.json").read_text())
    out = subprocess.run([sys.executable, "-m", "lab.tools.calibrate.fit_power", str(path), "--profile", str(prof),
                          "--write", "--b200", str(b200)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "load0" in out.stdout and "voltage_slope" in out.stdout
    hw = hardware.load(str(prof))
    assert hw.voltage_slope == pytest.approx(TRUE["voltage_slope"], abs=0.006)
    assert hw.energy_tensor_pj_per_flop == pytest.approx(TRUE["energy_tensor_pj_per_flop"], rel=0.01)
    assert hw.clock_min_ghz == 0.345 and hw.confidence["clock_min_ghz"] == "M"
    assert hw.sources["static_power_w"].startswith("measured on Test GPU by lab/tools/calibrate/")
    assert "2026" not in hw.sources["static_power_w"] and "power.json" not in hw.sources["static_power_w"]
    assert hw.sources["static_power_w"].endswith("; lab/campaigns/power-calibration/)")
    assert hw.confidence["energy_hbm_pj_per_byte"] == "M"
    # the B200 follows from the fitted H100 by the stated ratios
    b = hardware.load(str(b200))
    assert b.energy_tensor_pj_per_flop == pytest.approx(hw.energy_tensor_pj_per_flop * fit_power.TENSOR_RATIO,
                                                        rel=1e-3)
    assert b.static_power_w == pytest.approx(hw.static_power_w * fit_power.BOARD_RATIO, rel=1e-3)
    assert b.energy_mufu_pj_per_op == hw.energy_mufu_pj_per_op and b.confidence["voltage_slope"] == "L"
    assert b.power_cap_w == 1000 and "measured on Test GPU" in b.sources["energy_tensor_pj_per_flop"]


@pytest.mark.parametrize("doc,what", [
    ("not json", "not valid JSON"),
    (json.dumps({"meta": {"kind": "calibration"}}), "meta.kind"),
    (json.dumps({"meta": {"kind": "power"}, "gpu": {"power_limit_w": 700}, "loads": []}), "supported_clocks_mhz"),
    (json.dumps({"meta": {"kind": "power"}, "gpu": {"power_limit_w": 700, "supported_clocks_mhz": [1980]},
                 "loads": [{"name": "x", "power_w": -3, "clock_ghz": 1.9, "activity_per_clk": {}}]}), "power_w"),
])
def test_fit_refuses_bad_input_in_one_line(tmp_path, doc, what):
    path = tmp_path / "bad.json"
    path.write_text(doc)
    out = subprocess.run([sys.executable, "-m", "lab.tools.calibrate.fit_power", str(path)], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and what in lines[0]


# ----------------------------------------------------------------------------- bursts and mixed code
class _Busy:
    def __init__(self, unit, start, end):
        self.unit, self.start, self.end = unit, start, end


class _Trace:
    def __init__(self, spans):
        self.busy = [_Busy(u, a, b) for u, a, b in spans]


def test_tensor_gaps_are_the_idle_stretches_between_busy_ones():
    trace = _Trace([("tensor", 0, 100), ("tensor", 130, 300), ("mufu", 300, 900), ("tensor", 1000, 1500),
                    ("tensor", 1500, 1600), ("issue:wg0", 1550, 1650)])
    # touching intervals merge; each gap with the cycles of it some warp issues (the MUFU's 300..900)
    assert power.tensor_gaps(trace) == [(30, 0), (700, 600)]
    # a window counts its edges too: 50..1700 has 100 idle cycles after the last burst, 50 issuing
    assert power.tensor_gaps(trace, 50.0, 1700.0) == [(30, 0), (700, 600), (100, 50)]
    assert power.tensor_gaps(trace, None, 1700.0) == [(30, 0), (700, 600), (100, 50)]


def test_idle_cycles_count_issuing_cycles_and_weigh_long_gaps_less():
    hw = hardware.load("h100").with_values(tensor_idle_gap_cycles=1000.0)
    assert power.idle_cycles(hw, [(1000.0, 1000.0), (3000.0, 3000.0)]) == pytest.approx(1000 * 0.5 + 3000 * 0.25)
    assert power.idle_cycles(hw, [(1000.0, 400.0)]) == pytest.approx(400 * 0.5)  # warps wait the rest
    assert power.idle_cycles(hw.with_values(tensor_idle_gap_cycles=0.0), [(1000.0, 1000.0)]) == 0.0


def test_idle_and_mixed_terms_price_their_parts_only():
    hw = hardware.load("h100").with_values(tensor_idle_power_fraction=0.2, mixed_code_energy_fraction=0.4)
    rates = {"tensor": 3e5, "smem": 5e3, "mufu": 2e3, "fma": 6e3, "alu": 3e3, "l2": 0.0, "hbm": 0.0}
    _, plain = power.power_w(hw, rates, 1.6)
    _, both = power.power_w(hw, {**rates, "tensor_idle": 1.5e5, "mixed": 1.0}, 1.6)
    assert plain["tensor_idle"] == 0.0
    # idle at half the busy rate, drawing 0.2 of the busy power: 0.1 of the tensor core's part
    assert both["tensor_idle"] == pytest.approx(plain["tensor"] * 0.2 * 0.5)
    assert both["tensor"] == plain["tensor"]
    for u in ("mufu", "fma", "alu"):
        assert both[u] == pytest.approx(plain[u] * 1.4)
    assert both["smem"] == plain["smem"] and both["static"] == plain["static"]


def test_attention_pays_for_its_idle_tensor_core_in_clock():
    """The FA3-style loop keeps the tensor core busy in bursts with gaps between them: with the
    idle and mixed-code terms the power model holds a lower clock than without."""
    with_terms = simulate("h100", "fa3", PROBLEM)
    without = simulate("h100", "fa3", PROBLEM, {"tensor_idle_power_fraction": 0.0,
                                                 "mixed_code_energy_fraction": 0.0})
    idle = with_terms.activity.totals["tensor_idle"]
    assert 0.0 < idle < with_terms.activity.totals["tensor"]  # the loop's tensor core is busy more than idle
    assert with_terms.power_by_part["tensor_idle"] > 0.0
    assert with_terms.clock_ghz < without.clock_ghz


def synthetic_bursts(noise: float = 0.0) -> dict:
    """Duty-cycled tensor loads of several burst lengths, beside a softmax-like mix or not, made
    by a model with known idle and mixed-code terms (as bench_power's loads record them)."""
    truth = {**TRUE, "tensor_idle_power_fraction": 0.2, "tensor_idle_gap_cycles": 8192.0,
             "mixed_code_energy_fraction": 0.3}
    hw = hardware.load("h100").with_values(**truth)
    rng = np.random.default_rng(3)
    doc = synthetic(noise=noise)
    n = hw.num_sms
    peak = hw.tensor_flops_per_clk * n
    for duty in (0.5, 0.75):
        for trips in (1, 8, 64):
            for mix in (False, True):
                act = {"tensor_flops": duty * peak, "smem_bytes": duty * 80 * n}
                if mix:
                    act.update({"mufu_ops": 10 * n, "fma_lane_ops": 30 * n, "alu_lane_ops": 15 * n})
                L = trips * 8 * 2 * 64 * 256 * 16 / hw.tensor_flops_per_clk
                gap = L * (1 - duty) / duty
                rates = {u: float(act.get(k, 0.0)) for k, u in power.CALIBRATION_KEYS.items()}
                rates.update(tensor_idle=(1 - duty) * peak * 8192.0 / (8192.0 + gap), mixed=1.0 if mix else 0.0)
                for f in (1.98, 1.5):
                    doc["loads"].append({
                        "name": f"d{duty}_b{trips}{'+mix' if mix else ''}@{f}", "what": "synthetic",
                        "clock_ghz": f, "clock_ghz_nvml": f, "seconds": 2.0, "temperature_c": 60,
                        "power_w": power.power_w(hw, rates, f)[0] * (1 + noise * rng.standard_normal()),
                        "activity_per_clk": {k: float(act.get(k, 0.0)) for k in power.CALIBRATION_KEYS},
                        "wgmma_n": 256, "mma_gap_cycles": 1000, "burst_trips": trips,
                        "code": "mix" if mix else "sleep", "stream_warpgroups": 2 if mix else 0})
    # the single-pipe mix of synthetic() is not "mixed code": a real mixed load carries the term
    return doc, truth


def test_fit_recovers_the_idle_and_mixed_terms(tmp_path):
    doc, truth = synthetic_bursts()
    path = tmp_path / "power.json"
    path.write_text(json.dumps(doc))
    gpu, loads, meta = fit_power.read(str(path))
    fit_power.prepare(loads, hardware.load("h100"))
    values, res = fit_power.fit(loads, 1.98, slopes=[TRUE["voltage_slope"]])
    assert values["tensor_idle_gap_cycles"] == truth["tensor_idle_gap_cycles"]
    assert values["mixed_code_energy_fraction"] == pytest.approx(truth["mixed_code_energy_fraction"])
    assert values["tensor_idle_power_fraction"] == pytest.approx(truth["tensor_idle_power_fraction"], rel=1e-3)
    assert values["energy_tensor_pj_per_flop"] == pytest.approx(TRUE["energy_tensor_pj_per_flop"], rel=1e-3)
    assert res < 1e-6


def test_idle_rate_needs_a_clocked_sm_in_the_gaps():
    """A load whose warps all sleep in its gaps lets the SM stop its clock: no idle draw; the same
    gaps spun on clock64, or beside awake stream warps, count."""
    peak = 4096.0 * 132
    ld = {"rates": {"tensor": 0.5 * peak}, "burst_cycles": 1024.0, "tensor_peak": peak, "clocked_gaps": True}
    assert fit_power.idle_rate(ld, 1024.0) == pytest.approx(0.5 * peak * 0.5)  # gap = 1024 cycles: half
    assert fit_power.idle_rate({**ld, "clocked_gaps": False}, 1024.0) == 0.0
    assert fit_power.idle_rate({**ld, "burst_cycles": None}, 1024.0) == 0.0  # back to back: never idle


def test_fit_gives_another_host_its_own_static_power(tmp_path):
    doc, _ = synthetic_bursts()
    hot = json.loads(json.dumps(doc))
    for ld in hot["loads"]:
        ld["power_w"] += 15.0  # the same loads on a hotter host: more leakage
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(doc))
    b.write_text(json.dumps(hot))
    out = subprocess.run([sys.executable, "-m", "lab.tools.calibrate.fit_power", str(a), str(b)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "static power of" in x)
    assert float(line.rsplit(":", 1)[1].split()[0]) == pytest.approx(15.0, abs=0.5)


def test_fit_takes_the_tensor_ceiling_from_unheld_tensor_loads(tmp_path):
    """clock_tensor_ghz: the median in-kernel clock of the loads whose tensor core works while NVML
    reads the maximum with no clock-event reason; capped, thermal-held, sleeping and tensor-free
    loads do not count."""
    def load(name, f, tensor_per_sm, reasons, nvml=1.98, f_in=None):
        return {"name": name, "clock_ghz": f, "clock_ghz_in_kernel": f if f_in is None else f_in,
                "clock_ghz_nvml": nvml, "clock_event_reasons": reasons, "power_w": 500.0,
                "activity_per_clk": {"tensor_flops": tensor_per_sm * 132}}
    doc = {"meta": {"kind": "power", "device": "Test GPU", "date": "2026-11-23"},
           "gpu": {"clock_max_mhz": 1980, "num_sms": 132, "power_limit_w": 700, "supported_clocks_mhz": [345, 1980]},
           "loads": [load("a", 1.76, 2048, {"0x0": 200}), load("b", 1.84, 900, {"0x0": 200}),
                     load("c", 1.87, 2048, {"0x0": 150}),
                     load("capped", 1.60, 4096, {"0x4": 100}, nvml=1.61),
                     load("hot", 1.70, 2048, {"0x20": 100}, nvml=1.70),
                     load("asleep", 1.98, 2048, {"0x0": 100}, f_in=1.78),
                     load("ffma", 1.98, 0, {"0x0": 100}), load("trickle", 1.95, 100, {"0x0": 100})]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    value, names = fit_power.tensor_ceiling([str(path)], 4096)
    assert names == ["a", "b", "c"] and value == pytest.approx(1.84)
    prof = tmp_path / "h100.json"
    prof.write_text((ROOT / "fa4sim/profiles/h100.json").read_text())
    fit_power.write_ceiling(str(prof), value, names, doc["meta"])
    hw = hardware.load(str(prof))
    assert hw.clock_tensor_ghz == pytest.approx(1.84) and hw.confidence["clock_tensor_ghz"] == "M"
    assert "3 loads" in hw.sources["clock_tensor_ghz"] and "(a, b, c)" in hw.sources["clock_tensor_ghz"]


# --- the memory paths of the backward's dQ -------------------------------------------------

def test_reduce_adds_are_priced_as_reduce_adds_not_loads():
    """activity() moves a launch's reduce-add bytes out of its L2 loads into l2_reduce (TMA bulk)
    or red (RED.ADD), each at its own energy; a CTA pair's dsmem cycles become dsmem bytes."""
    from types import SimpleNamespace

    hw = hardware.load("h100")
    kt = SimpleNamespace(l2_bytes=3e9, hbm_bytes=1e8, cycles=2e6, cold_start_us=0.0, l2_us=0.0, hbm_us=0.0)
    per_block = {"dsmem": 100.0}
    bulk = power.activity(hw, kt, per_block, 10.0, 1e12, reduce_bytes=1e9)
    red = power.activity(hw, kt, per_block, 10.0, 1e12, reduce_bytes=1e9, reduce_by="red")
    assert bulk.totals["l2"] == red.totals["l2"] == pytest.approx(2e9)
    assert (bulk.totals["l2_reduce"], bulk.totals["red"]) == (pytest.approx(1e9), 0.0)
    assert (red.totals["l2_reduce"], red.totals["red"]) == (0.0, pytest.approx(1e9))
    assert bulk.totals["dsmem"] == pytest.approx(1000.0 * hw.dsmem_bytes_per_clk)
    f = 1.6
    _, pb = power.power_w(hw, bulk, f)
    _, pr = power.power_w(hw, red, f)
    per_clk = 1e9 / (bulk.time_us(f) * f * 1e3)
    assert pb["l2_reduce"] == pytest.approx(1e-3 * f * hw.values["energy_l2_reduce_pj_per_byte"] * per_clk)
    assert pr["red"] == pytest.approx(1e-3 * f * hw.values["energy_red_pj_per_byte"] * per_clk)
    # measured: a reduce-added byte costs more than a loaded one, RED from registers more still
    assert hw.values["energy_l2_pj_per_byte"] < hw.values["energy_l2_reduce_pj_per_byte"] \
        < hw.values["energy_red_pj_per_byte"]
    with pytest.raises(ValueError, match="reduce_by"):
        power.activity(hw, kt, per_block, 10.0, 1e12, reduce_bytes=1e9, reduce_by="atomic")


def test_the_backward_reports_its_dq_paths_power():
    p = Problem(1, 8, 4096, 4096, 256)
    pair = simulate("h100", problem=p, impl="fa4kernel", pass_="bwd")
    cta = simulate("h100", problem=p, impl="fa4kernel", pass_="bwd", overrides={"dq_sum": "cta"})
    red = simulate("h100", problem=Problem(1, 16, 4096, 4096, 128), impl="fa4kernel", pass_="bwd",
                   overrides={"dq_reduce": "red"})
    assert pair.power_by_part["dsmem"] > 0 and cta.power_by_part["dsmem"] == 0
    # the pair sums two CTAs' dQ before one reduce-add: half the reduce-add bytes per visit
    assert pair.activity.totals["l2_reduce"] == pytest.approx(cta.activity.totals["l2_reduce"] / 2)
    assert red.power_by_part["red"] > 0 and red.power_by_part["l2_reduce"] == 0


def test_an_rs_wgmma_operand_from_registers_is_priced_as_shared_memory_bytes():
    """An SM90 RS wgmma's A bytes take no shared-memory bandwidth but reach the power model's smem part: P from registers adds PV's A bytes to the work per
    KV block; SM100's A from TMEM adds nothing."""
    from fa4sim.tensor_core import mma_cost

    h100, b200 = hardware.load("h100"), hardware.load("b200")
    rs, ss = mma_cost(h100, 64, 128, 128, a_in_smem=False), mma_cost(h100, 64, 128, 128, a_in_smem=True)
    assert rs.rf_operand_cycles == pytest.approx(64 * 128 * 2 / h100.smem_bytes_per_clk)
    assert rs.smem_cycles == pytest.approx(ss.smem_cycles - rs.rf_operand_cycles)  # A is not fetched
    assert ss.rf_operand_cycles == 0.0
    assert mma_cost(b200, 128, 128, 128, a_in_smem=False).rf_operand_cycles == 0.0
    # in a schedule: the PV op carries the bytes as work, not as a unit it holds; P staged through shared memory (SS) carries none
    regs = simulate("h100", "fa3", PROBLEM, {"clock_ghz": 1.5, "p_in_registers": True})
    pv = regs.trace.schedule.op("PV0")
    p_bytes = 64 * regs.knobs["tile_n"] * 2  # one warpgroup's P: 64 rows x tile_n keys, bf16
    assert dict(pv.work)["rf_operand"] == pytest.approx(p_bytes / h100.smem_bytes_per_clk)
    assert "rf_operand" not in dict(pv.uses)
    staged = simulate("h100", "fa3", PROBLEM, {"clock_ghz": 1.5, "p_in_registers": False})
    assert not staged.trace.schedule.op("PV0").work
    from types import SimpleNamespace

    kt = SimpleNamespace(l2_bytes=0.0, hbm_bytes=0.0, cycles=1e6, cold_start_us=0.0, l2_us=0.0, hbm_us=0.0)
    act = power.activity(h100, kt, {"smem": 10.0, "rf_operand": 5.0}, 2.0, 0.0)
    assert act.totals["smem"] == pytest.approx(30.0 * h100.smem_bytes_per_clk)


def test_the_rs_calibration_loads_count_their_register_operand():
    """fit_power reads an RS load's A bytes (1/N byte per FLOP) into its smem rate; with them the
    H100 profile gives the recorded RS loads' power within 3 %, as the SS loads'."""
    _, loads, _ = fit_power.read(str(ROOT / "lab/campaigns/power-calibration/power_rs_h100_2026-11-27.json"))
    by = {ld["name"]: ld for ld in loads}
    for n in (128, 64):
        ld = by[f"tensor{n}_rs"]
        # per m64nNk16 (2 x 64 x N x 16 FLOPs): A 2 KiB from registers, B 32 N bytes from smem
        assert ld["rates"]["smem"] == pytest.approx(ld["rates"]["tensor"] * (1 / n + 1 / 64), rel=0.01)
    rows = {r["name"]: r for r in fit_power.check(hardware.load("h100"), loads)}
    for name in ("tensor128_rs", "tensor64_rs", "tensor128", "tensor64"):
        assert abs(rows[name]["power_error"]) < 0.03, (name, rows[name]["power_error"])


def test_a_cards_offset_is_its_capped_gemm_loads_above_the_reference():
    """card_power: a card whose every load draws 20 W more than the reference's at the same clock
    is +20 W; the reference itself is 0; the median card counts the reference; with card_power_w
    the power model adds it to the static power, and the predicted clock falls."""
    from lab.tools.calibrate import card_power

    hw = hardware.load("h200")
    ref = fit_power.read(str(ROOT / "lab/campaigns/power-calibration/power_h200_2026-11-27.json"))[1]
    hotter = [{**ld, "power_w": ld["power_w"] + 20.0} for ld in ref]
    off, shared = card_power.offset(hw, hotter, ref)
    assert off == pytest.approx(20.0) and "tensor256" in shared
    assert card_power.offset(hw, ref, ref)[0] == pytest.approx(0.0)
    assert card_power.median_card([20.0, 30.0, -5.0]) == pytest.approx(10.0)  # 0 (the reference), 20: the middle
    with pytest.raises(fit_power.BadInput, match="share no capped load"):
        card_power.offset(hw, [ld for ld in hotter if not ld.get("capped")], ref)
    load = gemm_like(1.0, hw)
    p0 = power.power_w(hw.with_values(card_power_w=0.0), load, 1.6)[1]["static"]
    assert power.power_w(hw.with_values(card_power_w=20.0), load, 1.6)[1]["static"] == pytest.approx(p0 + 20.0)
    assert power.predict_clock(hw.with_values(card_power_w=20.0), load).clock_ghz \
        < power.predict_clock(hw.with_values(card_power_w=0.0), load).clock_ghz


def test_the_profiles_card_is_the_median_of_the_recorded_cards():
    """h200's card_power_w is what card_power gives over the runs its source points to: those the
    power-calibration campaign's README lists for the profile ("Profiles")."""
    import re
    from lab.tools.calibrate import card_power

    hw = hardware.load("h200")
    assert "lab/campaigns/power-calibration/README.md lists for this profile" in hw.sources["card_power_w"]
    readme = (ROOT / "lab/campaigns/power-calibration/README.md").read_text()
    h200 = readme.split("## Profiles")[1].split("- **h200**")[1].split("- **b200")[0]
    ref = re.search(r"over\s+`(power_h200_[\w-]+\.json)`", h200).group(1)
    files = re.findall(r"`(power_[\w-]+\.json)`( and its `_again`)?", h200.split("the cards of")[1])
    paths = [f for name, again in files for f in [name] + ([name.replace(".json", "_again.json")] if again else [])]
    from lab.tools.index import path_of  # noqa: E402
    refs = fit_power.read(str(path_of(ref)))[1]
    offs = [card_power.offset(hw, fit_power.read(str(path_of(p)))[1], refs)[0] for p in paths]
    assert len(offs) == 7
    assert hw.card_power_w == pytest.approx(card_power.median_card(offs), abs=0.01)


def test_card_power_may_be_negative_but_not_a_word():
    """A card may draw less than the calibration card (--set card_power_w=-10 runs faster); a
    word or NaN is one line naming the parameter."""
    from fa4sim.errors import InputError

    cool = simulate("h100", "fa3", PROBLEM, {"card_power_w": "-10"})
    warm = simulate("h100", "fa3", PROBLEM, {"card_power_w": "10"})
    assert cool.clock_ghz > warm.clock_ghz
    for bad in ("abc", "nan"):
        with pytest.raises(InputError, match="card_power_w"):
            simulate("h100", "fa3", PROBLEM, {"card_power_w": bad})


def test_a_tile_with_idle_warpgroups_counts_only_its_live_rows_work():
    """hd64 runs 192-row tiles on three consumer warpgroups; at 1024 tokens a head's last tile
    holds 64 rows, and with skip_idle_wgs its two idle warpgroups issue no MMA and no softmax.
    The launch's activity counts the tensor FLOPs of the live rows and the softmax work of that
    tile's own one-warpgroup trace; with the idle warpgroups running, every tile counts whole."""
    prob = Problem(2, 4, 1024, 1024, 64)
    at = {"clock_ghz": 1.6}
    skip = simulate("h100", "fa3", prob, {**at, "skip_idle_wgs": True})
    full = simulate("h100", "fa3", prob, {**at, "skip_idle_wgs": False})
    assert skip.knobs["tile_m"] == 192 and full.knobs["tile_m"] == 192
    blocks = 1024 // 128
    per_row_block = 2.0 * 128 * (64 + 64) * prob.batch * prob.heads * blocks
    # five tiles of 192 rows and one of 64 per head
    assert skip.activity.totals["tensor"] == pytest.approx((5 * 192 + 64) * per_row_block)
    assert full.activity.totals["tensor"] == pytest.approx(6 * 192 * per_row_block)
    # the softmax's exp2s: one per live score, 1024 x 1024 per head where the idle rows skip
    # (the score tile's MUFU work scales with the rows that run it)
    ratio = skip.activity.totals["mufu"] / full.activity.totals["mufu"]
    assert ratio == pytest.approx((5 * 192 + 64) / (6 * 192), rel=0.02)
    # less work at one clock: less power
    assert power.power_w(hardware.load("h100"), skip.activity, 1.6)[0] < \
        power.power_w(hardware.load("h100"), full.activity, 1.6)[0]
