"""The GPU benchmarks run on a Hopper GPU (the Blackwell check, sustained_sm100.py, on a Blackwell
one): where there is none, one line and exit code 2."""
from __future__ import annotations

import sys


def require_hopper(script: str, hint: str = "") -> None:
    """Return if a Hopper GPU (compute capability 9.x) is here; else exit 2 with one line on stderr
    saying what was found. hint: what the script can do without a GPU."""
    _require(script, 9, "a Hopper GPU (H100 or H200, sm_90)", hint)


def require_blackwell(script: str, hint: str = "") -> None:
    """The same for a Blackwell GPU of the SM100 family (compute capability 10.x: B200, GB200)."""
    _require(script, 10, "a Blackwell GPU (B200 or GB200, sm_100)", hint)


def _require(script: str, major_wanted: int, what: str, hint: str) -> None:
    try:
        import torch
    except ImportError:
        found = "torch is not installed"
    else:
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            if major == major_wanted:
                return
            found = f"the GPU here is {torch.cuda.get_device_name(0)} (sm_{major}{minor})"
        else:
            found = "no CUDA GPU here" + ("" if torch.version.cuda else " (this torch is a CPU build)")
    sys.stderr.write(f"{script}: needs {what}; {found}{'; ' + hint if hint else ''}\n")
    sys.exit(2)


# The Hopper profiles a --predict file can be written for: fa4sim's profile name -> the device name
# torch reports for that GPU (what a measured file's meta.device says).
PROFILES = {"h200": "NVIDIA H200", "h100": "NVIDIA H100 80GB HBM3"}


def add_profile_arg(ap) -> None:
    """--profile: which GPU a --predict file predicts (an argparse choice, so a wrong name is one line, exit 2)."""
    ap.add_argument("--profile", default="h200", choices=sorted(PROFILES),
                    help="with --predict: the fa4sim profile to predict for (default h200; h100 for an H100 SXM)")
