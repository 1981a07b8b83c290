"""CPU-only: fa4kernel's SM90 forward compiles for sm_90a with fake tensors (no GPU needed),
and its SASS has the instructions the design promises.

Run: pytest -m compile tests/test_kernel_sm90_compile.py
"""

import re

import pytest

pytest.importorskip("cutlass")

import fa4kernel  # noqa: E402
from fa4kernel import make_config  # noqa: E402
from fa4kernel.sass import around_pv_wait, kv_loop  # noqa: E402

pytestmark = pytest.mark.compile

_SASS = {}


def sass(head_dim=128, causal=False, return_lse=False, dtype="bfloat16", **knobs):
    cfg = make_config(dtype, head_dim, causal, return_lse, knobs)
    if cfg not in _SASS:
        _SASS[cfg] = fa4kernel.compile_sass(cfg, arch="sm_90a")
    return _SASS[cfg]


def count(text, op):
    # opcode position: "/*0a10*/  MUFU.EX2 R3, R2 ;" -> match the opcode token
    return len(re.findall(r"\s" + re.escape(op) + r"[\s.]", text))


def assert_healthy(text):
    assert count(text, "HGMMA") > 0, "no wgmma (HGMMA) in SASS"
    assert count(text, "UTMALDG") > 0, "no TMA loads (UTMALDG) in SASS"
    assert count(text, "UTMASTG") > 0, "no TMA store (UTMASTG) in SASS"
    assert count(text, "MUFU.EX2") + count(text, "FFMA") > 0
    assert count(text, "LDL") == 0 and count(text, "STL") == 0, "register spills (LDL/STL)"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [64, 96, 128, 192, 256])
def test_every_head_dim_compiles(hd, causal):
    assert_healthy(sass(hd, causal))


