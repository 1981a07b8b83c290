"""fa4sim's varlen backward: fa4kernel's varlen build as one launch over the packed batch (its
grid, the per-sequence CTAs, the empty ones, the launches around it), and the
refusal where an implementation's backward has no varlen build."""
import math

import pytest

from fa4sim import implementation, simulate
from fa4sim.cli import main
from fa4sim.errors import InputError
from fa4sim.model import setup
from fa4sim.params import Problem
from fa4sim.schedules import fa3_sm90_bwd, kernel_bwd

H200 = "h200"
IMPL = "fa4kernel-sm90"
# A fixed clock: with the power model the clock follows the whole call's average power, and the
# varlen call's launches around the kernel (more of them, more bytes than the dense preprocess
# kernel alone) leave the main kernel a different clock; at one clock the launches compare as
# launches.
CLOCK = {"clock_ghz": 1.6}


def bwd(problem, overrides=None, impl=IMPL, hw=H200):
    return simulate(hw, problem=problem, impl=impl, pass_="bwd", overrides=overrides)


@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen", [1000, 4096])
def test_one_sequence_is_the_dense_backward(hdim, causal, seqlen):
    """A batch of one sequence launches the dense backward's CTAs of that problem, each costed by
    the same per-shape schedule, in the same order (the varlen build is heads_outer: the dense
    one with grid_order heads_outer). The model gives the same main kernel; 3 % is what a
    refinement of either side's grid-level terms (cold start, traffic) may move it by without
    the two launches being different launches."""
    dense = bwd(Problem(1, 16, seqlen, seqlen, hdim, causal), {**CLOCK, "grid_order": "heads_outer"})
    one = bwd(Problem.varlen(16, hdim, [seqlen], causal=causal), CLOCK)
    assert one.main_us == pytest.approx(dense.main_us, rel=0.03)
    assert one.kernel.units == dense.kernel.units
    # around it the varlen preprocess and postprocess: the dense ones' launches, over whole
    # query blocks (a few rows more)
    for mine, theirs in ((one.pre_us, dense.pre_us), (one.post_us, dense.post_us)):
        assert mine >= theirs and mine == pytest.approx(theirs, rel=0.05)
    assert one.time_us == pytest.approx(one.pre_us + one.main_us + one.post_us)


def test_one_grouped_sequence_is_the_dense_backward():
    """GQA: one CTA per (key block, K/V head) walks its group's q heads, as the dense launch."""
    loop = {"gqa_dkv": "loop"}  # causal with as many queries as keys: its default reduces
    dense = bwd(Problem(1, 32, 3000, 3000, 128, True, heads_kv=8), {**CLOCK, **loop, "grid_order": "heads_outer"})
    one = bwd(Problem.varlen(32, 128, [3000], causal=True, heads_kv=8), {**CLOCK, **loop})
    assert one.main_us == pytest.approx(dense.main_us, rel=0.03)
    assert one.kernel.units == dense.kernel.units == 8 * math.ceil(3000 / 128)


@pytest.mark.parametrize("causal", [False, True])
def test_equal_sequences_are_the_batched_backward(causal):
    """Equal sequences: no CTA lies past its sequence, the grid is the batched launch's (key
    block fastest, then head, then sequence = batch), each sequence's traffic its own."""
    dense = bwd(Problem(4, 16, 2048, 2048, 128, causal), {**CLOCK, "grid_order": "heads_outer"})
    packed = bwd(Problem.varlen(16, 128, [2048] * 4, causal=causal), CLOCK)
    assert packed.main_us == pytest.approx(dense.main_us, rel=1e-6)
    assert packed.kernel.hbm_bytes == pytest.approx(dense.kernel.hbm_bytes, rel=1e-6)


def _grid(problem):
    knobs = setup(H200, None, problem, None, IMPL, "bwd")[4]
    keys = fa3_sm90_bwd.rows_per_cta(knobs)
    units, _ = kernel_bwd.varlen_units(problem, keys, knobs["tile_m"], knobs, fa3_sm90_bwd.units)
    n_h = kernel_bwd.launch_heads(kernel_bwd.sequence(problem, 0), knobs)
    return units, kernel_bwd.varlen_grid(units, n_h, fa3_sm90_bwd.dq_pair(knobs)), knobs


