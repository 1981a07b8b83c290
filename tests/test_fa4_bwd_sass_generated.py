"""fa4sim/implementations/flash-attn-4-sm90.sass.json, flash-attn-4's SM90 backward loop counts
generated from its compiled builds (lab/tools/fa4_bwd_sass.py --write): marked generated, one row
per head dim its backward runs, causal and not, merged into the backward's constants; and, where a
flash-attn-4 install is named by FA4_PATH, its rows are what the compiler makes of it now.

If the compile test fails, flash-attn-4 or the compiler moved a count: rerun
python3 lab/tools/fa4_bwd_sass.py --fa4-path DIR --write and commit the file."""
import json
import os
import subprocess
import sys

import pytest

from fa4sim import Problem, implementation
from fa4sim.model import setup
from fa4sim.params import Context

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = json.loads((implementation.IMPL_DIR / "flash-attn-4-sm90.sass.json").read_text())
TABLE = DOC["bwd"]["loop_instr_sass"]


def test_the_file_says_it_is_generated_and_by_which_command():
    assert next(iter(DOC)) == "generated"
    assert DOC["generated"].startswith("by python3 lab/tools/fa4_bwd_sass.py --write")


def test_a_row_for_every_head_dim_the_backward_runs_causal_and_not():
    impl = implementation.load("flash-attn-4-sm90").for_pass("bwd")
    builds = {(r["build"]["hdim"], r["build"]["hdim_v"], r["build"]["causal"]) for r in TABLE["rows"]}
    assert builds == {(d, dv, c) for d, dv in impl.head_dims for c in (False, True)}
    assert len(builds) == len(TABLE["rows"])


@pytest.mark.parametrize("hdim,causal", [(96, False), (192, True), (128, True)])
def test_the_backward_reads_its_loop_counts_from_the_generated_rows(hdim, causal):
    p = Problem(batch=1, heads=4, seqlen_q=1024, seqlen_k=1024, hdim=hdim, causal=causal)
    _, _, _, impl, knobs = setup("h100", None, p, {}, "flash-attn-4", "bwd")
    want = next(r for r in TABLE["rows"] if r["build"] == {"hdim": hdim, "hdim_v": hdim, "causal": causal})
    ctx = Context(p, None, impl)
    assert impl.value("loop_instr_fixed", ctx, knobs) == want["fixed"]
    assert impl.value("loop_instr_per_kstep", ctx, knobs) == want["per_kstep"]
    assert "fa4_bwd_sass.py" in impl.params["loop_instr_fixed"]["source"]


def test_a_folder_without_flash_attn_4_is_one_line_and_exit_2(tmp_path):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "lab", "tools", "fa4_bwd_sass.py"), "--fa4-path",
                          str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "no flash_attn/cute/flash_bwd_sm90.py" in run.stderr


@pytest.mark.skipif(not os.environ.get("FA4_PATH"), reason="FA4_PATH (a flash-attn-4 install with quack) not set")
@pytest.mark.parametrize("hdim,hdim_v,causal", [(96, 96, False), (192, 192, True)])
def test_rows_are_what_flash_attn_4_compiles_to_now(hdim, hdim_v, causal):
    sys.path.insert(0, os.path.join(ROOT, "lab", "tools"))
    import fa4_bwd_sass

    os.environ["CUTE_DSL_ARCH"] = "sm_90a"
    got = fa4_bwd_sass.row(hdim, hdim_v, causal, os.environ["FA4_PATH"])
    want = next(r for r in TABLE["rows"] if r["build"] == got["build"])
    assert (got["per_kstep"], got["fixed"]) == (want["per_kstep"], want["fixed"])
