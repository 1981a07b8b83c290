"""dq_smem (fa3_sm90_bwd.py): with "qdo" each warpgroup's fp32 dQ is staged over the Q/dO stage it
was computed from, not in a buffer of its own; the dq_store warp releases the stage once its bulk
reduce-adds have read it. Shared memory, the schedule's ops and edges, the errors, and that
`--set dq_smem=own` is the own-buffer prediction. No timing is asserted."""
import json

import pytest

from fa4sim import Problem, hardware, simulate
from fa4sim.cli import main
from fa4sim.errors import InputError
from fa4sim.model import build_cta, setup
from fa4sim.schedules import fa3_sm90_bwd as bwd

H100 = hardware.load("h100")
P256 = Problem(1, 8, 2048, 2048, 256)
P192 = Problem(1, 8, 2048, 2048, 192)
P128 = Problem(1, 8, 2048, 2048, 128)


def knobs_of(problem, overrides=None, impl="fa4kernel"):
    return setup("h100", None, problem, overrides or {}, impl, "bwd")[4]


def schedule(problem, overrides=None, impl="fa4kernel"):
    # the per-CTA dQ sum (fa4kernel's hd256 default is the pair: tests/test_sim_bwd_dq_sum.py)
    return build_cta("h100", problem, {"dq_sum": "cta", **(overrides or {})}, n_kv=4, masked=0, impl=impl,
                     pass_="bwd")


def edges(s):
    return {(e.src, e.dst, e.kind, e.distance) for e in s.edges}


# ---------------------------------------------------------------- fa4kernel's choice and its shared memory
@pytest.mark.parametrize("hdim,want", [(64, "own"), (96, "own"), (128, "own"), (192, "own"), (256, "qdo")])
def test_fa4kernel_stages_dq_over_q_and_do_at_256(hdim, want):
    p = Problem(1, 8, 2048, 2048, hdim)
    assert knobs_of(p)["dq_smem"] == want
    assert knobs_of(p, {"dq_reduce": "red"})["dq_smem"] == "own"  # qdo is for the bulk reduce-add only


def test_qdo_drops_the_dq_buffer_and_fits_two_stages_at_256():
    qdo, own = knobs_of(P256), knobs_of(P256, {"dq_smem": "own"})
    assert (qdo["q_stages"], qdo["do_stages"], own["q_stages"], own["do_stages"]) == (2, 2, 1, 1)
    # the same stages: the fp32 dQ buffer (64 x 256 x 4 bytes) is all that differs
    assert bwd.smem_bytes(P256, {**qdo, "dq_smem": "own"}) - bwd.smem_bytes(P256, qdo) == 64 * 256 * 4
    assert bwd.smem_bytes(P256, qdo) <= H100.smem_capacity_bytes
    assert bwd.smem_bytes(P256, {**qdo, "dq_smem": "own"}) > H100.smem_capacity_bytes
    with pytest.raises(InputError) as e:
        knobs_of(P256, {"dq_smem": "own", "q_stages": 2, "do_stages": 2})
    assert e.value.param == "smem" and "dq_smem qdo" in str(e.value)
    # 192 (own by default): two stages either way, 48 KB less with qdo
    assert knobs_of(P192)["q_stages"] == knobs_of(P192, {"dq_smem": "qdo"})["q_stages"] == 2
    k192 = knobs_of(P192, {"dq_smem": "qdo"})
    assert bwd.smem_bytes(P192, {**k192, "dq_smem": "own"}) - bwd.smem_bytes(P192, k192) == 64 * 192 * 4
    # the what-if of three stages at 192: it fits only without the dQ buffer
    three = {**k192, "q_stages": 3, "do_stages": 3}
    assert bwd.smem_bytes(P192, three) <= H100.smem_capacity_bytes < bwd.smem_bytes(P192, {**three, "dq_smem": "own"})
    assert knobs_of(P192, {"dq_smem": "qdo", "q_stages": 3, "do_stages": 3})["q_stages"] == 3


