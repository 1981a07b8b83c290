"""Unit cost models: MMA cycles from shape and rate, exp2 with and without emulation, feeds."""
import numpy as np
import pytest

from fa4sim import hardware
from fa4sim.errors import InputError
from fa4sim.exp2_emulation import emulated_columns, exp2_costs, exp2_emulated
from fa4sim.feeds import tile_costs
from fa4sim.tensor_core import check_shape, mma_cost

B200, H100 = hardware.load("b200"), hardware.load("h100-datasheet")


def test_wgmma_cycles_are_n_over_2_per_k_step():
    # m64nNk16 takes N/2 cycles at 4096 FLOP/clk (hardware.md)
    for n in (64, 128, 256):
        c = mma_cost(H100, 64, n, 16, a_in_smem=True)
        assert c.tensor_cycles == n / 2


def test_wgmma_ss_small_n_is_smem_bound():
    # (2048 + 32N) B per m64nNk16 over 128 B/clk: at N=32 that is 24 cycles > N/2 = 16
    c = mma_cost(H100, 64, 32, 16, a_in_smem=True)
    assert c.smem_cycles == (2048 + 32 * 32) / 128
    assert c.cycles == c.smem_cycles > c.tensor_cycles


def test_umma_interval_and_half_rate_m64():
    full = mma_cost(B200, 128, 256, 16, a_in_smem=True)
    assert full.tensor_cycles == 128 * 256 / 256  # rows x N / 256
    half = mma_cost(B200, 64, 256, 16, a_in_smem=True)
    assert half.tensor_cycles == full.tensor_cycles  # M=64 at half rate: same time for half the work


def test_umma_latency_ss_ts_pair():
    ss = mma_cost(B200, 128, 128, 16, a_in_smem=True)
    ts = mma_cost(B200, 128, 128, 16, a_in_smem=False)
    pair = mma_cost(B200, 128, 128, 16, a_in_smem=True, two_cta=True)
    assert ss.tensor_cycles + ss.latency == 64 + 136   # SemiAnalysis: M128 N128 SS = 200 cycles
    assert ts.latency == 104 and pair.latency == B200.mma_latency_pair
    assert pair.smem_cycles < ss.smem_cycles          # a CTA pair stages half of B per SM


@pytest.mark.parametrize("arch,m,n,two", [("sm90", 96, 128, False), ("sm90", 64, 260, False),
                                           ("sm100", 96, 128, False), ("sm100", 128, 100, False),
                                           ("sm100", 64, 128, True)])
def test_illegal_mma_shapes(arch, m, n, two):
    with pytest.raises(InputError):
        check_shape(arch, m, n, 64, two)


def test_exp2_cost_without_and_with_emulation():
    plain = exp2_costs(16384, 0.0, B200)
    assert plain == {"mufu": 1024.0, "fma": 0.0, "alu": 0.0}
    emu = exp2_costs(16384, 0.25, B200)
    assert emu["mufu"] == 768.0
    assert emu["fma"] == 16384 * 0.25 * 6 / 128   # 6 FMA lane-ops per emulated element (768 f)
    assert emu["alu"] == 16384 * 0.25 * 2 / 64


def test_exp2_emulation_accuracy_and_bf16_agreement():
    rng = np.random.default_rng(0)
    x = rng.uniform(-60, 0, 200_000).astype(np.float32)
    y = exp2_emulated(x)
    ref = np.exp2(x.astype(np.float64))
    assert np.all(np.isfinite(y))
    assert np.max(np.abs(y - ref) / ref) < 1e-4  # degree 3: ~8.8e-5
    # after bf16 rounding, about 1% of values differ by one ulp from the correctly rounded exp2
    def bf16(a):
        b = np.asarray(a, np.float32).view(np.uint32)
        return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.int64)
    diff = np.abs(bf16(y) - bf16(ref.astype(np.float32)))
    assert diff.max() <= 1 and 0 < diff.mean() < 0.05


def test_emulated_columns_skip_first_and_last_fragment():
    m = emulated_columns(128, 0.125)
    assert m.sum() == 16
    assert not m[:32].any() and not m[96:].any()
    assert emulated_columns(128, 1.0).all() and not emulated_columns(128, 0.0).any()


def test_feeds_and_speeds_per_tile():
    b = tile_costs(B200, hdim=128, tile_m=128, tile_n=128)
    assert (b["mma"], b["exp_mufu"], b["smem"]) == (1024, 1024, 768)
    h = tile_costs(H100, hdim=128, tile_m=128, tile_n=128)
    assert (h["mma"], h["exp_mufu"]) == (2048, 1024)


def test_emulated_exp2_issue_count_by_arch():
    """SM90 has no packed FP32 ops: an emulated element issues 8 instructions (6 FMA-pipe + 2 ALU,
    as counted in our SM90 kernel's SASS), SM100's packed f32x2 ops 5; a MUFU element issues 1."""
    from fa4sim import hardware
    from fa4sim.softmax import exp2_phase

    for name, per in (("h100-datasheet", 8.0), ("b200", 5.0)):
        hw = hardware.load(name)
        full = exp2_phase(hw, 128.0, 1.0)["issue"] * 32 * hw.issue_per_clk
        none = exp2_phase(hw, 128.0, 0.0)["issue"] * 32 * hw.issue_per_clk
        assert full == pytest.approx(128 * per) and none == pytest.approx(128.0)


def test_added_softmax_instructions_take_the_measured_fill_share_of_a_slot():
    """An emulated exp2's 7 added instructions, and conditional rescaling's test, fill the
    softmax mix's idle issue slots: each costs mix_fill_slots of a mix slot (h100: 0.2,
    from bench_bursts.py --mma-gaps); the datasheet profile charges them whole (1.0)."""
    from fa4sim import Problem
    from fa4sim.model import build_cta
    from fa4sim.softmax import exp2_phase

    measured, sheet = hardware.load("h100"), hardware.load("h100-datasheet")
    assert (measured.mix_fill_slots, sheet.mix_fill_slots) == (0.2, 1.0)
    per_element = exp2_phase(measured, 128.0, 1.0)["issue"] * 32 * measured.issue_per_clk / 128
    assert per_element == pytest.approx(1 + 7 * 0.2)

    def max_issue(hw, tau):
        p = Problem(1, 1, 128, 4096, 128, False)
        # the rescale's position held fixed: only the test's instructions differ
        sched = build_cta(hw, p, {"rescale_threshold": tau, "rescale_before_pv": False}, n_kv=32)
        return dict(sched.op("MAX0").uses)["issue"]

    from fa4sim.model import setup
    from fa4sim.params import Context

    p = Problem(1, 1, 128, 4096, 128, False)
    _, _, _, impl, knobs = setup("h100", "fa3", p, {"rescale_threshold": 8.0}, "fa4kernel")
    test_instr = impl.value("tau_test_instr", Context(p, measured, impl), knobs)  # its SASS count (12-13)
    assert 10 <= test_instr <= 14
    for hw in (measured, sheet):  # the test's instructions per warp, 4 warps, SM-wide issue
        added = (max_issue(hw, 8.0) - max_issue(hw, None)) * hw.issue_per_clk / 4
        assert added == pytest.approx(test_instr * hw.mix_fill_slots)
