"""Implementations as data (fa4sim/implementations/*.json): each simulates with its kernel's own
choices. fa4kernel's are checked against the kernel's own configuration code; flash-attn-4's
against what its 4.0.0b36 source chooses (the JSON cites the lines)."""
import json

import pytest

from fa4sim import InputError, Problem, implementation, simulate
from fa4sim.model import setup

torch = pytest.importorskip("torch", reason="fa4kernel's configuration checks take torch tensors (CPU is enough)")
fa4kernel_interface = pytest.importorskip("fa4kernel.interface", reason="fa4kernel (the kernels extra) not installed")
import fa4kernel  # noqa: E402

# the kernel's knobs and the simulator's twins (same names); chained_row_sum (an instruction
# order of the softmax, same arithmetic) has no twin in the model
TWINS = ("tile_m", "tile_n", "kv_stages", "pingpong", "intra_wg_overlap", "p_in_registers", "exp_emulation",
         "persistent", "rescale_before_pv", "early_q_release", "defer_o_store_wait")


def kernel_config(hdim, causal, seqlen, **knobs):
    """What fa4kernel.attention would run for these shapes (CPU tensors: no GPU needed)."""
    q = torch.empty(1, seqlen, 1, hdim, dtype=torch.bfloat16)
    k = torch.empty(1, seqlen, 1, hdim, dtype=torch.bfloat16)
    return fa4kernel_interface.resolve_config(q, k, k, causal=causal, **knobs)


