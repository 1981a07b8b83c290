"""lab/tools/decode_kernels_sm90.py on a CPU: a call's kernel records split by role, the gap
from the decode kernel's end to the combine's start, and its bad input (one line, exit 2)."""
import subprocess
import sys

from lab.tools import decode_kernels_sm90 as tool


def test_kernels_take_their_roles_by_name():
    assert tool.kernel_role("kernel_cutlass_kernel_fa4kernelsm90combineCombineSm90_object_at_") == "combine"
    assert tool.kernel_role("kernel_cutlass_kernel_fa4kernelsm90fwdFlashFwdSm90Decode_object") == "decode"
    assert tool.kernel_role("void at::native::vectorized_elementwise_kernel<4>") == "other"


def test_a_call_splits_into_decode_gap_and_combine():
    events = [("FlashFwdSm90Decode", 0.0, 48.0), ("CombineSm90", 49.5, 53.0)]
    part = tool.split_call(events)
    assert part["decode_us"] == 48.0 and part["combine_us"] == 3.5 and part["other_us"] == 0.0
    assert part["gap_us"] == 1.5 and part["span_us"] == 53.0
    alone = tool.split_call([("FlashFwdSm90Decode", 10.0, 30.0)])  # one split: no combine, no gap
    assert alone["gap_us"] is None and alone["combine_us"] == 0.0


def _run(*args):
    return subprocess.run([sys.executable, "lab/tools/decode_kernels_sm90.py", *args], capture_output=True, text=True)


def test_dry_run_lists_rows_and_bad_input_is_one_line():
    r = _run("--dry-run", "--rows", "b4-q1-k65536-h8-kv1", "--splits", "8,16")
    assert r.returncode == 0 and r.stdout.strip() == "b4-q1-k65536-h8-kv1 splits 8,16"
    for bad in (["--rows", "nope"], ["--splits", "0"], ["--calls", "0"], ["--problem", "b=1,sq=1"]):
        r = _run("--dry-run", *bad)
        # one line naming the parameter (argparse's usage lines may come before it)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (bad, r.stderr)
        assert bad[0] in r.stderr.strip().splitlines()[-1], (bad, r.stderr)
