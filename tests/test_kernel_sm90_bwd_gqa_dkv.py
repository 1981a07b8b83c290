"""CPU-only: the backward's gqa_dkv="reduce" build (one CTA per key block of each q head, dK and
dV added into fp32 accumulators from registers) compiles for sm_90a, dense and varlen, at every
head dim; its SASS holds the adds the design promises and the loop's GEMMs; its knob is checked
before anything compiles.

Run: pytest -m compile tests/test_kernel_sm90_bwd_gqa_dkv.py
"""

import pytest

pytest.importorskip("cutlass")

import fa4kernel  # noqa: E402
from fa4kernel.sm90 import bwd_config as bc  # noqa: E402
from test_kernel_sm90_bwd_compile import count, hgmma_shapes, loop_instructions  # noqa: E402

pytestmark = pytest.mark.compile

_SASS = {}


def sass(cfg):
    if cfg not in _SASS:
        _SASS[cfg] = fa4kernel.compile_bwd_sass(cfg)
    return _SASS[cfg]


def build(hd, causal, varlen, gqa_dkv):
    if varlen:
        return bc.make_varlen_bwd_config("bfloat16", hd, causal, {"gqa_dkv": gqa_dkv})
    return bc.make_bwd_config("bfloat16", hd, causal, gqa_dkv=gqa_dkv)


# every head dim once, both masks at 256 (its spill), varlen where its epilogue differs most
@pytest.mark.parametrize("hd,causal,varlen", [(64, True, False), (96, False, False), (128, True, False),
                                              (192, False, False), (256, False, False), (256, True, False),
                                              (128, True, True), (256, False, True)])
def test_reduce_adds_dk_dv_from_registers(hd, causal, varlen):
    """A consumer thread holds tile_n x head_dim / 256 floats of each of dK and dV: one
    two-wide RED.ADD per pair of them, no TMA store of dK / dV; the loop's GEMMs are the loop
    build's. No register spills, except at head dim 256 without a mask, where
    ptxas keeps one shared-memory address in local memory: one STL before the loop, reloaded in
    it (once; twice in the varlen build, whose loop build at 256 spills two values outside the
    loop). Read by the GPU benchmark, not hidden: hd256 with grouped heads pays those loads."""
    loop_cfg, cfg = build(hd, causal, varlen, "loop"), build(hd, causal, varlen, "reduce")
    text, base = sass(cfg), sass(loop_cfg)
    pairs = 2 * cfg.tile_n * hd // (2 * 128 * cfg.num_consumer_wgs)
    assert count(text, "REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU") == pairs
    assert count(base, "REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU") == 0
    assert count(text, "UTMASTG") < count(base, "UTMASTG") or varlen  # varlen stores rows, not TMA
    assert hgmma_shapes(text) == hgmma_shapes(base)
    assert count(text, "HGMMA") == count(base, "HGMMA")
    loop = [o.split()[0] for o in loop_instructions(text)]
    assert not [o for o in loop if o.startswith("RED")], "dK / dV adds inside the query-block loop"
    spills = count(text, "STL") + count(text, "LDL")
    if hd == 256 and not causal:
        assert count(text, "STL") == 1 and sum(o.startswith("LDL") for o in loop) == (2 if varlen else 1)
    elif not (varlen and hd == 256):
        assert spills <= count(base, "STL") + count(base, "LDL"), "register spills the loop build does not have"


def test_reduce_is_a_checked_knob():
    cfg = bc.make_bwd_config("bfloat16", 128, True, gqa_dkv="reduce")
    assert cfg.gqa_dkv == "reduce" and cfg.grid_order == "tail_lpt"
    assert bc.make_bwd_config("bfloat16", 128, True).gqa_dkv == "loop"
    with pytest.raises(ValueError, match="gqa_dkv='sum' not supported; allowed: loop, reduce"):
        bc.make_bwd_config("bfloat16", 128, True, gqa_dkv="sum")
    with pytest.raises(ValueError, match="deterministic=True: gqa_dkv='loop'"):
        bc.make_bwd_config("bfloat16", 128, True, True, gqa_dkv="reduce")
    with pytest.raises(ValueError, match="gqa_dkv"):
        fa4kernel.compile_bwd_sass(head_dim=64, gqa_dkv="both")


def test_reduce_grid_has_a_cta_per_q_head():
    """The launch order and the clock probe's buffer count the q heads with reduce, the k/v heads
    with the loop: 16 q heads on 2 k/v heads, 1000 keys (8 key blocks), batch 3."""
    from fa4kernel.sm90.bwd import probe_words

    loop = bc.make_bwd_config("bfloat16", 128, False)
    red = bc.make_bwd_config("bfloat16", 128, False, gqa_dkv="reduce")
    assert bc.grid_heads(loop, 16, 2) == 2 and bc.grid_heads(red, 16, 2) == 16
    order = bc.launch_order(red, 1000, bc.grid_heads(red, 16, 2), 3)
    assert len(order) == 8 * 16 * 3 and len(set(order)) == len(order)
    assert probe_words(red, 3, 1000, 16) - probe_words(loop, 3, 1000, 2) == 4 * 8 * 3 * (16 - 2)