def test_the_grid_is_the_longest_sequences_key_blocks_in_block_index_order():
    # hd128: 128 keys per CTA; 100 keys -> 1 key block, 3000 -> 24; every sequence gets 24 x heads CTAs
    units, grid, _ = _grid(Problem.varlen(2, 128, [100, 3000]))
    assert [u.seq for u in units] == [0] + [1] * 24
    assert len(grid) == 2 * 2 * 24
    assert grid[:24] == [(0, 0)] + [(0, -1)] * 23            # sequence 0, head 0: its one key block
    assert grid[24:48] == [(1, 0)] + [(1, -1)] * 23          # sequence 0, head 1
    assert grid[48:72] == [(2, m) for m in range(1, 25)]      # sequence 1, head 0: key block fastest
    # hd256 (dq_sum pair): 64 keys per CTA, clusters of 2; 300 keys -> 5 key blocks, padded to 6;
    # 100 -> 2; the grid's x is 6: sequence 0's CTAs 2..5 start past its keys and exit
    units, grid, knobs = _grid(Problem.varlen(1, 256, [100, 300]))
    assert knobs["dq_sum"] == "pair"
    assert [u.seq for u in units] == [0, 0] + [1] * 6
    assert [m for _, m in grid] == [0, 1, -1, -1, -1, -1, 2, 3, 4, 5, 6, 7]
    # the second CTA of a cluster walks the Q blocks of the cluster's first key block
    assert units[7].first == units[6].first and units[7].n_kv == units[6].n_kv


def test_an_odd_longest_sequence_rounds_the_pair_grid_up():
    _, grid, _ = _grid(Problem.varlen(1, 256, [64 * 3]))  # 3 key blocks -> 4 CTAs, all in one cluster pair
    assert [m for _, m in grid] == [0, 1, 2, 3]


def test_short_sequences_and_one_token_ones_predict_a_finite_time():
    p = Problem.varlen(16, 128, [1, 4000, 1, 37], [1, 4000, 2000, 1], causal=True)
    r = bwd(p)
    assert math.isfinite(r.time_us) and r.time_us > 0 and 0 < r.tflops < r.hw.peak_tflops
    assert r.pre_us > 0 and r.main_us > 0 and r.post_us > 0
    # 4000 keys: 32 key blocks; the others 1 each: 16 heads x (32 + 1 + 16 + 1) live CTAs of 16 x 4 x 32
    assert r.kernel.units == 16 * (32 + 1 + 16 + 1)
    assert any(f"one launch of {16 * 4 * 32} CTAs" in n and f"{16 * (3 * 32 - 1 - 16 - 1)} lie past" in n
               for n in r.notes)
    assert r.tflops == pytest.approx(2.5 * p.flops / (r.time_us * 1e-6) / 1e12)
    # a sequence without tokens is no sequence: refused in one line
    with pytest.raises(InputError, match=r"^seqlens_k: sequence 1: a length must be >= 1 token, got 0$"):
        Problem.varlen(16, 128, [100, 200], [100, 0])


def test_empty_ctas_cost_their_launch():
    """Ten one-token sequences beside a long one: each has one live CTA per head and the rest of
    the long one's key blocks empty, each costing the CTA turnover on its SM."""
    long = Problem.varlen(16, 128, [8000], causal=True)
    more = Problem.varlen(16, 128, [1] * 10 + [8000], causal=True)
    a, b = bwd(long, CLOCK), bwd(more, CLOCK)
    free = bwd(more, {**CLOCK, "cta_launch_cycles": 0})
    assert b.main_us > free.main_us > a.main_us * 0.999
    assert b.kernel.cycles - free.kernel.cycles > 0.5 * (b.kernel.cycles - a.kernel.cycles)


def test_many_short_sequences_run_at_lower_tflops_than_one_long():
    """The same tokens as one sequence and as 64: the short ones have far fewer visible pairs
    (causal), a key block or few each, and the host's operations around the kernel cost about as
    much (the same packed rows, more padding): far fewer TFLOP/s."""
    lens = [1 + (i * 97) % 600 for i in range(64)]
    many = bwd(Problem.varlen(16, 128, lens, causal=True))
    one = bwd(Problem.varlen(16, 128, [sum(lens)], causal=True))
    assert many.tflops < 0.5 * one.tflops
    assert many.pre_us >= one.pre_us and many.pre_us == pytest.approx(one.pre_us, rel=0.1)
    # the launches around the kernel weigh more where the kernel has less to do
    assert (many.pre_us + many.post_us) / many.time_us > (one.pre_us + one.post_us) / one.time_us


