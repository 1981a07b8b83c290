"""lab/tools/calibrate/bench_mem_power.py: every load's kernel compiles for sm_90a on the CPU with
the instruction it loads with (UBLKRED, REDG.E.ADD.F32x2, STAS, UBLKCP); its stamps turn into
chip-wide bytes per SM clock as bench_power's loads do; its file has bench_power's shape.

Run: pytest -m compile tests/test_calibrate_mem_power.py (CPU); pytest -m gpu ... (device)
"""
import json
from pathlib import Path

import pytest
from hopper import has_hopper

pytest.importorskip("cutlass")

from lab.tools.calibrate import bench_bwd_units as bu  # noqa: E402
from lab.tools.calibrate import bench_mem_power as mp  # noqa: E402
from lab.tools.calibrate.common import compile_for_sass, sass_count  # noqa: E402

CASES = {name: (build, expect) for name, build, expect in mp.sass_cases()}


@pytest.mark.compile
@pytest.mark.parametrize("name", list(CASES))
def test_load_kernel_holds_its_instruction(name):
    build, expect = CASES[name]
    fn, args = build()
    sass = compile_for_sass(fn, *args)
    for opcode, least in expect.items():
        assert sass_count(sass, opcode) >= least, (name, opcode)


def test_every_load_has_a_sass_check_and_a_route():
    assert list(CASES) == list(mp.LOADS)
    for name, (_, keys, _) in mp.LOADS.items():
        assert keys and set(keys) <= set(mp.ACTIVITY_KEYS), name


@pytest.mark.compile
def test_check_sass_cli_passes(capsys):
    assert mp.main(["--check-sass"]) == 0
    out = capsys.readouterr().out
    assert "all ok" in out and all(name in out for name in mp.LOADS)


def test_activity_is_bytes_over_the_summed_mean_cta_window():
    # two launches of two CTAs: mean windows 200 and 300 cycles -> 500; 10 000 bytes -> 20 B/clk
    cycles = [[100, 300], [250, 350]]
    ns = [[50, 150], [125, 175]]
    act = mp.activity_per_clk({"smem_bytes": 10_000, "dsmem_bytes": 10_000}, cycles)
    assert mp.mean_cta_cycles(cycles) == pytest.approx(500.0)
    assert act["smem_bytes"] == pytest.approx(20.0) and act["dsmem_bytes"] == pytest.approx(20.0)
    assert set(act) == set(mp.ACTIVITY_KEYS)
    assert all(act[k] == 0.0 for k in act if k not in ("smem_bytes", "dsmem_bytes"))
    assert mp.clock_ghz(cycles, ns) == pytest.approx(1000 / 500)
    assert mp.activity_per_clk({"red_bytes": 5.0}, [])["red_bytes"] == 0.0  # no window: no rate


WINDOW = {"seconds": 2.5, "power_w": 400.0, "power_w_energy_diff": 401.0, "power_w_samples": 399.0,
          "clock_ghz_nvml": 1.98, "temperature_c": 50, "clock_event_reasons": {"0x0": 10}}


def _fake_run(monkeypatch, name, launches, gpu_ms, size):
    """measure() on made-up stamps (nsm = 2, CPU tensors), no GPU."""
    torch = pytest.importorskip("torch")
    plan = mp.plans(torch, 2, device="cpu")[name]

    def sustain(dev, nvml, p):
        assert p is plan
        return size, launches, gpu_ms, dict(WINDOW)

    monkeypatch.setattr(mp, "sustain", sustain)
    return mp.measure(None, None, name, plan)


def test_bulk_reduce_counts_its_adds_as_smem_and_l2_reduce_bytes(monkeypatch):
    st = []
    for rows in ([(0, 1000, 0, 500), (0, 3000, 0, 1500)], [(0, 2000, 0, 1000), (10, 2010, 0, 1000)]):
        words = [0] * bu.STAMPS
        for b, r in enumerate(rows):
            words[b * 4: b * 4 + 4] = r
        st.append(words)
    ld = _fake_run(monkeypatch, "bulk_reduce", st, gpu_ms=2000 / 1e6, size=10)
    total = 2 * 2 * 10 * mp.BULK_CHUNK            # launches x CTAs x adds x 32 KB
    assert ld["bytes_measured"] == total
    a = ld["activity_per_clk"]
    assert a["smem_bytes"] == pytest.approx(total / 4000) and a["l2_reduce_bytes"] == pytest.approx(total / 4000)
    assert a["l2_bytes"] == a["red_bytes"] == a["dsmem_bytes"] == 0.0
    assert ld["clock_ghz"] == pytest.approx(8000 / 4000) and ld["clock_ghz_in_kernel"] == ld["clock_ghz"]
    assert ld["cta_busy_fraction"] == pytest.approx(1.0) and ld["ctas_stamped_min"] == 2
    assert ld["adds_per_cta"] == 10 and ld["power_w"] == 400.0 and not ld["power_capped"]


def test_tma_l2_takes_the_bytes_its_loads_counted(monkeypatch):
    o = 4 * bu.STAMP_CTAS
    words = [0] * bu.STAMPS
    words[o: o + 3] = (4000, 2000, 100 * bu.LOAD_BYTES)
    words[o + 4: o + 7] = (4000, 2000, 104 * bu.LOAD_BYTES)
    ld = _fake_run(monkeypatch, "tma_l2", [words], gpu_ms=4000 / 1e6, size=100)
    a = ld["activity_per_clk"]
    assert a["l2_bytes"] == pytest.approx(204 * bu.LOAD_BYTES / 4000) and a["smem_bytes"] == a["l2_bytes"]
    assert a["l2_reduce_bytes"] == 0.0 and ld["cta_busy_fraction"] == pytest.approx(0.5)


