"""The accuracy registry (lab/accuracy.json): its rows are well-formed, and docs/accuracy.md's
generated Summary (and the README's block, where its markers exist) is what the registry computes
with the validators today (python -m lab.tools.accuracy)."""
import json
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from lab.tools import accuracy as acc

ROOT = Path(__file__).resolve().parents[1]
ROWS = acc.load_registry()
REQUIRED = ("id", "compares", "command", "files", "device", "statistics", "sample")


def _meta(path: str) -> dict:
    return json.loads((ROOT / path).read_text())["meta"]


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_row_is_well_formed(row):
    for key in REQUIRED:
        assert row.get(key), f"{row.get('id')}: no {key}"
    assert row["sample"] in acc.SAMPLES
    if row["sample"] == "in-sample":
        assert row.get("decided") or row.get("reason"), f"{row['id']}: in-sample without decided or reason"
    else:
        assert row.get("reason") and row.get("predictions_committed"), row["id"]
    # fa4sim validate reproduces a row; one that joins a benchmark with its committed predictions
    # (committed_time) the registry's own tool does
    joined = all(s["stat"] == "committed_time" for s in row["statistics"])
    assert row["command"].startswith("python3 -m lab.tools.accuracy --compare " if joined else "fa4sim validate ")
    assert "\n" not in row["compares"]
    for spec in row["files"]:
        path = acc.file_path(spec)
        assert path.startswith(acc.RESULTS) and (ROOT / path).is_file(), path
        assert path in row["command"], f"{row['id']}: its command does not name {path}"
        meta = _meta(path)
        assert meta.get("device") == row["device"], (path, meta.get("device"))
        for stat in row["statistics"]:
            assert meta["kind"] in acc.STAT_KINDS[stat["stat"]], (path, stat["stat"])
    for stat in row["statistics"]:
        assert stat["stat"] in acc.STATS
        if "predictions" in stat:
            assert (ROOT / stat["predictions"]).is_file()


def test_ids_unique_and_readme_rows_fit():
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids))
    assert 0 < sum(bool(r.get("readme")) for r in ROWS) <= acc.README_ROWS


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git history")
@pytest.mark.parametrize("row", [r for r in ROWS if r["sample"] == "out-of-sample"], ids=lambda r: r["id"])
def test_out_of_sample_predictions_precede_the_measurements(row):
    """The commit that made the predictions is older than every measurement of the row."""
    commit = row["predictions_committed"]["commit"]
    when = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%cI", commit], capture_output=True, text=True)
    if when.returncode != 0:
        pytest.skip(f"commit {commit} is not in this checkout's history")
    committed = datetime.fromisoformat(when.stdout.strip())
    for spec in row["files"]:
        measured = datetime.fromisoformat(_meta(acc.file_path(spec))["date"])
        assert committed < measured, (commit, acc.file_path(spec))


@pytest.fixture(scope="module")
def computed():
    return acc.compute(ROWS)


def _block(text: str, markers) -> str | None:
    a, b = text.find(markers[0]), text.find(markers[1])
    return None if a < 0 or b < a else text[a:b + len(markers[1])]


def test_docs_table_is_what_the_registry_computes(computed):
    block = _block(acc.DOC.read_text(), acc.TABLE_MARKERS)
    assert block is not None, "docs/accuracy.md has no accuracy-table markers"
    assert block == acc.table_block(computed)


def test_readme_block_where_its_markers_exist(computed):
    block = _block(acc.README.read_text(), acc.README_MARKERS)
    if block is None:
        pytest.skip("README.md has no accuracy-readme markers")
    assert block == acc.readme_block(computed)
    rows = [line for line in block.splitlines() if line.startswith(("| out-of-sample", "| in-sample"))]
    assert 0 < len(rows) <= acc.README_ROWS


