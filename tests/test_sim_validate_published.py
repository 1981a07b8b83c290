"""Published B200 figures (lab/campaigns/published-b200/published_b200.json, kind 'published'): the file's
points are well formed and sourced, each predicted point is compared as typed, and --uncertainty
gives each point its band."""
import json
from pathlib import Path

import pytest

from fa4sim import validate
from fa4sim.cli import main
from fa4sim.errors import InputError
from fa4sim.validate import published

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "lab/campaigns/published-b200/published_b200.json"


@pytest.fixture(scope="module")
def doc():
    return validate.load(str(FILE))


def test_every_point_has_its_source_and_shape(doc):
    sources = doc["meta"]["sources"]
    assert all(s["url"].startswith("https://") for s in sources.values())
    ids = [p["id"] for p in doc["points"]]
    assert len(ids) == len(set(ids))
    for p in doc["points"]:
        published.check_point(p, 0)
        assert p["source"] in sources and p["quality"] in ("A", "B")
        assert p.get("predict", True) or p["not_predicted"]  # context says why it is not predicted
    predicted = [p for p in doc["points"] if p.get("predict", True)]
    assert all(p["kernel"] == "flash-attn-4" and p["dtype"] in ("bf16", "fp16") for p in predicted)


def test_source_flops_convention():
    p = {"batch": 4, "heads": 16, "seqlen": 8192, "hdim": 128, "causal": True, "pass": "bwd"}
    assert published.source_flops(p) == 4 * 4 * 16 * 8192 ** 2 * 128 / 2 * 2.5
    assert published.source_flops({**p, "hdim_v": 64, "causal": False, "pass": "fwd"}) == \
        2 * 4 * 16 * 8192 ** 2 * (128 + 64)


def test_compare_as_typed(doc):
    res = validate.compare(doc)
    rows = res["points"]
    assert len(rows) == sum(p.get("predict", True) for p in doc["points"])
    assert len(res["context"]) == len(doc["points"]) - len(rows)
    for r in rows:
        assert r["error"] is not None and r["predicted_tflops"] > 0
        # the published time in the model's own count of causal pairs: at most 0.1 % apart at 1k
        assert r["measured_tflops"] == pytest.approx(r["tflops"], rel=2e-3)
        assert r["error"] == pytest.approx(r["predicted_tflops"] / r["measured_tflops"] - 1)
    s = res["summary"]
    assert s["all"]["points"] == len(rows) == s["fwd"]["points"] + s["bwd"]["points"]
    assert s["all"]["max_abs_error"] == max(abs(r["error"]) for r in rows)
    text = validate.report(res)
    assert "median |error|" in text and rows[0]["id"] in text


def test_band_per_point(tmp_path, capsys):
    d = json.loads(FILE.read_text())
    keep = {"paper-fig4L-fwd-nc-hd128-fa4-1k", "pr2804-bwd-hd64-b8-s8k-h32:32-fp16-nc-after"}
    d["points"] = [p for p in d["points"] if p["id"] in keep]
    path = tmp_path / "two.json"
    path.write_text(json.dumps(d))
    assert main(["validate", str(path), "--uncertainty", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert len(res["points"]) == 2
    for r in res["points"]:
        assert r["tflops_low"] <= r["predicted_tflops"] <= r["tflops_high"]
        assert r["covered"] == (r["tflops_low"] <= r["measured_tflops"] <= r["tflops_high"])
        assert r["dominant_params"]
    assert res["summary"]["all"]["banded"] == 2


GOOD = {"id": "p", "source": "s", "pass": "fwd", "batch": 1, "heads": 1, "seqlen": 1024, "hdim": 64,
        "causal": False, "tflops": 100.0}


@pytest.mark.parametrize("point,words", [({"id": "x"}, "lacks"), ({**GOOD, "pass": "both"}, "pass must be"),
                                         ({**GOOD, "tflops": -3}, "tflops must be"),
                                         ({**GOOD, "tflops": True}, "tflops must be")])
def test_bad_points_one_line(point, words):
    with pytest.raises(InputError, match=words) as e:
        published.check_point(point, 3)
    assert "\n" not in str(e.value)


def test_uncertainty_only_for_files_with_bands(capsys):
    other = ROOT / "lab/campaigns/kernel-sm90-forward/sm90_fwd_h100_2026-11-22.json"  # points at the in-kernel clock: no band
    assert main(["validate", str(other), "--uncertainty"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--uncertainty" in err[0]
    assert main(["validate", str(FILE), "--jobs", "2"]) == 2
    assert "only with --uncertainty" in capsys.readouterr().err


def test_disagreeing_sources_set_a_floor():
    """Figures of one launch from two sources bound the max error any prediction can reach; a
    knob the source names that the implementation would choose anyway is the same launch."""
    meta = {"kind": "published", "device": "NVIDIA B200", "sources": {"a": {"url": "https://a"}, "b": {"url": "https://b"}}}
    pts = [{**GOOD, "id": "a1", "source": "a", "tflops": 100.0, "quality": "A"},
           {**GOOD, "id": "b1", "source": "b", "tflops": 150.0, "quality": "A", "knobs": {"two_cta": False}},
           {**GOOD, "id": "b2", "source": "b", "tflops": 120.0, "quality": "A", "seqlen": 2048}]
    res = validate.compare({"meta": meta, "points": pts})
    (c,) = res["disagreements"]  # b2 is another problem; a1 and b1 one launch
    assert set(c["ids"]) == {"a1", "b1"} and c["floor"] == pytest.approx(50 / 250)
    assert res["summary"]["floor_max_abs_error"] == pytest.approx(0.2)
    # no prediction beats the floor: the harmonic mean of the two figures is off by exactly it
    best = 2 / (1 / 100 + 1 / 150)
    assert max(abs(best / 100 - 1), abs(best / 150 - 1)) == pytest.approx(c["floor"])
    assert "floor 20.0%" in validate.report(res)
    assert all("_same" not in r for r in res["points"])
