"""lab/tools/calibrate/bench_bwd_units.py: every kernel compiles for sm_90a on the CPU and its SASS
holds the instruction it times (the HGMMA of the intended N and operand source, the bulk
reduce-add UBLKRED, REDG.E.ADD.F32 / F32x2); on a Hopper GPU, a short run writes the JSON the
profiles take their backward unit facts from.

Run: pytest -m compile tests/test_calibrate_bwd_units.py (CPU); pytest -m gpu ... (device)
"""
import json
import re

import pytest
from hopper import has_hopper

pytest.importorskip("cutlass")

from lab.tools.calibrate import bench_bwd_units as bu  # noqa: E402
from lab.tools.calibrate.common import compile_for_sass, sass_count  # noqa: E402


def _hgmma_lines(sass):
    return [ln.split("*/", 1)[-1].strip() for ln in sass.splitlines() if "HGMMA." in ln]


@pytest.mark.compile
@pytest.mark.parametrize("form", list(bu.FORMS))
def test_wgmma_form_compiles_to_its_hgmma(form):
    """8 HGMMA.64xNx16 per trip, A from registers exactly for the RS forms, nothing spilled."""
    n, src = bu.FORMS[form][0], bu.FORMS[form][1]
    sass = compile_for_sass(bu.make_wgmma(form), *bu.wgmma_fake_args())
    lines = _hgmma_lines(sass)
    assert lines and all(f"HGMMA.64x{n}x16.F32.BF16" in ln for ln in lines), lines[:3]
    assert len(lines) == bu.KB
    # SS: "HGMMA... Racc, gdesc[UR..], Racc" ; RS: "HGMMA... Racc, Ra, gdesc[UR..], Racc"
    rs_form = [bool(re.search(r"R\d+, R\d+, gdesc\[", ln)) for ln in lines]
    assert all(rs_form) if src == "RS" else not any(rs_form), lines[:2]
    assert sass_count(sass, "STL") == 0


def test_forms_name_flash_attn_4_hd256_operands():
    """The hd256 forms are the ones flash_bwd_sm90.py builds (tile 64 x 48, two MMA warpgroups):
    S/dP 64x24 K-major 128B; dV/dK 64x48 A MN 128B, B MN unswizzled; dQ 64x128 A K unswizzled."""
    assert bu.FORMS["n24_ss_k128"][:4] == (24, "SS", "K_SW128", "K_SW128")
    assert bu.FORMS["n48_ss_dkv"][:4] == (48, "SS", "MN_SW128", "MN_INTER")
    assert bu.FORMS["n128_ss_dq"][:4] == (128, "SS", "K_INTER", "MN_SW128")
    assert bu.operand_bytes("n24_ss_k128") == {"a": 2048, "b": 768}
    assert bu.operand_bytes("n24_rs_k128") == {"a": 0, "b": 768}
    assert set(bu.QUICK_FORMS) <= set(bu.FORMS)


@pytest.mark.compile
def test_bulk_reduce_kernel_issues_ublkred():
    sass = compile_for_sass(bu.make_bulk(), *bu.bulk_fake_args())
    # one in the latency loop, one in the rate loop
    assert sass_count(sass, "UBLKRED.G.S.ADD.F32") == 2
    # the concurrent loads: the ring's first fill and its refill, LOAD_STAGES each
    assert sass_count(sass, "UBLKCP.S.G") == 2 * bu.LOAD_STAGES


@pytest.mark.compile
@pytest.mark.parametrize("width,opcode", [(1, "REDG.E.ADD.F32.FTZ"), (2, "REDG.E.ADD.F32x2.FTZ")])
def test_red_kernel_issues_red_add(width, opcode):
    sass = compile_for_sass(bu.make_red(width), *bu.red_fake_args())
    assert sass_count(sass, opcode) == bu.RED_UNROLL


def test_out_without_a_gpu_is_one_line_and_exit_2(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: --out runs the benchmark")
    with pytest.raises(SystemExit) as e:
        bu.main(["--out", str(tmp_path / "u.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Hopper" in err[0]


def test_bad_only_is_rejected():
    with pytest.raises(SystemExit) as e:
        bu.main(["--only", "wgmma,nope", "--out", "x.json"])
    assert e.value.code == 2



@pytest.mark.gpu
@pytest.mark.skipif(not has_hopper(), reason="needs a CUDA GPU (Hopper sm_90); none here")
def test_quick_run_writes_rates(tmp_path):
    out = tmp_path / "u.json"
    assert bu.main(["--out", str(out), "--quick"]) == 0
    res = json.loads(out.read_text())
    assert res["meta"]["kind"] == "bwd_units" and not res["errors"]
    w = res["benchmarks"]["wgmma"]
    for form in bu.QUICK_FORMS:
        t = w[form]["throughput"]["2"]
        assert t["sink_finite"] and t["cycles_per_instr"] > 0 and t["clock_ghz"] > 0
    for r in res["benchmarks"]["bulk"]["rate"].values():
        assert r["per_sm_bytes_per_clk_median"] > 0 and r["clock_ghz"] > 0
    for r in (res["benchmarks"]["bulk"]["with_loads"][k] for k in ("one_sm", "all_sms")):
        assert r["together"]["reduce_per_sm_bytes_per_clk_median"] > 0
        assert r["loads_alone"]["load_per_sm_bytes_per_clk_median"] > 0
    for v in res["benchmarks"]["red"].values():
        assert all(r["per_sm_warp_instr_per_clk"] > 0 for r in v["rate"].values())
