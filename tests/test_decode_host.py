"""decode_host_sm90.py on the CPU: --help and --dry-run run without a GPU, a run without one stops
with one line and exit 2, and its pieces of attention_with_kvcache (host_parts) are the call's own
(each runs alone on CPU tensors, the launches replaced as tests/test_kvcache.py replaces them)."""
import cProfile
import pstats
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fa4kernel import kvcache  # noqa: E402
from lab.tools import decode_host_sm90 as tool  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "lab/tools/decode_host_sm90.py"


def _run(*argv):
    return subprocess.run([sys.executable, SCRIPT, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_help_teaches_what_each_number_is():
    r = _run("--help")
    assert r.returncode == 0
    for word in ("wall_us", "host_us", "gpu_us", "graph_us", "cprofile", "parts", "host-bound", "--problem",
                 "--dry-run", "decode_host"):
        assert word in r.stdout, word


def test_dry_run_lists_the_default_rows_and_a_problem_without_a_gpu():
    r = _run("--dry-run", "--problem", "b=2,sq=4,sk=8192,h=16,kv=2,causal")
    assert r.returncode == 0, r.stderr
    names = [line.split(":")[0] for line in r.stdout.splitlines() if "GB of K and V" in line]
    assert names == [*tool.DEFAULT_ROWS, "b2-q4-k8192-h16-kv2-causal"]
    assert "17 splits" in r.stdout.splitlines()[0]  # the MQA row's plan at 132 SMs (kvcache.split_heuristic)
    assert "fa4kernel.kvcache[auto], sdpa" in r.stdout


@pytest.mark.parametrize("argv, says", [(["--rows", "b3-nope"], "--rows: unknown b3-nope"),
                                         (["--rows", ""], "no rows"),
                                         (["--problem", "b=1,sq=1,sk=64"], "give h=, kv="),
                                         (["--profile-calls", "500"], "--profile-calls 500")])
def test_bad_input_is_one_line_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        tool.parse_args(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err.strip().splitlines()[-1]


def test_no_gpu_is_one_line_and_exit_2():
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the script would run")
    r = _run("--out", "unused.json")
    assert r.returncode == 2
    assert r.stdout == "" and r.stderr.count("\n") == 1 and "needs a Hopper GPU" in r.stderr
    assert not (ROOT / "unused.json").exists()


@pytest.mark.parametrize("shape", [(4, 1, 512, 8, 1), (2, 4, 384, 8, 2), (2, 1, 256, 4, 4)],
                         ids=["mqa-split", "packed-copy", "no-combine"])
def test_host_parts_are_the_calls_pieces(monkeypatch, shape):
    """Every part runs alone; the launches it times are kvcache's (replaced here), with the
    arguments the call itself passes them."""
    seen = {"call": [], "part": []}
    which = ["call"]
    monkeypatch.setattr(kvcache, "launch_decode", lambda *a: seen[which[0]].append(("decode", _sig(a))))
    monkeypatch.setattr(kvcache, "launch_combine", lambda *a: seen[which[0]].append(("combine", _sig(a))))
    b, sq, sk, h, hkv = shape
    q = torch.randn(b, sq, h, 64).half()
    k, v = torch.randn(b, sk, hkv, 64).half(), torch.randn(b, sk, hkv, 64).half()
    causal = sq > 1
    kvcache.attention_with_kvcache(q, k, v, causal=causal)
    parts = tool.host_parts(q, k, v, causal)
    which[0] = "part"
    groups = {g for _, g, _ in parts}
    assert groups <= {"whole", "per_call", "once_per_signature", "reference"}  # no "within:" pieces without CUDA
    names = [n for n, _, _ in parts]
    assert [g for _, g, _ in parts].count("whole") == 1
    assert len(names) == len(set(names))
    for _, _, call in parts:
        call()
    # the whole call's launches, then the pieces': the call's own (same shapes, splits, configs)
    assert seen["part"] == seen["call"] * 2
    plan = kvcache.decode_plan(b, sq, sk, h, hkv, 64, "float16", causal, None, kvcache.DEFAULT_SMS)
    assert any(n.startswith("launch_combine") for n in names) == plan["combine"]
    assert sum(n.startswith("alloc:") for n in names) == 2 + plan["combine"]


def _sig(args):
    """A launch's arguments, tensors as (shape, stride, dtype)."""
    return tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def test_profile_summary_ranks_per_call():
    def inner():
        return sum(range(200))

    def entry():
        return inner() + inner()

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        entry()
    prof.disable()
    s = tool.profile_summary(pstats.Stats(prof), 50, top=5)
    assert s["calls"] == 50 and s["us_per_call"] > 0
    assert len(s["top_cumulative"]) <= 5 and len(s["top_tottime"]) <= 5
    cum = [r["cumtime_us"] for r in s["top_cumulative"]]
    assert cum == sorted(cum, reverse=True)
    by_name = {r["function"].split("(")[-1].rstrip(")"): r for r in s["top_cumulative"]}
    assert by_name["entry"]["ncalls_per_call"] == 1 and by_name["inner"]["ncalls_per_call"] == 2
    assert by_name["entry"]["function"].startswith("tests/test_decode_host.py:")
