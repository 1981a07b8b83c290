"""Which KV blocks a Q tile visits, and where the length and causal masks cut: one definition
for both kernels (at trace time, on DSL values) and the host's tile schedule (on Python ints).

A Q tile of `tile_m` query rows starting at row m_block * tile_m walks the KV blocks
[0, n_block_max), last first. Causal attention is bottom-right aligned, as in flash_attn: key j
is visible to query i iff j <= i + seqlen_k - seqlen_q. Blocks >= n_unmasked hold keys above
the diagonal for some row of the tile and need the causal mask; the last block (partial when
seqlen_k is not a multiple of tile_n) needs the length mask.

The arithmetic is written once, on an `ops` namespace (ceil_div, max, min): PY_OPS for host
Python ints, dsl_ops() for the CuTe DSL's Int32 values inside @cute.jit code (cute.ceil_div,
cutlass.max / min). Pure Python at import: the DSL is imported only by dsl_ops().
"""
from __future__ import annotations

from types import SimpleNamespace

PY_OPS = SimpleNamespace(ceil_div=lambda a, b: -(-a // b), max=max, min=min)


def dsl_ops():
    """The DSL's integer ops (for calls from @cute.jit code)."""
    import cutlass
    import cutlass.cute as cute

    return SimpleNamespace(ceil_div=cute.ceil_div, max=cutlass.max, min=cutlass.min)


def kv_block_range(m_block, tile_m: int, tile_n: int, seqlen_q, seqlen_k, causal: bool, ops=PY_OPS):
    """(n_block_max, n_unmasked) of Q tile m_block: blocks [0, n_block_max) are visited; with
    causal, blocks >= n_unmasked need the diagonal mask. A causal tile whose rows see no key at
    all still runs one fully masked block (its O is 0), so n_block_max >= 1."""
    n_block_max = ops.ceil_div(seqlen_k, tile_n)
    n_unmasked = n_block_max
    if causal:
        offset = seqlen_k - seqlen_q
        last_col = ops.max((m_block + 1) * tile_m + offset, 0)
        n_block_max = ops.min(n_block_max, ops.ceil_div(last_col, tile_n))
        n_block_max = ops.max(n_block_max, 1)
        n_unmasked = ops.max(m_block * tile_m + offset + 1, 0) // tile_n
    return n_block_max, n_unmasked


def packed_kv_block_range(m_block, tile_m: int, tile_n: int, rows, group, seqlen_k, causal: bool, ops=PY_OPS):
    """kv_block_range for pack-GQA rows (the varlen build's KernelConfig.pack_gqa): a sequence's
    `rows` = tokens x group packed rows, row r = token r // group, which sees key j iff j <=
    offset + token, offset = seqlen_k - tokens (bottom-right, as kv_block_range). Returns
    (n_block_max, n_unmasked, offset): the tile's last row's token (clamped to the sequence) bounds
    its blocks, its first row's token the unmasked ones; n_block_max >= 1 as there."""
    n_block_max = ops.ceil_div(seqlen_k, tile_n)
    n_unmasked = n_block_max
    tokens = rows // group
    offset = seqlen_k - tokens
    if causal:
        last_token = ops.min(((m_block + 1) * tile_m - 1) // group, tokens - 1)
        n_block_max = ops.min(n_block_max, ops.ceil_div(ops.max(offset + last_token + 1, 0), tile_n))
        n_block_max = ops.max(n_block_max, 1)
        n_unmasked = ops.max(offset + (m_block * tile_m) // group + 1, 0) // tile_n
    return n_block_max, n_unmasked, offset


def seqlen_col_limit(n_block, tile_n: int, seqlen_k, col0=None):
    """Columns of KV block n_block at or past this one lie beyond seqlen_k (the length mask).
    col0: count columns from this one (a thread's first column) instead of the block's first."""
    limit = seqlen_k - n_block * tile_n
    return limit if col0 is None else limit - col0


def causal_col_limit(row, n_block, tile_n: int, seqlen_q, seqlen_k, col0=None):
    """For query `row`, columns of KV block n_block at or past this one lie above the diagonal.
    col0: as seqlen_col_limit. (The two forms add up in the order each kernel has always compiled
    them: integer reassociation moves a few address instructions in ptxas's schedule.)"""
    if col0 is None:
        return row + (seqlen_k - seqlen_q) + 1 - n_block * tile_n
    return row + (seqlen_k - seqlen_q) - n_block * tile_n - col0 + 1


def decode_block_range(m_block, split, num_splits, tile_m: int, tile_n: int, rows, group, seqlen_k,
                       seqlen_cache, causal: bool, ops=PY_OPS):
    """The decode build's KV range of one CTA: Q tile m_block of a row's `rows` packed rows (row r
    = new token r // group of q head kv_head * group + r % group; rows // group new tokens), split
    `split` of num_splits, the row holding seqlen_k keys (clamped to [0, seqlen_cache]).

    Returns (n_block_min, n_blocks, key_limit, causal_offset), local to the split: the CTA visits
    absolute blocks [n_block_min, n_block_min + n_blocks); local key j (absolute n_block_min *
    tile_n + j) counts iff j < key_limit and, with causal, j <= causal_offset + token. The tile's
    blocks (up to the last key its last token sees) go to the splits in equal runs of
    ceil(blocks / num_splits); a split past them is empty: one block, key_limit 0 (every key
    masked: out 0, lse -inf), so no CTA needs a loop of zero trips."""
    seqlen_k = ops.min(ops.max(seqlen_k, 0), seqlen_cache)
    end = seqlen_k
    tokens = rows // group
    if causal:
        last_token = ops.min(((m_block + 1) * tile_m - 1) // group, tokens - 1)
        end = ops.max(seqlen_k - tokens + last_token + 1, 0)
    blocks = ops.ceil_div(end, tile_n)
    per = ops.ceil_div(blocks, num_splits)
    n_min = split * per
    n_blocks = ops.min(blocks - n_min, per)
    live = ops.min(ops.max(n_blocks, 0), 1)  # 0 for an empty split
    n_min = n_min * live
    base = n_min * tile_n
    return n_min, ops.max(n_blocks, 1), (seqlen_k - base) * live, seqlen_k - base - tokens


def decode_unmasked(m_block, tile_m: int, tile_n: int, group, causal_offset, ops=PY_OPS):
    """Local blocks >= this one hold a key above some row's causal limit (decode_block_range's
    offset; the tile's first row has the smallest limit)."""
    first_token = (m_block * tile_m) // group
    return ops.max(causal_offset + first_token + 1, 0) // tile_n
