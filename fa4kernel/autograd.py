"""torch.autograd for fa4kernel.attention: the SM90 forward (with its LSE) and the SM90 backward
(sm90/bwd.py) as one torch.autograd.Function.

attention() comes here when grad mode is on and q, k or v requires grad; the checks that the
backward supports the arguments run first, at forward time (one-line ValueError), so a missing
backward never shows up as a missing grad_fn.
"""

from __future__ import annotations

import math
from typing import Optional

from .sm90.bwd_config import BWD_HEAD_DIMS, bwd_config_from_knobs, with_dq_slices_default, with_gqa_default


def _bwd_knobs(q, k, causal, deterministic, bwd_knobs: dict) -> dict:
    """bwd_knobs with the shape-dependent defaults (gqa_dkv: bwd_config.gqa_dkv_for, on this
    GPU's SM count; deterministic, dq_slices: bwd_config.dq_slices_for)."""
    from .inputs import device_props

    b, sk, hkv = k.shape[0], k.shape[1], k.shape[2]
    sms = device_props(q.device).multi_processor_count
    knobs = with_gqa_default(bwd_knobs, q.shape[-1], q.shape[2], hkv, b, sk, deterministic, sms, causal, q.shape[1])
    dtype = "bfloat16" if str(q.dtype) == "torch.bfloat16" else "float16"
    return with_dq_slices_default(knobs, dtype, q.shape[-1], causal, deterministic, q.shape[1], sk, q.shape[2] // hkv)


def check_backward_supported(q, k, v, causal: bool, deterministic, **bwd_knobs) -> None:
    """One-line ValueError unless the SM90 backward supports these (already validated) inputs
    and knobs (sm90/bwd_config.py: dq_reduce, dq_smem, dq_sum, stats, mma_order, preprocess, postprocess,
    tile_m, grid_order, dq_zero)."""
    d = int(q.shape[-1])  # static under torch.compile's dynamic shapes too: it picks the kernel
    if d not in BWD_HEAD_DIMS:
        raise ValueError(f"head_dim={d} has no backward (q, k or v requires grad); allowed with grad: "
                         f"{', '.join(map(str, BWD_HEAD_DIMS))} (or call under torch.no_grad())")
    dtype = "bfloat16" if str(q.dtype) == "torch.bfloat16" else "float16"
    bwd_config_from_knobs(dtype, d, causal, deterministic, bwd_knobs)


def needs_grad(q, k, v) -> bool:
    import torch

    return torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))


def _function():
    import torch

    class FlashAttnFuncSm90(torch.autograd.Function):
        """out, lse = attention(q, k, v) saving q, k, v, out, lse; backward -> dq, dk, dv."""

        @staticmethod
        def forward(ctx, run, q, k, v, cfg, softmax_scale, deterministic, bwd_knobs):
            b, sq, h, d = q.shape
            out = torch.empty((b, sq, h, d), dtype=q.dtype, device=q.device)
            lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
            run(cfg, q.detach(), k.detach(), v.detach(), out, lse, softmax_scale)  # (DLPack refuses grad)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.causal = cfg.causal
            ctx.softmax_scale = softmax_scale
            ctx.deterministic = deterministic
            ctx.bwd_knobs = dict(bwd_knobs)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            from .sm90.bwd import run_bwd

            q, k, v, out, lse = ctx.saved_tensors
            dtype = "bfloat16" if q.dtype == torch.bfloat16 else "float16"
            knobs = _bwd_knobs(q, k, ctx.causal, ctx.deterministic, ctx.bwd_knobs)
            bcfg = bwd_config_from_knobs(dtype, q.shape[-1], ctx.causal, ctx.deterministic, knobs)
            scale = ctx.softmax_scale if ctx.softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
            dq, dk, dv = run_bwd(bcfg, dout, q, k, v, out, lse, scale)
            return None, dq, dk, dv, None, None, None, None

    return FlashAttnFuncSm90


_FUNC = None


def attention_with_grad(run, q, k, v, cfg, softmax_scale: Optional[float], deterministic: bool, **bwd_knobs):
    """(out, lse) of the SM90 forward built with an LSE (cfg.has_lse), recorded for autograd;
    run: the forward's launch (interface's), so this module stays below the host API;
    bwd_knobs: the backward's knobs (sm90/bwd_config.py: dq_reduce, dq_smem, dq_sum, stats, mma_order,
    preprocess, postprocess, tile_m, grid_order, dq_zero; left out: their defaults)."""
    global _FUNC
    if _FUNC is None:
        _FUNC = _function()
    return _FUNC.apply(run, q, k, v, cfg, softmax_scale, deterministic, tuple(sorted(bwd_knobs.items())))


