"""bench_power's TMA ring inside the wgmma load (HBM or L2 traffic beside a capped tensor core on
every SM) and the power model's HBM term it calibrates: an HBM byte's energy scales with f/fmax.
No GPU: the ring build compiles for sm_90a, and recorded files."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from lab.tools.index import path_of  # noqa: E402
RESULTS = ROOT / "lab" / "campaigns"
RING = {"h100": [path_of("power_ring_h100_2026-11-28.json"), path_of("power_ring_h100_2026-11-28_again.json")],
        "h200": [path_of("power_ring_h200_2026-11-28.json"), path_of("power_ring_h200_2026-11-28_again.json"),
                 path_of("power_ring_l2_h200_2026-11-28.json")]}


@pytest.fixture(scope="module")
def bp():
    pytest.importorskip("cutlass")
    from lab.tools.calibrate import bench_power

    return bench_power


def test_every_ring_load_runs_the_wgmma_kernel_with_at_most_one_stream_warpgroup(bp):
    assert {"tensor256+mix1+hbm", "tensor256+mix1+l2", "hbm_ring"} <= set(bp.RING_GAPS)
    for name, gap in bp.RING_GAPS.items():
        code, do_mma, n, _, nsf, *_ = bp.LOADS[name]
        assert gap >= 0 and nsf <= 1, name  # the ring takes warpgroup 2's first warp
        assert bp.layout(name, 132) == (132, None, 0), name  # every SM, one kernel
    assert bp.RING_WARP // 4 == 2


@pytest.mark.compile
@pytest.mark.parametrize("code", ["mix", "sleep"])
def test_ring_build_keeps_its_wgmma_loop_and_loads_one_box_per_stage(bp, code):
    good, line = bp.check_build(code, 256, False, True)
    assert good, line


def _loads(gpu):
    from lab.tools.calibrate import fit_power
    from fa4sim import hardware

    loads = []
    for i, path in enumerate(RING[gpu]):
        _, ls, _ = fit_power.read(str(path))
        loads += [{**ld, "file": i} for ld in ls]
    return hardware.load(gpu), loads


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_recorded_ring_loads_move_hbm_bytes_beside_a_capped_tensor_core(gpu):
    _, loads = _loads(gpu)
    by = {ld["name"]: ld for ld in loads if ld["file"] == 0}
    full, slow = by["tensor256+mix1+hbm"], by["tensor256+mix1+hbm_g2000"]
    assert full["rates"]["tensor"] == pytest.approx(by["tensor256+mix1"]["rates"]["tensor"], rel=0.01)
    assert full["rates"]["hbm"] == full["rates"]["l2"] > 4 * slow["rates"]["hbm"] > 0
    assert full["f"] < slow["f"] < by["tensor256+mix1"]["f"] < 1.7  # the more HBM traffic, the lower the clock
    assert by["hbm_ring"]["f"] == pytest.approx(1.98)  # alone, no cap


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_hbm_energy_scaled_by_the_clock_predicts_the_ring_loads(gpu):
    """The profile as it is (its HBM energy from loads at the maximum clock) predicts the clock of
    every capped HBM ring load within 2 %; with the HBM energy held at its maximum-clock value
    the full-rate load's clock comes out more than 8 % low."""
    from lab.tools.calibrate import fit_power
    from fa4sim import power

    hw, loads = _loads(gpu)
    rows = fit_power.check(hw, loads)
    capped = [(ld, r) for ld, r in zip(loads, rows) if "hbm" in ld["name"] and ld["f"] < 1.9]
    assert len(capped) >= 10
    for ld, r in capped:
        assert r["predicted_clock_ghz"] == pytest.approx(ld["f"], rel=0.02), ld["name"]
    ld, r = next((ld, r) for ld, r in capped if ld["name"] == "tensor256+mix1+hbm")
    flat = hw.with_values(static_power_w=float(hw.static_power_w) + r["static_offset_w"])
    rates = fit_power.load_rates(ld, hw.values)
    f = ld["f"]
    p_scaled = power.power_w(flat, rates, f)[0]
    p_flat = p_scaled + power.power_w(flat, rates, f)[1]["hbm"] * (hw.clock_ghz / f - 1.0)
    assert p_flat > 1.08 * ld["power_w"] and abs(p_scaled / ld["power_w"] - 1) < 0.02
