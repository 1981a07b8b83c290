"""fa4kernel's measured SASS tables, from its compiled builds: fa4sim/implementations/fa4kernel-sm90.sass.json.

    CUTE_DSL_ARCH=sm_90a python3 lab/tools/sass_tables.py [--write] [--only TABLE]

Compiles every build the tables hold for sm_90a on the CPU (fa4kernel.compile_sass,
compile_bwd_sass; the compile cache makes a rerun quick) and counts in its SASS:
  pv_wait_sass     the forward's KV loop split at the wait for the previous block's PV GEMM: per
                   pipe the share of the block's softmax instructions issued before it
                   (lab/tools/pv_wait_sass.py split), for fa4sim's pv_wait=compiled
  tau_test_sass    the forward's KV loop with conditional rescaling (rescale_threshold 8) less the
                   same build rescaling always (both rescale before the PV GEMM): the instructions
                   its test adds per warp and block, for tau_test_instr, per head dim's default
  v_zero_sass      the varlen / decode forward's V zeroing (fa4kernel.sass.v_zero_trip): a trip's
                   instructions, the longest chain of them that wait on each other (dependent_chain)
                   and the elements a thread zeroes per trip, for v_zero_loop_instr,
                   v_zero_loop_chain and v_zero_elems_per_trip
  combine_sass     the split-KV combine (sm90/combine.py, fa4kernel.sass.combine_in_flight): the
                   splits whose partials its warp has in flight when it waits for the first, for
                   combine_partial_splits_per_round
  loop_instr_sass  the backward's Q-block loop per consumer thread (loop_counts): per_kstep =
                   (HGMMA + uniform datapath) / HGMMA, fixed = the rest less the pointwise
                   instructions fa4sim counts itself (loop_fixed), for loop_instr_per_kstep and
                   loop_instr_fixed
Each row: `build`, the knob values it is matched on (exactly; exp_emulation and rescale_threshold
as the kernel's value written "%g", rescale_threshold "0" = always rescale), and `compiled_from`,
the configuration call it was compiled from. Without --write it prints the file it would write.
fa4sim's implementation loader merges the file into fa4kernel-sm90's constants
(fa4sim/implementation.py); tests/test_sass_tables_generated.py recompiles some rows.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

PATH = os.path.join(ROOT, "fa4sim", "implementations", "fa4kernel-sm90.sass.json")
GENERATED = "by python3 lab/tools/sass_tables.py --write from the compiled kernels; do not edit"
TOOLCHAIN = "compiled for sm_90a on the CPU (CUDA 13.0 ptxas via nvidia-cutlass-dsl 4.8.1)"

# ---------------------------------------------------------------- the forward: where the PV wait sits
FWD_KEYS = ("hdim", "causal", "tile_n", "kv_stages", "pingpong", "p_in_registers", "exp_emulation",
            "rescale_threshold", "rescale_before_pv")
# the builds: every head dim's default, causal and not, and each always rescaling (the model's
# rescale_threshold None: what the recorded runs before conditional rescaling was the default ran);
# at hd128 the knob variants, with conditional rescaling (the default) and without
ALWAYS = {"rescale_threshold": None}
KNOB_VARIANTS = [{"exp_emulation": 0.125}, {"exp_emulation": 0.25}, {"pingpong": False}, {"p_in_registers": False},
                 {"kv_stages": 3}]
# conditional rescaling after the PV wait (the kernel's place for it before rescale_before_pv)
AFTER_PV_WAIT = [{"rescale_before_pv": False}, {"exp_emulation": 0.125, "rescale_before_pv": False}]
FWD_VARIANTS = KNOB_VARIANTS + [{**v, **ALWAYS} for v in KNOB_VARIANTS] + [ALWAYS] + AFTER_PV_WAIT
FWD_BUILDS = ([(128, causal, v) for causal in (False, True) for v in FWD_VARIANTS]
              + [(hd, causal, {}) for hd in (64, 96, 128, 192, 256) for causal in (False, True)]
              + [(hd, causal, ALWAYS) for hd in (64, 96, 192, 256) for causal in (False, True)
                 if (hd, causal) != (256, False)]  # hd256 without a mask: its default rescales always
              + [(256, False, {"tile_n": 80})])  # long launches without a mask (interface.LONG_TILES)


def fwd_build(cfg) -> dict:
    """The knobs a forward row is matched on, from the kernel's configuration."""
    from fa4sim.implementation import discrete

    return {"hdim": cfg.head_dim, "causal": cfg.causal, "tile_n": cfg.tile_n, "kv_stages": cfg.kv_stages,
            "pingpong": cfg.pingpong, "p_in_registers": cfg.p_in_registers,
            "exp_emulation": discrete(float(cfg.exp_emulation)),
            "rescale_threshold": discrete(float(cfg.rescale_threshold)), "rescale_before_pv": cfg.rescale_before_pv}


