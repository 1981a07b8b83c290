"""Checks on the tensors attention() takes, shared by both kernels: one-line ValueErrors that
name the argument and what is allowed. Plain Python at import (torch is imported when called).
"""

from __future__ import annotations

import math


def validate_tensors(q, k, v, causal=False, softmax_scale=None, return_lse=False, *,
                     head_dims=(64, 96, 128, 192, 256), gqa=False):
    """Checks on torch tensors q, k, v shaped (batch, seqlen, heads, head_dim); k and v may have
    fewer heads than q (GQA / MQA: heads_kv divides heads) where the kernel supports it (gqa=True).

    Device-independent checks only (testable with CPU tensors); validate_device() runs after the
    knobs are validated, so every argument error is reported without a GPU. head_dims: those the
    kernel supports.
    Returns (batch, seqlen_q, seqlen_k, heads, head_dim, dtype_name).
    """
    import torch  # imported lazily: config is importable without torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"{name}.dtype={t.dtype} not supported; allowed: torch.bfloat16, torch.float16")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}); allowed: all the same")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
    b, sq, h, d = q.shape
    bk, sk, hk, dk = k.shape
    if d not in head_dims:
        raise ValueError(f"head_dim={d} not supported; allowed: {', '.join(map(str, head_dims))}")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k shape {tuple(k.shape)} != v shape {tuple(v.shape)}; allowed: equal shapes")
    if bk != b or dk != d:
        raise ValueError(
            f"k/v shape {tuple(k.shape)} does not match q shape {tuple(q.shape)}; allowed: same "
            f"batch and head_dim (seqlen may differ)"
        )
    if hk != h and not gqa:
        raise ValueError(
            f"k/v shape {tuple(k.shape)} does not match q shape {tuple(q.shape)}; allowed: same "
            f"batch, heads and head_dim (seqlen may differ)"
        )
    if gqa and (hk < 1 or h % hk != 0):
        raise ValueError(
            f"k/v heads={hk} with q heads={h}; allowed: k/v heads dividing q heads (GQA / MQA: "
            f"q head i reads k/v head i // (heads // heads_kv))"
        )
    if b < 1 or h < 1 or sq < 1 or sk < 1:
        raise ValueError(f"empty input (q {tuple(q.shape)}, k {tuple(k.shape)}); allowed: all dims >= 1")
    if b * h > 65535 * 65535 or h > 65535 or b > 65535:
        raise ValueError("batch and heads must each be <= 65535 (grid limits)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}.stride(-1)={t.stride(-1)}; allowed: 1 (head_dim contiguous)")
        for i in range(3):
            if t.stride(i) % 8 != 0 or t.stride(i) <= 0:
                raise ValueError(
                    f"{name}.stride({i})={t.stride(i)}; allowed: positive multiples of 8 elements "
                    f"(16-byte aligned rows for TMA)"
                )
    if not isinstance(causal, bool):
        raise ValueError(f"causal={causal!r}; allowed: True or False")
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
                or not math.isfinite(softmax_scale) or softmax_scale <= 0:
            raise ValueError(f"softmax_scale={softmax_scale!r}; allowed: None or a finite number > 0")
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse={return_lse!r}; allowed: True or False")
    dtype = "bfloat16" if q.dtype == torch.bfloat16 else "float16"
    return b, sq, sk, h, d, dtype


def validate_device(q, k, v):
    """Last checks (need the tensors' device): CUDA, same device, 16-byte aligned pointers."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on device {t.device}; allowed: a CUDA device (sm_90 Hopper or sm_100 Blackwell)")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v on different devices ({q.device}, {k.device}, {v.device})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.data_ptr() % 16 != 0:
            raise ValueError(f"{name}.data_ptr() is not 16-byte aligned; allowed: 16-byte aligned")


_PROPS: dict = {}  # device index -> torch.cuda device properties


def device_props(device):
    """The device's properties (capability, SM count, L2 size), asked once per device: a driver
    query per call costs host time that shows on short problems."""
    key = device.index if device.index is not None else 0
    if key not in _PROPS:
        import torch

        _PROPS[key] = torch.cuda.get_device_properties(device)
    return _PROPS[key]


def capability(q):
    """(major, minor) of the CUDA device q is on, or None (not a CUDA tensor, or no CUDA)."""
    dev = getattr(q, "device", None)
    if getattr(dev, "type", None) != "cuda":
        return None
    p = device_props(dev)
    return p.major, p.minor
