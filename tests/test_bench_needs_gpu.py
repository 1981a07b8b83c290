"""The GPU benchmarks, run where there is no Hopper GPU, stop with one line and exit code 2
(lab/tools/hopper.py), before any CUDA call can raise."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from lab.tools.hopper import require_hopper  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_no_cuda_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        require_hopper("x.py", "--dry-run works without one")
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.count("\n") == 1 and err.startswith("x.py: needs a Hopper GPU") and "--dry-run" in err


def test_another_gpu_names_what_it_found(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (10, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA B200")
    with pytest.raises(SystemExit) as e:
        require_hopper("x.py")
    assert e.value.code == 2
    assert "NVIDIA B200 (sm_100)" in capsys.readouterr().err


def test_a_hopper_gpu_passes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    assert require_hopper("x.py") is None


def _gpu_scripts():
    """Benchmark scripts with a main() that touch CUDA."""
    for p in sorted([*ROOT.glob("lab/tools/*.py"), *ROOT.glob("lab/tools/calibrate/*.py")]):
        text = p.read_text()
        if re.search(r"^def main\(", text, re.M) and "torch.cuda" in text:
            yield p


@pytest.mark.parametrize("path", list(_gpu_scripts()), ids=lambda p: p.name)
def test_every_gpu_script_checks_for_its_gpu(path):
    """Each one calls require_hopper (the Blackwell check: require_blackwell), or runs on
    calibrate.common.Device, which does."""
    text = path.read_text()
    assert "require_hopper(" in text or "require_blackwell(" in text or re.search(r"\bDevice\(\)", text), path.name


def test_sustained_problem_without_gpu():
    """The README's `sustained_sm90.py --problem` on a machine without CUDA: one line, exit 2."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the script would run")
    r = subprocess.run([sys.executable, "lab/tools/sustained_sm90.py", "--problem", "b=5,h=16,sq=3000,d=128,causal",
                        "--out", "unused.json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stdout == "" and r.stderr.count("\n") == 1 and "needs a Hopper GPU" in r.stderr
    assert not (ROOT / "unused.json").exists()


def test_the_blackwell_check_wants_sm100(monkeypatch, capsys):
    from lab.tools.hopper import require_blackwell
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (10, 0))
    assert require_blackwell("x.py") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    with pytest.raises(SystemExit) as e:
        require_blackwell("x.py")
    assert e.value.code == 2 and "NVIDIA H200 (sm_90)" in capsys.readouterr().err


@pytest.mark.parametrize("spec,says", [
    ("b=8,h=16,kv=3,s=2048,d=64", "kv=3 must divide h=16"),
    ("b=8,h=16,s=2048", "give b=, h=, s= and d="),
    ("b=8,h=16,s=2048,d=100", "d=100; allowed: 64, 96, 128, 192, 256"),
    ("b=8,h=16,s=2048,d=64,window", "'window'; allowed: b=, h=, kv=, s=, sk=, d="),
])
def test_bwd_bench_problem_fails_in_one_line(spec, says):
    """bench_bwd_sm90.py --problem (GQA / MQA shapes) checks its problem before anything needs a GPU."""
    r = subprocess.run([sys.executable, "lab/tools/bench_bwd_sm90.py", "--out", "/tmp/never.json", "--problem", spec],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert says in r.stderr.strip().splitlines()[-1]
