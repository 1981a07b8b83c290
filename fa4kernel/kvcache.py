"""Decode over a KV cache on the SM90 forward, host side only (docs/decode.md):

    out = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, causal=True,
                                 softmax_scale=None, num_splits=None, return_lse=False)

q (batch, seqlen_q new tokens, heads, d); k_cache, v_cache (batch, seqlen_cache, heads_kv, d),
heads_kv dividing heads; cache_seqlens (batch,) int32 or None (every row holds seqlen_cache
keys). The new tokens' keys are the last seqlen_q of a row's cache_seqlens keys: with causal,
new token t of row b sees keys j <= cache_seqlens[b] - seqlen_q + t (bottom-right).

How it runs on a kernel that knows one seqlen_k per launch and no per-row mask:

- pack-GQA: the `heads // heads_kv` q heads of a k/v head and the seqlen_q tokens become the rows
  of one query block (token-major), launched with heads = heads_kv and no mask, so each K/V block
  is read once per k/v head instead of once per q head;
- causal with seqlen_q > 1: a packed row's key limit would depend on its place in the block, not
  on its token, so the packed launches cover each row's "body" (the keys every new token sees,
  [0, L - seqlen_q)) and the last seqlen_q keys (the "tail") run unpacked with the causal mask
  (seqlen_q x seqlen_q); the two combine like splits;
- split-KV: the body in chunks, one launch over all chunks (the chunks are a strided view of the
  cache: `Piece`), q repeated per chunk, then the fp32 combine of (out, lse) in torch;
- cache_seqlens: rows of equal length that are neighbours in the batch form a run; each run is
  planned alone (a sync reads the lengths; ragged batches cost launches per run).

Every launch goes through `launch` (one function: the CPU tests replace interface.attention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from . import interface
from .inputs import device_props, validate_tensors
from .sm90.config import SUPPORTED_HEAD_DIMS, make_config

# num_splits=None (split_heuristic): a first guess, to be measured. Enough (batch x kv head x
# Q tile x split) tiles for about one wave of the SMs, at least MIN_SPLIT_KEYS keys per chunk.
DEFAULT_SMS = 132          # the SM count where q is not on a CUDA device (H100 SXM, H200)
FILL_FRACTION = 0.8        # this many tiles per SM already: no split
WAVE_EFFICIENCY = 0.85     # the smallest split count within this share of the best wave efficiency
MIN_SPLIT_KEYS = 512       # 4 KV blocks of 128 keys
MAX_SPLITS = 128
# Batch > 1: chunks tile the cache's allocation (the only strided view); a plan that would run
# more than this share of its used chunks again as chunks past the rows' lengths is not taken.
MAX_WASTE = 0.25
# ... then a run of at most this many rows is planned row by row (one set of launches each);
# a longer one runs unsplit.
MAX_ROWS_ONE_BY_ONE = 4


def launch(q, k, v, causal: bool, softmax_scale):
    """One forward launch: (out, lse) of fa4kernel's attention (every launch of this module)."""
    return interface.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True)


@dataclass(frozen=True)
class Piece:
    """One launch over `count` chunks per row: chunk s holds the row's keys [start + s * stride,
    start + s * stride + length); the first `used` chunks count, the others (past the row's
    length, launched because the view must tile the cache's allocation) are dropped."""

    start: int
    length: int
    stride: int
    count: int
    used: int


