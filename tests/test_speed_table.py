"""fa4kernel/README.md's speed table is generated from one settled results file per device
(lab/tools/speed_table.py), never typed in."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lab.tools import speed_table as st  # noqa: E402


def test_readme_blocks_are_the_files():
    text = st.README.read_text()
    assert st.splice(text, st.block()) == text, "run python -m lab.tools.speed_table"
    top = st.TOP_README.read_text()
    assert st.splice(top, st.readme_block(), st.README_MARKERS) == top, "run python -m lab.tools.speed_table"
    assert st.main(["--check"]) == 0


def test_every_grid_point_and_peer_is_in_the_table():
    block = st.block()
    rows = [ln for ln in block.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert len(rows) == 18
    # head dim, tokens, causal, then ours and three peers per device
    assert all(ln.count("|") == 4 + 4 * len(st.FILES) for ln in rows)
    assert all(f"{d}, fa4kernel's geomean" in block for d in st.FILES)
    assert "x FA3" in block and "x flash-attn-4" in block and "x cuDNN" in block


def test_the_build_each_file_timed_is_read_from_it():
    tau = [{"fa4kernel_config": {"rescale_threshold": 8.0}}, {"fa4kernel_config": {"rescale_threshold": None}}]
    assert "conditional" in st.build_of(tau) and "always" in st.build_of([{"fa4kernel_config": {}}])


def test_ratios_skip_failed_checks_and_name_the_lowest():
    def pt(name, ours, peer, ok=True):
        return {"name": name, "results": {"fa4kernel": {"tflops": ours, "check": {"ok": True}},
                                          "p": {"tflops": peer, "check": {"ok": ok}}}}
    r = st.ratios([pt("a", 110.0, 100.0), pt("b", 90.0, 100.0), pt("c", 50.0, 100.0, ok=False)], "p")
    assert r["of"] == 2 and r["ahead"] == 1 and r["lowest_at"] == "b"
    assert abs(r["geomean"] - (1.1 * 0.9) ** 0.5) < 1e-12 and abs(r["lowest"] - 0.9) < 1e-12
    assert st.ratios([pt("c", 50.0, 100.0, ok=False)], "p") == {}
