"""fa4sim validate on backward timings (kind sm90_bwd): flash-attn-4 against --pass bwd."""
import pytest

from fa4sim import Problem, simulate
from fa4sim.validate import compare, report


def _doc(fa4_tflops=500.0, ok=True):
    point = {"batch": 1, "seqlen": 4096, "heads": 16, "hdim": 128, "causal": False,
             "results": {"flash-attn-4": {"tflops": fa4_tflops, "ms": 1.0, "check": {"ok": ok}},
                         "fa4kernel": {"tflops": 300.0, "ms": 2.0, "check": {"ok": True}},
                         "sdpa-cudnn": {"tflops": 450.0, "ms": 1.1, "check": {"ok": True}}}}
    return {"meta": {"kind": "sm90_bwd", "device": "NVIDIA H100 80GB HBM3", "date": "2026-01-01"},
            "points": [point]}


def test_flash_attn_4_is_predicted_with_the_backward_model_and_others_are_listed():
    res = compare(_doc())
    rows = {r["kernel"]: r for r in res["points"]}
    want = simulate("h100", None, Problem(1, 16, 4096, 4096, 128, False), {}, impl="flash-attn-4", pass_="bwd")
    assert rows["flash-attn-4"]["predicted_tflops"] == pytest.approx(want.tflops)
    assert rows["flash-attn-4"]["error"] == pytest.approx(want.tflops / 500.0 - 1.0)
    assert rows["fa4kernel"]["predicted_tflops"] is None and rows["sdpa-cudnn"]["error"] is None
    assert res["summary"]["tflops"]["count"] == 1
    text = report(res)
    assert "flash-attn-4" in text and "not modelled" in text


def test_a_result_that_failed_its_gradient_check_is_left_out():
    res = compare(_doc(ok=False))
    assert "flash-attn-4" not in {r["kernel"] for r in res["points"]}
    assert res["summary"]["tflops"] is None
