"""Paged KV: K and V in pages of `page_size` tokens, found through a page table (one row of page
indices per sequence), as vLLM and SGLang keep a decode cache. How the SM90 forwards load such a
cache, and what the cp.async path costs the producer warpgroup.

- TMA path: where a KV block lies inside one page, the producer's TMA reads it as from a
  contiguous cache, the page's index looked up once per block. FlashAttention-3 takes it where
  page_size is a multiple of its (unpaged) kBlockN and the packed query rows (seqlen_q x q heads
  per K/V head) exceed its kBlockM (flash_api.cpp get_pagedkv_tma; decode rows never do);
  flash-attn-4 (SM90 and SM100) where page_size equals its tile_n (interface.py
  paged_kv_non_tma = page_size not in (None, tile_n)).
- cp.async path (FlashAttention-3's PagedKVNonTMA, flash-attn-4's PagedKVManager): the loading
  threads (SM90: the producer warpgroup's 128; flash-attn-4 on SM100: its load warps) copy 16
  bytes each per cp.async (LDGSTS), a few threads per key row
  (a row's 64-element chunks), each row's address from its page: one page-table load and a 64-bit
  address per row-group a thread owns, passed along the threads of a row by a warp shuffle
  (hopper/paged_kv.h). FlashAttention-3 then also narrows its tile at some head dims and packs
  GQA rows (tile_size.h with paged_kv_non_TMA; get_pack_gqa); flash-attn-4 on SM100 gives up its
  CTA pair and its S ping-pong (both need pages of tile_n keys).

What fa4sim counts for the cp.async path (cp_async_instructions): the thread instructions of one
KV block's K and V copies (the producer's issue slots, the LSU's warp instructions) and one more
L2 round trip before the K copies (the page-table load they wait on). The bytes are a contiguous
cache's: HBM and L2 traffic do not change with paging.
"""
from __future__ import annotations

import math

from .engine import Op
from .hardware import LSU_WARP_INSTR_PER_CLK

PRODUCER_THREADS = 128  # SM90: the producer warpgroup (FlashAttention-3's NumProducerThreads)
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


def cp_async_instructions(tile_n: int, d: int, dv: int, threads: int = PRODUCER_THREADS) -> dict:
    """Per loading thread (`threads` of them), for one KV block of tile_n keys: {'copies': cp.async
    of K and V, 'shuffles': the row addresses passed along a row's threads, 'page_entries':
    page-table entries it owns, 'instructions': all of them with the address and divmod work}."""
    threads_per_row = min(row_chunk_elems(d, dv) * ELEM_BYTES // LOAD_BYTES, threads)
    rows_per_pass = threads // threads_per_row
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


def cp_async_loads(hw, n: int, d: int, dv: int, threads: int, role: str = "load") -> list:
    """A paged cache's K and V blocks of n keys by cp.async (knob kv_load cp_async) as two ops,
    LK and LV, of the loading role: its `threads` issue each block's copies, shuffles and
    page-table work (their instructions per thread the role's time, all of them the SM's issue
    slots, the copies and shuffles the LSU's warp instructions); K waits for its page-table load
    first (an L2 round trip), then both for their data."""
    c = cp_async_instructions(n, d, dv, threads)
    warps = max(1, threads // 32)
    k_part = d / (d + dv)  # K's share of the copies and shuffles
    out = []
    for name, share, page, lat in (("LK", k_part, True, 2 * hw.l2_latency), ("LV", 1.0 - k_part, False, hw.l2_latency)):
        instr = (c["copies"] * (1 + PER_COPY) + c["shuffles"]) * share + (c["page_entries"] * PER_PAGE_ENTRY if page else 0)
        lsu = (c["copies"] + c["shuffles"]) * share * warps / LSU_WARP_INSTR_PER_CLK
        out.append(Op(name, role, (("lsu", lsu), ("issue", instr * warps / hw.issue_per_clk)), lat, "load",
                      asynchronous=True, issue_cycles=instr,
                      label=f"cp.async {name[1]} block (paged: {c['page_entries']} page-table entries per thread)"
                      if page else f"cp.async {name[1]} block"))
    return out