def attention_backward(dout, q, k, v, out, lse, causal: bool = False, softmax_scale: Optional[float] = None,
                       deterministic: bool = False, **bwd_knobs):
    """dq, dk, dv of attention(q, k, v) from its out and lse (natural log, (batch, heads,
    seqlen_q) fp32, as attention(..., return_lse=True) returns them) and dout; the SM90 backward
    built with bwd_knobs (sm90/bwd_config.py: dq_reduce, dq_smem, dq_sum, stats, mma_order, preprocess,
    postprocess, tile_m, grid_order, dq_zero; left out: their defaults)."""
    return _backward(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, None, bwd_knobs)


def attention_backward_probed(dout, q, k, v, out, lse, causal: bool = False, softmax_scale: Optional[float] = None,
                              deterministic: bool = False, stamps=None, **bwd_knobs):
    """attention_backward through the backward's clock-probe build (sm90/bwd.py,
    FlashBwdSm90Probe: the same kernel plus clock64 and globaltimer at each CTA's start and end).
    Returns (dq, dk, dv, stamps); stamps: an int64 buffer of bwd.probe_words() words to reuse
    (None: a new one). trace.ctas_clock_ghz(stamps.tolist()) is the launch's in-kernel clock;
    trace.probe_sums(stamps.tolist()) the mean over every CTA of every launch since its last
    PROBE_SUM_WORDS words were zeroed (a reused buffer keeps adding)."""
    import torch

    from .sm90.bwd import probe_words
    from .sm90.bwd_config import grid_heads

    bwd_knobs = _bwd_knobs(q, k, causal, deterministic, bwd_knobs)
    if stamps is None:
        dtype = "bfloat16" if q.dtype == torch.bfloat16 else "float16"
        bcfg = bwd_config_from_knobs(dtype, q.shape[-1], causal, deterministic, bwd_knobs)
        heads = grid_heads(bcfg, q.shape[2], k.shape[2])
        stamps = torch.zeros(probe_words(bcfg, q.shape[0], k.shape[1], heads), dtype=torch.int64, device=q.device)
    return (*_backward(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, stamps, bwd_knobs), stamps)


def check_backward_args(dout, q, k, v, out, lse, causal: bool, softmax_scale, deterministic, **bwd_knobs) -> None:
    """The backward's checks that need no GPU (one-line ValueError): q, k, v as the forward
    takes them, the backward's head dims and knobs, out and dout shaped like q, lse (batch,
    heads, seqlen_q) fp32. Fake tensors pass through (fa4kernel/ops.py's fake backward)."""
    import torch

    from .inputs import validate_tensors

    validate_tensors(q, k, v, causal, softmax_scale, False, head_dims=BWD_HEAD_DIMS, gqa=True)
    check_backward_supported(q, k, v, causal, deterministic, **bwd_knobs)
    for name, t, shape, dt in (("out", out, tuple(q.shape), q.dtype), ("dout", dout, tuple(q.shape), q.dtype),
                               ("lse", lse, (q.shape[0], q.shape[2], q.shape[1]), torch.float32)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dt:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: {got}; allowed: a {dt} tensor of shape {shape}")


def _backward(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, stamps, bwd_knobs):
    import torch

    from .inputs import validate_device

    check_backward_args(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, **bwd_knobs)
    validate_device(q, k, v)
    from .inputs import capability

    cap = capability(q)
    if cap != (9, 0):
        raise ValueError(f"q is on an sm_{cap[0]}{cap[1]} GPU; the backward runs on sm_90 (H100, H200)")
    from .sm90.bwd import run_bwd

    dtype = "bfloat16" if q.dtype == torch.bfloat16 else "float16"
    knobs = _bwd_knobs(q, k, causal, deterministic, bwd_knobs)
    bcfg = bwd_config_from_knobs(dtype, q.shape[-1], causal, deterministic, knobs)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return run_bwd(bcfg, dout, q, k, v, out, lse, scale, stamps)
