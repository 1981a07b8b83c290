"""A paged KV cache (Problem.page_size, fa4sim/paged_kv.py): which SM90 forwards read one, which load
path each takes (FlashAttention-3's get_pagedkv_tma, flash-attn-4's page_size == tile_n), what the
cp.async path costs the producer, and the clean errors elsewhere."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fa4sim import Problem, simulate
from fa4sim.errors import InputError
from fa4sim.model import build_cta, setup
from fa4sim.paged_kv import cp_async_instructions, fa3_paged_tma


def knobs(p, impl):
    return setup("h200", None, p, {}, impl, "fwd")[4]


def decode(page, heads=32, heads_kv=8, hdim=128):
    return Problem(8, heads, 1, 32768, hdim, heads_kv=heads_kv, page_size=page)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "16", 1 << 40])
def test_page_size_is_checked(bad):
    with pytest.raises(InputError, match="page_size"):
        Problem(1, 8, 1, 4096, 128, page_size=bad)


def test_a_contiguous_cache_is_page_size_0():
    assert Problem(1, 8, 1, 4096, 128).page_size == 0 and not Problem(1, 8, 1, 4096, 128).is_paged
    assert Problem.varlen(8, 128, [1, 1], [4096, 100], page_size=16).page_size == 16


def test_cp_async_counts_follow_the_paged_kv_manager():
    """hd128, 128 keys: 8 threads per 64-element row chunk, 16 rows a pass, 8 row groups of 2 chunks
    each for K and for V: 32 copies, 16 shuffles, one page-table entry per thread."""
    c = cp_async_instructions(128, 128, 128)
    assert (c["copies"], c["shuffles"], c["page_entries"]) == (32, 16, 1)
    assert c["instructions"] == 32 * 2 + 16 + 8
    c96 = cp_async_instructions(128, 96, 96)  # 192-byte rows: 32-element chunks, 4 threads per row
    assert (c96["copies"], c96["page_entries"]) == (4 * 3 * 2, 1)


def test_flash_attn_3_takes_tma_only_where_pages_hold_its_blocks_and_rows_fill_a_tile():
    assert fa3_paged_tma(256, 4096, 128, 128) and not fa3_paged_tma(256, 4096, 128, 176)
    assert not fa3_paged_tma(256, 4, 64, 128)  # decode: the packed rows do not exceed kBlockM
    # decode: the cp.async path at any page size, its paged tile (128 keys at hd128) and pack-GQA
    for page in (16, 64, 256):
        k = knobs(decode(page), "flash-attn-3")
        assert (k["kv_load"], k["tile_n"], k["pack_gqa"]) == ("cp_async", 128, True)
    assert knobs(decode(0), "flash-attn-3")["tile_n"] == 176
    # prefill, causal hd128 (unpaged kBlockN 128): pages of 256 on TMA, of 16 by cp.async
    pre = lambda page, causal: Problem(2, 32, 4096, 4096, 128, causal, heads_kv=8, page_size=page)  # noqa: E731
    assert knobs(pre(256, True), "flash-attn-3")["kv_load"] == "tma"
    assert knobs(pre(16, True), "flash-attn-3")["kv_load"] == "cp_async"
    # non-causal hd128 (kBlockN 176): 256 is no multiple, 352 is
    assert (knobs(pre(256, False), "flash-attn-3")["kv_load"], knobs(pre(256, False), "flash-attn-3")["tile_n"]) \
        == ("cp_async", 128)
    assert (knobs(pre(352, False), "flash-attn-3")["kv_load"], knobs(pre(352, False), "flash-attn-3")["tile_n"]) \
        == ("tma", 176)
    # the other head dims' paged tiles (tile_size.h with paged_kv_non_TMA)
    for hd, want in ((64, 160), (96, 128), (192, 96), (256, 80)):
        assert knobs(Problem(2, 8, 4096, 4096, hd, page_size=16), "flash-attn-3")["tile_n"] == want, hd


def test_flash_attn_4_takes_tma_where_a_page_is_its_tile():
    assert knobs(decode(128), "flash-attn-4")["kv_load"] == "tma"
    assert knobs(decode(256), "flash-attn-4")["kv_load"] == "cp_async"
    assert knobs(decode(16), "flash-attn-4")["kv_load"] == "cp_async"
    with pytest.raises(InputError, match="without cu_seqlens_k"):
        simulate("h200", problem=Problem.varlen(8, 128, [1, 1], [4096, 100], page_size=16), impl="flash-attn-4")


def test_the_cp_async_path_is_the_producers_work_and_one_more_round_trip():
    p = decode(16)
    sched = build_cta("h200", p, {}, n_kv=4, masked=0, impl="flash-attn-3", pass_="fwd")
    ops = {o.name: o for o in sched.ops}
    assert "lsu" in dict(ops["LK"].uses) and "tma" not in dict(ops["LK"].uses)
    assert ops["LK"].latency == pytest.approx(2 * ops["LV"].latency)
    c = cp_async_instructions(128, 128, 128)
    assert ops["LK"].issue_cycles + ops["LV"].issue_cycles == pytest.approx(c["instructions"])


def test_a_tma_paged_cache_costs_what_a_contiguous_one_does():
    pre = lambda page: Problem(2, 32, 4096, 4096, 128, True, heads_kv=8, page_size=page)  # noqa: E731
    a, b = simulate("h200", problem=pre(0), impl="flash-attn-3"), simulate("h200", problem=pre(256), impl="flash-attn-3")
    assert a.time_us == pytest.approx(b.time_us)
    assert any("paged KV" in n for n in b.notes)
    c = simulate("h200", problem=pre(16), impl="flash-attn-3")  # by cp.async: the producer's work added
    assert c.time_us > a.time_us


def test_kernels_without_a_paged_cache_say_so():
    with pytest.raises(InputError, match="flash-attn-3-sm90"):
        simulate("h200", problem=decode(16), impl="fa4kernel")
    with pytest.raises(InputError, match="--pass bwd: 0"):
        simulate("h200", problem=Problem(1, 8, 1024, 1024, 128, page_size=16), impl="flash-attn-3", pass_="bwd")


def test_cli_page_size():
    run = lambda *a: subprocess.run([sys.executable, "-m", "fa4sim", "run", "--hw", "h200", *a],  # noqa: E731
                                    capture_output=True, text=True)
    r = run("--impl", "flash-attn-3", "--seqlen", "1", "--seqlen-k", "8192", "--heads-kv", "4", "--page-size", "16",
            "--json", "--compact")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["knobs"]["kv_load"] == "cp_async"
    bad = run("--page-size", "-3")
    assert bad.returncode == 2 and "page_size" in bad.stderr and "Traceback" not in bad.stderr


def test_flash_attn_4_on_sm100_loads_pages_that_are_not_its_tile_by_cp_async():
    """flash-attn-4's SM100 forward: pages of its 128-key tile by TMA, as a contiguous cache (the same
    time); other pages by cp.async from its load warps (4 with one Q tile), without the CTA pair and
    the S ping-pong (interface.py: both need page_size in (None, tile_n))."""
    k_of = lambda p: setup("b200", None, p, {}, None, "fwd")[4]  # noqa: E731
    pre = lambda page: Problem(2, 16, 8192, 8192, 128, page_size=page)  # noqa: E731
    assert (k_of(pre(0))["two_cta"], k_of(pre(128))["two_cta"]) == (True, True)
    k16 = k_of(pre(16))
    assert (k16["kv_load"], k16["two_cta"]) == ("cp_async", False)
    assert simulate("b200", problem=pre(128)).time_us == pytest.approx(simulate("b200", problem=pre(0)).time_us)
    one = k_of(decode(16))
    assert (one["q_tiles"], one["s_stages"], one["kv_load"]) == (1, 1, "cp_async")
    sched = build_cta("b200", decode(16), {}, n_kv=4, masked=0, pass_="fwd")
    lk = next(o for o in sched.ops if o.name == "LK")
    assert lk.issue_cycles > cp_async_instructions(128, 128, 128, 128)["copies"]  # 4 warps' share of the copies
    with pytest.raises(InputError, match="two_cta"):
        simulate("b200", problem=pre(16), overrides={"two_cta": True})
