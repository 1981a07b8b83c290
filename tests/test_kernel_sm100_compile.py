"""CPU-only: fa4kernel's SM100 (Blackwell) forward compiles for sm_100a with fake tensors (no GPU
needed), and its SASS has the instructions and the MMA issue order the design promises.

Run: pytest -m compile tests/test_kernel_sm100_compile.py
"""

import re

import pytest

pytest.importorskip("cutlass")

import fa4kernel  # noqa: E402
from fa4kernel.sm100 import DEFAULT_EXP_EMULATION, emulated_mask, make_sm100_config  # noqa: E402

pytestmark = pytest.mark.compile

_SASS = {}


def sass(head_dim=128, causal=False, exp_emulation=DEFAULT_EXP_EMULATION, **knobs):
    key = (head_dim, causal, exp_emulation, tuple(sorted(knobs.items())))
    if key not in _SASS:
        _SASS[key] = fa4kernel.compile_sass(arch="sm_100a", head_dim=head_dim, causal=causal,
                                            exp_emulation=exp_emulation, **knobs)
    return _SASS[key]


def count(text, op):
    # opcode position: "/*0a10*/  MUFU.EX2 R3, R2 ;" -> match the opcode token
    return len(re.findall(r"\s" + re.escape(op) + r"[\s.]", text))


def mma_sequence(text):
    """'Q' for an SS UMMA (A from smem: QK), 'P' for a TS UMMA (A from TMEM: PV), in code order."""
    out = []
    for line in text.splitlines():
        m = re.search(r"\s(UTC[HQ]MMA)\s+(\S+)", line)
        if m:
            out.append("P" if m.group(2).startswith("tmem[") else "Q")
    return "".join(out)


def assert_healthy(text):
    assert count(text, "UTCHMMA") + count(text, "UTCQMMA") > 0, "no tcgen05.mma in SASS"
    assert count(text, "LDTM") > 0 and count(text, "STTM") > 0, "no tcgen05.ld/st in SASS"
    assert count(text, "UTMALDG") > 0, "no TMA loads (UTMALDG)"
    assert count(text, "UTMASTG") > 0, "no TMA store of O (UTMASTG)"
    assert count(text, "UTCBAR") > 0, "no tcgen05.commit (UTCBAR)"
    assert count(text, "MUFU.EX2") > 0
    assert count(text, "USETMAXREG") >= 3, "setmaxnreg per role missing"
    assert count(text, "LDL") == 0 and count(text, "STL") == 0, "register spills (LDL/STL)"


CONFIGS = [(hd, causal, emu) for hd in (64, 128) for causal in (False, True)
           for emu in (0.0, DEFAULT_EXP_EMULATION)]


@pytest.mark.parametrize("hd,causal,emu", CONFIGS,
                         ids=[f"hd{h}-{'causal' if c else 'full'}-emu{e}" for h, c, e in CONFIGS])
def test_compiles_with_expected_instructions(hd, causal, emu):
    text = sass(hd, causal, emu)
    assert_healthy(text)
    # 2 Q tiles x (hd/16 QK k-steps + 8 PV k-steps), in the first-block and the loop copies
    assert count(text, "UTCHMMA") == 2 * 2 * (hd // 16 + 8)
    # x * scale_log2 - max * scale_log2: one FFMA2 per pair of the 128-column row
    assert count(text, "FFMA2") >= 64


@pytest.mark.parametrize("hd", [64, 128])
def test_mma_issue_order(hd):
    """First block: QK0, QK1. Steady state: PV0(j-1), QK0(j), PV1(j-1), QK1(j). Last: PV0, PV1."""
    seq = mma_sequence(sass(hd))
    qk, pv = "Q" * (hd // 16), "P" * 8
    assert seq == qk + qk + pv + qk + pv + qk + pv + pv, seq


def test_exp_emulation_moves_exp2_from_mufu_to_fma():
    fracs = [0.0, 0.125, 0.25, 0.5]
    mufu = [count(sass(128, False, f), "MUFU.EX2") for f in fracs]
    ffma = [count(sass(128, False, f), "FFMA") + count(sass(128, False, f), "FFMA2") for f in fracs]
    assert all(a > b for a, b in zip(mufu, mufu[1:])), mufu
    assert all(a < b for a, b in zip(ffma, ffma[1:])), ffma
    # one softmax copy (one loop over KV blocks): 128 exp2 per row and block; FA4's pattern
    # emulates 4 groups x res columns (res = 4, 8, 16 of every 16 in fragments 1 and 2)
    assert [mufu[0] - m for m in mufu] == [0, 16, 32, 64], mufu


def test_emulation_pattern_is_fa4s():
    mask = emulated_mask(4)
    assert sum(mask) == 16
    assert not any(mask[:32]) and not any(mask[96:])  # first and last fragments never
    assert [c for c in range(128) if mask[c]] == [c for f in (1, 2) for g in (0, 16)
                                                 for c in range(32 * f + g + 12, 32 * f + g + 16)]


def test_hd96_compiles():
    assert_healthy(sass(96, True))


def test_lse_output_compiles():
    text = sass(128, False, return_lse=True)
    assert_healthy(text)
    assert count(text, "MUFU.LG2") > 0  # lse = (max * scale_log2 + log2(row_sum)) * ln 2


@pytest.mark.parametrize("knobs,msg", [
    (dict(head_dim=80), "head_dim"),
    (dict(head_dim=True), "head_dim"),
    (dict(causal=1), "causal"),
    (dict(exp_emulation=0.75), "exp_emulation"),
    (dict(exp_emulation=-0.1), "exp_emulation"),
    (dict(exp_emulation=float("nan")), "exp_emulation"),
    (dict(rescale_threshold=-1.0), "rescale_threshold"),
    (dict(rescale_threshold=32.0), "rescale_threshold"),
    (dict(kv_stages=1), "kv_stages"),
    (dict(kv_stages=4), "kv_stages"),  # hd128: 4 slots do not fit 227 KB with Q and O
    (dict(head_dim=64, kv_stages=11), "kv_stages"),
    (dict(dtype="float32"), "dtype"),
    (dict(return_lse=1), "return_lse"),
], ids=lambda x: str(x) if not isinstance(x, dict) else ",".join(f"{k}={v}" for k, v in x.items()))
def test_invalid_knobs_raise_before_compiling(knobs, msg):
    with pytest.raises(ValueError, match=msg) as ei:
        fa4kernel.compile_sass(arch="sm_100a", **knobs)
    assert "\n" not in str(ei.value)


def test_defaults():
    cfg = make_sm100_config()
    assert (cfg.head_dim, cfg.kv_stages, cfg.emu_res, cfg.rescale_threshold) == (128, 3, 4, 8.0)
    assert make_sm100_config(64).kv_stages == 10
    assert make_sm100_config(96).kv_stages == 5


@pytest.mark.gpu
def test_runs_on_blackwell():
    pytest.skip("needs a Blackwell (sm_100) GPU; none here")
