"""The SM90 (Hopper) forward kernel: config.py (what a user chooses, validated in plain Python)
and fwd.py (the kernel in the CuTe DSL). The host launch is fa4kernel.interface's."""

from .config import KNOB_NAMES, SUPPORTED_HEAD_DIMS, KernelConfig, default_knobs, make_config  # noqa: F401
