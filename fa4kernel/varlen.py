"""Packed batches of unequal sequences (varlen) on SM90 (docs/varlen.md):

    out = attention(q, k, v, causal=False, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                    max_seqlen_q=None, max_seqlen_k=None, ...)

q (total_q, heads, d), k / v (total_k, heads_kv, d): the sequences one after the other, sequence
i's rows [cu_seqlens_q[i], cu_seqlens_q[i + 1]) of q and its keys likewise; cu_seqlens int32,
(sequences + 1,), starting at 0, non-decreasing (empty sequences allowed). Causal is bottom-right
within each sequence (flash_attn's convention). lse: (heads, total_q) fp32, natural log.

The forward is one launch of the forward's varlen build (sm90/fwd.py, FlashFwdSm90Varlen): the
batch's Q tiles in (sequence, head, Q tile) order, counted on the device from cu_seqlens; one
persistent CTA per SM takes the next of them from a tile counter as it frees up (persistent=False:
one CTA per tile; grid_ctas). max_seqlen_q bounds the tile count: given on a GPU, the lengths are
not read on the host (no sync; a max_seqlen_q below the longest sequence may leave rows unwritten,
as flash_attn does); left None, or with cu_seqlens on the CPU, they are read and checked (one
sync).

MQA (heads_kv == 1, heads > 1): the forward runs the varlen build's pack-GQA form
(KernelConfig.pack_gqa) on q viewed as (total_q x heads, 1, d), row token * heads + j for q head
j (pack_plan; pack_gqa=False turns it off); out is the same view, lse comes back as (heads,
total_q), and the backward is the unpacked one's.

The backward is one launch of the backward's varlen build (sm90/bwd.py, FlashBwdSm90Varlen):
one CTA per (key block, k/v head, sequence) up to max_seqlen_k's key blocks, its sequence's
bounds read from cu_seqlens on the device, between the varlen preprocess and postprocess (three
launches, no sync; the layout they share: sm90/bwd_varlen.py). deterministic=True adds dQ in a
fixed order per query block (a semaphore each, as the dense backward does).
"""

from __future__ import annotations

import math
from typing import Optional

from .inputs import validate_tensors
from .sm90.config import SUPPORTED_HEAD_DIMS, make_varlen_config

# pack-GQA by default wherever the packed rows are a view of q (MQA): bench_varlen_sm90.py's mqa
# batch (32 q heads on one k/v head, hd128 causal) ran 6.7 % faster packed on an H200 and 7.7 %
# on an H100, same run (lab/campaigns/varlen-sm90/). None: pack where it is a view; True: pack or
# a ValueError saying why not; False: never
PACK_GQA_DEFAULT = None


def _check_cu(name: str, cu, device):
    import torch

    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
        what = f"{cu.dtype} {tuple(cu.shape)}" if isinstance(cu, torch.Tensor) else type(cu).__name__
        raise ValueError(f"{name} is {what}; allowed: an int32 tensor (sequences + 1,) of offsets, starting at 0")
    if cu.device.type != "cpu" and cu.device != device:
        raise ValueError(f"{name} on {cu.device}, q on {device}; allowed: q's device or the CPU")


def _check_max(name: str, x):
    if x is not None and (isinstance(x, bool) or not isinstance(x, int) or x < 0):
        raise ValueError(f"{name}={x!r}; allowed: None (read from cu_seqlens) or an int >= 0")


def lengths(name: str, cu, total: int) -> list:
    """The sequences' lengths from cu_seqlens (read on the host), checked: starts at 0, never
    decreases, ends within the packed tensor's `total` rows."""
    offs = [int(x) for x in cu.tolist()]
    if offs[0] != 0:
        raise ValueError(f"{name}[0]={offs[0]}; allowed: 0 (offsets of the packed rows)")
    for i in range(1, len(offs)):
        if offs[i] < offs[i - 1]:
            raise ValueError(f"{name}[{i}]={offs[i]} < {name}[{i - 1}]={offs[i - 1]}; allowed: non-decreasing offsets")
    if offs[-1] > total:
        raise ValueError(f"{name}[-1]={offs[-1]} past the {total} packed rows; allowed: at most {total}")
    return [offs[i + 1] - offs[i] for i in range(len(offs) - 1)]


