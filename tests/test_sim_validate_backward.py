"""fa4sim validate on backward timings (kind sm90_bwd): flash-attn-4 and fa4kernel (and its
bracketed variants) against --pass bwd."""
import pytest

from fa4sim import Problem, simulate
from fa4sim.validate import compare, report
from fa4sim.validate.backward import variant


def _doc(fa4_tflops=500.0, ok=True):
    point = {"batch": 1, "seqlen": 4096, "heads": 16, "hdim": 128, "causal": False,
             "results": {"flash-attn-4": {"tflops": fa4_tflops, "ms": 1.0, "check": {"ok": ok}},
                         "fa4kernel": {"tflops": 300.0, "ms": 2.0, "check": {"ok": True}},
                         "fa4kernel[dq_reduce=red]": {"tflops": 250.0, "ms": 2.4, "check": {"ok": True}},
                         "fa4kernel[deterministic]": {"tflops": 150.0, "ms": 4.0, "check": {"ok": True}},
                         "sdpa-cudnn": {"tflops": 450.0, "ms": 1.1, "check": {"ok": True}}}}
    return {"meta": {"kind": "sm90_bwd", "device": "NVIDIA H100 80GB HBM3", "date": "2026-01-01"},
            "points": [point]}


P = Problem(1, 16, 4096, 4096, 128, False)
_SIMULATED = {}


def simulate_bwd(hw, problem, knobs, impl):
    """The reference prediction: simulate(..., pass_="bwd") directly, not through validate;
    tests that ask for the same one share it (one simulation each)."""
    key = (hw, problem, tuple(sorted(knobs.items())), impl)
    if key not in _SIMULATED:
        _SIMULATED[key] = simulate(hw, None, problem, knobs, impl=impl, pass_="bwd")
    return _SIMULATED[key]


def test_flash_attn_4_and_fa4kernel_are_predicted_with_the_backward_model():
    res = compare(_doc())
    rows = {r["kernel"]: r for r in res["points"]}
    for kernel, impl, knobs in (("flash-attn-4", "flash-attn-4", {}), ("fa4kernel", "fa4kernel", {}),
                                ("fa4kernel[dq_reduce=red]", "fa4kernel", {"dq_reduce": "red"}),
                                ("fa4kernel[deterministic]", "fa4kernel", {"deterministic": True})):
        want = simulate_bwd("h100", P, knobs, impl)
        assert rows[kernel]["predicted_tflops"] == pytest.approx(want.tflops), kernel
        assert rows[kernel]["error"] == pytest.approx(want.tflops / rows[kernel]["measured_tflops"] - 1.0)
    # the dQ path is in the schedule: the RED variant is predicted differently from the bulk default
    assert rows["fa4kernel[dq_reduce=red]"]["predicted_tflops"] != rows["fa4kernel"]["predicted_tflops"]
    assert rows["sdpa-cudnn"]["predicted_tflops"] is None and rows["sdpa-cudnn"]["error"] is None
    assert res["summary"]["tflops"]["count"] == 4
    assert set(res["summary"]["by_kernel"]) == {"flash-attn-4", "fa4kernel", "fa4kernel[dq_reduce=red]",
                                                "fa4kernel[deterministic]"}
    text = report(res)
    assert "fa4kernel[deterministic]: median" in text and "not modelled: cuDNN" in text


def test_the_file_says_which_build_the_plain_row_timed():
    """meta.fa4kernel_bwd_knobs: the kernel's defaults when the file was recorded; brackets change them."""
    doc = _doc()
    doc["meta"]["fa4kernel_bwd_knobs"] = {"dq_reduce": "red", "stats": "thread"}
    rows = {r["kernel"]: r for r in compare(doc)["points"]}
    old = simulate_bwd("h100", P, {"dq_reduce": "red", "stats": "thread"}, "fa4kernel")
    assert rows["fa4kernel"]["predicted_tflops"] == pytest.approx(old.tflops)
    det = simulate_bwd("h100", P, {"dq_reduce": "red", "stats": "thread", "deterministic": True}, "fa4kernel")
    assert rows["fa4kernel[deterministic]"]["predicted_tflops"] == pytest.approx(det.tflops)
    assert rows["flash-attn-4"]["predicted_tflops"] == pytest.approx(
        simulate_bwd("h100", P, {}, "flash-attn-4").tflops)


def test_a_result_that_failed_its_gradient_check_is_left_out():
    res = compare(_doc(ok=False))
    assert "flash-attn-4" not in {r["kernel"] for r in res["points"]}
    assert res["summary"]["by_kernel"].get("flash-attn-4") is None
    assert res["summary"]["tflops"]["count"] == 3


