"""fa4lab's own FlashAttention kernels in the CuTe DSL: forward for SM90 (Hopper) and SM100
(Blackwell), backward for SM90 (through torch.autograd).

    fa4kernel.attention(q, k, v, causal=False, softmax_scale=None, return_lse=False,
                        deterministic=False, **knobs)        # out.backward() on SM90
    fa4kernel.attention_backward(dout, q, k, v, out, lse, causal=False, ...)   # dq, dk, dv
    fa4kernel.attention_backward_probed(...)   # the same through the clock-probe build, + stamps
    fa4kernel.compile_sass(cfg=None, arch="sm_90a" | "sm_100a", ...)   # no GPU needed
    fa4kernel.compile_bwd_sass(head_dim=128, causal=False, ...)         # the SM90 backward
    fa4kernel.attention_op(q, k, v, causal=False, ...)   # the torch custom op (torch.compile, CUDA graphs)
    fa4kernel.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, causal=True, ...)  # decode

Layout and knobs: fa4kernel/README.md. Importing this package imports neither torch nor the
CuTe DSL: make_config and default_knobs are plain Python (fa4sim reads the kernel's choices
through them). attention_op loads fa4kernel/ops.py (torch, the op's registration) on first use,
attention_with_kvcache fa4kernel/kvcache.py (docs/decode.md).
"""

from .interface import COMPILE_TIMES, attention, compile_bwd_sass, compile_sass
from .autograd import attention_backward, attention_backward_probed
from .sm90.bwd_config import BWD_HEAD_DIMS, BwdConfig, make_bwd_config
from .sm90.config import KNOB_NAMES, SUPPORTED_HEAD_DIMS, KernelConfig, default_knobs, make_config
from .diagnostics import Diagnostics

__all__ = [
    "attention",
    "attention_backward",
    "attention_backward_probed",
    "compile_sass",
    "compile_bwd_sass",
    "make_bwd_config",
    "BwdConfig",
    "BWD_HEAD_DIMS",
    "make_config",
    "default_knobs",
    "KernelConfig",
    "KNOB_NAMES",
    "SUPPORTED_HEAD_DIMS",
    "Diagnostics",
    "COMPILE_TIMES",
    "attention_op",
    "attention_with_kvcache",
]


def __getattr__(name):
    # attention_op registers torch custom ops: loaded on first use, so `import fa4kernel` stays torch-free
    # (kept as module attributes once loaded: a decode step's lookup skips this function)
    if name == "attention_op":
        from .ops import attention_op

        globals()[name] = attention_op
        return attention_op
    if name == "attention_with_kvcache":
        from .kvcache import attention_with_kvcache

        globals()[name] = attention_with_kvcache
        return attention_with_kvcache
    raise AttributeError(f"module 'fa4kernel' has no attribute {name!r}")
