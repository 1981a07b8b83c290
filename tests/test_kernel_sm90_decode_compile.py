"""CPU-only: the SM90 forward's decode build (KernelConfig.decode: seqused_k, pack-GQA rows,
causal per row's token, split-KV partials) and the split-KV combine (sm90/combine.py) compile
for sm_90a with fake tensors, and the decode options leave the ordinary forward's build alone.

Run: pytest -m compile tests/test_kernel_sm90_decode_compile.py
"""

import re

import pytest

pytest.importorskip("cutlass")

import fa4kernel  # noqa: E402
from fa4kernel import interface, make_config  # noqa: E402
from fa4kernel.sm90.config import make_decode_config  # noqa: E402
from fa4kernel.sm90.fwd import FlashFwdSm90, FlashFwdSm90Decode, make_kernel  # noqa: E402

pytestmark = pytest.mark.compile


def count(text, op):
    return len(re.findall(r"\s" + re.escape(op) + r"[\s.]", text))


def assert_healthy(text, tma_store):
    assert count(text, "HGMMA") > 0 and count(text, "UTMALDG") > 0
    assert (count(text, "UTMASTG") > 0) == tma_store  # split partials go out from registers (fp32)
    assert count(text, "LDL") == 0 and count(text, "STL") == 0, "register spills (LDL/STL)"


@pytest.mark.parametrize("causal,split_kv,hd", [(False, False, 128), (False, True, 128), (True, True, 128),
                                                (True, False, 64), (True, True, 256)])
def test_decode_builds_compile(causal, split_kv, hd):
    assert_healthy(fa4kernel.compile_sass(make_decode_config("bfloat16", hd, causal, split_kv), arch="sm_90a"),
                   not split_kv)


def test_combine_compiles():
    text = interface.compile_combine_sass("bfloat16", 128)
    assert count(text, "MUFU.EX2") > 0 and count(text, "STG") > 0
    assert count(text, "LDL") == 0 and count(text, "STL") == 0


def test_the_combine_launches_behind_the_decode_kernel_without_a_gap():
    """The combine is a programmatic dependent launch: its griddepcontrol.wait (ACQBULK) comes
    before its first global load; every decode build lets it launch (griddepcontrol.launch_dependents:
    PREEXIT), once; the ordinary forward does not."""
    combine = interface.compile_combine_sass("bfloat16", 128).splitlines()
    wait = next(i for i, line in enumerate(combine) if "ACQBULK" in line)
    assert wait < next(i for i, line in enumerate(combine) if "LDG" in line)
    for split_kv in (False, True):
        assert count(fa4kernel.compile_sass(make_decode_config("bfloat16", 128, True, split_kv), arch="sm_90a"),
                     "PREEXIT") == 1
    assert count(fa4kernel.compile_sass(make_config("bfloat16", 128, True, True, {}), arch="sm_90a"), "PREEXIT") == 0


def test_the_ordinary_forward_is_not_the_decode_build():
    """The decode options are compile-time: the ordinary config keeps decode off, and its kernel
    is the plain class, so its trace takes none of the decode branches (the SASS check below)."""
    cfg = make_config("bfloat16", 128, True, True, {})
    assert not cfg.decode and not cfg.split_kv
    assert type(make_kernel(cfg)) is FlashFwdSm90
    assert type(make_kernel(make_decode_config("bfloat16", 128, True, True))) is FlashFwdSm90Decode


@pytest.mark.parametrize("causal", [False, True])
def test_ordinary_sass_is_unchanged_by_the_decode_branches(causal, monkeypatch):
    """The ordinary build's SASS equals that of a build whose decode-only methods raise when
    called: no decode code is traced into it (and none reaches its SASS)."""
    monkeypatch.setenv("FA4LAB_CACHE", "off")
    cfg = make_config("bfloat16", 128, causal, True, {})
    plain = fa4kernel.compile_sass(cfg, arch="sm_90a")

    def boom(*a, **k):
        raise AssertionError("a decode-only method was traced into the ordinary build")

    for name in ("_decode_tile", "_apply_mask_packed", "_zero_v_past_keys", "_store_partial"):
        monkeypatch.setattr(FlashFwdSm90, name, boom)
    assert fa4kernel.compile_sass(cfg, arch="sm_90a") == plain
