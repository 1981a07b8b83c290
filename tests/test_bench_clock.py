"""lab/tools/nvml_clock.py: NVML SM-clock sampling beside timed GPU work; lab/tools/ctas_sm90.py's options (no GPU needed here)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lab.tools.nvml_clock import ClockSampler  # noqa: E402


def test_without_nvml_windows_report_nothing():
    s = ClockSampler()
    if s.ok:
        s.close()
        pytest.skip("NVML is present here; this test covers machines without an NVIDIA driver")
    assert "nvidia-ml" in s.error  # says why, instead of raising
    with s.window("a"):
        pass
    assert s.summary() == {}


def test_window_statistics_from_samples():
    s = ClockSampler.__new__(ClockSampler)  # no NVML, no thread: feed samples by hand
    s.ok, s.error, s._windows = True, None, {}
    s._t = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    s._mhz = [1980, 1700, 1600, 1500, 1980, 1980]
    s._windows = {"run": [(0.5, 3.5)], "idle": [(4.5, 9.0)], "empty": [(9.0, 10.0)]}
    out = s.summary()
    assert out["run"] == {"mhz_mean": 1600.0, "mhz_min": 1500, "mhz_max": 1700, "n": 3}
    assert out["idle"]["n"] == 1 and "empty" not in out


@pytest.mark.parametrize("args,says", [
    (["--knobs", "default,foo"], "--knobs: unknown variant(s) foo; allowed: default,"),
    (["--knob-hdims", "128,96"], "--knob-hdims: 96 not allowed; allowed: 64, 128, 256"),
    (["--ablations", "rescale;vote"], "--ablations: unknown vote; allowed: max, exp, sum, rescale"),
    (["--ablate-knobs", "default,tau8"], "--ablate-knobs: 'tau8' is not k=v"),
])
def test_ctas_knob_options_fail_in_one_line_before_the_gpu(tmp_path, args, says):
    """lab/tools/ctas_sm90.py --only-knobs picks variants and head dims by name; a wrong one is a
    one-line usage error before torch or the GPU is touched (so it says the same on this CPU box)."""
    import subprocess

    cmd = [sys.executable, os.path.join(ROOT, "lab", "tools", "ctas_sm90.py"), "--out", str(tmp_path / "x.json"),
           "--only-knobs", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert says in res.stderr.strip().splitlines()[-1]