def test_out_of_sample_rows_lead(computed):
    table = _block(acc.DOC.read_text(), acc.TABLE_MARKERS).split("Per file")[0]
    samples = [line.split(" | ")[2] for line in table.splitlines() if line.startswith("| `")]
    assert samples == sorted(samples, key=acc.SAMPLES.index)
    assert samples[0] == "out-of-sample"


def test_values(computed):
    """A few computed values: the committed predictions are today's, and the rows' counts and
    verdicts are what the files hold."""
    by_id = {r["id"]: {c["spec"]["stat"]: c for c in r["computed"]} for r in computed}
    committed = by_id["user-settled-committed-h200"]["committed"]["value"]
    assert committed["count"] == 2 * committed["committed"] == 48
    # the committed file rounds TFLOP/s to 0.1; its hd96 points (P through smem) moved 0.2 % when
    # fa4sim's P hand-off became the warp sync the kernels have
    assert committed["max"] < 3e-3
    grid = by_id["fwd-grid-h100"]["tflops"]
    assert grid["value"]["all"]["count"] == 36 and grid["verdict"] == "met"
    assert 0.0 < grid["value"]["all"]["median"] <= grid["value"]["all"]["max"] < 0.12
    knobs = by_id["fwd-knob-effects-h100"]["knob_deltas"]["value"]
    assert knobs["count"] == 31 and knobs["within"] < knobs["count"]
    b200 = by_id["b200-published"]["published"]
    assert b200["value"]["all"]["count"] == 76 and b200["verdict"] == "median not, max not"
    assert b200["value"]["floor"] > 0.10


def test_readme_block_is_spliced_between_its_markers(computed):
    text = f"before\n{acc.README_MARKERS[0]}\nold\n{acc.README_MARKERS[1]}\nafter\n"
    block = acc.readme_block(computed)
    assert acc.splice(text, block, acc.README_MARKERS) == f"before\n{block}\nafter\n"
    assert acc.splice("no markers\n", block, acc.README_MARKERS) is None
    lines = block.splitlines()
    samples = [line.split(" | ")[0][2:] for line in lines if line.startswith(("| out-of-sample", "| in-sample"))]
    assert samples == sorted(samples, key=acc.SAMPLES.index) and samples[0] == "out-of-sample"


def test_check_passes_on_the_committed_docs(computed, capsys):
    assert acc.main(["--check"]) == 0
    assert "the blocks as generated" in capsys.readouterr().out


def test_compare_joins_a_sustained_file_on_point_and_kernel(tmp_path, capsys):
    """--compare MEASURED PREDICTED: a sustained_sm90.py file (points, TFLOP/s) against its predictions
    (rows): the time error of a point is measured TFLOP/s over predicted - 1; a file that is not
    one of the benches' is one line, exit 2."""
    import json

    measured = {"meta": {"kind": "sustained"}, "points": [
        {"name": "a", "results": {"fa4kernel": {"tflops": 550.0}, "flash-attn-4": {"tflops": 480.0}}},
        {"name": "b", "results": {"fa4kernel": {"tflops": 600.0}}}]}
    predicted = {"meta": {"kind": "predictions"}, "rows": [
        {"point": "a", "kernel": "fa4kernel", "tflops": 500.0}, {"point": "a", "kernel": "flash-attn-4", "tflops": 500.0},
        {"point": "b", "kernel": "fa4kernel", "tflops": 600.0}]}
    m, p = tmp_path / "m.json", tmp_path / "p.json"
    m.write_text(json.dumps(measured))
    p.write_text(json.dumps(predicted))
    stats = acc.stat_committed_time({}, [str(m)], {"predictions": str(p)})
    assert stats["fa4kernel"]["count"] == 2 and stats["fa4kernel"]["max"] == pytest.approx(0.10)
    assert stats["flash-attn-4"]["max"] == pytest.approx(0.04)
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(SystemExit) as e:
        acc.main(["--compare", str(bad), str(p)])
    assert e.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
