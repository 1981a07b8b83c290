"""dq_sum (fa3_sm90_bwd.py, kernel_bwd.py): with "pair" the two CTAs of a 2-CTA cluster sum dQ
through distributed shared memory before one bulk reduce-add: warpgroup 0 owns its head-dim half,
warpgroup 1 sends its half to the peer (the mirror of this CTA). The knob's errors, the ops, edges
and bytes of the schedule, the launch's units and reduce-add bytes, and that `--set dq_sum=cta` is
the per-CTA prediction. No timing is asserted."""
import json

import pytest

from fa4sim import Problem, hardware, simulate
from fa4sim.cli import main
from fa4sim.errors import InputError
from fa4sim.model import build_cta, setup
from fa4sim.schedules import fa3_sm90_bwd as bwd
from fa4sim.schedules import kernel_bwd

H100 = hardware.load("h100")
P256 = Problem(1, 8, 2048, 2048, 256)
PART = 64 * 256 * 4 / 2  # one warpgroup's fp32 dQ at head dim 256, bytes


def knobs_of(problem, overrides=None, impl="fa4kernel"):
    return setup("h100", None, problem, overrides or {}, impl, "bwd")[4]


def schedule(problem, overrides=None, impl="fa4kernel"):
    return build_cta("h100", problem, overrides or {}, n_kv=4, masked=0, impl=impl, pass_="bwd")


def edges(s):
    return {(e.src, e.dst, e.kind, e.distance) for e in s.edges}


def uses(s, name):
    return dict(s.op(name).uses)


# ---------------------------------------------------------------- fa4kernel's choice
@pytest.mark.parametrize("hdim,overrides,want", [
    (64, {}, "cta"), (128, {}, "cta"), (192, {}, "cta"), (192, {"dq_smem": "qdo"}, "cta"), (256, {}, "pair"),
    (256, {"dq_smem": "own"}, "cta"), (256, {"mma_order": "dv_dk_dq"}, "cta"), (256, {"dq_reduce": "red"}, "cta")])
def test_fa4kernel_sums_dq_in_pairs_at_256_with_qdo(hdim, overrides, want):
    assert knobs_of(Problem(1, 8, 2048, 2048, hdim), overrides)["dq_sum"] == want


def test_the_per_cta_path_is_the_default_of_the_schedule():
    assert knobs_of(P256, {}, "flash-attn-4")["dq_sum"] == "cta"
    assert "dsmem" not in schedule(P256, {"dq_sum": "cta"}).units


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("problem,overrides,words", [
    (P256, {"dq_sum": "pair", "dq_smem": "own"}, ("dq_smem qdo", "not dq_smem own", "allowed there: cta")),
    (P256, {"dq_sum": "pair", "mma_order": "dv_dk_dq"}, ("dv_dk_dq", "allowed with dq_sum pair: mma_order dv_dq_dk")),
    (Problem(1, 8, 2048, 2048, 128), {"dq_sum": "pair"}, ("kv_split", "hdim 128", "allowed there: cta")),
])
def test_pair_where_it_cannot_sum_is_one_line(problem, overrides, words):
    with pytest.raises(InputError) as e:
        knobs_of(problem, overrides)
    assert e.value.param == "dq_sum" and "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value)


# the CLI's one-line rejection of a bad dq_sum: tests/test_sim_bwd_dq_smem.py (with dq_smem's)


# ---------------------------------------------------------------- the schedule
def test_pair_owner_receives_and_the_sender_sends_instead_of_staging():
    pair, cta = schedule(P256), schedule(P256, {"dq_sum": "cta"})
    names, cta_names = {o.name for o in pair.ops}, {o.name for o in cta.ops}
    # the owner (WG0) reads the peer's half back and stages the sum; the sender (WG1) stages nothing
    assert {"RECV0", "DQW0", "DQWQ0", "SEND1"} <= names and not {"DQW1", "DQWQ1", "SEND0", "RECV1"} & names
    assert {"DQW1", "DQWQ1"} <= cta_names and not {"SEND1", "RECV0"} & cta_names
    assert pair.op("SEND1").role == "wg1" and pair.op("RECV0").role == "wg0"
    assert "dsmem" in pair.units and "dsmem" not in cta.units
    e = edges(pair)
    # the sender sends once its dV and dK are done (its columns of the stage are dead); the peer's
    # half (its mirror's send) lands before the owner reads it, after its own dQ
    assert {("dV1", "SEND1", "flow", 0), ("dK1", "SEND1", "flow", 0), ("dQ1", "SEND1", "flow", 0),
            ("SEND1", "LAND1", "flow", 0), ("LAND1", "RECV0", "flow", 0), ("dQ0", "RECV0", "flow", 0),
            ("RECV0", "DQW0", "flow", 0)} <= e
    # one warpgroup's bulk reduce-adds (the sum), then the stage goes back to the load warp
    assert {("DQWQ0", "ADDQ0", "flow", 0), ("ADDQ0", "RELQ", "flow", 0)} <= e
    assert not any(x == "ADDQ1" for x, *_ in e) and "ADDQ1" not in names