def _max_length(side: str, cu, given, total: int, what: str):
    """max_seqlen_<side> as given, or read from cu_seqlens_<side> where None or where the offsets
    are on the CPU (then checked: at least the longest sequence)."""
    if given is not None and cu.device.type != "cpu":
        return given
    longest = max(lengths(f"cu_seqlens_{side}", cu, total))
    if given is not None and given < longest:
        raise ValueError(f"max_seqlen_{side}={given} < the longest sequence's {longest} {what}; allowed: >= {longest}")
    return longest if given is None else given


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                 return_lse):
    """One-line ValueErrors; returns (sequences, heads, heads_kv, d, dtype, max_seqlen_q, max_seqlen_k),
    the max lengths read from cu_seqlens where not given (or where cu_seqlens are on the CPU)."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (total tokens, heads, head_dim) with cu_seqlens, got shape "
                             f"{tuple(t.shape)}")
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("cu_seqlens_q and cu_seqlens_k: allowed: both given (varlen) or neither")
    _check_cu("cu_seqlens_q", cu_seqlens_q, q.device)
    _check_cu("cu_seqlens_k", cu_seqlens_k, q.device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.numel()} offsets, cu_seqlens_k {cu_seqlens_k.numel()}; "
                         "allowed: one per sequence + 1 in both")
    _check_max("max_seqlen_q", max_seqlen_q)
    _check_max("max_seqlen_k", max_seqlen_k)
    # dtypes, head dims, GQA, strides, the scale: the kernel's own checks, on the packed tensors
    validate_tensors(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), causal, softmax_scale, return_lse,
                     head_dims=SUPPORTED_HEAD_DIMS, gqa=True)
    n = cu_seqlens_q.numel() - 1
    if n > 65535:
        raise ValueError(f"{n} sequences; allowed: at most 65535 (grid limits)")
    max_seqlen_q = _max_length("q", cu_seqlens_q, max_seqlen_q, q.shape[0], "rows")
    max_seqlen_k = _max_length("k", cu_seqlens_k, max_seqlen_k, k.shape[0], "keys")
    dtype = "bfloat16" if q.dtype == torch.bfloat16 else "float16"
    return n, q.shape[1], k.shape[1], q.shape[2], dtype, max_seqlen_q, max_seqlen_k


def pack_plan(pack_gqa, q, k) -> int:
    """The q heads packed into each token's rows (KernelConfig.pack_gqa), 1 for none: q's heads
    with MQA (q (total_q, heads, d), k (total_k, 1, d)), where q viewed as (total_q x heads, 1, d)
    is row token * heads + j (q head j): q's heads of a token adjacent in memory. pack_gqa None
    packs where that view exists, True asks for it (a one-line ValueError where it does not),
    False never packs."""
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise ValueError(f"pack_gqa={pack_gqa!r}; allowed: None (where the packed rows are a view of q), True or False")
    h, hkv = q.shape[1], k.shape[1]
    if pack_gqa is False or h == 1:
        return 1
    # why the packed rows would be no view of q (the first that holds), None where they are one
    why_not = next((reason for bad, reason in (
        (hkv != 1, f"heads_kv={hkv}; allowed: heads_kv == 1 (MQA, where the packed rows are a view of q)"),
        (q.shape[0] * h >= 2 ** 31, f"{q.shape[0]} x {h} packed rows; allowed: fewer than 2^31 (the kernel's "
                                    "int32 row offsets)"),
        (q.shape[0] > 1 and q.stride(0) != h * q.stride(1),
         f"q.stride()={tuple(q.stride())}; allowed: q.stride(0) == heads x q.stride(1) (a token's heads "
         "adjacent, so the packed rows are a view)"),
    ) if bad), None)
    if why_not is None:
        return h
    if pack_gqa is None:
        return 1
    raise ValueError(f"pack_gqa=True with {why_not}, or pack_gqa=False")


def packed_view(t, group: int):
    """q or out (total_q, heads, d) as the launch takes it: (1, total_q, heads, d), or with the
    pack (group = heads) (1, total_q x heads, 1, d), row token * heads + j: a view, no copy."""
    if group == 1:
        return t.unsqueeze(0)
    return t.view(1, t.shape[0] * group, 1, t.shape[2])


def varlen_config(d: int, dtype: str, causal: bool, has_lse: bool, max_seqlen_q: int, max_seqlen_k: int,
                  knobs: dict, tile_rule, group: int = 1):
    """The forward's varlen build for these options: the tile shape the plain forward takes for
    the longest sequence (interface.tile_rule) unless the knobs set one; group > 1: the pack-GQA
    build (pack_plan), whose longest sequence has max_seqlen_q x group rows (a tile's diagonal
    spans tile_m / group tokens)."""
    if knobs.get("tile_m") is None and knobs.get("tile_n") is None:
        knobs = {**tile_rule(d, causal, max(max_seqlen_q * group, 1), max(max_seqlen_k, 1)), **knobs}
    return make_varlen_config(dtype, d, causal, has_lse, knobs, pack_gqa=group > 1)


def tile_bound(sequences: int, total_q: int, max_seqlen_q: int, heads: int, tile_m: int) -> int:
    """At most this many Q tiles (x heads) in a batch of `sequences` sequences of at most
    max_seqlen_q rows within total_q packed rows: sum ceil(L_i / tile_m) <= (total_q + sequences
    (tile_m - 1)) / tile_m, and <= sequences ceil(max_seqlen_q / tile_m)."""
    per_head = min(sequences * -(-max_seqlen_q // tile_m), (total_q + sequences * (tile_m - 1)) // tile_m)
    return heads * per_head


def grid_ctas(persistent: bool, tiles: int, sms: int) -> int:
    """The varlen build's grid: one CTA per SM when persistent (never more than the tiles), else
    one per tile; at least one."""
    return max(1, min(tiles, sms) if persistent else tiles)


def forward(run, cfg, q, k, v, cu_q, cu_k, max_seqlen_q: int, softmax_scale):
    """out (total_q, heads, d), lse (heads, total_q) (None unless cfg.has_lse) of one launch of
    the varlen build; run takes the bound on its tiles (tile_bound) and sizes the grid. With
    cfg.pack_gqa q and out go as packed_view's rows, the group (q's heads) with them; lse keeps
    its layout (the kernel writes row token * heads + j at [j, token])."""
    import torch

    group = q.shape[1] if cfg.pack_gqa else 1
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device) if cfg.has_lse else None
    tiles = tile_bound(cu_q.numel() - 1, q.shape[0] * group, max_seqlen_q * group, q.shape[1] // group,
                       cfg.tile_m)
    run(cfg, packed_view(q, group), k.unsqueeze(0), v.unsqueeze(0), packed_view(out, group),
        lse.unsqueeze(0) if lse is not None else None, cu_q, cu_k, tiles, softmax_scale, group=group)
    return out, lse


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_seqlen_q: int, max_seqlen_k: int, softmax_scale, bcfg):
    """dq, dk, dv: one launch of the backward's varlen build (bcfg) between its pre- and postprocess."""
    from .sm90.bwd import run_bwd_varlen

    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return run_bwd_varlen(bcfg, dout, q, k, v, out, lse, cu_q, cu_k, max_seqlen_q, max_seqlen_k, scale)