@pytest.mark.parametrize("hd,causal", [(128, True), (256, False)])
def test_loop_build_never_traces_the_reduce_epilogue(hd, causal, monkeypatch):
    """The loop build's SASS equals a build's whose reduce-only method raises."""
    from fa4kernel.sm90.bwd import FlashBwdSm90

    monkeypatch.setenv("FA4LAB_CACHE", "off")
    plain = fa4kernel.compile_bwd_sass(head_dim=hd, causal=causal)

    def boom(*a, **k):
        raise AssertionError("the reduce epilogue was traced into the loop build")

    monkeypatch.setattr(FlashBwdSm90, "_reduce_dkv", boom)
    assert fa4kernel.compile_bwd_sass(head_dim=hd, causal=causal) == plain


def test_the_default_reduces_where_the_loop_leaves_sms_idle():
    """gqa_dkv_for: "reduce" with grouped heads when the loop's CTAs (key blocks x k/v heads) are
    fewer than the SMs or with a causal mask and at least half as many queries as keys, "loop"
    otherwise, without grouped heads and when deterministic; a knob the caller set stays."""
    assert bc.gqa_dkv_for(16, 1, 8 * 16, sms=132) == "reduce"  # MQA hd64 2k, batch 8: 128 CTAs
    assert bc.gqa_dkv_for(16, 1, 8 * 16, sms=114) == "loop"  # the same on 114 SMs: a wave full
    assert bc.gqa_dkv_for(64, 8, 8 * 32) == "loop"  # GQA 8:1, 4k keys, batch 8: 2048 CTAs
    assert bc.gqa_dkv_for(16, 16, 1) == "loop"  # no grouped heads
    assert bc.gqa_dkv_for(16, 1, 1, deterministic=True) == "loop"
    assert bc.with_gqa_default({}, 64, 16, 1, 8, 2048, False) == {"gqa_dkv": "reduce"}
    assert bc.with_gqa_default({}, 256, 16, 1, 8, 2048, False) == {"gqa_dkv": "loop"}  # 64-key blocks: 256 CTAs
    assert bc.with_gqa_default({"gqa_dkv": "loop"}, 64, 16, 1, 8, 2048, False) == {"gqa_dkv": "loop"}
    # a packed batch: its total keys in blocks (the varlen MQA batch: 10581 keys, 83 blocks)
    assert bc.with_gqa_default({}, 128, 32, 1, 1, 10581, False) == {"gqa_dkv": "reduce"}
    # the loop's CTAs fill the SMs: causal with as many queries as keys reduces, a chunk loops
    assert bc.gqa_dkv_for(64, 8, 8 * 32, causal=True, queries_per_key=1.0) == "reduce"
    assert bc.gqa_dkv_for(64, 8, 8 * 32, causal=True, queries_per_key=0.5) == "reduce"
    assert bc.gqa_dkv_for(64, 8, 8 * 32, causal=True, queries_per_key=0.49) == "loop"
    assert bc.gqa_dkv_for(64, 8, 8 * 32, causal=False, queries_per_key=1.0) == "loop"
    assert bc.gqa_dkv_for(64, 8, 8 * 32, True, causal=True, queries_per_key=1.0) == "loop"  # deterministic
    assert bc.with_gqa_default({}, 128, 64, 8, 2, 4096, False, causal=True, seqlen_q=4096) == {"gqa_dkv": "reduce"}
    assert bc.with_gqa_default({}, 128, 32, 8, 2, 8192, False, causal=False, seqlen_q=8192) == {"gqa_dkv": "loop"}
    # the GQA chunk batch: 3025 queries on 18096 keys
    assert bc.with_gqa_default({}, 128, 32, 8, 1, 18096, False, causal=True, seqlen_q=3025) == {"gqa_dkv": "loop"}


def test_fa4sim_describes_the_default():
    """fa4sim's fa4kernel-sm90.json resolves gqa_dkv as the kernel's host does."""
    from fa4sim import Problem, implementation
    from fa4sim.model import setup

    impl = implementation.load("fa4kernel", "sm90")
    cases = [(Problem(8, 16, 2048, 2048, 64, True, heads_kv=1), 8, 2048),
             (Problem(8, 64, 4096, 4096, 128, True, heads_kv=8), 8, 4096),
             (Problem(4, 16, 4096, 4096, 256, True, heads_kv=2), 4, 4096),
             (Problem(2, 16, 1024, 1024, 128), 2, 1024),
             (Problem(2, 32, 8192, 8192, 128, False, heads_kv=8), 2, 8192),
             (Problem(2, 32, 2048, 8192, 128, True, heads_kv=8), 2, 8192),
             (Problem.varlen(32, 128, (1, 100, 2000, 4097, 3000, 1383), causal=True, heads_kv=1), 1, 10581),
             (Problem.varlen(32, 128, (512, 512, 1, 2000), causal=True, heads_kv=8,
                             seqlens_k=(4096, 9000, 3000, 2000)), 1, 18096)]
    for p, batch, keys in cases:
        queries = sum(sq for sq, _ in p.sequences) if p.is_varlen else p.seqlen_q
        want = bc.with_gqa_default({}, p.hdim, p.heads, p.heads_kv, batch, keys, False, causal=p.causal,
                                   seqlen_q=queries)["gqa_dkv"]
        assert setup("h200", None, p, {}, impl, "bwd")[4]["gqa_dkv"] == want, p
