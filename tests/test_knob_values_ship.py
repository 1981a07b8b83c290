"""Only what ships: every value a kernel knob can take is chosen by an implementation (fa4kernel's
own defaults, which fa4sim/implementations/fa4kernel-sm90.json describes; flash-attn-4-sm90.json
for the simulator) or set by a lesson (lessons/*.py). A value neither chooses leaves the code: its
kernel branches, the simulator's choice and its tests (kept as a .diff in its campaign, e.g.
lab/campaigns/kernel-sm90-backward/).

A lesson's setting is a knob name with a literal value in a dict or as a keyword argument
(`{"stats": "thread"}`, `dq_reduce="red"`), read from the lessons' syntax trees; a knob written
inside a string (a recorded column such as "fa4kernel[mma_order=...]") is no setting. The values a
setting implies count too: make_bwd_config (or the implementation's rules) resolved with it.
Plain Python: nothing compiles."""
import ast
import dataclasses
import functools
import itertools
from pathlib import Path

import pytest

from fa4kernel.interface import LONG_TILES, SHORT_CAUSAL_TILES
from fa4kernel.sm90 import bwd_config as bc
from fa4kernel.sm90 import config as fc
from fa4sim import Problem, implementation
from fa4sim.errors import InputError
from fa4sim.model import setup
from fa4sim.schedules import fa3_sm90_bwd

LESSONS = sorted((Path(__file__).resolve().parent.parent / "lessons").glob("*.py"))

# the backward's value tuples (bwd_config.py), by knob
BWD_VALUES = {"dq_reduce": bc.DQ_REDUCE_MODES, "dq_smem": bc.DQ_SMEM_MODES, "dq_sum": bc.DQ_SUM_MODES,
              "stats": bc.STATS_MODES, "mma_order": bc.MMA_ORDERS, "preprocess": bc.PREPROCESS_MODES,
              "postprocess": bc.POSTPROCESS_MODES, "grid_order": bc.GRID_ORDERS, "dq_zero": bc.DQ_ZERO_MODES,
              "gqa_dkv": bc.GQA_DKV_MODES, "dq_slices": bc.DQ_SLICES,
              "tile_m": tuple(sorted({m for ms in bc.TILE_M_BY_HEAD_DIM.values() for m in ms}))}
BWD_KNOBS = tuple(n for n in bc.BWD_KNOB_NAMES if n != "deterministic")
SIM_BWD_CHOICES = {k.name: k.choices for k in fa3_sm90_bwd.KNOBS if k.choices}
SIM_BWD_KNOBS = tuple(k.name for k in fa3_sm90_bwd.KNOBS)
SIM_IMPLS = ("fa4kernel", "flash-attn-4")  # fa4sim/implementations/<name>-sm90.json


def settings(tree: ast.AST, names) -> list[dict]:
    """Each dict literal's and each call's knob settings: {name: literal value} of the names."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            pairs = [(k.value, v) for k, v in zip(node.keys, node.values)
                     if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        elif isinstance(node, ast.Call):
            pairs = [(kw.arg, kw.value) for kw in node.keywords if kw.arg]
        else:
            continue
        got = {}
        for name, value in pairs:
            if name in names and isinstance(value, ast.Constant):
                got[name] = value.value
        if got:
            out.append(got)
    return out


def lesson_settings(names) -> list[dict]:
    return [s for path in LESSONS for s in settings(ast.parse(path.read_text()), names)]


def test_a_knob_inside_a_string_is_no_setting():
    tree = ast.parse('STEPS = {"a": ("fa4kernel[mma_order=dv_x]", "x")}\nf(q, mma_order="dv_dk_dq")\n'
                     'y = {"stats": "thread", "label": "fa4kernel[stats=z]"}\ng(**{"tile_m": n})')
    assert settings(tree, BWD_KNOBS) == [{"mma_order": "dv_dk_dq"}, {"stats": "thread"}]


def test_the_lessons_set_the_first_design():
    """lessons/09_backward.py's baseline build: without it red, thread, dv_dk_dq and torch would
    have no lesson."""
    assert {"dq_reduce": "red", "stats": "thread", "mma_order": "dv_dk_dq", "preprocess": "torch"} in \
        lesson_settings(BWD_KNOBS)


@functools.cache
def bwd_shipped() -> dict:
    """Every value make_bwd_config gives each knob: its defaults at every (head dim, causal,
    deterministic), and with every lesson's setting."""
    shipped = {name: set() for name in BWD_VALUES}
    for knobs in [{}] + lesson_settings(bc.BWD_KNOB_NAMES):
        for hd, causal, det in itertools.product(bc.BWD_HEAD_DIMS, (False, True), (False, True)):
            det = knobs.get("deterministic", det)
            try:
                cfg = bc.make_bwd_config("bfloat16", hd, causal, det,
                                         **{k: v for k, v in knobs.items() if k != "deterministic"})
            except ValueError:
                continue  # not at this head dim
            for name in shipped:
                shipped[name].add(getattr(cfg, name))
    # the shape-dependent default (the host's, bwd_config.with_gqa_default): MQA on 8 x 2k keys, GQA 8:1 on 8 x 4k
    for heads, heads_kv, batch, keys in ((16, 1, 8, 2048), (64, 8, 8, 4096)):
        for hd in bc.BWD_HEAD_DIMS:
            for causal in (False, True):
                shipped["gqa_dkv"].add(bc.with_gqa_default({}, hd, heads, heads_kv, batch, keys, False,
                                                           causal=causal, seqlen_q=keys)["gqa_dkv"])
    # the deterministic default by shape (bwd_config.dq_slices_for): square, and 256 queries on 512 to 8k keys and 64 to 512 on 4k
    for sq, sk in ((4096, 4096), (256, 512), (256, 1024), (256, 8192), (256, 4096), (64, 4096), (512, 4096)):
        knobs = bc.with_dq_slices_default({}, "bfloat16", 64, False, True, sq, sk, 1)
        shipped["dq_slices"].add(knobs["dq_slices"])
    return shipped


