"""fa4kernel's attention as torch custom ops (torch.library), so torch.compile traces it
without graph breaks and CUDA graphs capture it:

    torch.ops.fa4lab.attention_fwd(q, k, v, causal, softmax_scale, deterministic) -> (out, lse)
    torch.ops.fa4lab.attention_bwd(dout, q, k, v, out, lse, causal, softmax_scale, deterministic)
        -> (dq, dk, dv)
    attention_op(q, k, v, causal=False, softmax_scale=None, deterministic=False)   # out, with autograd

q (batch, seqlen_q, heads, head_dim), k and v (batch, seqlen_k, heads_kv, head_dim), bf16 or
fp16 on an sm_90 GPU (heads_kv divides heads: GQA / MQA). out (batch, seqlen_q, heads, head_dim)
contiguous in q's dtype, lse (batch, heads, seqlen_q) fp32 contiguous (natural log); dq, dk, dv
contiguous, shaped and typed like q, k, v. The real ops call fa4kernel.attention and
fa4kernel.attention_backward; the fake ones (torch.compile's tracing) run the same input checks
(one-line ValueError) and return empty tensors of those shapes.

Importing this module imports torch and registers the ops; `import fa4kernel` does not import it
(fa4kernel.attention_op loads it on first use).
"""

from __future__ import annotations

from typing import Optional

import torch

from .autograd import attention_backward, check_backward_args, check_backward_supported
from .inputs import validate_tensors
from .interface import attention
from .sm90.config import SUPPORTED_HEAD_DIMS

NAMESPACE = "fa4lab"


def _check_fwd(q, k, v, causal, softmax_scale, deterministic):
    """The forward's checks that need no GPU; returns (batch, seqlen_q, heads, head_dim)."""
    b, sq, _, h, d, _ = validate_tensors(q, k, v, causal, softmax_scale, True, head_dims=SUPPORTED_HEAD_DIMS,
                                         gqa=True)
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic={deterministic!r}; allowed: True or False")
    return b, sq, h, d


@torch.library.custom_op(f"{NAMESPACE}::attention_fwd", mutates_args=())
def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  softmax_scale: Optional[float] = None, deterministic: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of fa4kernel.attention(q, k, v, causal, softmax_scale, return_lse=True).
    deterministic is the backward's (kept here so the autograd formula sees it)."""
    with torch.no_grad():  # the op's autograd is register_autograd's, not attention()'s
        out, lse = attention(q, k, v, causal, softmax_scale, return_lse=True)
    return out.contiguous(), lse  # (a no-op on sm_90; the sm_100 forward returns empty_like(q))


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal=False, softmax_scale=None, deterministic=False):
    b, sq, h, d = _check_fwd(q, k, v, causal, softmax_scale, deterministic)
    out = q.new_empty((b, sq, h, d))  # contiguous, as interface.attention allocates it
    lse = q.new_empty((b, h, sq), dtype=torch.float32)
    return out, lse


@torch.library.custom_op(f"{NAMESPACE}::attention_bwd", mutates_args=())
def attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, causal: bool = False, softmax_scale: Optional[float] = None,
                  deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of fa4kernel.attention_backward (the SM90 backward)."""
    return attention_backward(dout, q, k, v, out, lse, causal, softmax_scale, deterministic)


@attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, causal=False, softmax_scale=None, deterministic=False):
    check_backward_args(dout, q, k, v, out, lse, causal, softmax_scale, deterministic)
    # contiguous like the backward's own buffers (sm90/bwd.py), whatever q, k, v's strides
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device))


def _setup_context(ctx, inputs, output):
    q, k, v, causal, softmax_scale, deterministic = inputs
    out, lse = output
    check_backward_supported(q, k, v, causal, deterministic)  # at forward time, not in the backward
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.softmax_scale, ctx.deterministic = causal, softmax_scale, deterministic
    ctx.mark_non_differentiable(lse)  # the backward takes dout alone


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_bwd(dout, q, k, v, out, lse, ctx.causal, ctx.softmax_scale, ctx.deterministic)
    return dq, dk, dv, None, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def attention_op(q, k, v, causal: bool = False, softmax_scale: Optional[float] = None,
                 deterministic: bool = False, return_lse: bool = False):
    """softmax(q k^T * scale [+ causal mask]) v through the custom op: the same as
    fa4kernel.attention(q, k, v, causal, softmax_scale, deterministic=deterministic) (no knobs),
    but torch.compile traces it as one node (no graph break) and its backward as another. In
    eager, on plain tensors, it runs fa4kernel.attention itself (the same kernels and results,
    less host time per call).
    Returns out, or (out, lse) if return_lse (lse carries no gradient). Bad input raises the
    one-line ValueError of fa4kernel.attention, in eager and while torch.compile traces."""
    if _eager(q, k, v):
        # the same kernels through fa4kernel.attention's own autograd Function: half the host
        # time of the custom op's autograd in eager (lab/tools/attn_host_sm90.py measures both)
        return attention(q, k, v, causal, softmax_scale, return_lse, deterministic=deterministic)
    _check_fwd(q, k, v, causal, softmax_scale, deterministic)
    out, lse = attention_fwd(q, k, v, causal, softmax_scale, deterministic)
    return (out, lse) if return_lse else out


def _eager(q, k, v) -> bool:
    """True outside torch.compile's tracing, on plain CUDA tensors (fake, functional and other
    subclasses take the op, which every tracer sees as one node; so do CPU tensors, whose op
    raises attention()'s one-line error, or runs a stand-in registered for CPU tests)."""
    return (not torch.compiler.is_compiling() and q.device.type == "cuda"
            and all(type(t) is torch.Tensor for t in (q, k, v)))