def test_the_passes_around_the_kernel():
    """varlen_passes: the varlen preprocess (O, dO, LSE read over the packed rows; dPsum, LSE_log2
    and the zeroed accumulator written over each sequence's whole query blocks), then the
    postprocess (those blocks of the accumulator read, dQ's packed rows written): a launch each,
    as the dense backward's, and the same bytes where every length is a whole block."""
    p = Problem.varlen(8, 128, [100, 3000, 7], [200, 3000, 70], causal=True, heads_kv=2)
    knobs = setup(H200, None, p, {"gqa_dkv": "loop"}, IMPL, "bwd")[4]
    assert knobs["preprocess"] == "kernel" and knobs["grid_order"] == "heads_outer"
    pre, post = kernel_bwd.passes(p, knobs)
    d, tq, m = 128, 3107, knobs["tile_m"]
    blocks = 8 * (128 + 3008 + 64)                   # each head's sequences' whole query blocks (m = 64)
    assert m == 64 and len(pre) == len(post) == 1
    assert dict(pre) == {"preprocess kernel (varlen)": 8 * tq * (2 * d * 2 + 4) + blocks * (8 + 4 * d)}
    assert dict(post) == {"postprocess kernel (varlen)": blocks * 4 * d + 8 * tq * 2 * d}
    whole = Problem.varlen(8, 128, [128, 3008, 64], causal=True, heads_kv=2)  # lengths of whole blocks
    assert kernel_bwd.passes(whole, knobs) == tuple(
        ((f"{w} kernel (varlen)", b),) for w, ((_, b),) in zip(("preprocess", "postprocess"),
                                                                kernel_bwd.passes(Problem(1, 8, 3200, 3200, d), knobs)))
    post = dict(post)
    hw = setup(H200, None, p, {"gqa_dkv": "loop"}, IMPL, "bwd")[0]
    us = kernel_bwd.pre_post_us(p, hw, knobs)
    bw = hw.hbm_bandwidth_tbps * 1e6
    assert us[1] == pytest.approx(sum(post.values()) / bw + len(post) * hw.launch_gap_us)


def test_the_implementations_say_which_backward_runs_varlen():
    assert implementation.load("fa4kernel-sm90").varlen_bwd
    assert implementation.load("fa4kernel-sm90").for_pass("bwd").varlen
    for name in ("flash-attn-4-sm90", "flash-attn-3-sm90", "flash-attn-4-sm100"):
        assert not implementation.load(name).varlen_bwd
    entry = implementation.load("fa4kernel-sm90").bwd["varlen"]
    assert entry["source"].startswith("fa4kernel/sm90/bwd.py FlashBwdSm90Varlen, fa4kernel/varlen.py")


@pytest.mark.parametrize("hw, impl, allowed", [
    (H200, "flash-attn-4", "fa4kernel-sm90"),
    (H200, "flash-attn-3", "fa4kernel-sm90"),
    ("b200", "flash-attn-4", "none on sm100 (fa4kernel-sm90)"),
])
def test_an_implementation_without_a_varlen_backward_is_refused_in_one_line(hw, impl, allowed):
    with pytest.raises(InputError) as e:
        bwd(Problem.varlen(8, 128, [100, 200]), impl=impl, hw=hw)
    assert str(e.value) == f"impl: {impl} has no varlen backward; allowed impls: {allowed}"


@pytest.mark.parametrize("setting, param", [
    ({"grid_order": "tail_lpt"}, "grid_order"),
    ({"preprocess": "torch"}, "preprocess"),
])
def test_what_the_varlen_build_does_not_run_is_refused_in_one_line(setting, param):
    with pytest.raises(InputError) as e:
        bwd(Problem.varlen(8, 128, [100, 200], causal=True), setting)
    msg = str(e.value)
    assert msg.startswith(f"{param}: ") and "\n" not in msg and "allowed with a varlen batch: " in msg


