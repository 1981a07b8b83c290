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

# num_splits=None (split_heuristic): the (batch x heads_kv x Q tile) CTAs of an unsplit launch
# rarely fill the SMs in decode, and one split CTA streams its KV blocks at a fraction of an SM's
# share of HBM (H100: 32 CTAs read a 128 MiB cache at 2.0 TB/s), so the KV blocks split until the
# CTAs reach HBM_CTA_FILL of the SMs, where the read saturates (48 CTAs 2.6 TB/s, 64 and up 2.8);
# no further, since each split more adds to the combine (2.2 us at 2 splits, 5.5-7.8 at 29):
# lab/tools/decode_kernels_sm90.py, lab/campaigns/decode-sm90/. One CTA fits per SM (the K/V
# stages take most of its shared memory).
DEFAULT_SMS = 132          # the SM count where q is not on a CUDA device (H100 SXM, H200)
FILL_FRACTION = 0.8        # this many CTAs per SM already unsplit: no split
HBM_CTA_FILL = 0.5         # split until the CTAs reach this share of the SMs
MIN_SPLIT_BLOCKS = 2       # KV blocks per split at least: a CTA's start-up and epilogue stay small
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
    rows) fill FILL_FRACTION of the `sms` SMs; else the fewest splits whose CTAs reach
    HBM_CTA_FILL of them, at most MAX_SPLITS and at least MIN_SPLIT_BLOCKS of a row's `blocks`
    KV blocks per split."""
    tiles = batch * heads_kv * -(-rows // tile_m)
    if tiles >= FILL_FRACTION * sms:
        return 1
    top = max(1, min(MAX_SPLITS, blocks // MIN_SPLIT_BLOCKS))
    return max(1, min(top, -(-math.ceil(HBM_CTA_FILL * sms) // tiles)))


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


# Host time per call is what a decode step waits for (a small decode launch runs in a few
# microseconds): what a call needs beyond its tensors is made once per call signature (_call_key)
# and kept in a _Record, its fp32 workspaces once per signature's layout and stream (_workspace).
_torch = None  # torch, bound on the first call (this module imports without torch)
_Tensor = None  # torch.Tensor: only exact tensors have a signature (subclasses take the uncached path)
_grad_enabled = _empty_like = _contiguous = None  # torch.is_grad_enabled, torch.empty_like, torch.contiguous_format
_MAX_RECORDS = 256


def _bind_torch():
    global _torch, _Tensor, _grad_enabled, _empty_like, _contiguous
    import torch

    _Tensor, _grad_enabled, _empty_like, _contiguous = (torch.Tensor, torch.is_grad_enabled, torch.empty_like,
                                                        torch.contiguous_format)
    _torch = torch
    return torch


def _call_key(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, num_splits, return_lse):
    """The call signature: everything _check's verdict and the _Record depend on (the tensors'
    shapes, strides, dtypes and devices, cache_seqlens' shape, dtype and device, whether grad is
    needed, the other arguments with their types: True is not 1), so an input that fails a check
    never shares a signature with one that passed. None (no caching, every check runs) where q,
    k_cache, v_cache or cache_seqlens is not exactly a torch.Tensor (or None)."""
    T = _Tensor or _bind_torch().Tensor
    if type(q) is not T or type(k_cache) is not T or type(v_cache) is not T:
        return None
    if cache_seqlens is None:
        s = None
    elif type(cache_seqlens) is T:
        s = (cache_seqlens.shape, cache_seqlens.dtype, cache_seqlens.device)
    else:
        return None
    return (q.shape, q.stride(), q.dtype, q.device, k_cache.shape, k_cache.stride(), k_cache.dtype,
            k_cache.device, v_cache.shape, v_cache.stride(), v_cache.dtype, v_cache.device, s,
            _grad_enabled() and (q.requires_grad or k_cache.requires_grad or v_cache.requires_grad),
            causal, softmax_scale, num_splits, return_lse,
            type(causal), type(softmax_scale), type(num_splits), type(return_lse))


class _Record:
    """What a call signature runs, made once (_record): the shape, the plan (decode_plan) and its
    pieces, the packed views' geometry, the kept seqused_k, the workspace layout, and after the
    first launch that went through launch_decode / launch_combine the compiled TVM-FFI functions
    and the scale (the launch wrappers' per-call work)."""

    __slots__ = ("shape", "plan", "cfg", "group", "num_splits", "rows", "combine", "cuda", "device", "dtype",
                 "host_lengths", "full_lengths", "q_contiguous", "q_view", "out_view", "lse_rows", "lse_shape",
                 "lse_like", "layout", "decode_fn", "combine_fn", "scale_log2")


_RECORDS: dict = {}  # _call_key -> _Record
_CHECKED = _RECORDS  # the name lab/tools/decode_host_sm90.py looks up


def _view_geometry(packed, t):
    """(size, stride) of `packed` where it is a view of `t` (pack's one-token or group-1 view), else None."""
    if packed._base is None or packed.data_ptr() != t.data_ptr() or packed.storage_offset() != t.storage_offset():
        return None
    return tuple(packed.shape), packed.stride()


def _record(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, num_splits, return_lse) -> _Record:
    """_check (raises on bad input), then the signature's _Record."""
    torch = _torch or _bind_torch()
    b, sq, sk, h, hkv, d = _check(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, num_splits, return_lse)
    r = _Record()
    r.shape = (b, sq, sk, h, hkv, d)
    r.cuda = q.device.type == "cuda"
    r.device = q.device
    r.dtype = "bfloat16" if q.dtype == torch.bfloat16 else "float16"
    sms = device_props(q.device).multi_processor_count if r.cuda else DEFAULT_SMS
    r.plan = plan = decode_plan(b, sq, sk, h, hkv, d, r.dtype, causal, num_splits, sms)
    r.cfg, r.group, r.num_splits, r.rows, r.combine = (plan["cfg"], plan["group"], plan["num_splits"],
                                                       plan["rows"], plan["combine"])
    r.host_lengths = cache_seqlens is not None and cache_seqlens.device.type == "cpu"
    r.full_lengths = _full_lengths(b, sk, q.device) if cache_seqlens is None else None
    # the packed views' (size, stride) as pack's views make them: one as_strided per call, the same tensor
    r.q_view = _view_geometry(_pack_views(q, hkv), q) if plan["packed_view"] else None
    out_meta = torch.empty(q.shape, dtype=q.dtype, device="meta")  # out: q's shape, contiguous
    r.q_contiguous = q.stride() == out_meta.stride()  # then torch.empty_like(q) has out's strides already
    r.out_view = None if r.combine else _view_geometry(_pack_views(out_meta, hkv), out_meta)
    if not r.combine:
        assert r.out_view is not None, "packed out must be a view"
    r.lse_rows = (b, hkv, r.rows)
    r.lse_shape = (b, h, sq)
    # a fresh lse for the caller: torch.empty_like of this template (cheaper than torch.empty)
    r.lse_like = torch.empty(r.lse_shape, dtype=torch.float32, device=q.device) if return_lse else None
    # the workspaces: the fp32 partials (combine), the lse the caller does not get (not return_lse)
    lse_ws = None if return_lse else ("out" if r.combine else "rows")
    r.layout = (q.device, r.combine and r.num_splits, b, r.rows, hkv, d, sq, h, lse_ws) \
        if (r.combine or lse_ws) else None
    r.decode_fn = r.combine_fn = r.scale_log2 = None
    return r


def _bind_launches(r: _Record, q, softmax_scale):
    """After a launch through launch_decode / launch_combine (the compile and the full
    validate_device ran): the compiled TVM-FFI functions as interface.run_decode / run_combine
    call them, so the signature's later calls skip the wrappers (the device checks' verdict is
    the signature's; the alignment checks, which depend on the data pointers, stay per call)."""
    if not interface._USE_TVM_FFI:
        return  # the DLPack path converts every argument per call: the wrappers stay
    fn = interface._CACHE.get(r.cfg)
    fc = interface._CACHE.get(("combine", r.dtype, r.shape[5])) if r.combine else None
    if fn is None or (r.combine and fc is None):
        return
    r.scale_log2 = interface._scale_log2(q, softmax_scale)
    r.combine_fn = fc
    r.decode_fn = fn


def _check_alignment(q, k, v):
    """validate_device's pointer checks (one-line ValueError), per call on the bound path."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.data_ptr() % 16 != 0:
            raise ValueError(f"{name}.data_ptr() is not 16-byte aligned; allowed: 16-byte aligned")


_NO_CACHE = object()  # _stream_key's answer where workspaces must not be kept (CUDA graph capture)


def _stream_key(device):
    """Which kept workspaces a call may use: None off CUDA (the host runs ops in order); on CUDA
    (device index, current stream id): a workspace is reused only by later calls on its stream,
    which run after the kernels that used it. _NO_CACHE during CUDA graph capture (the graph
    keeps the pointers of its launches: fresh buffers from its pool) and where q's device is not
    the current device (capture there is not visible here)."""
    if device.type != "cuda":
        return None
    torch = _torch
    if torch.cuda.is_current_stream_capturing() or device.index != torch._C._cuda_getDevice():
        return _NO_CACHE
    return torch._C._cuda_getCurrentStream(device.index)[:2]


def _capturing(r: _Record) -> bool:
    """Whether a CUDA graph capture is underway on the current stream (r on CUDA)."""
    return r.cuda and _torch.cuda.is_current_stream_capturing()


_WORKSPACES: dict = {}  # (_Record.layout, _stream_key) -> (out_accum, lse_accum, lse): fp32, kept
_WORKSPACE_BYTES = [0]  # their total size
MAX_WORKSPACES = 16
MAX_WORKSPACE_BYTES = 256 << 20  # more is dropped oldest first; a larger one alone is not kept


def _new_workspace(r: _Record):
    """(out_accum, lse_accum, lse) fp32 for r.layout (None where the call does not need one), in
    one allocation: the partials first (16-byte aligned, as the call made them before it kept
    them), the lse 256-byte aligned after them."""
    torch = _torch
    b, sq, sk, h, hkv, d = r.shape
    rows, ns = r.rows, r.num_splits
    n_o = ns * b * rows * hkv * d if r.combine else 0
    n_l = ns * b * hkv * rows if r.combine else 0
    lse_ws = r.layout[-1]
    at = -(-(n_o + n_l) // 64) * 64
    n = at + b * h * sq if lse_ws else n_o + n_l
    with torch.inference_mode(False):  # kept past an inference_mode block: a normal tensor
        buf = torch.empty(n, dtype=torch.float32, device=r.device)
    o_acc = buf[:n_o].view(ns * b, rows, hkv, d) if r.combine else None
    l_acc = buf[n_o:n_o + n_l].view(ns * b, hkv, rows) if r.combine else None
    lse = None
    if lse_ws == "out":
        lse = buf[at:].view(b, h, sq)
    elif lse_ws == "rows":
        lse = buf[at:].view(b, hkv, rows)
    return o_acc, l_acc, lse


def _workspace(r: _Record, stream):
    """The kept workspace of r.layout for `stream` (_stream_key), made on first use."""
    if stream is _NO_CACHE:
        return _new_workspace(r)
    key = (r.layout, stream)
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _new_workspace(r)
        size = sum(t.numel() * 4 for t in ws if t is not None)
        if size > MAX_WORKSPACE_BYTES:
            return ws
        while _WORKSPACES and (len(_WORKSPACES) >= MAX_WORKSPACES
                               or _WORKSPACE_BYTES[0] + size > MAX_WORKSPACE_BYTES):
            old = _WORKSPACES.pop(next(iter(_WORKSPACES)), None)
            if old is not None:
                _WORKSPACE_BYTES[0] -= sum(t.numel() * 4 for t in old if t is not None)
        _WORKSPACES[key] = ws
        _WORKSPACE_BYTES[0] += size
    return ws


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
    if t is None and device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.full((b,), sk, dtype=torch.int32, device=device)  # filled on replay only: not kept
    if t is None:
        if len(_FULL_LENGTHS) >= 64:
            _FULL_LENGTHS.pop(next(iter(_FULL_LENGTHS)))
        t = _FULL_LENGTHS[key] = torch.full((b,), sk, dtype=torch.int32, device=device)
    return t


def _pack_views(t, heads_kv: int):
    """pack by torch's view ops (the definition of pack's layout)."""
    b, sq, h, d = t.shape
    g = h // heads_kv
    if sq == 1:
        return t.view(b, heads_kv, g, d).transpose(1, 2)
    return t.view(b, sq, heads_kv, g, d).permute(0, 1, 3, 2, 4).reshape(b, sq * g, heads_kv, d)


_ONE_TOKEN_VIEWS: dict = {}  # (shape, stride, heads_kv) -> the one-token view's (size, stride)


def pack(t, heads_kv: int):
    """(b, seqlen_q, heads, d) -> packed rows (b, seqlen_q * group, heads_kv, d), row t * group + j
    = token t of head kv_head * group + j: a view for one token or group 1, else a copy. One
    token: one as_strided with the view's size and strides (host time per decode call)."""
    if t.shape[1] != 1:
        return _pack_views(t, heads_kv)
    key = (t.shape, t.stride(), heads_kv)
    geo = _ONE_TOKEN_VIEWS.get(key)
    if geo is None:
        if len(_ONE_TOKEN_VIEWS) >= 256:
            _ONE_TOKEN_VIEWS.pop(next(iter(_ONE_TOKEN_VIEWS)), None)
        v = _pack_views(t, heads_kv)
        geo = _ONE_TOKEN_VIEWS[key] = (tuple(v.shape), v.stride())
    return t.as_strided(*geo)


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
    read on the host, and the kernel clamps them to [0, seqlen_cache]). No backward.

    Host side: the checks and the plan run once per call signature (_call_key, _Record); out, and
    lse where returned, are fresh tensors every call; the fp32 partials and an lse not returned
    are workspaces kept per layout and CUDA stream (_workspace)."""
    key = _call_key(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, num_splits, return_lse)
    try:
        r = _RECORDS.get(key) if key is not None else None
    except TypeError:  # an unhashable argument: _check names it
        key = r = None
    if r is None:
        r = _record(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, num_splits, return_lse)
        if key is not None and not _capturing(r):  # kept tensors made in a capture hold data only on replay
            if len(_RECORDS) >= _MAX_RECORDS:
                _RECORDS.pop(next(iter(_RECORDS)), None)
            _RECORDS[key] = r
    if r.host_lengths:  # the values: per call
        b, sq, sk = r.shape[:3]
        _lengths(cache_seqlens, b, sq, sk, causal)
    seqused = r.full_lengths if cache_seqlens is None else cache_seqlens.contiguous()
    qp = q.as_strided(*r.q_view) if r.q_view is not None else _pack_views(q, r.shape[4])
    out = _empty_like(q) if r.q_contiguous else _empty_like(q, memory_format=_contiguous)
    lse = _empty_like(r.lse_like) if return_lse else None
    ws = _workspace(r, _stream_key(r.device)) if r.layout is not None else None
    g, ns = r.group, r.num_splits
    bound = r.decode_fn is not None and launch_decode is _LAUNCH_DECODE and launch_combine is _LAUNCH_COMBINE
    if not r.combine:  # out and lse are written in place through their packed views
        out_p = out.as_strided(*r.out_view)
        lse_p = lse.view(r.lse_rows) if return_lse else ws[2]
        if bound:
            if (qp.data_ptr() | k_cache.data_ptr() | v_cache.data_ptr()) & 15:
                _check_alignment(qp, k_cache, v_cache)
            r.decode_fn(qp, k_cache, v_cache, out_p, lse_p, seqused, g, 1, r.scale_log2)
        else:
            launch_decode(r.cfg, qp, k_cache, v_cache, out_p, lse_p, seqused, g, 1, softmax_scale)
            if launch_decode is _LAUNCH_DECODE and launch_combine is _LAUNCH_COMBINE:
                _bind_launches(r, q, softmax_scale)
    else:
        out_accum, lse_accum, lse_ws = ws
        lse_c = lse if return_lse else lse_ws
        if bound:
            if (qp.data_ptr() | k_cache.data_ptr() | v_cache.data_ptr()) & 15:
                _check_alignment(qp, k_cache, v_cache)
            r.decode_fn(qp, k_cache, v_cache, out_accum, lse_accum, seqused, g, ns, r.scale_log2)
            r.combine_fn(out_accum, lse_accum, out, lse_c, g, ns)
        else:
            launch_decode(r.cfg, qp, k_cache, v_cache, out_accum, lse_accum, seqused, g, ns, softmax_scale)
            launch_combine(out_accum, lse_accum, out, lse_c, g, ns)
            if launch_decode is _LAUNCH_DECODE and launch_combine is _LAUNCH_COMBINE:
                _bind_launches(r, q, softmax_scale)
    return (out, lse) if return_lse else out


_LAUNCH_DECODE, _LAUNCH_COMBINE = launch_decode, launch_combine  # the real launches (the CPU tests replace them)