def test_pair_halves_the_reduce_add_bytes_and_moves_the_other_half_between_sms():
    pair, cta = schedule(P256), schedule(P256, {"dq_sum": "cta"})
    l2 = lambda s: sum(uses(s, o.name).get("l2", 0.0) for o in s.ops if o.name.startswith("ADDQ"))  # noqa: E731
    assert l2(pair) == pytest.approx(l2(cta) / 2)
    assert uses(pair, "ADDQ0")["tma"] * H100.reduce_bytes_per_clk == pytest.approx(PART)
    assert pair.op("ADDQ0").issue_cycles == 2  # two bulk reduce-adds of half each
    sent, landing = uses(pair, "SEND1"), uses(pair, "LAND1")
    # the senders are held until all but dsmem_queue_bytes have left; those land after they go on
    assert 0 < H100.dsmem_queue_bytes < PART
    assert sent["dsmem"] * H100.dsmem_bytes_per_clk == pytest.approx(PART - H100.dsmem_queue_bytes)
    assert landing["dsmem"] * H100.dsmem_bytes_per_clk == pytest.approx(H100.dsmem_queue_bytes)
    assert pair.op("LAND1").asynchronous
    assert sent["smem"] * H100.smem_bytes_per_clk == pytest.approx(PART)  # the peer's half lands here
    got = uses(pair, "RECV0")
    assert got["smem:lsu"] * H100.smem_bytes_per_clk == pytest.approx(PART)  # read back once (LDS)
    assert got["fma"] * H100.fma_lanes_per_clk == pytest.approx(PART / 4)   # one FADD per float
    # the owner writes the sum over its own columns: the bytes of the per-CTA path's halves
    for x in ("DQW0", "DQWQ0"):
        assert uses(pair, x)["smem:lsu"] == pytest.approx(uses(cta, x)["smem:lsu"])


def test_launch_reduce_add_bytes_halve():
    units = kernel_bwd.kv_units(P256, 64, 64)
    k = knobs_of(P256)
    assert kernel_bwd.reduce_add_bytes(P256, units, 64, k) == pytest.approx(
        kernel_bwd.reduce_add_bytes(P256, units, 64) / 2)
    l2_pair, _ = kernel_bwd.traffic(P256, H100, units, 64, False, k)
    l2_cta, _ = kernel_bwd.traffic(P256, H100, units, 64, False, {**k, "dq_sum": "cta"})
    visits = 8 * sum(u.n_kv for u in units)
    assert l2_cta - l2_pair == pytest.approx(visits * 64 * 256 * 4 / 2)
    # deterministic: one accumulator either way, the same preprocess bytes
    det = {**k, "deterministic": True}
    assert kernel_bwd.passes(P256, det) == kernel_bwd.passes(P256, {**det, "dq_sum": "cta"})


# ---------------------------------------------------------------- the launch's units
def test_pair_units_walk_the_first_tiles_q_blocks_causal_one_more():
    p = Problem(1, 8, 1024, 1024, 256, True)
    alone, pair = kernel_bwd.kv_units(p, 64, 64), kernel_bwd.kv_units(p, 64, 64, pair=True)
    assert len(alone) == len(pair) == 16
    for i, (a, b) in enumerate(zip(alone, pair)):
        if i % 2 == 0:
            assert (b.n_kv, b.first, b.masked) == (a.n_kv, a.first, a.masked)
        else:  # the second CTA starts at its pair's first Q block: one more, fully masked
            assert (b.n_kv, b.first, b.masked) == (a.n_kv + 1, a.first - 1, a.masked + 1)
            assert b.n_kv == pair[i - 1].n_kv
    assert sum(u.n_kv for u in pair) - sum(u.n_kv for u in alone) == 8
    # without a mask the pairs change nothing
    q = Problem(1, 8, 1024, 1024, 256)
    assert kernel_bwd.kv_units(q, 64, 64, pair=True) == kernel_bwd.kv_units(q, 64, 64)


def test_pair_units_pad_an_odd_count_of_kv_tiles():
    p = Problem(1, 8, 960, 960, 256)  # 15 KV tiles of 64 keys
    alone, pair = kernel_bwd.kv_units(p, 64, 64), kernel_bwd.kv_units(p, 64, 64, pair=True)
    assert (len(alone), len(pair)) == (15, 16)
    pad = pair[-1]
    assert pad.n_kv == pair[-2].n_kv == alone[-1].n_kv and pad.masked == pad.n_kv and pad.rank == 15
    assert bwd.units(p, 64, 64, knobs_of(p)) == pair
    assert bwd.units(p, 64, 64, knobs_of(p, {"dq_sum": "cta"})) == alone


# ---------------------------------------------------------------- --set dq_sum=cta keeps the per-CTA prediction
RUN = ["run", "--pass", "bwd", "--hw", "h100", "--impl", "fa4kernel", "--seqlen", "2048", "--batch", "1",
       "--heads", "8", "--hdim", "256", "--json"]


def _cli(args, capsys):
    assert main(args) == 0
    return json.loads(capsys.readouterr()[0])


@pytest.mark.parametrize("causal", [False, True])
def test_set_dq_sum_cta_is_the_per_cta_prediction(causal, capsys):
    extra = ["--causal"] if causal else []
    got = _cli([*RUN, *extra, "--set", "dq_sum=cta"], capsys)
    ref = simulate("h100", None, Problem(1, 8, 2048, 2048, 256, causal), {"dq_sum": "cta"}, impl="fa4kernel",
                   pass_="bwd")
    assert got["knobs"]["dq_sum"] == "cta" and got["knobs"]["dq_smem"] == "qdo"
    for key in ("tflops", "time_us", "cycles", "clock_ghz"):
        assert got[key] == ref.to_json()[key], key
    dflt = _cli([*RUN, *extra], capsys)
    assert dflt["knobs"]["dq_sum"] == "pair"
    assert {n for n in dflt["knobs"] if dflt["knobs"][n] != got["knobs"][n]} == {"dq_sum"}