def test_cli_varlen_backward(capsys):
    assert main(["run", "--hw", H200, "--impl", "fa4kernel", "--seqlens", "100,3000", "--pass", "bwd"]) == 0
    out = capsys.readouterr().out
    assert "varlen: 2 sequences" in out and "TFLOP/s" in out and "launches  preprocess" in out
    assert main(["run", "--hw", H200, "--impl", "flash-attn-4", "--seqlens", "100,3000", "--pass", "bwd"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "flash-attn-4 has no varlen backward; allowed impls: fa4kernel-sm90" in err


def test_deterministic_grid_of_one_head_is_the_dense_model():
    """deterministic_cycles (the dense launch) is deterministic_grid of its heads-outer grid; an
    empty CTA in the grid costs its slot a launch and breaks no head's chain."""
    from fa4sim.schedules.kernel_bwd import KvUnit, deterministic_cycles, deterministic_grid

    units = [KvUnit(4, 0, 0, 0, 0), KvUnit(4, 0, 0, 0, 0), KvUnit(3, 0, 0, 1, 0)]
    costs = [(400.0, 100.0), (400.0, 100.0), (300.0, 100.0)]
    for causal in (False, True):
        order = list(range(3))[::-1] if causal else list(range(3))
        grid = [(h, m) for h in range(2) for m in order]
        assert deterministic_cycles(units, costs, 2, 2, 150.0, 10.0, 5.0, causal) == \
            deterministic_grid(grid, units, costs, 2, 150.0, 10.0, 5.0)
    with_empty = [(0, 0), (0, -1), (0, 1), (0, 2)]
    plain = deterministic_grid([(0, 0), (0, 1), (0, 2)], units, costs, 1, 150.0, 0.0, 0.0)
    assert deterministic_grid(with_empty, units, costs, 1, 150.0, 0.0, 0.0) == (plain[0], plain[1] + 1)


def test_varlen_deterministic_waits_its_turns():
    """The deterministic varlen backward (fa4kernel's build) is modelled: it takes longer than the
    fast one, most where many key blocks share few query blocks (a long key sequence under a short
    query chunk: each query block's dQ turns run through every key block in order), and its
    causal grid runs each sequence's key blocks last first."""
    from fa4sim.schedules.kernel_bwd import varlen_grid

    batch = Problem.varlen(8, 64, [256, 1024], [8192, 3000])
    fast, det = bwd(batch), bwd(batch, {"deterministic": True})
    assert det.main_us > fast.main_us
    long = Problem.varlen(8, 64, [4000, 3000])
    ratio_long = bwd(long, {"deterministic": True}).main_us / bwd(long).main_us
    assert det.main_us / fast.main_us > ratio_long
    assert any(n.startswith("varlen:") for n in det.notes)

    class U:
        def __init__(self, seq):
            self.seq = seq

    units = [U(0), U(0), U(0), U(1)]
    assert varlen_grid(units, 1, False, reverse=True) == [(0, 2), (0, 1), (0, 0), (1, 3), (1, -1), (1, -1)]
    units = [U(0)] * 5 + [U(1)] * 2
    assert varlen_grid(units, 1, True, reverse=True) == [(0, 4), (0, 2), (0, 3), (0, 0), (0, 1), (0, -1),
                                                       (1, 5), (1, 6), (1, -1), (1, -1), (1, -1), (1, -1)]


def test_varlen_gqa_dkv_reduce_adds_the_accumulators_passes():
    """gqa_dkv "reduce" on a varlen batch: the dK / dV fp32 accumulators' zeroing and their turn
    into 16 bit run around the kernel, over the packed keys of each k/v head."""
    from fa4sim.schedules.kernel_bwd import varlen_passes

    p = Problem.varlen(8, 128, [300, 1000], heads_kv=2)
    knobs = {"tile_m": 64, "gqa_dkv": "reduce"}
    pre, post = varlen_passes(p, knobs)
    loop_pre, loop_post = varlen_passes(p, {"tile_m": 64, "gqa_dkv": "loop"})
    assert len(pre) == len(loop_pre) + 2 and len(post) == len(loop_post) + 2
    assert dict(pre)["dk_accum = zeros (fp32)"] == 2 * 1300 * 128 * 4
    assert dict(post)["dV fp32 -> 16 bit"] == 2 * 1300 * 128 * 6


def test_varlen_joint_accumulators_take_one_launch_each_side():
    """dkv_accum "joint" (fa4kernel): one zeroing launch and one conversion for both
    accumulators, the same bytes as flash-attn-4's two each."""
    from fa4sim.schedules.kernel_bwd import varlen_passes

    p = Problem.varlen(8, 128, [300, 1000], heads_kv=2)
    split = varlen_passes(p, {"tile_m": 64, "gqa_dkv": "reduce"})
    joint = varlen_passes(p, {"tile_m": 64, "gqa_dkv": "reduce", "dkv_accum": "joint"})
    assert len(joint[0]) == len(split[0]) - 1 and len(joint[1]) == len(split[1]) - 1
    assert sum(b for _, b in joint[0]) == sum(b for _, b in split[0])
    assert sum(b for _, b in joint[1]) == sum(b for _, b in split[1])