def test_qdo_smem_is_the_kernels():
    cfgmod = pytest.importorskip("fa4kernel.sm90.bwd_config")
    if not hasattr(cfgmod, "DQ_SMEM_DEFAULT"):
        pytest.skip("this fa4kernel predates dq_smem")
    for hdim in (192, 256):
        p = Problem(1, 8, 2048, 2048, hdim)
        for dq_smem in ("qdo", "own"):
            cfg = cfgmod.make_bwd_config("bfloat16", hdim, False, dq_smem=dq_smem)
            k = knobs_of(p, {"dq_smem": dq_smem})
            assert (k["q_stages"], k["do_stages"]) == (cfg.q_stages, cfg.q_stages)
            # fa4sim's count leaves out the kernel's 1 KiB alignments; both under the same limit
            assert bwd.smem_bytes(p, k) <= cfgmod.SMEM_LIMIT_BYTES >= cfgmod.bwd_smem_bytes(cfg)


# ---------------------------------------------------------------- the schedule: who releases the stage, and when
def test_qdo_stage_is_released_by_the_dq_store_warp_after_its_reduce_adds():
    s = schedule(P256)
    k = knobs_of(P256)
    e = edges(s)
    assert s.op("RELQ").role == "dq_store"
    for w in range(2):
        # the dO half once its dV is done, the Q half once its dK is done; then warp 1 adds both
        assert (f"dV{w}", f"DQW{w}", "flow", 0) in e and (f"dK{w}", f"DQWQ{w}", "flow", 0) in e
        assert (f"DQWQ{w}", f"ADDQ{w}", "flow", 0) in e and (f"ADDQ{w}", "RELQ", "flow", 0) in e
        # the MMA warpgroups release nothing; the dQ staging has no buffer of its own to wait for
        assert not any(src in (f"WAIT{w}", f"dV{w}") and dst in ("LQ", "LdO") for src, dst, _, _ in e)
        assert (f"ADDQ{w}", f"DQW{w}", "anti", 1) not in e
    assert ("RELQ", "LQ", "anti", k["q_stages"]) in e and ("RELQ", "LdO", "anti", k["do_stages"]) in e
    names = [o.name for o in s.ops if o.role == "dq_store"]
    assert names == ["ADDQ0", "ADDQ1", "RELQ"]
    wg0 = [o.name for o in s.ops if o.role == "wg0"]
    assert wg0.index("dQ0") < wg0.index("DQW0") < wg0.index("DQWQ0") < wg0.index("WAIT0")


def test_qdo_writes_and_adds_the_same_dq_bytes_in_two_halves():
    qdo, own = schedule(P256), schedule(P256, {"dq_smem": "own"})
    part = 64 * 256 * 4 / 2  # a warpgroup's fp32 dQ
    lsu = lambda s, n: dict(s.op(n).uses)["smem:lsu"] * H100.smem_bytes_per_clk  # noqa: E731
    assert lsu(qdo, "DQW0") == pytest.approx(part / 2) and lsu(qdo, "DQWQ0") == pytest.approx(part / 2)
    assert lsu(own, "DQW0") == pytest.approx(part)
    for s in (qdo, own):
        assert dict(s.op("ADDQ0").uses)["tma"] * H100.reduce_bytes_per_clk == pytest.approx(part)


def test_own_is_released_by_the_mma_warpgroups():
    s = schedule(P256, {"dq_smem": "own"})
    k = knobs_of(P256, {"dq_smem": "own"})
    e = edges(s)
    assert not any(o.name in ("RELQ", "DQWQ0", "DQWQ1") for o in s.ops)
    for w in range(2):
        assert (f"WAIT{w}", "LQ", "anti", k["q_stages"]) in e and (f"dV{w}", "LdO", "anti", k["do_stages"]) in e
        assert (f"ADDQ{w}", f"DQW{w}", "anti", 1) in e


