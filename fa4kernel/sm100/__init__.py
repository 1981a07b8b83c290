"""The SM100 (Blackwell) forward kernel: config.py (knobs, validated in plain Python) and fwd.py
(the kernel in the CuTe DSL, its CPU compile and its launcher). README.md describes it."""

from .config import (  # noqa: F401
    DEFAULT_EXP_EMULATION, SUPPORTED_HEAD_DIMS, Sm100Config, emulated_mask, make_sm100_config,
)


def __getattr__(name):
    """The DSL-side names (compile_sm100_sass, attention_sm100, ...) import the CuTe DSL on first use."""
    if name in ("compile_sm100_sass", "compile_sm100_config", "attention_sm100", "FlashFwdSm100", "COMPILE_TIMES"):
        from . import fwd

        return getattr(fwd, name)
    raise AttributeError(name)
