"""CPU-only: the SM90 forward's varlen build (KernelConfig.varlen: the batch's tiles counted on
the device from cu_seqlens, persistent CTAs taking them from a tile counter, O out by TMA
where the tile lies inside its sequence, else through row-predicated 16-byte stores), its pack-GQA
form (KernelConfig.pack_gqa) and the backward's
(BwdConfig.varlen: dK, dV out likewise) compile for sm_90a with fake tensors, and leave the
ordinary builds alone.

Run: pytest -m compile tests/test_kernel_sm90_varlen_compile.py
"""

import re

import pytest

pytest.importorskip("cutlass")

import fa4kernel  # noqa: E402
from fa4kernel import make_config  # noqa: E402
from fa4kernel.sm90.config import make_varlen_config  # noqa: E402
from fa4kernel.sm90.fwd import FlashFwdSm90, FlashFwdSm90Varlen, FlashFwdSm90VarlenPacked, make_kernel  # noqa: E402

pytestmark = pytest.mark.compile


def count(text, op):
    return len(re.findall(r"\s" + re.escape(op) + r"[\s.]", text))


# hd192 with its 112-key tile and 3 vectors per thread and row in the O store; hd64's 3 warpgroups
@pytest.mark.parametrize("hd,causal", [(128, False), (64, True), (192, True)])
def test_varlen_builds_compile(hd, causal):
    text = fa4kernel.compile_sass(make_varlen_config("bfloat16", hd, causal, True, {}), arch="sm_90a")
    assert count(text, "HGMMA") > 0 and count(text, "UTMALDG") > 0
    # a full tile's O goes out by TMA, a sequence's partial last tile by 16-byte row stores
    assert count(text, "UTMASTG") > 0
    assert len(re.findall(r"\sSTG\.E\.128\s", text)) > 0
    assert count(text, "LDL") == 0 and count(text, "STL") == 0, "register spills (LDL/STL)"
    # the tiles found by a warp-wide prefix sum over cu_seqlens; a persistent CTA's next tile
    # from one atomic add on the tile counter per tile (none without persistence)
    assert count(text, "POPC") > 0 and count(text, "VOTE") > 0
    assert count(text, "ATOMG") == 1


def test_varlen_without_persistence_fetches_no_tile():
    cfg = make_varlen_config("bfloat16", 128, True, True, {"persistent": False})
    text = fa4kernel.compile_sass(cfg, arch="sm_90a")
    assert not cfg.persistent and count(text, "ATOMG") == 0 and count(text, "HGMMA") > 0


def test_the_ordinary_forward_is_not_the_varlen_build():
    cfg = make_config("bfloat16", 128, True, True, {})
    assert not cfg.varlen and type(make_kernel(cfg)) is FlashFwdSm90
    vcfg = make_varlen_config("bfloat16", 128, True, True, {})
    assert vcfg.varlen and vcfg.persistent and type(make_kernel(vcfg)) is FlashFwdSm90Varlen


@pytest.mark.parametrize("causal", [False, True])
def test_ordinary_sass_is_unchanged_by_the_varlen_branches(causal, monkeypatch):
    """The ordinary build's SASS equals that of a build whose varlen-only methods raise when
    called: no varlen code is traced into it."""
    monkeypatch.setenv("FA4LAB_CACHE", "off")
    cfg = make_config("bfloat16", 128, causal, True, {})
    plain = fa4kernel.compile_sass(cfg, arch="sm_90a")

    def boom(*a, **k):
        raise AssertionError("a varlen-only method was traced into the ordinary build")

    for name in ("_varlen_chunk", "_varlen_counts", "_varlen_seek", "_varlen_coords", "_produce_varlen",
                 "_varlen_blocks", "_store_o_rows"):
        monkeypatch.setattr(FlashFwdSm90, name, boom)
    assert fa4kernel.compile_sass(cfg, arch="sm_90a") == plain


# pack-GQA: hd128 both ways, hd64's 3 warpgroups (192 rows), hd256 (O through Q's buffer)
@pytest.mark.parametrize("hd,causal", [(128, True), (128, False), (64, True), (256, True)])
def test_pack_gqa_varlen_builds_compile(hd, causal):
    cfg = make_varlen_config("bfloat16", hd, causal, True, {}, pack_gqa=True)
    assert type(make_kernel(cfg)) is FlashFwdSm90VarlenPacked
    text = fa4kernel.compile_sass(cfg, arch="sm_90a")
    assert count(text, "HGMMA") > 0 and count(text, "UTMALDG") > 0
    # a full tile's O by TMA, a sequence's partial last tile by 16-byte row stores
    assert count(text, "UTMASTG") > 0 and len(re.findall(r"\sSTG\.E\.128\s", text)) > 0
    assert count(text, "LDL") == 0 and count(text, "STL") == 0, "register spills (LDL/STL)"
    assert count(text, "POPC") > 0 and count(text, "VOTE") > 0 and count(text, "ATOMG") == 1