def pv_wait_rows(builds=FWD_BUILDS) -> list[dict]:
    import fa4kernel
    from fa4kernel import make_config

    from lab.tools.pv_wait_sass import split

    rows = []
    for hd, causal, knobs in builds:
        call = f"make_config('bfloat16', {hd}, {causal}, False, {knobs!r})"
        print(f"# {call}", file=sys.stderr, flush=True)
        cfg = make_config("bfloat16", hd, causal, False, dict(knobs))
        rows.append({"build": fwd_build(cfg), **({} if knobs else {"default": True}), "compiled_from": call,
                     "before": split(fa4kernel.compile_sass(cfg, arch="sm_90a"))})
    return rows


# the tau test's instructions: the tau build less the same build always rescaling, both rescaling
# before the PV GEMM
TAU_PAIR = ({"rescale_threshold": 8.0}, {**ALWAYS, "rescale_before_pv": True})


def tau_test_rows() -> list[dict]:
    import fa4kernel
    from fa4kernel import make_config
    from fa4kernel.sass import kv_loop

    rows = []
    for hd in (64, 96, 128, 192, 256):
        for causal in (False, True):
            calls = [f"make_config('bfloat16', {hd}, {causal}, False, {k!r})" for k in TAU_PAIR]
            print(f"# {calls[0]} less {calls[1]}", file=sys.stderr, flush=True)
            tau, plain = (len(kv_loop(fa4kernel.compile_sass(make_config("bfloat16", hd, causal, False, k),
                                                             arch="sm_90a")))
                          for k in TAU_PAIR)
            rows.append({"build": {"hdim": hd, "causal": causal}, "compiled_from": " less ".join(calls),
                         "instr": tau - plain})
    return rows


def v_zero_rows() -> list[dict]:
    import fa4kernel
    from fa4kernel.sass import dependent_chain, v_zero_trip
    from fa4kernel.sm90.config import make_varlen_config

    rows = []
    for hd in (64, 96, 128, 192, 256):
        call = f"make_varlen_config('bfloat16', {hd}, True, True, {{}})"
        print(f"# {call}", file=sys.stderr, flush=True)
        trip, elems = v_zero_trip(fa4kernel.compile_sass(make_varlen_config("bfloat16", hd, True, True, {}),
                                                         arch="sm_90a"))
        rows.append({"build": {"hdim": hd}, "compiled_from": call, "instr": len(trip), "chain": dependent_chain(trip),
                     "elems": elems})
    return rows


def combine_rows() -> list[dict]:
    from fa4kernel.interface import compile_combine_sass
    from fa4kernel.sass import combine_in_flight
    from fa4kernel.sm90.combine import SPLIT_UNROLL

    rows = []
    for hd in (64, 96, 128, 192, 256):
        call = f"compile_combine_sass('bfloat16', {hd})"
        print(f"# {call}", file=sys.stderr, flush=True)
        rows.append({"build": {"hdim": hd}, "compiled_from": call,
                     "in_flight": round(combine_in_flight(compile_combine_sass("bfloat16", hd), SPLIT_UNROLL), 4)})
    return rows


