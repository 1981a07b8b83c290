"""The backward's unit facts (lab/tools/calibrate/bench_bwd_units.py) in the SM90 backward model:
the L2's shared time for loads and fp32 reduce-adds (together in l2_mixed_time_fraction of their
times alone), one SM's reduce-add rate, and the wgmma's
fewest cycles per k-step. Each parameter moves the prediction the way, and by the amount, the
hand calculation says; no measured timing is asserted."""
import pytest

from fa4sim import Problem, hardware, simulate
from fa4sim.errors import InputError
from fa4sim.model import build_cta, setup
from fa4sim.schedules import fa3_sm90_bwd as bwd

H100 = hardware.load("h100")
P256 = Problem(4, 8, 4096, 4096, 256)
P128 = Problem(1, 8, 2048, 2048, 128)
CLOCK = {"clock_ghz": 1.5}  # a fixed clock: cycles per TB/s do not move with the power model


def uses(sched, name):
    return dict(sched.op(name).uses)


def l2_share(tbps, ghz=1.5, sms=None, fraction=None):
    """One SM's share of a whole-chip rate, bytes per SM clock, with loads and reduce-adds
    sharing the L2 (over l2_mixed_time_fraction)."""
    fraction = H100.l2_mixed_time_fraction if fraction is None else fraction
    return tbps * 1e3 / ((sms or H100.num_sms) * ghz) / fraction


def test_reduce_add_leaves_the_sm_at_its_rate_and_takes_its_l2_share():
    # flash-attn-4 hd256: each warpgroup's dQ part is 64 x 256 x 4 / 2 = 32 KB
    s = build_cta("h100", P256, CLOCK, n_kv=4, impl="flash-attn-4", pass_="bwd")
    part = 64 * 256 * 4 / 2
    u = uses(s, "ADDQ0")
    assert u["tma"] == pytest.approx(part / H100.reduce_bytes_per_clk)
    assert u["l2"] == pytest.approx(part / l2_share(H100.l2_reduce_bandwidth_tbps))
    # a Q load takes its share of the L2's load rate (Q + LSE)
    assert uses(s, "LQ")["l2"] == pytest.approx((64 * 256 * 2 + 64 * 4) / l2_share(H100.l2_bandwidth_tbps))


def test_red_from_registers_leaves_at_the_reduce_rate():
    s = build_cta("h100", P128, {**CLOCK, "dq_reduce": "red"}, n_kv=4, impl="fa4kernel", pass_="bwd")
    part = 64 * 128 * 4 / 2
    u = uses(s, "DQR0")
    assert u["red"] == pytest.approx(part / H100.reduce_bytes_per_clk)
    assert u["l2"] == pytest.approx(part / l2_share(H100.l2_reduce_bandwidth_tbps))


def _interval(overrides, problem=P256, impl="flash-attn-4"):
    return simulate("h100", problem=problem, overrides={**CLOCK, **overrides}, impl=impl, pass_="bwd").interval


def test_hd256_loop_is_its_l2_time_when_reduce_adds_are_slow():
    # With the L2 the binding unit, one Q block costs this SM's share of the L2's time: Q and dO
    # (+ LSE, dPsum) at the load rate and the 64 KB of dQ at the reduce-add rate
    loads = 2 * (64 * 256 * 2 + 64 * 4) / l2_share(H100.l2_bandwidth_tbps)
    adds = 64 * 256 * 4 / l2_share(H100.l2_reduce_bandwidth_tbps)
    assert _interval({}) == pytest.approx(loads + adds, rel=2e-3)
    # halve the reduce-add rate: the loop grows by the adds' time again
    assert _interval({"l2_reduce_bandwidth_tbps": H100.l2_reduce_bandwidth_tbps / 2}) == pytest.approx(
        loads + 2 * adds, rel=2e-3)


def test_the_l2_mixed_time_fraction_scales_an_l2_bound_loop():
    # measured: loads and reduce-adds together take 0.91 of their times alone on the H100
    # (bench_bwd_units.py, with_loads); the hd256 loop, bound by the L2, is that much shorter
    # than with the times simply added (fraction 1)
    assert 0.85 < H100.l2_mixed_time_fraction < 1.0
    added = _interval({"l2_mixed_time_fraction": 1.0})
    assert _interval({}) == pytest.approx(added * H100.l2_mixed_time_fraction, rel=2e-3)
    with pytest.raises(InputError, match="l2_mixed_time_fraction"):
        _interval({"l2_mixed_time_fraction": 0.0})


def test_fast_reduce_adds_leave_the_loop_to_the_sm():
    # reduce-adds as fast as loads (the datasheet profiles' assumption): the L2 no longer binds and
    # the loop is shorter than its L2 time at the measured rate
    slow = _interval({})
    fast = _interval({"l2_reduce_bandwidth_tbps": H100.l2_bandwidth_tbps})
    assert fast < slow
    loads = 2 * (64 * 256 * 2 + 64 * 4) / l2_share(H100.l2_bandwidth_tbps)
    assert fast > loads + 64 * 256 * 4 / l2_share(H100.l2_bandwidth_tbps)


def test_mma_min_cycles_floors_each_narrow_k_step():
    # flash-attn-4 hd256: S is 16 k-steps of m64n24k16 per warpgroup: 16 x 12 cycles at 4096 FLOP/clk
    k = setup("h100", None, P256, {}, "flash-attn-4", "bwd")[4]
    hw0 = H100.with_values(mma_min_cycles=0)
    assert bwd.gemms(hw0, P256, k)["S"][0] == pytest.approx(16 * 12)
    assert bwd.gemms(H100.with_values(mma_min_cycles=20), P256, k)["S"][0] == pytest.approx(16 * 20)
    # dQ (m64n128k16, 3 k-steps: 64 cycles each) is wider than any floor below 64
    assert bwd.gemms(H100.with_values(mma_min_cycles=20), P256, k)["dQ"][0] == pytest.approx(3 * 64)
    # the measured floor: 13.05 cycles per k-step
    assert bwd.gemms(H100, P256, k)["S"][0] == pytest.approx(16 * H100.mma_min_cycles)


@pytest.mark.parametrize("name", ["l2_reduce_bandwidth_tbps", "reduce_bytes_per_clk"])
def test_a_rate_of_zero_is_one_clear_error(name):
    with pytest.raises(InputError) as e:
        simulate("h100", problem=P128, overrides={name: 0}, impl="flash-attn-4", pass_="bwd")
    assert name in str(e.value) and "> 0" in str(e.value)


def test_every_profile_gives_the_backward_unit_facts():
    for name in hardware.available():
        hw = hardware.load(name)
        assert hw.reduce_bytes_per_clk > 0 and hw.l2_reduce_bandwidth_tbps > 0 and hw.mma_min_cycles >= 0
    # literature-only profiles assume nothing beyond the loads' rates
    for name in ("h100-datasheet", "h200-datasheet", "b200"):
        hw = hardware.load(name)
        assert hw.l2_reduce_bandwidth_tbps == hw.l2_bandwidth_tbps and hw.reduce_bytes_per_clk == hw.tma_bytes_per_clk
