"""fa4sim/implementations/fa4kernel-sm90.sass.json, the SASS tables generated from fa4kernel's
compiled builds (lab/tools/sass_tables.py --write): marked generated, keyed exactly, complete for
every build fa4kernel-sm90.json chooses and lessons/09_backward.py simulates, and (compile) its rows
for a few builds are what the compiler makes of them now.

If a compile test here fails, a compiler or kernel change moved a count or the PV wait: rerun
CUTE_DSL_ARCH=sm_90a python3 lab/tools/sass_tables.py --write and commit the file."""
import json

import pytest

from fa4sim import Problem, implementation
from fa4sim.implementation import discrete
from fa4sim.model import setup
from fa4sim.params import Context

DOC = json.loads((implementation.IMPL_DIR / "fa4kernel-sm90.sass.json").read_text())
TABLES = {**DOC["fwd"], **DOC["bwd"]}  # pv_wait_sass, tau_test_sass, v_zero_sass, combine_sass; loop_instr_sass
HEAD_DIMS = (64, 96, 128, 192, 256)


def test_the_file_says_it_is_generated_and_by_which_command():
    assert next(iter(DOC)) == "generated"
    assert DOC["generated"].startswith("by python3 lab/tools/sass_tables.py --write")
    assert DOC["generated"].endswith("do not edit")


@pytest.mark.parametrize("name", TABLES)
def test_each_row_names_its_build_by_every_key_once(name):
    """Rows keyed by knob -> value, every key, no floats (matched exactly), each build once, each
    with the configuration call it was compiled from; fallbacks substitute keys only."""
    t = TABLES[name]
    builds = [r["build"] for r in t["rows"]]
    assert all(list(b) == t["keys"] for b in builds)
    assert all(isinstance(v, (str, int, bool)) for b in builds for v in b.values())
    assert len({json.dumps(b) for b in builds}) == len(builds)
    assert all(r["compiled_from"].startswith(("make_config(", "make_varlen_config(", "make_bwd_config(",
                                              "compile_combine_sass("))
               for r in t["rows"])
    assert all(set(f) <= set(t["keys"]) for f in t.get("fallbacks", []))


def test_the_file_holds_the_builds_the_command_compiles():
    from lab.tools import sass_tables

    fwd = [f"make_config('bfloat16', {hd}, {c}, False, {k!r})" for hd, c, k in sass_tables.FWD_BUILDS]
    bwd = [f"make_bwd_config('bfloat16', {hd}, {c}{''.join(f', {n}={v!r}' for n, v in k.items())})"
           for hd, c, k in sass_tables.BWD_BUILDS]
    assert [r["compiled_from"] for r in TABLES["pv_wait_sass"]["rows"]] == fwd
    assert [r["compiled_from"] for r in TABLES["loop_instr_sass"]["rows"]] == bwd
    assert [r["build"] for r in TABLES["tau_test_sass"]["rows"]] == [{"hdim": hd, "causal": c} for hd in HEAD_DIMS
                                                                      for c in (False, True)]
    assert TABLES["loop_instr_sass"]["fallbacks"] == sass_tables.BWD_FALLBACKS
    assert [r["build"] for r in TABLES["v_zero_sass"]["rows"]] == [{"hdim": hd} for hd in HEAD_DIMS]
    assert [r["build"] for r in TABLES["combine_sass"]["rows"]] == [{"hdim": hd} for hd in HEAD_DIMS]


def _fwd_key(p: Problem, k: dict) -> dict:
    cfg = {"hdim": p.hdim, "causal": p.causal, **k, "exp_emulation": float(k["exp_emulation"]),
           "rescale_threshold": float(k["rescale_threshold"] or 0.0)}
    return {key: discrete(cfg[key]) for key in TABLES["pv_wait_sass"]["keys"]}


def _bwd_key(p: Problem, k: dict) -> dict:
    return {key: discrete({"hdim": p.hdim, "causal": p.causal, **k}[key]) for key in TABLES["loop_instr_sass"]["keys"]}


