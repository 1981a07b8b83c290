"""fa4lab's own FlashAttention forward kernels in the CuTe DSL: SM90 (Hopper) and SM100 (Blackwell).

    fa4kernel.attention(q, k, v, causal=False, softmax_scale=None, return_lse=False, **knobs)
    fa4kernel.compile_sass(cfg=None, arch="sm_90a" | "sm_100a", ...)   # no GPU needed

Layout and knobs: fa4kernel/README.md. Importing this package imports neither torch nor the
CuTe DSL: make_config and default_knobs are plain Python (fa4sim reads the kernel's choices
through them).
"""

from .interface import COMPILE_TIMES, attention, compile_sass
from .sm90.config import KNOB_NAMES, SUPPORTED_HEAD_DIMS, KernelConfig, default_knobs, make_config
from .diagnostics import Diagnostics

__all__ = [
    "attention",
    "compile_sass",
    "make_config",
    "default_knobs",
    "KernelConfig",
    "KNOB_NAMES",
    "SUPPORTED_HEAD_DIMS",
    "Diagnostics",
    "COMPILE_TIMES",
]
