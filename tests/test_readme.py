"""Every number README.md shows is what the command beside it produces today: each test runs the
command (in-process) or reads the recorded file the README names, formats the number as the
README writes it, and finds that text in the README. A change that moves a number fails here
until the README says the new one."""
import json
import math
import re
from pathlib import Path

import pytest

from fa4sim import Problem, cli, hardware, simulate, validate

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
TEXT = " ".join(README.split())  # prose wraps anywhere: compare with single spaces
from lab.tools.index import path_of  # noqa: E402
RESULTS = ROOT / "lab" / "campaigns"


def says(text: str) -> None:
    assert " ".join(text.split()) in TEXT, f"README.md should say {text!r} (what the command gives today)"


def _cli(capsys, *argv) -> str:
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def _line(out: str, head: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(head))


MAIN_JOB = ("run", "--hw", "b200", "--schedule", "fa4", "--hdim", "128", "--seqlen", "32768", "--batch", "1",
            "--heads", "16")


def test_set_up_is_two_commands_and_the_main_job_is_ci_free():
    commands = re.findall(r"^ {7}(pip install .*)$", README, re.M)
    assert len(commands) == 2
    assert commands[0].startswith("pip install -e . && fa4sim " + " ".join(MAIN_JOB))
    assert commands[1] == 'pip install -e ".[dev,kernels,lessons,cluster]" torch==2.13.0 && python -m pytest -q'
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q -e ".[dev,kernels,lessons,cluster]" torch==2.13.0' in ci and "python -m pytest -q\n" in ci


def test_main_job(capsys):
    out = _cli(capsys, *MAIN_JOB)
    r = simulate("b200", "fa4", Problem(1, 16, 32768, 32768, hdim=128))
    says(f"The main job prints {r.tflops:.0f} TFLOP/s at {r.clock_ghz:.3f} GHz with the tensor core "
         f"{math.floor(r.utilization['tensor'] * 100)} % busy")
    assert "the tensor core idles" in r.bottleneck and "waiting for" in r.bottleneck
    clock = _line(out, "clock ")
    says(clock)  # quoted as printed


def test_accuracy_b200():
    res = validate.compare(validate.load(str(path_of("published_b200.json"))))
    paper = [r for r in res["points"] if r["source"] == "paper" and "-det-" not in r["id"]]
    e = sorted(abs(r["error"]) for r in paper)
    import statistics
    says(f"On the B200 the paper's forward and backward, {len(paper)} points, come within "
         f"{_pct(statistics.median(e))} / {_pct(max(e))}; the sources' own disagreement on one launch puts any "
         f"model's max at {_pct(res['summary']['floor_max_abs_error'])} or more")
    hw = hardware.load("b200")
    low = sum(1 for n in hardware.PARAMS if hw.confidence[n] == "L")
    says(f"{low} of the b200 profile's {len(hardware.PARAMS)} parameters are inferred (confidence L), each "
         f"with a stated range")


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def test_clock_ceilings():
    h100, h200 = hardware.load("h100"), hardware.load("h200")
    assert h100.clock_ghz == h200.clock_ghz
    says(f"({h100.clock_tensor_ghz:.2f} GHz on the H100, {h200.clock_tensor_ghz:.2f} on the H200, where NVML "
         f"still reports {h100.clock_ghz:.2f})")


def test_emulation_off():
    p = Problem(2, 16, 8192, 8192, hdim=128)  # fa4sim run's default problem
    on, off = simulate("b200", problem=p), simulate("b200", problem=p, overrides={"exp_emulation": 0})
    says(f"the loop grows from {on.interval:.0f} to {off.interval:.0f} cycles per KV block, but the clock rises "
         f"from {on.clock_ghz:.3f} to {off.clock_ghz:.3f} GHz")
    says(f"so TFLOP/s fall only from {on.tflops:.0f} to {off.tflops:.0f}")


