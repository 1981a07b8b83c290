"""Decode over a KV cache on the SM90 forward (docs/decode.md):

    out = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, causal=True,
                                 softmax_scale=None, num_splits=None, return_lse=False)

q (batch, seqlen_q new tokens, heads, d); k_cache, v_cache (batch, seqlen_cache, heads_kv, d),
heads_kv dividing heads; cache_seqlens (batch,) int32 or None (every row holds seqlen_cache
keys). The new tokens' keys are the last seqlen_q of a row's cache_seqlens keys: with causal,
new token t of row b sees keys j <= cache_seqlens[b] - seqlen_q + t (bottom-right).

A call is one launch of the forward's decode build (sm90/fwd.py, FlashFwdSm90Decode) and, where
it splits the keys or packs rows that are no view of `out`, one launch of the combine
(sm90/combine.py):
- pack-GQA: the forward runs heads_kv heads of seqlen_q x group packed rows (row r = token
  r // group of q head kv_head * group + r % group), causal per row's token; q packed is a view
  of q for one new token (or group 1), else a copy;
- the rows' key counts come from cache_seqlens on the device (no host sync);
- split-KV: the grid runs num_splits chunks of every row's KV blocks; each writes fp32 partials,
  the combine adds them up and writes out / lse in q's layout.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

from . import interface
from .inputs import device_props, validate_device, validate_tensors
from .sm90.config import SUPPORTED_HEAD_DIMS, make_decode_config

# num_splits=None (split_heuristic), FlashAttention-3's rule for a kernel bound by reading the
# cache: the (batch x heads_kv x Q tile) CTAs of an unsplit launch rarely fill the SMs in decode,
# and one CTA per SM cannot pull an SM's share of HBM bandwidth from a fraction of the SMs, so the
# KV blocks split until the CTAs make about one full wave; more waves only add partials and
# start-ups. One CTA fits per SM (the K/V stages take most of its shared memory).
DEFAULT_SMS = 132          # the SM count where q is not on a CUDA device (H100 SXM, H200)
FILL_FRACTION = 0.8        # this many CTAs per SM already unsplit: no split
WAVE_EFFICIENCY = 0.85     # the smallest split count within this share of the best wave efficiency
MIN_SPLIT_BLOCKS = 4       # KV blocks per split at least: a CTA's start-up and epilogue stay small
MAX_SPLITS = 128


def launch_decode(cfg, q, k, v, out, lse, seqused_k, group: int, num_splits: int, softmax_scale):
    """The forward's decode build (interface.run_decode); the CPU tests replace this function."""
    validate_device(q, k, v)
    interface.run_decode(cfg, q, k, v, out, lse, seqused_k, group, num_splits, softmax_scale)


def launch_combine(out_accum, lse_accum, out, lse, group: int, num_splits: int):
    """The split-KV combine (interface.run_combine); the CPU tests replace this function."""
    interface.run_combine(out_accum, lse_accum, out, lse, group, num_splits)