@pytest.mark.parametrize("knobs", [
    dict(pingpong=False),
    dict(intra_wg_overlap=False),
    dict(p_in_registers=False),
    dict(kv_stages=3),
    dict(rescale_threshold=8.0),
    dict(exp_emulation=0.125, rescale_threshold=8.0),
    dict(tile_m=192, tile_n=96, p_in_registers=False),
], ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_knob_variants_compile(knobs):
    assert_healthy(sass(128, True, **knobs))


def test_lse_and_fp16_compile():
    assert_healthy(sass(128, False, return_lse=True, dtype="float16"))


def test_p_in_smem_uses_stmatrix():
    # P staged through smem: stmatrix (STSM) for P besides the O epilogue, more than RS has
    assert count(sass(128, p_in_registers=False), "STSM") > count(sass(128), "STSM")


@pytest.mark.parametrize("causal", [False, True])
def test_p_store_issues_among_the_exp2s_and_its_fence_before_the_o_rescale(causal):
    """fa4sim's P-via-smem order (fa3_sm90 P_STORE_ORDER): in the KV loop 7 of the 8 STSM of P
    lie between the PV wait and the last exp2 (the last right after it), the fence (MEMBAR)
    follows them, then the O rescale's FMULs; no barrier ends the block (a warp sync: the only
    BAR.SYNC left is the ping-pong's at the block's start)."""
    ops = [o.split()[0] for o in kv_loop(sass(128, causal, p_in_registers=False, rescale_threshold=None))]
    where = lambda pred: [i for i, o in enumerate(ops) if pred(o)]
    pv_wait = where(lambda o: o.startswith("WARPGROUP.DEPBAR"))[1]
    stsm, mufu = where(lambda o: o.startswith("STSM")), where(lambda o: o.startswith("MUFU"))
    membar, bar = where(lambda o: o.startswith("MEMBAR")), where(lambda o: o.startswith("BAR.SYNC"))
    assert len(stsm) == 8 and pv_wait < stsm[0] and stsm[-2] < mufu[-1] < stsm[-1] < membar[0]
    fmul = where(lambda o: o == "FMUL")
    assert sum(membar[0] < i for i in fmul) >= 63 and bar == bar[:1] and bar[0] < stsm[0]


def test_exp_emulation_moves_exp2_from_mufu_to_fma():
    """MUFU.EX2 per KV block falls as exp_emulation rises; FFMA rises."""
    fracs = [0.0, 0.25, 0.5, 1.0]
    mufu = [count(sass(128, exp_emulation=f), "MUFU.EX2") for f in fracs]
    ffma = [count(sass(128, exp_emulation=f), "FFMA") for f in fracs]
    assert all(a > b for a, b in zip(mufu, mufu[1:])), mufu
    assert all(a < b for a, b in zip(ffma, ffma[1:])), ffma
    # hd128, tile 128x128, intra-WG overlap: 2 softmax copies in the code (the first block and the
    # loop body; the loop's last block is not peeled), each 2 rows x 32 columns per thread = 64
    # exp2 per copy.
    copies = 2
    per_block_base = (mufu[0] - mufu[-1]) / copies
    assert per_block_base == 64, mufu
    per_block = [(m - mufu[-1]) / copies for m in mufu]
    assert per_block == [64, 48, 32, 0], per_block



# hd256's loops issue about half their exp2s ahead of the PV wait (18 of 42 at 80 keys, 19 of 34 at
# 64): the generated table (pv_wait_sass) gives fa4sim each build's own position there
ALWAYS = {"rescale_threshold": None}  # always rescale: the order the tests below are about


@pytest.mark.parametrize("hd,knobs,most_before", [(64, ALWAYS, 6), (128, ALWAYS, 12), (192, ALWAYS, 12)])
def test_pv_wait_sits_before_the_exp2s(hd, knobs, most_before):
    """The compiled order fa4sim's fa3 schedule models (knob pv_wait = after_max): in the KV
    loop ptxas places the wait for the previous block's PV GEMM (the second WARPGROUP.DEPBAR,
    gsb0 0x0) after the S wait and (part of) the row max, ahead of most of the block's exp2s,
    whatever the source order (hd128's loop, whose last block is not peeled, issues 10 of its 66
    before it). If a compiler update moves it, this fails and the model's default
    must follow; each build's own position is in fa4sim/implementations/fa4kernel-sm90.json (pv_wait_sass)."""
    between, after = around_pv_wait(kv_loop(sass(head_dim=hd, **knobs)))
    assert between.count("FMNMX") >= 16                      # row max work overlaps PV
    assert between.count("MUFU.EX2") <= most_before          # the acc_scale exp2s, a few P exp2s at most
    per_thread = make_config("bfloat16", hd, False, False, knobs).tile_n // 2  # a 64 x tile_n S over 128 threads
    assert after.count("MUFU.EX2") >= per_thread - most_before       # the block's exp2s wait for PV


def test_hd256_default_pv_wait_after_part_of_the_exp2s():
    """hd256's default (tile_n 64, O rescaled before the PV GEMM): here ptxas puts the PV wait
    after the row max and part of the block's exp2s (19 of 32 per thread with CUDA 13.0)."""
    between, _ = around_pv_wait(kv_loop(sass(head_dim=256)))
    assert 8 <= between.count("MUFU.EX2") <= 28


@pytest.mark.parametrize("hd,before", [(256, None), (256, False), (64, True), (64, None)])  # QK, PV shapes differ
def test_rescale_before_pv_moves_the_o_rescale(hd, before):
    """rescale_before_pv (auto: head_dim > 128, FA4's RescaleOBeforeGemm): the KV loop multiplies
    O (head_dim / 2 fp32 per thread) by the previous block's scale before the PV wgmmas are
    issued, i.e. while S is computed; otherwise after them, once the PV GEMM has finished."""
    knobs = {} if before is None else {"rescale_before_pv": before}
    cfg = make_config("bfloat16", hd, False, False, knobs)
    loop = kv_loop(fa4kernel.compile_sass(cfg, arch="sm_90a"))
    pv = f"HGMMA.64x{hd}x16"
    first_pv = next(i for i, o in enumerate(loop) if o.startswith(pv))
    last_pv = max(i for i, o in enumerate(loop) if o.startswith(pv))
    fmul_before = loop[:first_pv].count("FMUL")
    fmul_after = loop[last_pv:].count("FMUL")
    if cfg.rescale_before_pv:
        assert fmul_before >= hd // 2 and fmul_after < hd // 4, (fmul_before, fmul_after)
    else:
        assert fmul_after >= hd // 2 and fmul_before < hd // 4, (fmul_before, fmul_after)


@pytest.mark.parametrize("hd,knobs,chained", [(64, ALWAYS, False), (64, {**ALWAYS, "chained_row_sum": True}, True),
                                              (128, ALWAYS, False), (128, {**ALWAYS, "chained_row_sum": True}, True)])
def test_chained_row_sum_interleaves_the_o_rescale(hd, knobs, chained):
    """What the knob is for (lab/findings/kernel-design-sm90.md, "Softmax order"): with the O-scale exp2 after
    the P exp2s and one row-sum chain, ptxas issues the O rescale (head_dim / 2 FMULs per thread)
    between the block's exp2s after the PV wait; with the O-scale exp2 first and four partial
    sums, after the last of them. If a compiler update changes this, the measured A/B behind the
    knob's auto value needs repeating."""
    _, after = around_pv_wait(kv_loop(sass(head_dim=hd, **knobs)))
    last_ex2 = max(i for i, o in enumerate(after) if o == "MUFU.EX2")
    between, behind = after[:last_ex2].count("FMUL"), after[last_ex2:].count("FMUL")
    if chained:
        assert between >= hd // 2 and behind == 0, (between, behind)
    else:
        assert behind >= hd // 2 and between <= 4, (between, behind)


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_kv_loop_length_matches_the_models_instruction_count(hd):
    """fa4sim counts the KV loop's instructions as its softmax phases (fa4sim/softmax.py) plus
    bookkeeping (fa4kernel's implementation constants loop_overhead_fixed / loop_overhead_per_kstep,
    counted in this SASS). The always-rescaling loops stay within 5 % of that count; if a compiler or
    kernel change moves them further, the constants need recounting
    (fa4sim/implementations/fa4kernel-sm90.json)."""
    from fa4sim import Problem, hardware
    from fa4sim.model import build_cta

    # always rescaling: with conditional rescaling (the default) the O rescale's FMULs stay in the
    # static loop but run only when a max moves; its test is checked below (tau_test_instr)
    cfg = make_config("bfloat16", hd, False, False, ALWAYS)
    loop = kv_loop(sass(head_dim=hd, **ALWAYS))
    hw = hardware.load("h100")
    p = Problem(1, 1, 8192, 8192, hd, False)
    sched = build_cta(hw, p, {"tile_m": cfg.tile_m, "tile_n": cfg.tile_n, **ALWAYS}, 64, 0, impl="fa4kernel")
    # warp-instructions per warp of warpgroup 0 per KV block: the issue unit's cycles x 4 per clock / 4 warps
    modelled = sum(dict(o.uses).get("issue", 0.0) * hw.issue_per_clk / 4
                   for o in sched.ops if o.role == "wg0" and o.when == "all")
    assert abs(len(loop) - modelled) <= 0.05 * len(loop), (len(loop), modelled)


@pytest.mark.parametrize("hd,causal", [(64, False), (128, False), (128, True), (256, True)])
def test_tau_test_instructions_match_the_models_count(hd, causal):
    """Conditional rescaling adds its test to every KV block (compares, a vote, a branch, the scale's
    select) whether or not a rescale is skipped; fa4sim charges fa4kernel's implementation constant
    tau_test_instr of them per warp and block (12, or the build's own count). Keep the count within
    2 of the SASS."""
    from fa4sim import Problem
    from fa4sim.model import setup
    from fa4sim.params import Context

    # against the same rescale order: with tau the rescale goes before the PV GEMM at every head dim
    plain = kv_loop(sass(head_dim=hd, causal=causal, rescale_before_pv=True, **ALWAYS))
    tau = kv_loop(sass(head_dim=hd, causal=causal, rescale_threshold=8.0))
    assert "VOTE" in {o.split(".")[0] for o in tau} and "VOTE" not in {o.split(".")[0] for o in plain}
    p = Problem(1, 1, 8192, 8192, hd, causal)
    hw, _, _, impl, knobs = setup("h100-datasheet", "fa3", p, {"rescale_threshold": 8.0}, "fa4kernel")
    model = impl.value("tau_test_instr", Context(p, hw, impl), knobs)
    assert abs((len(tau) - len(plain)) - model) <= 2, (len(tau), len(plain), model)