# ---------------------------------------------------------------- the backward: its Q-block loop's instructions
BWD_KEYS = ("hdim", "causal", "tile_m", "grid_order", "dq_reduce", "stats", "mma_order", "dq_smem", "dq_sum")
# a combination not compiled takes the first of these substitutions that names a row: the launch
# order heads_outer (it moves only registers), then the head dim's stand-in (dq_reduce red, stats
# thread, mma_order dv_dk_dq up to head dim 128 with 64-row blocks, else bulk / tma / dv_dq_dk),
# then its own dQ sum, then (a combination the kernel does not build) 64-row blocks with their own dQ buffer
_RED = {"dq_reduce": "red", "stats": "thread", "mma_order": "dv_dk_dq"}
_BULK = {"dq_reduce": "bulk", "stats": "tma", "mma_order": "dv_dq_dk"}
_OWN = {"tile_m": 64, "dq_smem": "own", "dq_sum": "cta"}
BWD_FALLBACKS = [{"grid_order": "heads_outer"}, {"grid_order": "heads_outer", **_RED},
                 {"grid_order": "heads_outer", **_BULK}, {"grid_order": "heads_outer", **_BULK, "dq_sum": "cta"},
                 {"grid_order": "heads_outer", **_RED, **_OWN}, {"grid_order": "heads_outer", **_BULK, **_OWN}]
_HO = {"grid_order": "heads_outer"}
_THREE = [{"dq_reduce": r, "stats": s, "mma_order": m} for r, s, m in (
    ("bulk", "thread", "dv_dk_dq"), ("bulk", "thread", "dv_dq_dk"), ("bulk", "tma", "dv_dk_dq"),
    ("bulk", "tma", "dv_dq_dk"), ("red", "thread", "dv_dk_dq"))]
_KV_SPLIT = [{"dq_reduce": r, "dq_smem": "own", "dq_sum": "cta"} for r in ("bulk", "red")]
# (head dim, causal, make_bwd_config's knobs): each head dim's default build (causal: tail_lpt),
# the variants measured, and the builds lessons/09_backward.py simulates (hd128 dq_reduce red,
# hd256 tail_lpt without a mask)
BWD_BUILDS = (
    [(64, c, {}) for c in (False, True)]
    + [(64, c, {"mma_order": "dv_dk_dq"}) for c in (False, True)]
    + [(64, True, {**_HO}), (64, True, {"mma_order": "dv_dk_dq", **_HO}), (64, True, {"tile_m": 64})]
    + [(64, c, {"tile_m": 64, **v, **_HO}) for c in (False, True) for v in _THREE]
    + [(96, c, {}) for c in (False, True)]
    + [(96, c, {"dq_reduce": r, "stats": "thread", "mma_order": "dv_dk_dq", **_HO}) for c in (False, True)
       for r in ("bulk", "red")]
    + [(128, True, {})] + [(128, c, {**v, **_HO}) for c in (False, True) for v in _THREE]
    + [(128, False, {"dq_reduce": "red"})]
    + [(192, True, {}), (192, True, {"dq_reduce": "red"})]
    + [(192, c, {**v, **_HO}) for c in (False, True) for v in [*_KV_SPLIT, {"dq_smem": "qdo"}]]
    + [(256, c, {}) for c in (False, True)] + [(256, True, {**_HO}), (256, False, {"grid_order": "tail_lpt"})]
    + [(256, c, {**v, **_HO}) for c in (False, True) for v in [*_KV_SPLIT, {"dq_smem": "qdo", "dq_sum": "cta"}]]
)
_POINTWISE = {"FFMA", "FADD", "FMUL", "MUFU", "F2FP", "FSEL", "SHFL", "LDS", "STSM", "STS", "REDG", "LDG"}


def loop_counts(sass: str) -> collections.Counter:
    """hgmma, uniform (uniform datapath, S2UR, R2UR; not UTMA / UBLK), pointwise (the opcodes fa4sim
    counts itself: _POINTWISE, MUFU only as MUFU.EX2) and other instructions of the backward's
    Q-block loop (fa4kernel.sass.kv_loop: the smallest loop with HGMMA and MUFU.EX2)."""
    from fa4kernel.sass import kv_loop

    c = collections.Counter()
    for full in kv_loop(sass):
        op = full.split(".")[0]
        if op == "HGMMA":
            c["hgmma"] += 1
        elif (op.startswith("U") and not op.startswith(("UTMA", "UBLK"))) or op in ("S2UR", "R2UR"):
            c["uniform"] += 1
        elif op in _POINTWISE and not (op == "MUFU" and not full.startswith("MUFU.EX2")):
            c["pointwise"] += 1
        else:
            c["other"] += 1
    return c