def split_heuristic(batch: int, heads_kv: int, rows: int, blocks: int, tile_m: int, sms: int) -> int:
    """num_splits=None: 1 where the unsplit CTAs (batch x heads_kv x Q tiles of the `rows` packed
    rows) fill FILL_FRACTION of the `sms` SMs; else the smallest split count whose CTAs fill
    their waves within WAVE_EFFICIENCY of the best count's efficiency (FlashAttention's rule),
    at most MAX_SPLITS and at least MIN_SPLIT_BLOCKS of a row's `blocks` KV blocks per split."""
    tiles = batch * heads_kv * -(-rows // tile_m)
    if tiles >= FILL_FRACTION * sms:
        return 1
    top = max(1, min(MAX_SPLITS, blocks // MIN_SPLIT_BLOCKS))
    eff = {}
    for n in range(1, top + 1):
        waves = tiles * n / sms
        eff[n] = waves / math.ceil(waves)
    best = max(eff.values())
    return min(n for n in eff if eff[n] >= WAVE_EFFICIENCY * best)


@functools.lru_cache(maxsize=256)  # host time per call: the plan of a shape is made once
def decode_plan(batch: int, seqlen_q: int, seqlen_cache: int, heads: int, heads_kv: int, head_dim: int,
                dtype: str, causal: bool, num_splits: Optional[int], sms: int) -> dict:
    """What a call runs: the forward's config (cfg), num_splits (the heuristic's where None; at
    most one per KV block of seqlen_cache), rows (packed rows per k/v head), packed_view (q and
    out pack by a view: one new token or group 1), combine (whether the combine runs). Cached:
    do not change the dict."""
    group = heads // heads_kv
    rows = seqlen_q * group
    causal = causal and seqlen_q > 1  # one new token sees the whole row either way: no mask to build
    cfg = make_decode_config(dtype, head_dim, causal, False)
    blocks = max(1, -(-seqlen_cache // cfg.tile_n))
    if num_splits is None:
        num_splits = split_heuristic(batch, heads_kv, rows, blocks, cfg.tile_m, sms)
    num_splits = max(1, min(num_splits, blocks))
    packed_view = seqlen_q == 1 or group == 1
    combine = num_splits > 1 or not packed_view
    if combine:
        cfg = make_decode_config(dtype, head_dim, causal, True)
    return {"cfg": cfg, "num_splits": num_splits, "rows": rows, "group": group, "packed_view": packed_view,
            "combine": combine}


def _check(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, num_splits, return_lse):
    """One-line ValueErrors; returns (b, sq, sk, h, hkv, d)."""
    import torch

    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise ValueError(f"k_cache shape {tuple(k_cache.shape)} != v_cache shape {tuple(v_cache.shape)}; "
                         "allowed: equal shapes")
    b, sq, h, d = q.shape
    bk, sk, hkv, dk = k_cache.shape
    if bk != b or dk != d:
        raise ValueError(f"k_cache shape {tuple(k_cache.shape)} does not match q shape {tuple(q.shape)}; "
                         "allowed: same batch and head_dim")
    if hkv < 1 or h % hkv:
        raise ValueError(f"k_cache heads={hkv} with q heads={h}; allowed: heads_kv dividing heads")
    if not (q.device == k_cache.device == v_cache.device):
        raise ValueError(f"q, k_cache, v_cache on different devices ({q.device}, {k_cache.device}, "
                         f"{v_cache.device})")
    if not isinstance(causal, bool):
        raise ValueError(f"causal={causal!r}; allowed: True or False")
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse={return_lse!r}; allowed: True or False")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or num_splits < 1):
        raise ValueError(f"num_splits={num_splits!r}; allowed: None (a heuristic) or an int >= 1")
    if causal and sk < sq:
        raise ValueError(f"causal with seqlen_cache={sk} < seqlen_q={sq}; allowed: a cache holding at least "
                         "the new tokens' keys")
    # dtypes, head dims, strides, the scale: the kernel's own checks (one line each)
    validate_tensors(q, k_cache, v_cache, causal, softmax_scale, True, head_dims=SUPPORTED_HEAD_DIMS, gqa=True)
    if cache_seqlens is not None:
        if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32 \
                or tuple(cache_seqlens.shape) != (b,):
            what = (f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)}" if isinstance(cache_seqlens, torch.Tensor)
                    else type(cache_seqlens).__name__)
            raise ValueError(f"cache_seqlens is {what}; allowed: None or an int32 tensor of shape ({b},)")
        if cache_seqlens.device != q.device:
            raise ValueError(f"cache_seqlens on {cache_seqlens.device}, q on {q.device}; allowed: the same device")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_cache, v_cache)):
        raise ValueError("q, k_cache or v_cache requires grad; attention_with_kvcache has no backward "
                         "(allowed: under torch.no_grad(), or tensors without grad)")
    return b, sq, sk, h, hkv, d


_CHECKED: dict = {}  # _call_key -> _check's result: a call like one already checked skips the checks


def _call_key(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, num_splits, return_lse):
    """What _check's verdict depends on: the tensors' types, shapes, strides, dtypes and devices,
    grad mode and requires_grad, and the other arguments (their types too: True is not 1). Host
    time per call is what a decode step waits for: the checks run once per such signature."""
    import torch

    def meta(t):
        if not isinstance(t, torch.Tensor):
            return (type(t),)
        return (t.shape, t.stride(), t.dtype, t.device, t.requires_grad)

    args = (causal, softmax_scale, num_splits, return_lse)
    return (meta(q), meta(k_cache), meta(v_cache), None if cache_seqlens is None else meta(cache_seqlens),
            torch.is_grad_enabled(), args, tuple(type(a) for a in args))


def _lengths(cache_seqlens, b: int, sq: int, sk: int, causal: bool) -> list:
    """The rows' cache lengths on the host (one sync when given), checked."""
    if cache_seqlens is None:
        return [sk] * b
    lens = [int(x) for x in cache_seqlens.tolist()]
    low = sq if causal else 0
    bad = [x for x in lens if not low <= x <= sk]
    if bad:
        raise ValueError(f"cache_seqlens holds {bad[0]}; allowed: each in [{low}, {sk}] "
                         f"({'seqlen_q' if causal else '0'} .. seqlen_cache)")
    return lens


_FULL_LENGTHS: dict = {}  # (batch, seqlen_cache, device) -> int32 tensor of seqlen_cache


def _full_lengths(b: int, sk: int, device):
    """cache_seqlens=None: every row holds seqlen_cache keys (one small tensor per shape, kept)."""
    import torch

    key = (b, sk, str(device))
    t = _FULL_LENGTHS.get(key)
    if t is None:
        if len(_FULL_LENGTHS) >= 64:
            _FULL_LENGTHS.pop(next(iter(_FULL_LENGTHS)))
        t = _FULL_LENGTHS[key] = torch.full((b,), sk, dtype=torch.int32, device=device)
    return t


def pack(t, heads_kv: int):
    """(b, seqlen_q, heads, d) -> packed rows (b, seqlen_q * group, heads_kv, d), row t * group + j
    = token t of head kv_head * group + j: a view for one token or group 1, else a copy."""
    b, sq, h, d = t.shape
    g = h // heads_kv
    if sq == 1:  # the same view in one step (host time per decode call)
        return t.view(b, heads_kv, g, d).transpose(1, 2)
    return t.view(b, sq, heads_kv, g, d).permute(0, 1, 3, 2, 4).reshape(b, sq * g, heads_kv, d)


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, causal: bool = True,
                           softmax_scale: Optional[float] = None, num_splits: Optional[int] = None,
                           return_lse: bool = False):
    """Attention of seqlen_q new tokens per row against a KV cache (flash_attn_with_kvcache's
    names): q (batch, seqlen_q, heads, d), k_cache / v_cache (batch, seqlen_cache, heads_kv, d),
    cache_seqlens (batch,) int32 or None (full cache); causal: bottom-right (new token t of row b
    sees keys j <= cache_seqlens[b] - seqlen_q + t). num_splits: KV chunks per row (None: a
    heuristic, split_heuristic; at most one chunk per KV block). Returns out (batch, seqlen_q,
    heads, d) in q's dtype, and lse (batch, heads, seqlen_q) fp32 (natural log) if return_lse. A
    row that sees no key (cache length 0, not causal) gives out 0, lse -inf. Bad input: a one-line
    ValueError (cache_seqlens' values are checked where they are on the CPU; on a GPU they are not
    read on the host, and the kernel clamps them to [0, seqlen_cache]). No backward."""
    import torch

    key = _call_key(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, num_splits, return_lse)
    shape = _CHECKED.get(key)
    if shape is None:
        shape = _check(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, num_splits, return_lse)
        if len(_CHECKED) >= 256:
            _CHECKED.pop(next(iter(_CHECKED)))
        _CHECKED[key] = shape
    b, sq, sk, h, hkv, d = shape
    if cache_seqlens is not None and cache_seqlens.device.type == "cpu":
        _lengths(cache_seqlens, b, sq, sk, causal)
    sms = device_props(q.device).multi_processor_count if q.device.type == "cuda" else DEFAULT_SMS
    dtype = "bfloat16" if q.dtype == torch.bfloat16 else "float16"
    plan = decode_plan(b, sq, sk, h, hkv, d, dtype, causal, num_splits, sms)
    g, ns, rows = plan["group"], plan["num_splits"], plan["rows"]
    seqused = cache_seqlens.contiguous() if cache_seqlens is not None else _full_lengths(b, sk, q.device)
    qp = pack(q, hkv)
    if not plan["combine"]:  # out and lse are written in place through their packed views
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
        out_p = pack(out, hkv)
        assert out_p.data_ptr() == out.data_ptr() and out_p._base is not None, "packed out must be a view"
        launch_decode(plan["cfg"], qp, k_cache, v_cache, out_p, lse.view(b, hkv, rows), seqused, g, 1,
                      softmax_scale)
    else:
        # the partials in one allocation (host time per call): O first, so both stay 16-byte aligned
        n_o = ns * b * rows * hkv * d
        scratch = torch.empty(n_o + ns * b * hkv * rows, dtype=torch.float32, device=q.device)
        out_accum = scratch[:n_o].view(ns * b, rows, hkv, d)
        lse_accum = scratch[n_o:].view(ns * b, hkv, rows)
        launch_decode(plan["cfg"], qp, k_cache, v_cache, out_accum, lse_accum, seqused, g, ns, softmax_scale)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
        launch_combine(out_accum, lse_accum, out, lse, g, ns)
    return (out, lse) if return_lse else out