def test_red_and_dsmem_bytes(monkeypatch):
    words = [0, 1000, 0, 500, 0, 1000, 0, 500]
    ld = _fake_run(monkeypatch, "red", [words], gpu_ms=500 / 1e6, size=3)
    assert ld["activity_per_clk"]["red_bytes"] == pytest.approx(2 * 3 * bu.RED_UNROLL * bu.THREADS * 8 / 1000)
    assert ld["activity_per_clk"]["smem_bytes"] == 0.0
    words = [1000, 500, 7, 0, 1000, 500, 9, 0]   # cycles, ns, issue per CTA
    ld = _fake_run(monkeypatch, "dsmem", [words], gpu_ms=500 / 1e6, size=5)
    a = ld["activity_per_clk"]
    assert a["dsmem_bytes"] == pytest.approx(2 * 5 * mp.DSMEM_CHUNK / 1000) and a["smem_bytes"] == a["dsmem_bytes"]


def _mem_file(path, hw, energies: dict, kind: str = "mem_power"):
    """A bench_mem_power file the power model itself generates with `energies` (pJ/B) for the paths."""
    from fa4sim import power

    n = hw.num_sms
    loads = []
    for name, act in (("bulk_reduce", {"smem_bytes": 16.0 * n, "l2_reduce_bytes": 16.0 * n}),
                      ("red", {"red_bytes": 16.0 * n}),
                      ("dsmem", {"smem_bytes": 17.0 * n, "dsmem_bytes": 17.0 * n}),
                      ("tma_l2", {"smem_bytes": 60.0 * n, "l2_bytes": 60.0 * n})):
        rates = {u: act.get(k, 0.0) for k, u in power.CALIBRATION_KEYS.items()}
        if name == "tma_l2":
            rates["smem"] = 0.0  # bench_power's convention: the smem write is in the L2 byte's energy
        watts = power.power_w(hw.with_values(**energies), rates, 1.98)[0]
        loads.append({"name": name, "clock_ghz": 1.98, "power_w": watts, "activity_per_clk": act})
    path.write_text(json.dumps({"meta": {"kind": kind, "device": "Test GPU", "date": "2026-11-27", "data": "random"},
                                "loads": loads}))
    return path


def test_fit_mem_power_recovers_the_energies_it_was_made_with(tmp_path):
    from lab.tools.calibrate import fit_mem_power
    from fa4sim import hardware

    hw = hardware.load("h100")
    true = {"energy_l2_reduce_pj_per_byte": 44.0, "energy_red_pj_per_byte": 61.0, "energy_dsmem_pj_per_byte": 27.0}
    meta, loads = fit_mem_power.read(str(_mem_file(tmp_path / "m.json", hw, true)))
    got, rows = fit_mem_power.energies(hw, loads)
    assert got == pytest.approx(true, rel=1e-9)
    control = [r for r in rows if r[0] == "tma_l2"][0]
    assert control[3] == pytest.approx(control[2])  # the model prices the control's loads as measured


def test_fit_mem_power_writes_the_profile_and_refuses_other_files(tmp_path, capsys):
    import shutil

    from lab.tools.calibrate import fit_mem_power
    from fa4sim import hardware

    prof = tmp_path / "h100.json"
    shutil.copy(Path(hardware.__file__).parent / "profiles" / "h100.json", prof)
    hw = hardware.load(str(prof)).with_values(card_power_w=0.0)  # the loads of the card the fit prices
    true = {"energy_l2_reduce_pj_per_byte": 40.0, "energy_red_pj_per_byte": 50.0, "energy_dsmem_pj_per_byte": 20.0}
    path = _mem_file(tmp_path / "m.json", hw, true)
    assert fit_mem_power.main([str(path), "--profile", str(prof), "--write"]) == 0
    params = json.loads(prof.read_text())["params"]
    for k, v in true.items():
        assert params[k]["value"] == pytest.approx(v, abs=0.01) and "bench_mem_power" in params[k]["source"]
    capsys.readouterr()
    bad = _mem_file(tmp_path / "p.json", hw, true, kind="power")
    assert fit_mem_power.main([str(bad), "--profile", str(prof)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fit_mem_power: results:") and "mem_power" in err and "\n" not in err


def test_bad_only_is_rejected():
    with pytest.raises(SystemExit) as e:
        mp.main(["--only", "red,nope", "--out", "x.json"])
    assert e.value.code == 2


def test_out_without_a_gpu_is_one_line_and_exit_2(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: --out runs the benchmark")
    with pytest.raises(SystemExit) as e:
        mp.main(["--out", str(tmp_path / "m.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Hopper" in err[0]



@pytest.mark.gpu
@pytest.mark.skipif(not has_hopper(), reason="needs a CUDA GPU (Hopper sm_90); none here")
def test_run_writes_every_load(tmp_path):
    out = tmp_path / "m.json"
    assert mp.main(["--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["meta"]["kind"] == "mem_power" and [ld["name"] for ld in res["loads"]] == list(mp.LOADS)
    for ld in res["loads"]:
        assert ld["power_w"] > 0 and ld["clock_ghz"] > 0 and ld["cta_busy_fraction"] > 0.8, ld["name"]
        assert all(ld["activity_per_clk"][k] > 0 for k in mp.LOADS[ld["name"]][1]), ld["name"]