@pytest.mark.parametrize("name", BWD_VALUES)
def test_every_backward_knob_value_ships(name):
    shipped = bwd_shipped()[name]
    assert set(BWD_VALUES[name]) <= shipped, (
        f"{name}: {sorted(set(BWD_VALUES[name]) - shipped)} chosen by no default of make_bwd_config "
        f"and set by no lesson; remove it (kept as a .diff in its campaign) or use it in a lesson")


def test_the_backward_value_tuples_cover_the_knobs():
    """Every backward knob with a fixed set of values is checked above."""
    assert set(BWD_KNOBS) == set(BWD_VALUES)


@functools.cache
def sim_shipped() -> dict:
    """Every value the implementations' backward choices (their JSON rules) resolve each choice knob
    to, at each of their head dims, causal or not, short, long and two chunks (256 queries on 1024
    and 8192 keys), deterministic or not (a user's argument) and with every lesson's setting; and
    the values the lessons set themselves."""
    shipped = {name: set() for name in SIM_BWD_CHOICES}
    lessons = lesson_settings(SIM_BWD_KNOBS)
    for knobs in lessons:
        for name, value in knobs.items():
            if name in shipped:
                shipped[name].add(value)
    for impl_name in SIM_IMPLS:
        impl = implementation.load(impl_name, "sm90")
        for (hd, hdv), causal, (sq, sk) in itertools.product(impl.for_pass("bwd").head_dims, (False, True),
                                                             ((1024, 1024), (8192, 8192), (256, 1024), (256, 8192), (256, 4096), (64, 4096))):
            p = Problem(1, 16, sq, sk, hd, causal, hdim_v=hdv)
            for knobs in [{}, {"deterministic": True}] + lessons:
                try:
                    k = setup("h100", None, p, knobs, impl, "bwd")[4]
                except InputError:
                    continue
                for name in shipped:
                    shipped[name].add(k[name])
    return shipped


@pytest.mark.parametrize("name", SIM_BWD_CHOICES)
def test_every_simulator_backward_choice_ships(name):
    shipped = sim_shipped()[name]
    assert set(SIM_BWD_CHOICES[name]) <= shipped, (
        f"fa3_sm90_bwd {name}: {sorted(set(SIM_BWD_CHOICES[name]) - shipped, key=str)} resolved by no "
        f"implementation ({', '.join(SIM_IMPLS)}) and set by no lesson")


# the forward (sm90/config.py KNOB_NAMES): its bool knobs, and tile_m, whose values are the
# multiples of 16 make_config accepts somewhere; tile_n, kv_stages, exp_emulation and
# rescale_threshold are ranges, not value sets
FWD_BOOLS = tuple(f.name for f in dataclasses.fields(fc.KernelConfig) if f.name in fc.KNOB_NAMES and f.type == "bool")


def _fwd_accepts(name, value) -> bool:
    for hd in fc.SUPPORTED_HEAD_DIMS:
        for knobs in ({name: value}, {name: value, "tile_n": 64}):
            try:
                fc.make_config("bfloat16", hd, False, False, knobs)
                return True
            except ValueError:
                pass
    return False


FWD_VALUES = {**{n: (False, True) for n in FWD_BOOLS},
              "tile_m": tuple(m for m in range(16, 257, 16) if _fwd_accepts("tile_m", m))}


@functools.cache
def fwd_shipped() -> dict:
    shipped = {name: set() for name in FWD_VALUES}
    for knobs in [{}] + lesson_settings(fc.KNOB_NAMES):
        for hd, causal, lse in itertools.product(fc.SUPPORTED_HEAD_DIMS, (False, True), (False, True)):
            rule = SHORT_CAUSAL_TILES if causal else LONG_TILES
            for short in ([{}, rule[hd]] if hd in rule else [{}]):
                try:
                    cfg = fc.make_config("bfloat16", hd, causal, lse, {**short, **knobs})
                except ValueError:
                    continue
                for name in shipped:
                    shipped[name].add(getattr(cfg, name))
    return shipped


def test_the_forward_knob_sets():
    assert FWD_VALUES["tile_m"] == (128, 192)
    assert set(FWD_BOOLS) == {"pingpong", "intra_wg_overlap", "p_in_registers", "persistent", "rescale_before_pv",
                              "early_q_release", "defer_o_store_wait", "chained_row_sum"}


@pytest.mark.parametrize("name", FWD_VALUES)
def test_every_forward_knob_value_ships(name):
    """A bool knob passes where its auto rule (or a lesson) picks both values somewhere."""
    shipped = fwd_shipped()
    assert set(FWD_VALUES[name]) <= shipped[name], (
        f"{name}: {sorted(set(FWD_VALUES[name]) - shipped[name])} chosen by no default of make_config and set "
        f"by no lesson")