def test_graph_and_solve(capsys):
    g = json.loads(_cli(capsys, "graph", "--hw", "b200", "--schedule", "fa4", "--json"))
    says(f"(ResMII: the tensor core's {g['res_mii']['value']:.0f} cycles; RecMII: "
         f"{g['rec_mii_hand_order']['value']:.0f}, a Q tile's S/P chain")
    out = json.loads(_cli(capsys, "solve", "--hw", "b200", "--schedule", "fa4", "--json"))
    says(f"finds a modulo schedule with CP-SAT (II {out['ii']:.0f}, {out['status']})")
    says(f"replays its role programs in the engine: {out['replayed_interval']:.0f} cycles per KV block, as the "
         f"hand schedule")
    assert out["replayed_interval"] == pytest.approx(out["hand_interval"])


def test_hopper_loops_are_issue_bound():
    p = Problem(2, 16, 8192, 8192, hdim=128)
    for impl in ("fa4kernel", "flash-attn-4"):
        assert simulate("h100", problem=p, impl=impl).bottleneck.startswith("instruction issue-bound")
    says("Both loops are bound by instruction issue")


def test_profiles_listed():
    listed = re.search(r"`--hw ([a-z0-9 |-]+) \| FILE\.json`", README).group(1).split(" | ")
    assert sorted(listed) == hardware.available()


_SUMMARIES: dict = {}


def _summary(name: str) -> dict:
    """`fa4sim validate FILE`'s summary (once per file: two tests quote the same one)."""
    if name not in _SUMMARIES:
        _SUMMARIES[name] = validate.compare(validate.load(str(path_of(name))))["summary"]
    return _SUMMARIES[name]


def test_validate_example():
    s = _summary("sm90_fwd_h100_2026-11-22.json")
    says(f"replays {s['points']} recorded points (our kernel and flash-attn-4), each at the clock measured inside "
         f"the kernel: median error {100 * s['median_abs_error']:.1f} %")


def _ratios(name: str, peer: str) -> tuple[float, float]:
    doc = json.loads(path_of(name).read_text())
    xs = [p["results"]["fa4kernel"]["tflops"] / p["results"][peer]["tflops"]
          for p in doc["points"] if p.get("label", "main") == "main"]
    assert len(xs) == 18
    return math.exp(sum(map(math.log, xs)) / len(xs)), min(xs)


def test_kernel_table():
    """The forward's summary is generated (lab/tools/speed_table.py, tests/test_speed_table.py); the
    backward's sentence gives what its settled files give today."""
    def cell(name, peer):
        g, low = _ratios(name, peer)
        return f"{g:.3f} (lowest {low:.3f})"

    says(f"The backward, settled, against flash-attn-4: {cell('sm90_bwd_tail_h100_2026-11-27.json', 'flash-attn-4')} "
         f"on H100, {cell('sm90_bwd_settled_h200_2026-11-28.json', 'flash-attn-4')} on H200; against cuDNN "
         f"{cell('sm90_bwd_tail_h100_2026-11-27.json', 'sdpa-cudnn')} on H100.")
    says("(lab/campaigns/kernel-sm90-backward/README.md)")  # the README links the campaign that names the files
    for name in ("sm90_bwd_tail_h100_2026-11-27.json", "sm90_bwd_settled_h200_2026-11-28.json"):
        assert f"`{name}`" in (ROOT / "lab" / "campaigns" / "kernel-sm90-backward" / "README.md").read_text()
        assert "4.0.0b36" == json.loads(path_of(name).read_text())["meta"]["versions"]["flash_attn_4"]
    says("<!-- speed-summary: generated by python -m lab.tools.speed_table; do not edit -->")


def test_speed_numbers():
    """The newest lab/tools/bench_sim_speed.py record (speed is a benchmark, not a test)."""
    files = sorted(RESULTS.glob("*/sim_speed_*.json"), key=lambda p: json.loads(p.read_text())["meta"]["date"])
    s = json.loads(files[-1].read_text())
    says(f"median of {s['repeat']}): the main job {s['run_median_s']:.2f} s, a backward (hd128 16k causal on h200) "
         f"{s['bwd_median_s']:.2f} s, `fa4sim solve` {s['solve_median_s']:.2f} s of CP-SAT, a 200-point sweep "
         f"{s['sweep_wall_s']:.0f} s; the slowest of {len(s['runs_median_s'])} usual runs (both passes, every card, "
         f"short and long) {s['runs_max_median_s']:.2f} s")