def loop_fixed(c: collections.Counter, cfg) -> int:
    """The loop's instructions less HGMMA, uniform datapath and the pointwise ones the schedule
    counts: 5 per score element (FFMA, MUFU.EX2, FADD, FMUL, F2FP), the mask's (1, or 3 causal),
    the statistics' loads (LDG per score, or LDS per pair), stmatrix, the dQ stores (bulk) or REDs;
    with dq_sum pair the owner's LDS.128 and FADDs and the sender's STAS.128 too."""
    e = cfg.tile_m * cfg.tile_n // 2 // 128  # score elements per thread
    hd_part = 64 * cfg.head_dim * 4 / (2 if cfg.head_dim >= 128 else 1)
    dq = hd_part / 16 / 128 if cfg.dq_reduce == "bulk" else hd_part / 8 / 128
    stsm = e * 2 * (2 if cfg.head_dim > 128 else 1) // 16
    counted = 5 * e + (3 if cfg.causal else 1) * e + (e if cfg.stats == "thread" else e // 2) + stsm + dq
    if cfg.dq_sum == "pair":
        counted += dq + 4 * dq + dq
    return round(sum(c.values()) - c["hgmma"] - c["uniform"] - counted)


def bwd_build(cfg) -> dict:
    """The knobs a backward row is matched on, from the kernel's configuration."""
    return {"hdim": cfg.head_dim, "causal": cfg.causal, "tile_m": cfg.tile_m, "grid_order": cfg.grid_order,
            "dq_reduce": cfg.dq_reduce, "stats": cfg.stats, "mma_order": cfg.mma_order, "dq_smem": cfg.dq_smem,
            "dq_sum": cfg.dq_sum}


def loop_instr_rows(builds=BWD_BUILDS) -> list[dict]:
    import fa4kernel
    from fa4kernel import make_bwd_config

    rows = []
    for hd, causal, knobs in builds:
        args = "".join(f", {k}={v!r}" for k, v in knobs.items())
        call = f"make_bwd_config('bfloat16', {hd}, {causal}{args})"
        print(f"# {call}", file=sys.stderr, flush=True)
        cfg = make_bwd_config("bfloat16", hd, causal, **knobs)
        c = loop_counts(fa4kernel.compile_bwd_sass(cfg))
        rows.append({"build": bwd_build(cfg), "compiled_from": call,
                     "per_kstep": round((c["hgmma"] + c["uniform"]) / c["hgmma"], 2), "fixed": loop_fixed(c, cfg)})
    return rows


SOURCES = {
    "pv_wait_sass": "fa4kernel's forward builds " + TOOLCHAIN + ": per pipe, the share of the KV block's "
                    "softmax instructions between the S wait and the PV wait (max: FMNMX, fma: FFMA+FADD, mufu: "
                    "MUFU.EX2; lab/tools/pv_wait_sass.py split); a variant not compiled takes its head dim's "
                    "default build (same tile_n, rescale_before_pv), else the model's order",
    "tau_test_sass": "fa4kernel's forward builds " + TOOLCHAIN + ": the KV loop's instructions with "
                     "rescale_threshold 8 less those of the same build rescaling always before the PV GEMM (the "
                     "compares, vote, branch and the scale's select and FMUL / FADD the test adds), per warp and "
                     "block, of each head dim's default build; its other builds take their head dim's",
    "v_zero_sass": "fa4kernel's varlen forward builds " + TOOLCHAIN + " (causal; the decode build runs the same "
                   "_zero_v_past_keys): one trip of its V zeroing (fa4kernel.sass.v_zero_trip: a loop of one "
                   "2-byte store per trip and thread, or 16-byte stores of zeros in one trip), the trip's "
                   "instructions (a loop's index division by the head dim and the swizzle's address math "
                   "included), the longest chain of them each waiting on the one before, and the elements of V "
                   "a thread zeroes per trip",
    "combine_sass": "fa4kernel's split-KV combine " + TOOLCHAIN + " (sm90/combine.py, bf16): in its partial "
                    "loop, the global loads ptxas issues before the first FFMA over one split's loads "
                    "(fa4kernel.sass.combine_in_flight): the splits a row's warp has in flight per round trip, "
                    "however many (SPLIT_UNROLL) the source loads before its first add",
    "loop_instr_sass": "fa4kernel's backward builds " + TOOLCHAIN + ", the consumers' innermost Q-block loop, "
                       "per thread, counted statically (where both warpgroups' branches are in the loop, both): "
                       "per_kstep (HGMMA + uniform datapath) / HGMMA, fixed the rest less the pointwise "
                       "instructions fa4sim counts itself (sass_tables.py loop_fixed); a combination not compiled "
                       "takes the row named by the first of `fallbacks` (knob values substituted) that names one",
}


# the generated file's tables, by pass
TABLES = {"fwd": ("pv_wait_sass", "tau_test_sass", "v_zero_sass", "combine_sass"), "bwd": ("loop_instr_sass",)}


def table(name: str) -> dict:
    if name == "pv_wait_sass":
        return {"source": SOURCES[name], "keys": list(FWD_KEYS), "rows": pv_wait_rows()}
    if name == "tau_test_sass":
        return {"source": SOURCES[name], "columns": {"tau_test_instr": "instr"}, "keys": ["hdim", "causal"],
                "rows": tau_test_rows()}
    if name == "v_zero_sass":
        return {"source": SOURCES[name], "columns": {"v_zero_loop_instr": "instr", "v_zero_loop_chain": "chain",
                                                     "v_zero_elems_per_trip": "elems"},
                "keys": ["hdim"], "rows": v_zero_rows()}
    if name == "combine_sass":
        return {"source": SOURCES[name], "columns": {"combine_partial_splits_per_round": "in_flight"},
                "keys": ["hdim"], "rows": combine_rows()}
    return {"source": SOURCES[name], "columns": {"loop_instr_per_kstep": "per_kstep", "loop_instr_fixed": "fixed"},
            "keys": list(BWD_KEYS), "fallbacks": BWD_FALLBACKS, "rows": loop_instr_rows()}


def document(only=None, old=None) -> dict:
    """The generated file: tables not in `only` kept from `old`."""
    old = old or {}
    doc = {"generated": GENERATED}
    for pass_, names in TABLES.items():
        doc[pass_] = {name: table(name) if only in (None, name) or name not in old.get(pass_, {}) else old[pass_][name]
                      for name in names}
    return doc


def dumps(doc: dict) -> str:
    """One row per line: the file stays readable and its diffs small."""
    lines = ["{", f' "generated": {json.dumps(doc["generated"])},']
    passes = [k for k in doc if k != "generated"]
    for i, pass_ in enumerate(passes):
        lines.append(f' "{pass_}": {{')
        names = list(doc[pass_])
        for j, name in enumerate(names):
            t = doc[pass_][name]
            lines.append(f'  "{name}": {{')
            for key in [k for k in t if k != "rows"]:
                lines.append(f'   "{key}": {json.dumps(t[key])},')
            lines.append('   "rows": [')
            lines += [f"    {json.dumps(r)}{',' if r is not t['rows'][-1] else ''}" for r in t["rows"]]
            lines.append("   ]")
            lines.append("  }" + ("," if j < len(names) - 1 else ""))
        lines.append(" }" + ("," if i < len(passes) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"write {os.path.relpath(PATH, ROOT)}")
    ap.add_argument("--only", choices=[name for names in TABLES.values() for name in names],
                    help="recompile one table, keep the others")
    args = ap.parse_args(argv)
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    old = json.load(open(PATH)) if args.only and os.path.exists(PATH) else None
    text = dumps(document(args.only, old))
    if args.write:
        with open(PATH, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(PATH, ROOT)}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
