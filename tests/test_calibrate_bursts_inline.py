"""bench_bursts --inline: the O rescale's FMULs between the wgmma warps' own HGMMAs (fa4kernel hd256).
CPU: the SASS holds the planned loop; bad options fail in one line before the GPU."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.compile
def test_inline_bursts_sit_between_the_first_and_second_hgmma(capsys):
    pytest.importorskip("cutlass")
    from lab.tools.calibrate import bench_bursts

    assert bench_bursts.check_sass_inline() == 0, capsys.readouterr().out


@pytest.mark.parametrize("args,says", [
    (["--inline", "96"], "--inline: '96'; allowed: comma-separated from 64, 128, 256"),
    (["--inline", "64,x"], "--inline: '64,x'; allowed: comma-separated from 64, 128, 256"),
])
def test_inline_options_fail_in_one_line_before_the_gpu(tmp_path, args, says):
    cmd = [sys.executable, os.path.join(ROOT, "lab", "tools", "calibrate", "bench_bursts.py"),
           "--out", str(tmp_path / "x.json"), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert says in res.stderr.strip().splitlines()[-1]
