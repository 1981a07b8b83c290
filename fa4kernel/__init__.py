"""fa4lab's own FlashAttention kernels in the CuTe DSL (Hopper SM90 forward for now)."""

from .config import KNOB_NAMES, SUPPORTED_HEAD_DIMS, KernelConfig, default_knobs, make_config
from .interface import COMPILE_TIMES, attention, compile_sass

__all__ = [
    "attention",
    "compile_sass",
    "make_config",
    "default_knobs",
    "KernelConfig",
    "KNOB_NAMES",
    "SUPPORTED_HEAD_DIMS",
    "COMPILE_TIMES",
]
