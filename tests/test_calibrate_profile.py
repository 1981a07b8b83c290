"""CPU tests of lab/tools/calibrate/make_profile.py on a small synthetic results JSON, and of
lab/tools/calibrate/tile_jitter.py on a synthetic tile log."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.tools.calibrate.make_profile import build_profile, derive
from fa4sim.hardware import PARAMS, from_json

ROOT = Path(__file__).resolve().parents[1]


def _wg_lat(base, per):
    # issue: 4 cycles per instruction up to 6 queued, then one interval (per) each
    return {str(k): {"issue_median": 10 + 4 * min(k, 6) + per * max(0, k - 6), "issue_min": 9 + 4 * k,
                     "complete_median": base + per * k, "complete_min": base + per * k - 2}
            for k in (1, 2, 3, 4, 6, 8, 12, 16)}


def synthetic():
    wg = {}
    for n in (64, 128, 256):
        for src, extra in (("ss", 0), ("rs", 10)):
            wg[f"{src}_n{n}"] = {
                "N": n, "a_source": src.upper(),
                "throughput": {"1": {"cycles": 1000, "instructions": 10, "cycles_per_instr": n / 2 + 2,
                                     "flops_per_clk": 3900.0 if n == 256 else 3500.0},
                               "2": {"cycles": 1000, "instructions": 20, "cycles_per_instr": n / 2,
                                     "flops_per_clk": 4000.0 if (n == 256 and src == "ss") else 3800.0}},
                "latency": _wg_lat(120 + extra, n / 2)}
    tma_lat = {}
    for kb in (8, 16, 32):
        for pat in ("seq", "far"):
            tma_lat[f"{pat}_{kb}KB"] = {"hbm_median": 800 + 10 * kb, "hbm_min": 700, "hbm_max": 900,
                                        "l2_median": 500 + 10 * kb, "l2_min": 450, "l2_max": 600}
    return {
        "meta": {"date_utc": "2026-11-22T02:00:00Z", "device": "NVIDIA H100 80GB HBM3", "num_sms": 132,
                 "l2_bytes": 52428800, "driver": "580.159.04", "cuda": "13.0", "cutlass_dsl": "4.8.1"},
        "scripts": {"pipes": "bench_pipes.py", "smem": "bench_smem.py", "sync": "bench_sync.py",
                    "wgmma": "bench_wgmma.py", "tma": "bench_tma.py", "launch": "bench_launch.py",
                    "clock": "bench_wgmma.py"},
        "benchmarks": {
            "pipes": {"ffma": {"lanes_per_clk": 127.5, "latency_cycles": 4.02},
                      "ex2": {"lanes_per_clk": 15.9, "latency_cycles": 17.5},
                      "fmnmx": {"lanes_per_clk": 63.0, "latency_cycles": 4.1},
                      "f2fp": {"lanes_per_clk": 31.0, "latency_cycles": 5.0}},
            "smem": {"bytes_per_clk": 126.0, "latency_cycles": 30.2},
            "sync": {"named_pingpong": {"cycles_per_handoff": 25.0},
                     "bar_sync_all": {"cycles_per_handoff": 20.0},
                     "mbarrier_pingpong_trywait": {"cycles_per_handoff": 60.0},
                     "mbarrier_pingpong_testwait": {"cycles_per_handoff": 50.0}},
            "wgmma": wg,
            "tma": {"latency": tma_lat, "sm_l2": {"bytes_per_clk": 100.0, "bytes_in_flight": 196608},
                    "sm_l2_spin": {"bytes_per_clk": 110.0, "bytes_in_flight": 196608},
                    "chip_l2": {"tbps": 10.5, "per_sm_bytes_per_clk_median": 45.0},
                    "chip_hbm": {"tbps": 3.1, "bytes": 1.06e9}, "d2d_copy_tbps": 2.9},
            "launch": {"cute_empty": {"gpu_side_us": 2.1, "host_loop_us": 9.0},
                       "torch_add_1elem": {"gpu_side_us": 1.9, "host_loop_us": 5.0}},
            "clock": {"clock_ghz_median": 1.755, "clock_ghz_min": 1.74, "clock_ghz_max": 1.77, "N": 256,
                      "ctas": 132, "warpgroups_per_cta": 2, "event_ms": 2000.0, "ghz_from_events": 1.75,
                      "tflops_events": 760.0},
            # a failed benchmark leaves nothing behind: its parameters keep the base values
        },
        "errors": {},
    }


def test_values_provenance_and_all_params(tmp_path):
    base = json.loads((ROOT / "fa4sim/profiles/h100-datasheet.json").read_text())
    prof = build_profile(synthetic(), base)
    hw = from_json(prof, origin="test")  # raises unless every PARAMS entry is present
    assert set(PARAMS) <= set(prof["params"])
    assert prof["arch"] == "sm90" and prof["name"] == "h100"
    v = hw.values
    assert v["clock_ghz"] == 1.755
    assert v["fma_lanes_per_clk"] == 127.5 and v["fma_latency"] == 4.02
    assert v["mufu_ex2_per_clk"] == 15.9 and v["mufu_latency"] == 17.5
    assert v["alu_lanes_per_clk"] == 63.0
    assert v["smem_bytes_per_clk"] == 126.0 and v["smem_latency"] == 30.2
    assert v["named_barrier_latency"] == 25.0 and v["mbarrier_latency"] == 60.0
    assert v["tensor_flops_per_clk"] == 4000
    # latency = intercept of complete(nk) = 120 + 64 nk (N=128): 120 SS, 130 RS
    assert v["mma_latency_ss"] == 120.0 and v["mma_latency_rs"] == 130.0
    assert v["mma_issue_cycles"] == 4.0
    # issue(16) = 10 + 24 + 10 per ... : stalled; D = 16 - (issue(16) - a) / b
    lat = synthetic()["benchmarks"]["wgmma"]["ss_n256"]["latency"]
    assert lat["16"]["issue_median"] - lat["12"]["issue_median"] == 4 * 128
    assert v["mma_queue_depth"] == round(16 - (lat["16"]["issue_median"] - 120) / 128)
    assert isinstance(v["mma_queue_depth"], int)
    # TMA: (8 KB, 580), (16 KB, 660), (32 KB, 820) -> intercept 500 (L2); 800 (HBM)
    assert v["l2_latency"] == 500 and v["hbm_latency"] == 800
    assert v["tma_bytes_per_clk"] == 110.0
    assert v["l2_bandwidth_tbps"] == 10.5 and v["hbm_bandwidth_tbps"] == 2.9  # the D2D copy
    assert v["launch_gap_us"] == 2.1
    assert v["num_sms"] == 132 and isinstance(v["num_sms"], int)
    for k in ("clock_ghz", "mma_latency_ss", "l2_latency", "launch_gap_us"):
        # device, tool and campaign folder; no date (fa4sim carries none: the campaign's README does)
        assert hw.sources[k].startswith("measured on NVIDIA H100 80GB HBM3 by lab/tools/calibrate/")
        assert hw.sources[k].endswith("; lab/campaigns/unit-calibration/)")
        assert hw.confidence[k] == "M"
    assert "bench_wgmma.py" in hw.sources["mma_latency_ss"] and "bench_tma.py" in hw.sources["l2_latency"]
    # unmeasured parameters keep the base profile's value and source
    for k in ("issue_per_clk", "registers_per_sm", "smem_capacity_bytes", "tmem_columns"):
        assert prof["params"][k] == base["params"][k]


def test_missing_benchmarks_keep_base():
    base = json.loads((ROOT / "fa4sim/profiles/h200-datasheet.json").read_text())
    res = synthetic()
    del res["benchmarks"]["wgmma"], res["benchmarks"]["clock"]
    res["benchmarks"]["pipes"]["ex2"]["lanes_per_clk"] = float("nan")
    prof = build_profile(res, base)
    from_json(prof)
    for k in ("clock_ghz", "tensor_flops_per_clk", "mma_latency_ss", "mma_latency_rs", "mma_issue_cycles",
              "mma_queue_depth", "mufu_ex2_per_clk"):
        assert prof["params"][k] == base["params"][k]
    assert "mufu_ex2_per_clk" not in derive(res)
    assert prof["params"]["fma_latency"]["confidence"] == "M"


def test_cli(tmp_path):
    r = tmp_path / "r.json"
    r.write_text(json.dumps(synthetic()))
    out = tmp_path / "p.json"
    subprocess.run([sys.executable, "-m", "lab.tools.calibrate.make_profile", str(r), "--base", "h100-datasheet",
                    "--out", str(out)], check=True, cwd=ROOT)
    prof = json.loads(out.read_text())
    from_json(prof)
    assert prof["params"]["smem_bytes_per_clk"]["value"] == 126.0
    out2 = tmp_path / "p2.json"
    base = json.loads((ROOT / "fa4sim/profiles/h100-datasheet.json").read_text())
    subprocess.run([sys.executable, "-m", "lab.tools.calibrate.make_profile", str(r), "--base", "h100-datasheet",
                    "--out", str(out2), "--skip", "tma_bytes_per_clk,l2_bandwidth_tbps"], check=True, cwd=ROOT)
    prof2 = json.loads(out2.read_text())
    assert prof2["params"]["tma_bytes_per_clk"] == base["params"]["tma_bytes_per_clk"]
    assert prof2["params"]["l2_bandwidth_tbps"] == base["params"]["l2_bandwidth_tbps"]
    assert prof2["params"]["smem_bytes_per_clk"]["confidence"] == "M"
    # the module imports nothing GPU-related
    code = ("import sys, lab.tools.calibrate.make_profile; "
            "bad = [m for m in ('torch', 'cutlass', 'cuda', 'triton') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_tile_jitter_from_a_tile_log(tmp_path):
    """lab/tools/calibrate/tile_jitter.py: middle tiles only (not a CTA's first or last), each
    against the median of its kind, in units of the tile's Q load; --write puts it into a profile."""
    from lab.tools.calibrate.tile_jitter import main, tile_jitter

    # 12 CTAs of 3 non-causal tiles (one kind: 8 KV blocks of 128 x 128); middle tiles alternate
    # 1000 +- 30 cycles, first and last tiles are far off and must not count
    table = [[3 * c, 3 * c + 1, 3 * c + 2] for c in range(12)]
    log = [[c, t, k, {0: 9000, 1: 1000 + (30 if c % 2 else -30), 2: 50}[k]] for c, row in enumerate(table)
           for k, t in enumerate(row)]
    point = {"head_dim": 128, "seqlen": 1024, "causal": False, "tile_m": 128, "tile_n": 128, "num_m": 8,
             "table": table, "tile_logs": [log]}
    doc = {"meta": {"kind": "cta_log", "device": "Test GPU", "date": "2026-11-22T00:00:00+00:00"},
           "points": [{"head_dim": 64}, point]}
    value, details = tile_jitter(doc, tma_bytes_per_clk=128 * 128 * 2 / 300)  # a Q load = 300 cycles
    assert value == pytest.approx(30 / 300) and "12 middle tiles" in details
    src, prof = tmp_path / "log.json", tmp_path / "prof.json"
    src.write_text(json.dumps(doc))
    base = json.loads((ROOT / "fa4sim" / "profiles" / "h100.json").read_text())
    prof.write_text(json.dumps(base))
    assert main([str(src), "--profile", str(prof), "--write"]) == 0
    got = json.loads(prof.read_text())["params"]["tile_jitter_q_loads"]
    assert got["value"] == pytest.approx(30 / (128 * 128 * 2 / base["params"]["tma_bytes_per_clk"]["value"]), abs=1e-3)
    assert got["source"].startswith("measured on Test GPU by lab/tools/cta_log_sm90.py's tile log (log.json, "
                                    "lab/campaigns/launch-jitter/)") and got["confidence"] == "M"
    assert "2026" not in got["source"]
    with pytest.raises(SystemExit):
        main([str(src), "--profile", str(tmp_path / "missing.json")])
