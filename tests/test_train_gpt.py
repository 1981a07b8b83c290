"""lab/tools/train_gpt_sm90.py on the CPU (sdpa only): the corpus is the same bytes every time,
a tiny run's loss is finite and falls, two runs from one seed give the same losses bit for bit
(its --repeat-deterministic), bad options exit 2 with one line, --plot draws a PNG from a file."""

import json
import math
import os
import subprocess
import sys

import pytest

from lab.tools import train_gpt_sm90 as T

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lab", "tools",
                      "train_gpt_sm90.py")
TINY = ["--device", "cpu", "--attn", "sdpa", "--layers", "1", "--width", "64", "--seq", "64", "--batch", "4"]


def test_corpus_is_the_same_bytes_twice():
    (a, meta_a), (b, meta_b) = T.corpus_bytes(), T.corpus_bytes()
    assert a == b and meta_a == meta_b
    assert meta_a["bytes"] == len(a) > 1_000_000 and meta_a["files"] > 100
    assert b"def " in a[:100_000]  # Python source, read as bytes (tokens 0-255)


def test_tiny_run_learns_and_repeats_bit_for_bit(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "train.json"
    assert T.main(TINY + ["--steps", "20", "--lr-warmup", "5", "--warmup", "2", "--eval-batches", "2",
                          "--repeat-deterministic", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["meta"]["kind"] == "training" and res["meta"]["corpus"]["sha256"]
    (run,) = res["runs"]
    losses = run["losses"]
    assert run["status"] == "ok" and run["steps_run"] == len(losses) == 20
    assert all(math.isfinite(x) for x in losses) and math.isfinite(run["held_out_loss"])
    assert abs(losses[0] - math.log(256)) < 0.5  # starts near uniform over bytes
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3
    assert len(run["step_ms"]) == 20 and run["tokens_per_s_median"] > 0
    rep = res["repeat_deterministic"]
    assert rep["bit_identical"] is True and rep["first_diff_step"] is None and rep["compared_steps"] == 20
    assert [r["losses"] for r in rep["runs"]] == [losses, losses]  # same seed: same init, same batches


@pytest.mark.parametrize("args, says", [
    (TINY + ["--attn", "sdpa,flashy"], "unknown backend"),
    (TINY + ["--seq", "100"], "a multiple of 8"),
    (TINY + ["--attn", "fa4kernel"], "needs a CUDA GPU"),
    (TINY + ["--attn", "flash-attn-4"], "needs a CUDA GPU"),
    (TINY + ["--kv-heads", "4", "--width", "384"], "must divide"),
    (TINY + ["--head-dim", "32", "--attn", "fa4kernel"], "fa4kernel takes"),
    (["--plot", "x.json"], "needs --figure"),
])
def test_bad_options_exit_2_with_one_line(args, says):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_plot_from_a_file(tmp_path):
    pytest.importorskip("matplotlib")
    run = lambda name, tps: {"backend": name, "status": "ok", "losses": [5.5, 4.0, 3.1], "steps_run": 3,  # noqa
                             "tokens_per_s_median": tps, "attention": {"share_estimate": 0.2}}
    res = {"meta": {"device": "NVIDIA H200", "config": {"layers": 6, "width": 384, "head_dim": 64, "kv_heads": 6,
                                                        "seq": 1024, "batch": 16, "compile": True}},
           "runs": [run("fa4kernel", 3.1e6), run("sdpa", 2.9e6), {"backend": "flash-attn-4", "status": "error"}],
           "repeat_deterministic": {"backend": "fa4kernel", "runs": [run("fa4kernel", 3e6)] * 2,
                                    "bit_identical": True, "first_diff_step": None}}
    src, png = tmp_path / "r.json", tmp_path / "r.png"
    src.write_text(json.dumps(res))
    assert T.main(["--plot", str(src), "--figure", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, says", [(["--attn", "xformers"], "--attn xformers"),
                                         (["--heads", "6", "--kv-heads", "4"], "--kv-heads 4"),
                                         (["--calls", "0"], "--calls 0"), (["--seq", "0"], "--seq 0")])
def test_attn_host_bad_input_is_one_line_exit_2(argv, says, capsys):
    from lab.tools import attn_host_sm90

    with pytest.raises(SystemExit) as e:
        attn_host_sm90.parse_args(["--out", "x.json", *argv])
    assert e.value.code == 2
    assert says in capsys.readouterr().err.strip().splitlines()[-1]
