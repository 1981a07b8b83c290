"""fa4sim validate on a small synthetic results file (the format of benchmarks/bench_fwd_sm90.py)."""
import json

import pytest

from fa4sim import validate
from fa4sim.cli import main
from fa4sim.errors import InputError


def point(label, knobs, ours, peer=None, causal=False):
    res = {"fa4kernel": {"tflops": ours}}
    if peer:
        res["flash-attn-4"] = {"tflops": peer}
    res["sdpa-cudnn"] = {"tflops": 1.0}  # not simulated: ignored
    return {"batch": 2, "seqlen": 8192, "heads": 16, "hdim": 128, "causal": causal, "label": label,
            "knobs": knobs, "results": res}


DOC = {"meta": {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-22T00:00:00+00:00"},
       "points": [point("main", {}, 600.0, 650.0), point("main", {}, 300.0, 320.0, causal=True),
                  {"batch": 2, "seqlen": 8192, "heads": 16, "hdim": 128, "causal": False, "label": "knobs",
                   "configs": {"default": {}, "pingpong=False": {"pingpong": False}},
                   "results": {"fa4kernel[default]": {"tflops": 600.0},
                               "fa4kernel[pingpong=False]": {"tflops": 560.0},
                               "flash-attn-4": {"tflops": 620.0}}}]}


def test_compare_errors_and_knob_deltas(tmp_path):
    r = validate.compare(DOC, "h100")
    main_rows = [x for x in r["points"] if x["label"] == "main"]
    assert len(main_rows) == 4  # two points x (ours, flash-attn-4); cuDNN is not simulated
    for x in main_rows:
        assert x["error"] == pytest.approx((x["predicted_tflops"] - x["measured_tflops"]) / x["measured_tflops"])
    s = r["summary"]
    assert s["max_abs_error"] == max(abs(x["error"]) for x in main_rows)
    (d,) = r["knob_deltas"]
    assert d["knob"] == "pingpong=False" and d["measured_delta"] == pytest.approx(560 / 600 - 1)
    png = tmp_path / "c.png"
    validate.plot(r, str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_validate(tmp_path, capsys):
    f = tmp_path / "r.json"
    f.write_text(json.dumps(DOC))
    assert main(["validate", str(f), "--hw", "h100"]) == 0
    out = capsys.readouterr().out
    assert "median |error|" in out and "pingpong=False" in out


def test_bad_results_file(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("{}")
    with pytest.raises(InputError):
        validate.load(str(f))
    with pytest.raises(InputError):
        validate.load(str(tmp_path / "missing.json"))
    assert validate.profile_for("NVIDIA H200") in ("h200", "h200-measured")