def _divisors(n: int) -> list:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _chunked(P: int, C: int, count: int, tiled: bool) -> list:
    """Pieces covering keys [0, P) with chunks of period C (m = ceil(P / C) of them used, count
    launched): the first piece takes C - delta keys of each period, delta = m * C - P, so its
    last chunk ends at P; a second one takes the other delta keys of the periods before the last.
    tiled: the view tiles the rows (batch > 1), so every piece launches all `count` chunks."""
    m = -(-P // C)
    delta = m * C - P
    pieces = [Piece(0, C - delta, C, count, m)]
    if delta and m > 1:
        pieces.append(Piece(C - delta, delta, C, count if tiled else m - 1, m - 1))
    return pieces


def plan_body(P: int, n: int, rows: int, period: Optional[int]) -> Optional[list]:
    """The pieces of keys [0, P) of a run of `rows` rows in about n chunks, or None where no
    strided view fits (batch > 1 and the cache's rows not `period` keys apart, or too much waste).
    period: keys from one row to the next (None: not a whole number of keys)."""
    if P == 0:
        return []
    n = max(1, min(n, P))
    if n == 1:
        return [Piece(0, P, 0, 1, 1)]
    if rows == 1:  # any chunk length: the view's batch stride is the chunk's
        C = -(-P // n)
        return _chunked(P, C, -(-P // C), False)
    if period is None:
        return None
    best = None
    for C in _divisors(period):
        m, count = -(-P // C), period // C
        if count - m > MAX_WASTE * m:
            continue
        key = (abs(m - n), m * C != P, -C)
        if best is None or key < best[0]:
            best = (key, C, count)
    if best is None:
        return None
    return _chunked(P, best[1], best[2], True)


def split_heuristic(batch: int, heads_kv: int, rows: int, keys: int, tile_m: int, sms: int,
                    tiling: Optional[int] = None) -> int:
    """num_splits=None: the smallest split count whose tiles (batch x heads_kv x Q tiles of the
    packed rows x splits) fill the SMs' waves within WAVE_EFFICIENCY of the best count's
    efficiency (FlashAttention's rule), a divisor of `tiling` (default keys) first: chunks that
    tile it exactly need no second launch; 1 where the tiles already fill FILL_FRACTION of the
    SMs; chunks of at least MIN_SPLIT_KEYS of the `keys` keys."""
    tiles = batch * heads_kv * -(-rows // tile_m)
    if tiles >= FILL_FRACTION * sms:
        return 1
    seqlen = tiling or keys
    top = max(1, min(MAX_SPLITS, keys // MIN_SPLIT_KEYS))
    eff = {}
    for n in range(1, top + 1):
        waves = tiles * n / sms
        eff[n] = waves / math.ceil(waves)
    best = max(eff.values())
    good = [n for n in eff if eff[n] >= WAVE_EFFICIENCY * best]
    whole = [n for n in good if seqlen % n == 0]
    return min(whole or good)


def plan_runs(body: list, num_splits: int, period: Optional[int]) -> list:
    """The launches of the packed body: [(first row, end row, pieces)] for the rows' body lengths
    (keys each new token sees before the tail) in about num_splits chunks (plan_body per run of
    equal lengths; a run with no strided view goes row by row up to MAX_ROWS_ONE_BY_ONE rows, else
    unsplit)."""
    runs = []
    for r0, r1, P in _runs(body):
        plan = plan_body(P, num_splits, r1 - r0, period)
        if plan is None and r1 - r0 <= MAX_ROWS_ONE_BY_ONE:
            runs += [(r, r + 1, plan_body(P, num_splits, 1, period)) for r in range(r0, r1)]
        else:
            runs.append((r0, r1, plan if plan is not None else plan_body(P, 1, r1 - r0, period)))
    return runs


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


def _runs(values: list) -> list:
    """Maximal runs of equal neighbours: [(first row, end row, value)]."""
    out = []
    for i, x in enumerate(values):
        if out and out[-1][2] == x:
            out[-1] = (out[-1][0], i + 1, x)
        else:
            out.append((i, i + 1, x))
    return out


def _period(t) -> Optional[int]:
    """Keys from one batch row of t to the next, where that is a whole number that tiles its rows."""
    sb, ss = t.stride(0), t.stride(1)
    if t.shape[0] == 1:
        return t.shape[1]
    if sb % ss or sb // ss != t.shape[1]:
        return None
    return t.shape[1]


def _view(t, r0: int, r1: int, piece: Piece):
    """Rows [r0, r1) of t, chunked as `piece`: (rows * count, length, heads_kv, d), a view."""
    if piece.count == 1:
        return t[r0:r1, piece.start:piece.start + piece.length]
    rows = r1 - r0
    sb, ss, sh, sd = t.stride()
    return t.as_strided((rows * piece.count, piece.length, t.shape[2], t.shape[3]),
                        (piece.stride * ss, ss, sh, sd),
                        t.storage_offset() + r0 * sb + piece.start * ss)


def combine(outs: list, lses: list, dtype):
    """Partials (rows, n_i, sq, h, d) and their lse (rows, n_i, h, sq) fp32 -> out (rows, sq, h, d)
    in dtype and lse (rows, h, sq): out = sum_s exp(lse_s - lse) out_s, lse = logsumexp_s lse_s,
    in fp32. Rows whose every lse is -inf (no key) give out 0, lse -inf."""
    import torch

    if len(outs) == 1 and outs[0].shape[1] == 1:
        return outs[0][:, 0].to(dtype), lses[0][:, 0]
    o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    lse = lses[0] if len(lses) == 1 else torch.cat(lses, dim=1)
    m = lse.amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)  # -inf -> finite: no NaN
    w = torch.exp(lse - m)                     # 0 for empty partials
    denom = w.sum(dim=1)                       # 0 where no partial saw a key, else >= 1
    lse_out = m[:, 0] + torch.log(denom)       # -inf there
    w = w / denom.clamp_min(1.0)[:, None]
    out = torch.einsum("bnhs,bnshd->bshd", w, o.float())
    return out.to(dtype), lse_out


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, causal: bool = True,
                           softmax_scale: Optional[float] = None, num_splits: Optional[int] = None,
                           return_lse: bool = False):
    """Attention of seqlen_q new tokens per row against a KV cache (flash_attn_with_kvcache's
    names): q (batch, seqlen_q, heads, d), k_cache / v_cache (batch, seqlen_cache, heads_kv, d),
    cache_seqlens (batch,) int32 or None (full cache); causal: bottom-right (new token t of row b
    sees keys j <= cache_seqlens[b] - seqlen_q + t). num_splits: KV chunks per row (None: a
    heuristic, split_heuristic; with batch > 1 the chunks tile seqlen_cache, so the count is the
    nearest that does). Returns out (batch, seqlen_q, heads, d) in q's dtype, and lse (batch,
    heads, seqlen_q) fp32 (natural log) if return_lse. A row that sees no key (cache length 0,
    not causal) gives out 0, lse -inf. Bad input: a one-line ValueError. No backward."""
    import torch

    b, sq, sk, h, hkv, d = _check(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, num_splits,
                                  return_lse)
    lens = _lengths(cache_seqlens, b, sq, sk, causal)
    g = h // hkv
    rows = sq * g
    tail = causal and sq > 1  # sq == 1: causal bottom-right sees the whole cache
    body = [x - sq if tail else x for x in lens]
    if num_splits is None:
        sms = device_props(q.device).multi_processor_count if q.device.type == "cuda" else DEFAULT_SMS
        tile_m = make_config("bfloat16" if q.dtype == torch.bfloat16 else "float16", d, False, True, {}).tile_m
        num_splits = split_heuristic(b, hkv, rows, max(body), tile_m, sms, sk if b > 1 else None)
    # packed q: (b, sq * g, hkv, d), row t * g + j = token t of q head kvh * g + j
    qp = q.view(b, sq, hkv, g, d).permute(0, 1, 3, 2, 4).reshape(b, rows, hkv, d)

    tail_out = tail_lse = None
    if tail:
        if cache_seqlens is None:
            kt, vt = k_cache[:, sk - sq:], v_cache[:, sk - sq:]
        else:
            pos = (cache_seqlens.long() - sq)[:, None] + torch.arange(sq, device=q.device)
            bi = torch.arange(b, device=q.device)[:, None]
            kt, vt = k_cache[bi, pos], v_cache[bi, pos]
        tail_out, tail_lse = launch(q, kt, vt, True, softmax_scale)  # (b, sq, h, d), (b, h, sq)

    periods = (_period(k_cache), _period(v_cache))
    period = periods[0] if periods[0] == periods[1] else None
    runs = plan_runs(body, num_splits, period)

    results = []
    for r0, r1, plan in runs:
        nb = r1 - r0
        outs, lses = [], []
        for piece in plan:
            qv = qp[r0:r1] if piece.count == 1 else qp[r0:r1].repeat_interleave(piece.count, dim=0)
            o, lse = launch(qv, _view(k_cache, r0, r1, piece), _view(v_cache, r0, r1, piece), False, softmax_scale)
            # unpack to (nb, used, sq, h, d) and (nb, used, h, sq)
            o = o.view(nb, piece.count, sq, g, hkv, d)[:, :piece.used].permute(0, 1, 2, 4, 3, 5)
            outs.append(o.reshape(nb, piece.used, sq, h, d))
            lse = lse.view(nb, piece.count, hkv, sq, g)[:, :piece.used].permute(0, 1, 2, 4, 3)
            lses.append(lse.reshape(nb, piece.used, h, sq))
        if tail:
            outs.append(tail_out[r0:r1, None])
            lses.append(tail_lse[r0:r1, None])
        results.append((r0, r1, combine(outs, lses, q.dtype) if outs else None))

    if len(results) == 1 and results[0][2] is not None:
        out, lse = results[0][2]
    else:
        out = torch.zeros((b, sq, h, d), dtype=q.dtype, device=q.device)
        lse = torch.full((b, h, sq), float("-inf"), dtype=torch.float32, device=q.device)
        for r0, r1, res in results:
            if res is not None:
                out[r0:r1], lse[r0:r1] = res
    return (out, lse) if return_lse else out