@pytest.mark.parametrize("name,want", [
    ("fa4kernel", ("fa4kernel", {})),
    ("fa4kernel[deterministic]", ("fa4kernel", {"deterministic": True})),
    ("fa4kernel[dq_reduce=bulk]", ("fa4kernel", {"dq_reduce": "bulk"})),
    ("fa4kernel[dq_reduce=bulk, deterministic]", ("fa4kernel", {"dq_reduce": "bulk", "deterministic": True})),
])
def test_a_bracket_names_the_knobs_of_a_variant(name, want):
    assert variant(name) == want


def test_a_variant_with_an_unknown_knob_is_listed_with_its_error():
    doc = _doc()
    doc["points"][0]["results"] = {"fa4kernel[no_such_knob]": {"tflops": 300.0, "check": {"ok": True}}}
    row = compare(doc)["points"][0]
    assert row["predicted_tflops"] is None and "no_such_knob" in row["bottleneck"]


def test_the_clock_probe_row_is_fa4kernel_and_its_clock_is_compared():
    """A sustained file's fa4kernel[clock probe] row is modelled as fa4kernel; the plain fa4kernel
    row is compared with the probe's in-kernel clock and predicted again at it (the cycle model)."""
    doc = _doc()
    point = doc["points"][0]
    point["results"]["fa4kernel[clock probe]"] = {"tflops": 299.0, "ms": 2.0, "check": {"ok": True}}
    point["clock_ghz_in_kernel"] = 1.7
    res = compare(doc)
    rows = {r["kernel"]: r for r in res["points"]}
    plain = simulate_bwd("h100", P, {}, "fa4kernel")
    assert rows["fa4kernel[clock probe]"]["predicted_tflops"] == pytest.approx(plain.tflops)
    assert rows["fa4kernel"]["clock_error"] == pytest.approx(plain.clock_ghz / 1.7 - 1.0)
    at = simulate_bwd("h100", P, {"clock_ghz": 1.7}, "fa4kernel")
    assert rows["fa4kernel"]["error_at_measured_clock"] == pytest.approx(at.tflops / 300.0 - 1.0)
    assert rows["flash-attn-4"]["clock_error"] is None  # no probe of flash-attn-4's kernel
    assert res["summary"]["clock"]["count"] == 1
    assert res["summary"]["tflops"]["count"] == 4  # the probe row is not a kernel of its own
    text = report(res)
    assert "GHz probe" in text and "clock vs the probe's in-kernel clock (fa4kernel): median |error|" in text


# ---- kind bwd_ctas: whole launches by launch order, at their in-kernel clock


def _ctas_doc():
    order = lambda us, ghz: {"launch_us": us, "clock_ghz": ghz, "busy": 0.95, "tail_us": 20.0}  # noqa: E731
    return {"meta": {"kind": "bwd_ctas", "device": "NVIDIA H200", "date": "2026-01-01"},
            "points": [{"hdim": 256, "seqlen": 4096, "batch": 4, "heads": 8, "causal": True,
                        "orders": {"heads_outer": order(1800.0, 1.79), "tail_lpt": order(1700.0, 1.79)}}]}


def test_a_backward_launch_is_the_main_kernel_in_its_order_at_its_own_clock():
    """Each order is simulated with grid_order and the launch's in-kernel clock; the launch (first
    CTA start to last CTA end) is the main kernel less the launch gap; the gain of tail_lpt over
    heads_outer is compared measured against predicted."""
    res = compare(_ctas_doc())
    rows = {r["order"]: r for r in res["points"]}
    p = Problem(4, 8, 4096, 4096, 256, True)
    for order in ("heads_outer", "tail_lpt"):
        want = simulate_bwd("h200", p, {"grid_order": order, "clock_ghz": 1.79}, "fa4kernel")
        assert rows[order]["predicted_us"] == pytest.approx(want.main_us - want.hw.launch_gap_us)
    assert rows["heads_outer"]["measured_gain"] is None
    assert rows["tail_lpt"]["measured_gain"] == pytest.approx(1800.0 / 1700.0 - 1.0)
    assert rows["tail_lpt"]["predicted_gain"] == pytest.approx(
        rows["heads_outer"]["predicted_us"] / rows["tail_lpt"]["predicted_us"] - 1.0)
    assert rows["tail_lpt"]["predicted_gain"] > 0.02  # the causal tail the order saves
    assert res["summary"]["launch"]["count"] == 2 and res["summary"]["gain_error_pp"]["count"] == 1
    assert "the order's gain, predicted - measured" in report(res)