@pytest.mark.parametrize("hdim", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen", [1000, 8192])
def test_every_forward_build_fa4kernel_chooses_has_its_own_row(hdim, causal, seqlen):
    """pv_wait=compiled finds fa4kernel's own choice at every head dim in the table itself (not
    through a fallback), and its other variants hd128's rows."""
    from fa4sim.schedules.fa3_sm90 import compiled_pv_wait

    p = Problem(1, 1, seqlen, seqlen, hdim, causal)
    impl = implementation.load("fa4kernel", "sm90")
    builds = [r["build"] for r in TABLES["pv_wait_sass"]["rows"]]
    for what_if in [{}] + ([{"exp_emulation": 0.125}, {"rescale_threshold": 8.0}, {"pingpong": False},
                            {"p_in_registers": False}, {"kv_stages": 3}] if hdim == 128 else []):
        k = setup("h100-datasheet", "fa3", p, {"pv_wait": "compiled", **what_if}, "fa4kernel")[4]
        key = _fwd_key(p, k)
        assert key in builds, key
        assert compiled_pv_wait(impl, p, k) == TABLES["pv_wait_sass"]["rows"][builds.index(key)]["before"]
    tau = next(r["instr"] for r in TABLES["tau_test_sass"]["rows"] if r["build"] == {"hdim": hdim, "causal": causal})
    k = setup("h100-datasheet", "fa3", p, {"rescale_threshold": 8.0}, "fa4kernel")[4]
    assert impl.value("tau_test_instr", Context(p, None, impl), k) == tau


# the backward builds lessons/09_backward.py simulates with --impl fa4kernel: the launch orders at
# hd256, and the settled-power runs' knobs (lab/campaigns/backward-power/bwd_power_long_*.json)
LESSON_BWD = ([(256, c, {"grid_order": g}) for c in (False, True) for g in ("heads_outer", "tail_lpt")]
              + [(128, False, {}), (128, False, {"dq_reduce": "red"}), (256, False, {"dq_sum": "cta"}),
                 (64, False, {}), (256, False, {})])


@pytest.mark.parametrize("hdim,causal,knobs", [(hd, c, {}) for hd in HEAD_DIMS for c in (False, True)] + LESSON_BWD)
def test_every_backward_build_chosen_or_simulated_has_its_own_row(hdim, causal, knobs):
    p = Problem(1, 8, 2048, 2048, hdim, causal)
    impl, k = (lambda s: (s[3], s[4]))(setup("h100", None, p, knobs, "fa4kernel", "bwd"))
    key = _bwd_key(p, k)
    rows = {json.dumps(r["build"]): r for r in TABLES["loop_instr_sass"]["rows"]}
    assert json.dumps(key) in rows, key
    row = rows[json.dumps(key)]
    ctx = Context(p, None, impl)
    assert (impl.value("loop_instr_per_kstep", ctx, k), impl.value("loop_instr_fixed", ctx, k)) == (
        row["per_kstep"], row["fixed"])


def test_a_combination_not_compiled_takes_its_fallback():
    """hd128 causal with the first design's knobs launches tail_lpt, compiled only heads_outer; hd96 with
    stats thread alone takes the head dim's stand-in (dq_reduce red, stats thread, dv_dk_dq)."""
    p128, p96 = Problem(1, 8, 2048, 2048, 128, True), Problem(1, 8, 2048, 2048, 96, False)
    first = {"dq_reduce": "red", "stats": "thread", "mma_order": "dv_dk_dq"}
    rows = {json.dumps(r["build"]): r for r in TABLES["loop_instr_sass"]["rows"]}
    for p, knobs, stand_in in [
        (p128, first, {**_bwd_key(p128, setup("h100", None, p128, first, "fa4kernel", "bwd")[4]),
                       "grid_order": "heads_outer"}),
        (p96, {"stats": "thread"}, {"hdim": 96, "causal": False, "tile_m": 64, "grid_order": "heads_outer",
                                    **first, "dq_smem": "own", "dq_sum": "cta"})]:
        impl, k = (lambda s: (s[3], s[4]))(setup("h100", None, p, knobs, "fa4kernel", "bwd"))
        assert json.dumps(_bwd_key(p, k)) not in rows
        assert impl.value("loop_instr_fixed", Context(p, None, impl), k) == rows[json.dumps(stand_in)]["fixed"]


# a few builds compiled again (the compile cache keys on the kernel's sources): each head dim's
# default, a causal one, a knob variant of each pass
FWD_RECOMPILED = [(128, False, {}), (128, True, {"exp_emulation": 0.125}), (192, True, {}), (256, False, {}),
                  (128, False, {"rescale_before_pv": False}), (64, True, {"rescale_threshold": None})]
BWD_RECOMPILED = [(128, True, {}), (64, False, {}), (64, True, {"tile_m": 64, "dq_reduce": "red", "stats": "thread",
                                                                "mma_order": "dv_dk_dq", "grid_order": "heads_outer"}),
                  (192, False, {"dq_smem": "qdo", "grid_order": "heads_outer"}), (256, True, {})]


@pytest.mark.compile
@pytest.mark.parametrize("build", FWD_RECOMPILED)
def test_pv_wait_rows_match_fresh_sass(build):
    pytest.importorskip("cutlass")
    from lab.tools import sass_tables

    (fresh,) = sass_tables.pv_wait_rows([build])
    assert fresh in TABLES["pv_wait_sass"]["rows"], fresh


@pytest.mark.compile
@pytest.mark.parametrize("build", BWD_RECOMPILED)
def test_loop_instr_rows_match_fresh_sass(build):
    pytest.importorskip("cutlass")
    from lab.tools import sass_tables

    (fresh,) = sass_tables.loop_instr_rows([build])
    assert fresh in TABLES["loop_instr_sass"]["rows"], fresh


@pytest.mark.compile
def test_tau_test_rows_match_fresh_sass():
    pytest.importorskip("cutlass")
    from lab.tools import sass_tables

    assert sass_tables.tau_test_rows() == TABLES["tau_test_sass"]["rows"]


@pytest.mark.compile
def test_v_zero_rows_match_fresh_sass():
    pytest.importorskip("cutlass")
    from lab.tools import sass_tables

    assert sass_tables.v_zero_rows() == TABLES["v_zero_sass"]["rows"]


@pytest.mark.compile
def test_combine_rows_match_fresh_sass():
    pytest.importorskip("cutlass")
    from lab.tools import sass_tables

    assert sass_tables.combine_rows() == TABLES["combine_sass"]["rows"]