def test_qdo_with_dv_dk_dq_writes_both_halves_after_the_wait():
    s = schedule(P256, {"mma_order": "dv_dk_dq"})
    wg0 = [o.name for o in s.ops if o.role == "wg0"]
    assert wg0.index("WAIT0") < wg0.index("DQW0") < wg0.index("DQWQ0")
    assert ("RELQ", "LQ", "anti", 2) in edges(s)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("problem,overrides,impl,words", [
    (P256, {"dq_smem": "qdo", "dq_reduce": "red"}, "fa4kernel", ("dq_reduce red", "allowed with dq_reduce red: own")),
    (P128, {"dq_smem": "qdo"}, "fa4kernel", ("kv_split", "hdim 128", "allowed: own")),
    (Problem(1, 8, 2048, 2048, 192, hdim_v=128), {"dq_smem": "qdo"}, "flash-attn-4", ("kv_split", "hdim_v 128")),
    (P256, {"dq_smem": "qdo", "atom_dkv": 2, "tile_n": 128}, "fa4kernel", ("kv_split", "atom_dkv 2")),
])
def test_qdo_where_it_cannot_stage_is_one_line(problem, overrides, impl, words):
    with pytest.raises(InputError) as e:
        knobs_of(problem, overrides, impl)
    assert e.value.param == "dq_smem" and "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("knob,cases", [
    ("dq_smem", (("256", "shared", "own, qdo"), ("128", "qdo", "kv_split"))),
    ("dq_sum", (("256", "cluster", "cta, pair"), ("128", "pair", "kv_split"))),  # tests/test_sim_bwd_dq_sum.py
])
def test_cli_rejects_a_bad_dq_staging_knob_in_one_line(capsys, knob, cases):
    base = ["run", "--pass", "bwd", "--hw", "h100", "--impl", "fa4kernel", "--seqlen", "1024", "--batch", "1",
            "--heads", "1"]
    for hdim, value, want in cases:
        assert main([*base, "--hdim", hdim, "--set", f"{knob}={value}"]) == 2
        out, err = capsys.readouterr()
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1 and knob in lines[0] and want in lines[0] and "Traceback" not in err


# ---------------------------------------------------------------- --set dq_smem=own keeps the own-buffer prediction
RUN = ["run", "--pass", "bwd", "--hw", "h100", "--impl", "fa4kernel", "--seqlen", "2048", "--batch", "1",
       "--heads", "8", "--json"]


def _cli(args, capsys):
    assert main(args) == 0
    return json.loads(capsys.readouterr()[0])


@pytest.mark.parametrize("hdim,causal", [(256, False), (256, True)])
def test_set_dq_smem_own_is_the_own_buffer_prediction(hdim, causal, capsys):
    extra = ["--causal"] if causal else []
    got = _cli([*RUN, "--hdim", str(hdim), *extra, "--set", "dq_smem=own"], capsys)
    p = Problem(1, 8, 2048, 2048, hdim, causal)
    # the own-buffer build with every knob it had set explicitly (the stage counts make_bwd_config gives it)
    stages = 1 if hdim == 256 else 2
    ref = simulate("h100", None, p, {"dq_smem": "own", "q_stages": stages, "do_stages": stages},
                   impl="fa4kernel", pass_="bwd")
    assert got["knobs"]["dq_smem"] == "own" and got["knobs"]["q_stages"] == stages
    for key in ("tflops", "time_us", "cycles", "clock_ghz"):
        assert got[key] == ref.to_json()[key], key
    # and it differs from the default (qdo) only in dq_smem and the stage counts
    dflt = _cli([*RUN, "--hdim", str(hdim), *extra], capsys)
    assert {n for n in dflt["knobs"] if dflt["knobs"][n] != got["knobs"][n]} <= {"dq_smem", "dq_sum", "q_stages", "do_stages"}


@pytest.mark.parametrize("hdim", [128, 192])
def test_where_own_is_the_default_setting_it_changes_nothing(hdim, capsys):
    a = _cli([*RUN, "--hdim", str(hdim)], capsys)
    b = _cli([*RUN, "--hdim", str(hdim), "--set", "dq_smem=own"], capsys)
    for key in ("tflops", "time_us", "cycles", "clock_ghz"):
        assert a[key] == b[key], key
