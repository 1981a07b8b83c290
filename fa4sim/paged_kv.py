"""Paged KV: K and V in pages of `page_size` tokens, found through a page table (one row of page
indices per sequence), as vLLM and SGLang keep a decode cache. How the SM90 forwards load such a
cache, and what the cp.async path costs the producer warpgroup.

- TMA path: where a KV block lies inside one page, the producer's TMA reads it as from a
  contiguous cache, the page's index looked up once per block. FlashAttention-3 takes it where
  page_size is a multiple of its (unpaged) kBlockN and the packed query rows (seqlen_q x q heads
  per K/V head) exceed its kBlockM (flash_api.cpp get_pagedkv_tma; decode rows never do);
  flash-attn-4's SM90 forward where page_size equals its tile_n (interface.py
  paged_kv_non_tma = page_size not in (None, tile_n)).
- cp.async path (FlashAttention-3's PagedKVNonTMA, flash-attn-4's PagedKVManager): the producer
  warpgroup's 128 threads copy 16 bytes each per cp.async (LDGSTS), a few threads per key row
  (a row's 64-element chunks), each row's address from its page: one page-table load and a 64-bit
  address per row-group a thread owns, passed along the threads of a row by a warp shuffle
  (hopper/paged_kv.h). FlashAttention-3 then also narrows its tile at some head dims and packs
  GQA rows (tile_size.h with paged_kv_non_TMA; get_pack_gqa).

What fa4sim counts for the cp.async path (cp_async_instructions): the thread instructions of one
KV block's K and V copies (the producer's issue slots, the LSU's warp instructions) and one more
L2 round trip before the K copies (the page-table load they wait on). The bytes are a contiguous
cache's: HBM and L2 traffic do not change with paging.
"""
from __future__ import annotations

import math

PRODUCER_THREADS = 128  # the producer warpgroup (FlashAttention-3's NumProducerThreads)
LOAD_BYTES = 16         # one cp.async.cg of 16 bytes per thread (SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>)
ELEM_BYTES = 2          # bf16 / fp16
# per page-table entry a thread owns: the entry's load, FastDivmod's divmod of the row index by
# page_size (a multiply-high, a shift, a multiply-subtract), and the 64-bit row addresses of K and V
# (a wide multiply-add each, over the page and head strides): hopper/paged_kv.h load_page_table,
# compute_K_ptr, compute_V_ptr
PER_PAGE_ENTRY = 1 + 3 + 2 * 2
# per cp.async: its address from the row's (shuffled) base and the chunk's offset, and its predicate
PER_COPY = 1


def row_chunk_elems(d: int, dv: int) -> int:
    """Elements one thread row-chunk covers (paged_kv.h kBlockKGmem): 128, 64 or 32 bytes of the
    head dims' common divisor."""
    row_bytes = math.gcd(d, dv) * ELEM_BYTES
    return (128 if row_bytes % 128 == 0 else 64 if row_bytes % 64 == 0 else 32) // ELEM_BYTES


def cp_async_instructions(tile_n: int, d: int, dv: int) -> dict:
    """Per producer thread, for one KV block of tile_n keys: {'copies': cp.async of K and V,
    'shuffles': the row addresses passed along a row's threads, 'page_entries': page-table entries
    it owns, 'instructions': all of them with the address and divmod work}."""
    threads_per_row = row_chunk_elems(d, dv) * ELEM_BYTES // LOAD_BYTES
    rows_per_pass = PRODUCER_THREADS // threads_per_row
    groups = math.ceil(tile_n / rows_per_pass)  # key rows a thread copies into (the copy's M mode)
    per_row = lambda cols: math.ceil(cols * ELEM_BYTES / (threads_per_row * LOAD_BYTES))  # noqa: E731
    copies = groups * (per_row(d) + per_row(dv))
    shuffles = 2 * groups
    entries = math.ceil(groups / threads_per_row)
    return {"copies": copies, "shuffles": shuffles, "page_entries": entries,
            "instructions": copies * (1 + PER_COPY) + shuffles + entries * PER_PAGE_ENTRY}


def fa3_paged_tma(page_size: int, q_rows_packed: int, tile_m: int, tile_n: int) -> bool:
    """FlashAttention-3's get_pagedkv_tma: its TMA path for a paged cache, with its unpaged tile."""
    return page_size > 0 and page_size % tile_n == 0 and q_rows_packed > tile_m