def _boom(*a, **k):
    raise AssertionError("traced")


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_sass_is_unchanged_by_the_pack_gqa_branches(causal, monkeypatch):
    """The varlen build without the pack: its SASS equals that of a build whose pack-only code
    (the per-token mask and block range, the unpacked LSE store) raises when traced."""
    from fa4kernel import block_info

    monkeypatch.setenv("FA4LAB_CACHE", "off")
    cfg = make_varlen_config("bfloat16", 128, causal, True, {})
    plain = fa4kernel.compile_sass(cfg, arch="sm_90a")
    monkeypatch.setattr(block_info, "packed_kv_block_range", _boom)
    for name in ("_apply_mask_packed", "_store_lse_unpacked"):
        monkeypatch.setattr(FlashFwdSm90, name, _boom)
    assert fa4kernel.compile_sass(cfg, arch="sm_90a") == plain


@pytest.mark.parametrize("name", ["packed_kv_block_range", "_apply_mask_packed", "_store_lse_unpacked"])
def test_pack_gqa_build_masks_by_token(name, monkeypatch):
    """The causal pack-GQA build traces the packed rows' block range, their per-token mask and
    the unpacked LSE store (each replaced by one that raises: the compile fails)."""
    from fa4kernel import block_info

    monkeypatch.setenv("FA4LAB_CACHE", "off")
    monkeypatch.setattr(block_info if name == "packed_kv_block_range" else FlashFwdSm90, name, _boom)
    with pytest.raises(Exception, match="traced"):
        fa4kernel.compile_sass(make_varlen_config("bfloat16", 128, True, True, {}, pack_gqa=True), arch="sm_90a")


# the backward's varlen build (FlashBwdSm90Varlen): hd64's 128-row blocks, hd128, hd256's CTA pairs
# (without a mask ptxas keeps two values of hd256's consumers, at their 240-register limit, in
# local memory: 2 STL, 2 LDL; not asserted here, reported by the varlen campaign)
@pytest.mark.parametrize("hd,causal,deterministic", [(64, False, False), (128, True, False), (256, True, False),
                                                    (128, True, True), (64, False, True)])
def test_varlen_backward_builds_compile(hd, causal, deterministic):
    from fa4kernel.sm90.bwd_config import make_varlen_bwd_config

    text = fa4kernel.compile_bwd_sass(make_varlen_bwd_config("bfloat16", hd, causal, {}, deterministic))
    assert count(text, "HGMMA") > 0 and count(text, "UTMALDG") > 0
    assert count(text, "UTMASTG") == 0, "a TMA store of dK / dV would write the next sequence's keys"
    assert len(re.findall(r"\sSTG\.E\.128\s", text)) > 0, "dK and dV go out as 16-byte row stores"
    assert count(text, "LDL") == 0 and count(text, "STL") == 0, "register spills (LDL/STL)"


@pytest.mark.parametrize("hd,causal,deterministic", [(128, False, False), (256, True, False), (128, True, True)])
def test_ordinary_backward_sass_is_unchanged_by_the_varlen_branches(hd, causal, deterministic, monkeypatch):
    """As for the forward: the dense backward's SASS equals a build's whose varlen-only methods raise."""
    from fa4kernel.sm90.bwd import FlashBwdSm90

    monkeypatch.setenv("FA4LAB_CACHE", "off")
    plain = fa4kernel.compile_bwd_sass(head_dim=hd, causal=causal, deterministic=deterministic)

    def boom(*a, **k):
        raise AssertionError("a varlen-only method was traced into the dense backward")

    for name in ("_varlen_views", "_zero_key_tail", "_store_rows"):
        monkeypatch.setattr(FlashBwdSm90, name, boom)
    assert fa4kernel.compile_bwd_sass(head_dim=hd, causal=causal, deterministic=deterministic) == plain


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_varlen_backward_pre_and_postprocess_compile(hd):
    """BwdPreprocessVarlen, BwdPostprocessVarlen: one launch each around the varlen backward,
    16-byte loads and stores, no local memory."""
    from fa4kernel.sass import sass_for
    from fa4kernel.sm90.bwd_config import make_varlen_bwd_config
    from fa4kernel.sm90.bwd_postprocess import compile_postprocess
    from fa4kernel.sm90.bwd_preprocess import compile_preprocess

    cfg = make_varlen_bwd_config("bfloat16", hd, True, {})
    for build in (compile_preprocess, compile_postprocess):
        text = sass_for(lambda o: build(cfg, o), "sm_90a")
        assert len(re.findall(r"\sLDG\.E\.128", text)) > 0 and len(re.findall(r"\sSTG\.E\.128", text)) > 0
        assert count(text, "LDL") == 0 and count(text, "STL") == 0