@pytest.mark.parametrize("hdim", fa4kernel.SUPPORTED_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen", [1000, 8192])
@pytest.mark.parametrize("tau", [None, 8.0])
def test_impl_fa4kernel_is_the_kernels_own_configuration(hdim, causal, seqlen, tau):
    """--impl fa4kernel resolves to exactly what fa4kernel's make_config (through attention's
    resolve_config, which adds the short causal tiles) chooses, for every head dim and causal flag."""
    cfg = kernel_config(hdim, causal, seqlen, **({"rescale_threshold": tau} if tau else {}))
    knobs = setup("h100-datasheet", "fa3", Problem(1, 1, seqlen, seqlen, hdim, causal),
                  {"rescale_threshold": tau} if tau else {}, "fa4kernel")[4]
    assert {n: knobs[n] for n in TWINS} == {n: getattr(cfg, n) for n in TWINS}
    assert (knobs["rescale_threshold"] or 0.0) == cfg.rescale_threshold  # the kernel's 0 = always rescale
    assert knobs["tile_order"] == "fa4kernel" and knobs["skip_idle_wgs"] is True


@pytest.mark.parametrize("hdim", fa4kernel.SUPPORTED_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", [(1, 700), (300, 8192, 50)])
def test_impl_fa4kernel_varlen_is_the_varlen_builds_configuration(hdim, causal, lens):
    """A varlen batch resolves to what fa4kernel's varlen build runs (fa4kernel/varlen.py
    varlen_config: the tiles of the longest sequence's lengths, make_varlen_config: persistent as
    the dense forward), and to the order its CTAs count the tiles in."""
    from fa4kernel.varlen import varlen_config

    cfg = varlen_config(hdim, "bfloat16", causal, False, max(lens), max(lens), {}, fa4kernel_interface.tile_rule)
    knobs = setup("h100-datasheet", "fa3", Problem.varlen(1, hdim, list(lens), causal=causal), {}, "fa4kernel")[4]
    assert {n: knobs[n] for n in TWINS} == {n: getattr(cfg, n) for n in TWINS}
    assert cfg.varlen and knobs["persistent"] is cfg.persistent and knobs["tile_order"] == "sequence"


def test_a_rule_can_test_whether_the_batch_is_varlen():
    """{"when": {"is_varlen": ...}}: a problem fact, true for a packed batch of unequal lengths."""
    from fa4sim.hardware import load as load_hw
    from fa4sim.params import Context

    impl = implementation.load("fa4kernel-sm90")
    spec = {"rules": [{"when": {"is_varlen": True}, "value": "packed"}], "else": "dense"}
    hw = load_hw("h100-datasheet")
    got = {p.is_varlen: implementation._evaluate(spec, Context(p, hw, impl), {}, "test")
           for p in (Problem(2, 4, 300, 300, 128), Problem.varlen(4, 128, [300, 100]))}
    assert got == {False: "dense", True: "packed"}
    ne = {"rules": [{"when": {"is_varlen_ne": True}, "value": 1}], "else": 2}
    assert implementation._evaluate(ne, Context(Problem.varlen(4, 128, [3]), hw, impl), {}, "test") == 2


@pytest.mark.parametrize("name", implementation.available())
def test_every_entry_has_a_value_a_source_and_a_confidence(name):
    impl = implementation.load(name)
    for entry in (*impl.knobs.values(), *impl.params.values()):
        assert set(entry) == {"value", "source", "confidence"} and entry["source"] and entry["confidence"] in "HML"
    raw = json.loads((implementation.IMPL_DIR / f"{name}.json").read_text())
    assert raw["name"] == name and name == f"{impl.kernel}-{impl.arch}"


@pytest.mark.parametrize("hw,impl", [("h100-datasheet", "fa4kernel"), ("h200", "flash-attn-4"), ("b200", "flash-attn-4")])
@pytest.mark.parametrize("causal", [False, True])
def test_every_supported_head_dim_simulates_with_its_own_choices(hw, impl, causal):
    """Each head-dim pair an implementation runs (incl. flash-attn-4's 192/128 and its hd256)
    simulates, with a tile that fits, at a plausible fraction of peak."""
    arch = "sm100" if hw == "b200" else "sm90"
    for hd, hd_v in implementation.load(impl, arch).head_dims:
        r = simulate(hw, None, Problem(2, 16, 4096, 4096, hd, causal, hdim_v=hd_v), impl=impl)
        assert 0.05 < r.tflops / r.hw.peak_tflops < 1.0, (hd, hd_v, r.tflops)  # hd16 is memory-light, not fast
        assert r.impl.name == f"{impl}-{arch}"


@pytest.mark.parametrize("hd,hd_v,causal,want", [
    (64, 64, False, dict(tile_m=192, tile_n=128, p_in_registers=True, pingpong=True)),
    (96, 96, False, dict(tile_m=192, tile_n=144, p_in_registers=False, pingpong=True)),
    (96, 96, True, dict(tile_m=192, tile_n=128, p_in_registers=False, pingpong=True)),
    (128, 128, True, dict(tile_m=128, tile_n=128, p_in_registers=True, pingpong=True)),
    (192, 128, False, dict(tile_m=128, tile_n=128, pingpong=False, rescale_before_pv=False)),
    (192, 192, False, dict(tile_m=128, tile_n=112, pingpong=False, rescale_before_pv=True)),
    (256, 256, True, dict(tile_m=128, tile_n=80, pingpong=False, rescale_before_pv=True, persistent=False)),
])
def test_flash_attn_4_sm90_tiles(hd, hd_v, causal, want):
    """flash-attn-4 4.0.0b36's _tile_size_fwd_sm90 and its flash_fwd_sm90 flags."""
    knobs = setup("h100-datasheet", "fa3", Problem(1, 1, 4096, 4096, hd, causal, hdim_v=hd_v), {}, "flash-attn-4")[4]
    assert {n: knobs[n] for n in want} == want


@pytest.mark.parametrize("hd,hd_v,causal,seqlen,want", [
    (128, 128, False, 8192, dict(two_cta=True, q_tiles=2, kv_stages=6, exp_emulation=0.1875)),
    (128, 128, True, 8192, dict(two_cta=False, q_tiles=2, kv_stages=3, exp_emulation=0.125)),
    (128, 128, False, 200, dict(two_cta=False, q_tiles=2)),       # one M block per CTA pair: no pair
    (64, 64, False, 8192, dict(two_cta=False, kv_stages=10, exp_emulation=0.125)),
    (96, 96, True, 8192, dict(kv_stages=5)),
    (192, 128, False, 8192, dict(two_cta=True, kv_stages=5, exp_emulation=0.1875)),
    (192, 128, True, 8192, dict(two_cta=False, kv_stages=3, exp_emulation=0.0625)),
    (256, 256, True, 8192, dict(two_cta=True, q_tiles=1, s_stages=2, kv_stages=5, exp_emulation=0.1875)),
    (64, 64, False, 100, dict(q_tiles=1, s_stages=2)),
    (192, 128, False, 100, dict(q_tiles=1, s_stages=1)),          # S ping-pong needs hdim_v = hdim
    (80, 80, False, 8192, dict(q_tiles=2, s_stages=1, kv_stages=7, exp_emulation=0.125)),
])
def test_flash_attn_4_sm100_choices(hd, hd_v, causal, seqlen, want):
    """flash-attn-4 4.0.0b36's SM100 forward: q_stage, S ping-pong with one Q tile, 2-CTA, its K/V
    stage formula and the emulated fraction of its tuning table."""
    knobs = setup("b200", "fa4", Problem(1, 1, seqlen, seqlen, hd, causal, hdim_v=hd_v), {}, "flash-attn-4")[4]
    assert {n: knobs[n] for n in want} == pytest.approx(want)


def test_knobs_given_win_over_the_implementation():
    knobs = setup("h100-datasheet", None, Problem(1, 1, 4096, 4096, 128, False), {"tile_n": 64, "persistent": "false"},
                  "flash-attn-4")[4]
    assert knobs["tile_n"] == 64 and knobs["persistent"] is False and knobs["tile_order"] == "flash-attn-4"


@pytest.mark.parametrize("hw,impl,problem,param", [
    ("h100-datasheet", "fa4kernel", Problem(1, 1, 128, 128, 192, False, hdim_v=128), "hdim"),  # fa4kernel: hdim_v = hdim
    ("h100-datasheet", "flash-attn-4", Problem(1, 1, 128, 128, 72, False), "hdim"),            # not a multiple of 16
    ("b200", "flash-attn-4", Problem(1, 1, 128, 128, 192, False), "hdim"),            # SM100: 192 needs hdim_v 128
    ("b200", "fa4kernel-sm90", Problem(1, 1, 128, 128, 128, False), "impl"),          # an SM90 kernel on SM100
])
def test_what_an_implementation_does_not_run_is_refused(hw, impl, problem, param):
    with pytest.raises(InputError) as e:
        simulate(hw, None, problem, impl=impl)
    assert e.value.param == param