def _function():
    import torch

    class FlashAttnVarlenFuncSm90(torch.autograd.Function):
        """out, lse = the varlen forward, saving q, k, v, out, lse; backward: backward()."""

        @staticmethod
        def forward(ctx, run, cfg, q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, softmax_scale, bcfg):
            out, lse = forward(run, cfg, q.detach(), k.detach(), v.detach(), cu_q, cu_k, max_seqlen_q,
                               softmax_scale)
            ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
            ctx.max_seqlen, ctx.softmax_scale, ctx.bcfg = (max_seqlen_q, max_seqlen_k), softmax_scale, bcfg
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
            dq, dk, dv = backward(dout, q.detach(), k.detach(), v.detach(), out, lse, cu_q, cu_k, *ctx.max_seqlen,
                                  ctx.softmax_scale, ctx.bcfg)
            return None, None, dq, dk, dv, None, None, None, None, None, None

    return FlashAttnVarlenFuncSm90


_FUNC = None


def attention_varlen(run, tile_rule, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: Optional[int],
                     max_seqlen_k: Optional[int], causal: bool, softmax_scale, return_lse: bool,
                     deterministic: bool, bwd_knobs: dict, knobs: dict):
    """attention() with cu_seqlens (module docstring). run: the varlen build's launch
    (interface.run_varlen); tile_rule: interface.tile_rule (this module stays below the host API).
    knobs: the forward's, and pack_gqa (PACK_GQA_DEFAULT; pack_plan)."""
    global _FUNC
    from .autograd import check_backward_supported, needs_grad
    from .inputs import validate_device

    n, h, hkv, d, dtype, max_q, max_k = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                     max_seqlen_k, causal, softmax_scale, return_lse)
    knobs = dict(knobs)
    group = pack_plan(knobs.pop("pack_gqa", PACK_GQA_DEFAULT), q, k)
    grad = needs_grad(q, k, v)
    bcfg = None
    if grad:
        from .sm90.bwd_config import make_varlen_bwd_config

        check_backward_supported(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), causal, deterministic, **bwd_knobs)
        from .inputs import device_props
        from .sm90.bwd_config import TAIL_SLOTS, with_dq_slices_default, with_gqa_default

        # the packed keys' blocks stand for the sequences' (no read of cu_seqlens on the host),
        # the longest sequences for a CTA's walk and a head's key blocks (dq_slices)
        sms = device_props(q.device).multi_processor_count if q.device.type == "cuda" else TAIL_SLOTS
        bwd_knobs = with_gqa_default(bwd_knobs, d, h, hkv, 1, k.shape[0], deterministic, sms, causal, q.shape[0])
        bwd_knobs = with_dq_slices_default(bwd_knobs, dtype, d, causal, deterministic, max_q, max_k, h // hkv)
        bcfg = make_varlen_bwd_config(dtype, d, causal, bwd_knobs, deterministic)
    cfg = varlen_config(d, dtype, causal, return_lse or grad, max_q, max_k, knobs, tile_rule, group)
    validate_device(q, k, v)
    cu_q = cu_seqlens_q.to(q.device).contiguous()
    cu_k = cu_seqlens_k.to(q.device).contiguous()
    if grad:
        if _FUNC is None:
            _FUNC = _function()
        out, lse = _FUNC.apply(run, cfg, q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, bcfg)
    else:
        out, lse = forward(run, cfg, q, k, v, cu_q, cu_k, max_q, softmax_scale)
    return (out, lse) if return_lse else out
