"""fa4sim command line: run one simulation, list parameters, sweep a grid, validate, and look at a
schedule as a dependency graph (graph) or find one from its constraints (solve).

Exit codes: 0 ok, 2 bad input (one line naming the parameter), 3 deadlock (the ops involved),
130 interrupted (Ctrl-C; a sweep keeps the points it finished).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import hardware, implementation, power
from .errors import DeadlockError, InputError
from .params import Context, Problem
from .schedules import SCHEDULES

EPILOG_RUN = """\
examples:
  fa4sim run --hw b200 --hdim 128 --seqlen 32768 --batch 1 --heads 16 --gantt fa4.png
      FA4 forward on B200 (flash-attn-4's choices); TFLOP/s, utilisation, the bottleneck; one CTA's timeline
  fa4sim run --hw b200 --set mufu_ex2_per_clk=32 --set exp_emulation=0
      what if MUFU were twice as fast (a B300-like chip) and emulation were off?
  fa4sim run --hw h100 --impl flash-attn-4 --hdim 192 --hdim-v 128 --causal
      flash-attn-4's SM90 forward on the DeepSeek head dims, with its own tile
  fa4sim run --hw h100-datasheet --hdim 128 --seqlen 8192 --set pingpong=false --json
      our SM90 kernel (fa4kernel) without inter-warpgroup ping-pong, as one JSON object
  fa4sim params --hw h100-datasheet --impl flash-attn-4 --hdim 256
      every knob, what the implementation chooses, and every hardware parameter with its source
"""

EPILOG_SWEEP = """\
examples:
  fa4sim sweep --hw b200 --grid exp_emulation=0,0.125,0.25,0.5 --grid seqlen=1024,4096,16384 --out emu
      12 points, one per combination, in worker processes on this machine
  fa4sim sweep --hw h100 --grid hdim=64,128,256 --grid kv_stages=2,3,4 --backend ray
      the same kind of grid as tasks on a Ray cluster started here for the sweep (--jobs CPUs)
  ray start --head --port 6379        (once, on the head node; `ray start --address HEAD:6379` on the others)
  fa4sim sweep --hw h100 --grid seqlen=512,1024,2048,4096,8192,16384 --grid hw=h100,h200 \\
               --backend ray --ray-address HEAD:6379
      a large grid spread over every CPU of every node (run it on a node; or set RAY_ADDRESS)

grid names: seqlen, seqlen_k, hdim, hdim_v, batch, heads, causal, hw, impl, or any schedule knob or
hardware parameter (`fa4sim params`). Every value is checked, and every point set up, before the
first simulation: a bad value, a name given twice or a grid of invalid points only is an error; a
point whose combination alone is invalid (a head dim the implementation does not run) is kept in
the output with its error. Ctrl-C writes the points that finished.

Every point is one simulation (a fraction of a second), independent of the others, so a sweep
parallelises almost perfectly: its time is about points x seconds per point / CPUs. --backend
process (the default) uses this machine's cores and starts in a second. --backend ray sends each
point to a Ray cluster as a task: worth it when the cluster has many more CPUs than this machine,
since starting a local Ray cluster alone takes seconds (10-30 s on 2 cores). This command ships its
own fa4sim to the nodes, so they need only Ray, Python and fa4lab's dependencies (simpy, numpy), of
the same versions. From outside the cluster use --ray-address ray://HEAD:10001 (needs `pip install
"ray[client]"`); a cluster with token authentication also needs RAY_AUTH_MODE=token. Both backends
write the same CSV and JSON, in the grid's order.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message):
        sys.stderr.write(f"fa4sim: error: {message}\n")
        sys.exit(2)


def _set_pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items or []:
        name, _, value = item.partition("=")
        if not _ or not name.strip():
            raise InputError("--set", f"expected NAME=VALUE, got {item!r}")
        if name.strip() in out:
            raise InputError("--set", f"{name.strip()} given twice; give each name once")
        out[name.strip()] = value.strip()
    return out


def _default_schedule(hw_name: str) -> str:
    from .model import default_schedule
    return default_schedule(hardware.load(hw_name).arch)


def _lengths(option: str, text: str) -> list:
    """--seqlens 512,3000,...: one length per sequence."""
    parts = [t.strip() for t in str(text).split(",")]
    if not text.strip() or any(not t for t in parts):
        raise InputError(option, f"a comma list of lengths, one per sequence (e.g. 512,3000,100), got {text!r}")
    out = []
    for t in parts:
        try:
            out.append(int(t))
        except ValueError:
            raise InputError(option, f"{t!r} is not a whole number; a comma list of lengths, e.g. 512,3000,100") from None
    return out


def _problem(a) -> Problem:
    if getattr(a, "seqlens", None) is not None:
        ks = _lengths("--seqlens-k", a.seqlens_k) if a.seqlens_k is not None else None
        return Problem.varlen(a.heads, a.hdim, _lengths("--seqlens", a.seqlens), ks, causal=a.causal,
                              hdim_v=a.hdim_v, heads_kv=getattr(a, "heads_kv", None),
                              page_size=getattr(a, "page_size", 0))
    if getattr(a, "seqlens_k", None) is not None:
        raise InputError("--seqlens-k", "only with --seqlens")
    return Problem(batch=a.batch, heads=a.heads, seqlen_q=a.seqlen,
                   seqlen_k=a.seqlen_k if a.seqlen_k is not None else a.seqlen, hdim=a.hdim, causal=a.causal,
                   hdim_v=a.hdim_v, heads_kv=getattr(a, "heads_kv", None), page_size=getattr(a, "page_size", 0))


# what an output file's name may end in, by option (matplotlib writes these; Perfetto reads JSON);
# sweep's --out is a prefix it adds .csv, .json and .png to
OUTPUT_FORMATS = {"--gantt": (".png", ".svg", ".pdf"), "--trace": (".json",), "--plot": (".png", ".svg", ".pdf"),
                  "--dot": (".dot", ".gv"), "--out": None}
SWEEP_OUTPUTS = (".csv", ".json", ".png")
GANTT_ITERS = (1, 64)  # KV iterations a Gantt chart shows: past a few dozen its bars are too thin to read
GANTT_DEFAULT = 6
TIME_LIMIT_S = 0.7     # solve's default time limit
DOMINANT_SHOWN = 6     # --uncertainty: the parameters the text lists
MAX_TIME_LIMIT_S = 3600.0


def check_output(option: str, path: str | None) -> None:
    """An output path's folder must exist (nothing creates it), the path name a file, not a folder,
    and its format be one we write: checked before any work."""
    if path is None:
        return
    if not os.path.basename(path) or os.path.isdir(path):
        raise InputError(option, f"{path!r} is {'a folder' if path else 'empty'}: give a file name"
                                 + (" prefix, e.g. sweeps/emu" if option == "--out" else ""))
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(option, f"folder {os.path.dirname(path) or '.'!r} does not exist (create it first)")
    formats = OUTPUT_FORMATS[option]
    if formats and not path.lower().endswith(formats):
        raise InputError(option, f"{path!r}: allowed formats {', '.join(formats)}")
    if option == "--out" and path.lower().endswith(SWEEP_OUTPUTS):
        raise InputError(option, f"a prefix: sweep writes PREFIX{', PREFIX'.join(SWEEP_OUTPUTS)}; give "
                                 f"{os.path.splitext(path)[0]!r}, not {path!r}")


def add_problem_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hw", default="b200", help=f"hardware profile: {', '.join(hardware.available())}, or a "
                                               f"profile .json (default b200). h100, h200: calibrated by our "
                                               f"microbenchmarks on those GPUs; b200, b300: public "
                                               f"facts and ranged assumptions; *-datasheet: datasheet numbers only")
    p.add_argument("--impl", default=None, help="whose choices to simulate (tile per head dim, launch, measured "
                                                "constants): fa4kernel or flash-attn-4, for the arch of --hw "
                                                "(default: fa4kernel on sm90, flash-attn-4 on sm100); see "
                                                "`fa4sim params --impl NAME`")
    p.add_argument("--schedule", default=None, choices=sorted(SCHEDULES),
                   help="fa4 (SM100, Blackwell) or fa3 (SM90, Hopper; on b200: the no-TMEM what-if, registers for S, P and O); default: the one for --hw")
    p.add_argument("--hdim", type=int, default=128, help="head dimension of Q and K (default 128)")
    p.add_argument("--hdim-v", type=int, default=None, help="head dimension of V and O (default: --hdim; "
                                                            "DeepSeek: --hdim 192 --hdim-v 128)")
    p.add_argument("--seqlen", type=int, default=8192, help="query sequence length (default 8192)")
    p.add_argument("--seqlen-k", type=int, default=None, help="key sequence length (default: --seqlen)")
    p.add_argument("--batch", type=int, default=2, help="batch size (default 2)")
    p.add_argument("--seqlens", default=None, metavar="L1,L2,...",
                   help="a packed batch of unequal lengths (varlen): one query length per sequence; replaces "
                        "--batch, --seqlen and --seqlen-k")
    p.add_argument("--seqlens-k", default=None, metavar="K1,K2,...",
                   help="with --seqlens: the key lengths, one per sequence (default: the query lengths)")
    p.add_argument("--heads", type=int, default=16, help="attention heads (default 16)")
    p.add_argument("--heads-kv", type=int, default=None, help="K/V heads, a divisor of --heads (default: --heads); "
                                                              "fewer: grouped-query attention (GQA), 1: MQA")
    p.add_argument("--causal", action="store_true", help="causal mask (bottom-right aligned)")
    p.add_argument("--page-size", type=int, default=0, metavar="TOKENS",
                   help="a paged KV cache of pages of this many tokens, read through a page table (vLLM, SGLang); "
                        "flash-attn-3 and flash-attn-4 (default 0: contiguous)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a what-if: a schedule knob, a hardware parameter or a constant measured on the "
                        "implementation (repeatable); `fa4sim params` lists them (`--pass bwd`: the backward's)")


def cmd_run(a) -> int:
    from .model import simulate
    check_output("--gantt", a.gantt)
    check_output("--trace", a.trace)
    if a.gantt_iters is not None:
        lo, hi = GANTT_ITERS
        if not a.gantt:
            raise InputError("--gantt-iters", "only with --gantt")
        if not lo <= a.gantt_iters <= hi:
            raise InputError("--gantt-iters", f"must be in {lo}..{hi}, got {a.gantt_iters}")
    _check_jobs(a)
    overrides = _set_pairs(a.set)
    if a.uncertainty:
        from . import steady_state, uncertainty
        with steady_state.shared():  # the band's predictions reuse the nominal one's engine runs
            r = simulate(a.hw, a.schedule, _problem(a), overrides, impl=a.impl, pass_=a.pass_)
            band = uncertainty.band(a.hw, a.schedule, r.problem, overrides, r.impl.name, a.pass_, jobs=a.jobs,
                                    progress=not a.json and sys.stderr.isatty(), nominal=r)
    else:
        r = simulate(a.hw, a.schedule, _problem(a), overrides, impl=a.impl, pass_=a.pass_)
        band = None
    schedule = r.schedule
    if a.gantt:
        from .gantt import draw
        draw(r.trace, a.gantt, title=_title(r), iterations=a.gantt_iters or GANTT_DEFAULT)
    if a.trace:
        from .perfetto import write
        write(r.trace, a.trace, {"summary": r.to_json()["problem"], "schedule": schedule, "hw": r.hw.name})
    if a.json:
        out = r.to_json()
        if band:
            b = band.to_json()
            out.update({k: b[k] for k in ("tflops_low", "tflops_high", "dominant_params")}, uncertainty=b)
        print(json.dumps(out, indent=None if a.compact else 1))
    else:
        print(_summary(r))
        if band:
            print(_band_lines(band))
        for path in (a.gantt, a.trace):
            if path:
                print(f"wrote {path}")
    return 0


def _check_jobs(a) -> None:
    """--jobs: worker processes of --uncertainty, checked before any work."""
    if a.jobs is None:
        return
    if not a.uncertainty:
        raise InputError("--jobs", "only with --uncertainty")
    from .sweep import check_backend
    check_backend("process", a.jobs, None)


def _band_lines(b) -> str:
    """The band in two lines, and the parameters that dominate it."""
    n = len(b.deviations)
    lines = [f"band      {b.tflops_low:.0f}..{b.tflops_high:.0f} TFLOP/s ({b.time_low_us:.1f}..{b.time_high_us:.1f} us), "
             f"clock {b.clock_low_ghz:.3f}..{b.clock_high_ghz:.3f} GHz: {n} hardware parameters, each at either end of "
             f"its range (first order, combined as independent errors; {len(b.exact)} exact)"]
    for d in b.deviations[:DOMINANT_SHOWN]:
        if not (d.slower or d.faster):
            break
        lines.append(f"  {d.name:28s} {_g(d.lo)}..{_g(d.hi)} ({d.why}): time {d.time_at_lo:+.1%} .. {d.time_at_hi:+.1%}")
    return "\n".join(lines)


def _g(x) -> str:
    return f"{x:.4g}"


def _title(r) -> str:
    p = r.problem
    if r.pass_ == "bwd":
        return (f"{r.impl.name} backward on {r.hw.name}: hd{_hd(p)}, seqlen {p.seqlen_q}, batch {p.batch}, heads "
                f"{p.heads}{_kv(p)}{', causal' if p.causal else ''} -> {r.tflops:.0f} TFLOP/s (one CTA, first "
                f"{r.trace.tiles[0]} Q blocks simulated)")
    return (f"{r.impl.name} on {r.hw.name}: hd{_hd(p)}, seqlen {p.seqlen_q}, batch {p.batch}, heads {p.heads}"
            f"{_kv(p)}{', causal' if p.causal else ''} -> {r.tflops:.0f} TFLOP/s (one CTA, first {r.trace.tiles[0]} KV blocks simulated)")


def _kv(p) -> str:
    """' over N K/V heads' where they are grouped (GQA / MQA), else nothing."""
    return f" over {p.heads_kv} K/V heads" if p.heads_kv != p.heads else ""


def _hd(p) -> str:
    return str(p.hdim) if p.hdim == p.hdim_v else f"{p.hdim}/{p.hdim_v}"


def _summary(r) -> str:
    p, k = r.problem, r.kernel
    bwd = r.pass_ == "bwd"
    lines = [
        f"{r.impl.name} ({r.schedule} schedule{', backward' if bwd else ''}) on {r.hw.name} ({r.hw.description})",
        f"problem   batch {p.batch} x heads {p.heads}{_kv(p)}, seqlen_q {p.seqlen_q}, seqlen_k {p.seqlen_k}, hdim {_hd(p)}"
        f"{', causal' if p.causal else ''}{f', paged KV ({p.page_size} tokens per page)' if p.page_size else ''}"
        + (f" (varlen: {p.batch} sequences, q {','.join(str(q) for q, _ in p.seqlens)}"
           + ("" if all(q == k for q, k in p.seqlens) else f"; k {','.join(str(k) for _, k in p.seqlens)}") + ")"
           if p.seqlens else ""),
        "knobs     " + ", ".join(f"{n}={v}" for n, v in r.knobs.items()),
        f"result    {r.tflops:.1f} TFLOP/s  ({r.tflops / r.hw.peak_tflops:.1%} of {r.hw.peak_tflops:.0f} peak at "
        f"{r.hw.clock_ghz:.4g} GHz),  {r.time_us:.1f} us,  {r.cycles:.0f} cycles"
        + (" (main kernel; 2.5 x the forward's FLOPs)" if bwd else ""),
    ]
    if bwd:
        lines.append(f"launches  preprocess {r.pre_us:.1f} us, main kernel {r.main_us:.1f} us, postprocess "
                     f"{r.post_us:.1f} us")
    lines += [
        f"kernel    {k.units} {'KV tiles' if bwd else 'tiles'} on {k.slots} slots ({k.waves:.2f} waves), slowest slot {k.tiles_on_slowest} tiles"
        + (f" (+{k.jitter_cycles:.0f} cycles: tile jitter on a table fixed before the launch)" if k.jitter_cycles else "") + ";"
        f" L2 {k.l2_us:.1f} us, HBM {k.hbm_us:.1f} us, compute {k.compute_us:.1f} us",
    ]
    if not bwd:
        lines.append(f"memory    K/V {p.kv_bytes / 1e9:.3g} GB read at {r.kv_read_gbps:.0f} GB/s over the whole time "
                     f"(HBM {r.hw.hbm_bandwidth_tbps * 1e3:.0f} GB/s)"
                     + (f"; split-KV {r.knobs.get('num_splits')} chunks: main kernel {k.time_us:.1f} us + combine "
                        f"{r.combine_us:.1f} us" if r.combine_us else ""))
    clock = power.describe(r.clock_ghz, r.clock_source, r.power_w, r.power_by_part, r.power_limited,
                           float(r.hw.power_cap_w), r.clock_ceiling)
    lines.append("clock     " + clock.removeprefix("clock "))
    if r.power_w is not None:
        parts = sorted(r.power_by_part.items(), key=lambda kv: -kv[1])
        lines.append(f"power     {r.power_w:.0f} W: " + ", ".join(f"{n} {w:.0f}" for n, w in parts if w >= 0.5))
    if r.interval:
        lines.append(f"loop      {r.interval:.1f} cycles per {'Q' if bwd else 'KV'} block in the steady state (one CTA)")
    lines.append("utilisation (steady state):")
    for u, v in sorted(r.utilization.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {u:7s} {v:6.1%} {'#' * int(round(v * 40))}")
    lines.append(f"bottleneck: {r.bottleneck}")
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


def cmd_params(a) -> int:
    from .model import setup
    problem = Problem(1, 1, 8192, 8192, a.hdim, a.causal, hdim_v=a.hdim_v)
    # resolved and checked as a run of this problem is (the schedule runs on --hw, --impl on it)
    hw, schedule, module, impl, defaults = setup(a.hw, a.schedule, problem, {}, a.impl, a.pass_)
    ctx = Context(problem, hw, impl)
    if a.json:
        print(json.dumps({"schedule": {k.name: {"default": defaults[k.name], "unit": k.unit, "allowed": k.describe(),
                                                "doc": k.doc} for k in module.KNOBS},
                          "implementation": impl.to_json(), "implementations": implementation.available(),
                          "hardware": hw.to_json()}, indent=1))
        return 0
    print(f"implementations: {', '.join(implementation.available())} (--impl fa4kernel | flash-attn-4)")
    print(f"\nknobs of the {schedule} schedule's {'backward' if a.pass_ == 'bwd' else 'forward'} "
          f"({module.DESCRIPTION}), as {impl.name} sets them for "
          f"hdim {_hd(problem)}{', causal' if a.causal else ''}; * = the implementation's choice:")
    for k in module.KNOBS:
        mark = "*" if k.name in impl.knobs else " "
        print(f"  {k.name:18s} ={mark}{str(defaults[k.name]):8s} {k.unit:11s} {k.describe():14s} {k.doc}")
    print(f"\nmeasured on {impl.name} ({impl.description}):")
    for n, entry in impl.params.items():
        v = entry["value"]
        shown = impl.value(n, ctx, defaults) if not isinstance(v, list) else f"a table of {len(v)} builds"
        print(f"  {n:24s} = {shown!s:10s} [{entry['confidence']}] source: {entry['source']}")
    print(f"\nhardware parameters of {hw.name} ({hw.description}); confidence H/M/L:")
    for n, p in hardware.PARAMS.items():
        print(f"  {n:22s} = {hw.values[n]!s:10s} {p.unit:18s} [{hw.confidence[n]}] {p.meaning}\n{'':28s}"
              f"allowed: {p.allowed()}; source: {hw.sources[n]}")
    return 0


def cmd_sweep(a) -> int:
    from .sweep import run_sweep
    check_output("--out", a.out)
    schedule = a.schedule or _default_schedule(a.hw)
    return run_sweep(a, schedule, _problem(a), _set_pairs(a.set))


def cmd_validate(a) -> int:
    from . import validate
    check_output("--plot", a.plot)
    _check_jobs(a)
    return validate.main(a.results, a.hw, a.plot, a.json, a.at_profile_clock, a.pv_wait, overrides=_set_pairs(a.set),
                         uncertainty=a.uncertainty, jobs=a.jobs)


def _loop_schedule(a):
    """(hand schedule, iterations per tile) of the problem's longest tile, built as simulate()
    builds it (unmasked blocks: the loop; a causal tile's mask is a once-per-tile op)."""
    import math
    from .model import setup
    problem = _problem(a)
    profile, _, module, impl, knobs = setup(a.hw, a.schedule, problem, _set_pairs(a.set), a.impl, a.pass_)
    if a.pass_ == "bwd":
        n = math.ceil(problem.seqlen_q / knobs["tile_m"])
    else:
        n = math.ceil(problem.seqlen_k / knobs["tile_n"])
    return module.build(profile, problem, knobs, n, 0, impl), n


def cmd_graph(a) -> int:
    from . import graph
    check_output("--dot", a.dot)
    check_output("--plot", a.plot)
    schedule, _ = _loop_schedule(a)
    g = graph.build(schedule, slowed=a.slowed)
    res, rec, rec_order = graph.res_mii(g), graph.rec_mii(g), graph.rec_mii(g, with_order=True)
    if a.dot:
        with open(a.dot, "w") as f:
            f.write(graph.to_dot(g, rec_order))
    if a.plot:
        from .graph_plot import draw
        draw(g, a.plot, res, rec_order, title=f"{schedule.name} on {a.hw} ({a.pass_}): one iteration; ResMII "
                                              f"{res.value:.0f} ({res.critical}), RecMII {rec.value:.0f}, with the "
                                              f"roles' program order {rec_order.value:.0f}")
    if a.json:
        print(json.dumps(graph.to_json(g, res, rec, rec_order), indent=None if a.compact else 1))
        return 0
    print(f"{schedule.name} on {a.hw} ({a.pass_}): {len(g.loop_nodes)} ops per iteration "
          f"({len(g.nodes) - len(g.loop_nodes)} more once per tile), {len(g.units)} units, {len(g.roles)} roles, "
          f"{len(g.loop_deps)} edges in the loop ({len(g.deps) - len(g.loop_deps)} at tile boundaries), "
          f"{len(g.order)} program-order edges")
    print(f"{'op':8s} {'role':11s} {'completion':>10s} {'hold':>7s}  units (cycles)")
    for n in g.nodes:
        units = ", ".join(f"{u} {c:.0f}" for u, c in sorted(n.uses.items(), key=lambda kv: -kv[1]))
        mark = "" if n.in_loop else f"  [once per tile: {n.when}]"
        print(f"{n.name:8s} {n.role:11s} {n.completion:10.0f} {n.hold:7.0f}  {units}{mark}")
    print("edges (src -> dst, distance, kind, delay = completion + lag):")
    for d in g.deps:
        print(f"  {d.src} -> {d.dst}  d={d.distance}{'t' if d.per == 'tile' else ''}  {d.kind}  {d.delay:.0f}"
              + ("" if d.in_loop else "  [tile boundary]"))
    busiest = sorted(res.loads.items(), key=lambda kv: -kv[1])[:5]
    print(f"ResMII  {res.value:8.1f}  {res.critical} (" + ", ".join(f"{u} {v:.0f}" for u, v in busiest) + ")")
    print(f"RecMII  {rec.value:8.1f}  {rec.critical}  (dependence edges only)")
    print(f"        {rec_order.value:8.1f}  {rec_order.critical}  (with the roles' program order)")
    for path in (a.dot, a.plot):
        if path:
            print(f"wrote {path}")
    return 0


def cmd_solve(a) -> int:
    import time
    from . import graph, modulo
    if not 0 < a.time_limit <= MAX_TIME_LIMIT_S:
        raise InputError("--time-limit", f"must be in (0, {MAX_TIME_LIMIT_S:g}] seconds, got {a.time_limit}")
    t0 = time.perf_counter()
    schedule, n = _loop_schedule(a)
    g = graph.build(schedule)
    try:
        sol = modulo.solve(g, order=a.order, time_limit_s=a.time_limit)
    except InputError as e:
        if e.param != "solve" or "no schedule found within" not in str(e):
            raise
        # 3 x (at least the default): the h100 backward needs 1.2 to 2 s
        more = min(MAX_TIME_LIMIT_S, float(f"{3 * max(a.time_limit, TIME_LIMIT_S):.2g}"))
        raise InputError("--time-limit", f"{str(e).removeprefix('solve: ')}: give it more time, e.g. --time-limit "
                                         f"{more:g} (default {TIME_LIMIT_S:g})") from None
    t1 = time.perf_counter()
    solved = modulo.schedule_from(schedule, sol.programs)
    replayed = modulo.replayed_interval(solved, n)
    hand = modulo.replayed_interval(schedule, n)
    t2 = time.perf_counter()
    text = modulo.program_text(sol.programs, g)
    r = lambda x: None if x is None else round(x, 2)  # noqa: E731
    out = {
        "schedule_name": schedule.name, "hw": a.hw, "pass": a.pass_, "order": a.order, "iterations": n,
        "ii": r(sol.ii), "status": sol.status, "lower_bound": r(sol.lower_bound),
        "res_mii": {"value": r(sol.res_mii), "critical": sol.res_critical},
        "rec_mii": {"value": r(sol.rec_mii), "critical": sol.rec_critical},
        "stages": sol.stages, "replayed_interval": r(replayed), "hand_interval": r(hand),
        "schedule": {k: {"offset": r(sol.offset[k]), "stage": sol.stage[k], "role": g.node(k).role,
                         "skew": dict(sol.programs[g.node(k).role])[k], "in_loop": g.node(k).in_loop}
                     for k in sol.offset},
        "programs": text,
        "kept_order_edges": [{"src": d.src, "dst": d.dst, "distance": d.distance} for d in sol.kept],
        "tried": {str(k / sol.ticks_per_cycle): v for k, v in sorted(sol.tried.items())},
        "ticks_per_cycle": sol.ticks_per_cycle, "time_limit_s": a.time_limit,
        "solve_wall_s": round(sol.wall_s, 3), "replay_wall_s": round(t2 - t1, 3), "wall_s": round(t2 - t0, 3),
    }
    if a.json:
        print(json.dumps(out, indent=None if a.compact else 1))
        return 0
    print(f"{schedule.name} on {a.hw} ({a.pass_}), order={a.order}: II {sol.ii:.0f} cycles ({sol.status}; "
          f"ResMII {sol.res_mii:.0f} {sol.res_critical}, RecMII {sol.rec_mii:.0f}), {sol.stages} stages, "
          f"solved in {sol.wall_s:.2f} s")
    print(f"replayed in the engine: {replayed:.1f} cycles per iteration; the hand schedule: {hand:.1f}"
          if replayed is not None and hand is not None else "replayed in the engine: no steady state found")
    print(f"recurrence: {sol.rec_critical}")
    for role, p in text.items():
        if not p["steady"]:
            continue
        print(f"{role} (depth {p['depth']}):")
        for i, line in enumerate(p["prologue"]):
            print(f"  prologue {i}: {line or '-'}")
        print(f"  steady   k: {' '.join(p['steady'])}")
        for i, line in enumerate(p["epilogue"]):
            print(f"  epilogue {i}: {line or '-'}")
        once = ([f"{' '.join(p['first'])} (with iteration 0)"] if p["first"] else []) + \
               ([f"{' '.join(p['last'])} (with iteration n-1)"] if p["last"] else [])
        if once:
            print(f"  once per tile: {'; '.join(once)}")
    return 0


def _add_loop_args(p) -> None:
    add_problem_args(p)
    p.add_argument("--pass", dest="pass_", default="fwd", choices=("fwd", "bwd"),
                   help="fwd (default) or bwd (iterations are Q blocks)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--compact", action="store_true", help="with --json: on one line")


def build_parser() -> argparse.ArgumentParser:
    top = _Parser(prog="fa4sim", formatter_class=argparse.RawDescriptionHelpFormatter,
                  description="A cycle-level model of one GPU SM running FlashAttention schedules, forward and "
                              "backward: FA4 on Blackwell (b200) and the FA3-style kernel on Hopper (h100, h200). "
                              "It replays the schedule's warp roles on the SM's units (tensor core, MUFU, FMA and "
                              "ALU pipes, TMEM, shared memory, TMA) and tells you the time, the TFLOP/s, how busy "
                              "each unit is and why.",
                  epilog=EPILOG_RUN)
    sub = top.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="simulate one problem", formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog=EPILOG_RUN, description="Simulate one attention forward (or backward: --pass bwd) and explain the result.")
    add_problem_args(run)
    run.add_argument("--pass", dest="pass_", default="fwd", choices=("fwd", "bwd"),
                     help="fwd (the forward, default) or bwd (the backward: preprocess, main kernel, postprocess; "
                          "TFLOP/s count 2.5 x the forward's FLOPs)")
    run.add_argument("--json", action="store_true", help="print one JSON object (tflops, time_us, cycles, clock_ghz, "
                                                         "clock_source, power_w, utilization, bottleneck, ...)")
    run.add_argument("--compact", action="store_true", help="with --json: on one line")
    run.add_argument("--gantt", metavar="FILE.png", help="draw one CTA's timeline (rows: units and warp roles)")
    run.add_argument("--gantt-iters", type=int, default=None,
                     help=f"with --gantt: KV iterations the chart shows, {GANTT_ITERS[0]}..{GANTT_ITERS[1]} "
                          f"(default {GANTT_DEFAULT})")
    run.add_argument("--trace", metavar="FILE.json", help="write a Perfetto/Chrome trace (1 cycle = 1 ns)")
    run.add_argument("--uncertainty", action="store_true",
                     help="also the band each hardware parameter's range puts on time, TFLOP/s and clock, and the "
                          "parameters that dominate it (each at either end of its range, the others at their "
                          "values; a few seconds on worker processes); JSON: tflops_low, tflops_high, "
                          "dominant_params")
    run.add_argument("--jobs", type=int, default=None, help="with --uncertainty: worker processes (default: one per core)")
    run.set_defaults(func=cmd_run)

    par = sub.add_parser("params", help="list every knob, the implementations' choices and every hardware "
                                        "parameter, with defaults, units and sources")
    par.add_argument("--hw", default="b200", help=f"hardware profile: {', '.join(hardware.available())}, or a "
                                                 f"profile .json (default b200)")
    par.add_argument("--impl", default=None, help="implementation whose choices to show (default: the schedule's)")
    par.add_argument("--schedule", choices=sorted(SCHEDULES))
    par.add_argument("--hdim", type=int, default=128)
    par.add_argument("--hdim-v", type=int, default=None)
    par.add_argument("--causal", action="store_true")
    par.add_argument("--pass", dest="pass_", default="fwd", choices=("fwd", "bwd"),
                     help="the forward's knobs and constants (default) or the backward's (the schedule's backward, "
                          "the implementation's \"bwd\" choices: what `run --pass bwd --set` takes)")
    par.add_argument("--json", action="store_true")
    par.set_defaults(func=cmd_params)

    sw = sub.add_parser("sweep", help="simulate a grid of knob values and problem sizes in parallel",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Simulate every combination of the --grid values; write CSV, JSON and a plot.",
                        epilog=EPILOG_SWEEP)
    add_problem_args(sw)
    sw.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2,...", help="a swept dimension (repeatable)")
    sw.add_argument("--out", default="sweep", help="output prefix: writes PREFIX.csv, PREFIX.json, PREFIX.png")
    sw.add_argument("--jobs", type=int, default=None, help="worker processes (default: one per core); with --backend "
                                                           "ray and no cluster address, the CPUs of the local Ray cluster")
    sw.add_argument("--backend", choices=("process", "ray"), default="process",
                    help="where the points run: 'process' = a pool of worker processes on this machine (default); "
                         "'ray' = one Ray task per point, on a Ray cluster (needs `pip install ray`)")
    sw.add_argument("--ray-address", metavar="HOST:PORT", default=None,
                    help="with --backend ray: the cluster to join (the head node's GCS address, or "
                         "ray://HOST:10001); default: $RAY_ADDRESS, else a local cluster of --jobs CPUs "
                         "started for this sweep and shut down after")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar")
    sw.set_defaults(func=cmd_sweep)

    va = sub.add_parser("validate", help="predicted vs measured for every point of a recorded GPU benchmark",
                        description="Simulate every point of a benchmark results JSON (lab/tools/bench_fwd_sm90.py) "
                                    "and report per-point error, median and max |error|, and the knob deltas. "
                                    "Given a lab/tools/ctas_sm90.py file instead, compare exact steady-state "
                                    "cycles per KV block (no clock involved) and the per-SM knob deltas; given its "
                                    "--only-tiles output, exact cycles per tile of one persistent CTA, split into "
                                    "per-block and per-tile parts; given lab/tools/idle_wg_sm90.py's, tiles with "
                                    "idle warpgroups; given lab/tools/cta_log_sm90.py's, each whole launch against a "
                                    "replay of its own mean tile costs (what tile jitter cost it) and the model's "
                                    "tile-jitter term. Backward files: lab/tools/bench_bwd_sm90.py's (the backward "
                                    "alone, fa4kernel and flash-attn-4, at the model's own clock) and "
                                    "lab/tools/bwd_ctas_sm90.py's (fa4kernel's launches in each launch order at "
                                    "their in-kernel clock, and the gain of one order over another). A unit benchmark: "
                                    "lab/tools/calibrate/bench_contention.py's intra kernel (warpgroups running a "
                                    "softmax-like mix beside their own wgmma) replayed with the engine's "
                                    "interference rules; lab/tools/calibrate/bench_bursts.py's (warps sharing a scheduler) "
                                    "against the engine's issue-sharing rule. Sustained timings: "
                                    "lab/tools/sustained_sm90.py's (each kernel back to back until the power cap "
                                    "settles its clock) against the model predicting the clock itself. Published "
                                    "figures (lab/campaigns/published-b200/published_b200.json): every B200 figure found in "
                                    "papers and pull requests, predicted as typed (--uncertainty: with each one's band).")
    va.add_argument("results", nargs="+", help="result files (.json or .json.gz) of a kind validate compares (meta.kind: "
                                               "points, knob_points, loop_intervals (several of those add a scoreboard "
                                               "of their per-SM knob deltas), tile_costs, idle_wgs, cta_log, sm90_bwd, "
                                               "bwd_ctas, contention, bursts, sustained, published); the recorded ones "
                                               "are listed in lab/results.json by kind, device and campaign "
                                               "(python -m lab.tools.index)")
    va.add_argument("--hw", default=None, help="profile to predict with (default: from the file's device name: h100 or h200, "
                                               "the profiles our microbenchmarks calibrated, or b200)")
    va.add_argument("--plot", metavar="FILE.png", help="correlation plot: predicted vs measured with y = x (for "
                                                      "ctas_sm90.py files: their per-SM knob deltas, +-3 pp band; "
                                                      "for a tile-cost file: the error against the tile's blocks)")
    va.add_argument("--at-profile-clock", action="store_true",
                    help="end-to-end points files (bench_fwd_sm90.py's) only: predict at the profile's clock (the power "
                         "model's prediction where the profile has one, "
                         "else its clock_ghz) even where the benchmark recorded the in-kernel clock of the point "
                         "(default: at that measured clock, so the error is the cycle model's)")
    va.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="sustained files only: a what-if for their predictions, a hardware parameter, schedule knob or "
                         "measured constant (repeatable), e.g. the card's own "
                         "card_power_w, which lab/tools/calibrate/card_power.py gives from the card's capped GEMM "
                         "loads")
    va.add_argument("--pv-wait", choices=("model", "sass"), default="model",
                    help="end-to-end points files only: where each build waits for the previous block's PV GEMM: "
                         "'model' = the whole row max "
                         "before the wait, the exp2s and row sum after (the default, validated); 'sass' = "
                         "where ptxas put it in that build (the implementation's pv_wait_sass table), a what-if")
    va.add_argument("--uncertainty", action="store_true",
                    help="published and sustained files only: each point's band from the hardware parameters' "
                         "ranges (as `run --uncertainty`) and whether the measured or published figure falls "
                         "inside it (seconds per point)")
    va.add_argument("--jobs", type=int, default=None, help="with --uncertainty: worker processes (default: one per core)")
    va.add_argument("--json", action="store_true")
    va.set_defaults(func=cmd_validate)

    gr = sub.add_parser("graph", help="one loop iteration's dependency graph and its II bounds (ResMII, RecMII)",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="The dependency graph of one iteration of the schedule the simulation "
                                    "replays: ops (cycles per unit, latency, role), units, edges (distance, "
                                    "kind, delay), the resource bound (busiest unit or role) and the "
                                    "recurrence bound (critical cycle), without and with the roles' program "
                                    "order (docs/schedules-from-constraints.md).",
                        epilog="example:\n  fa4sim graph --hw b200 --schedule fa4 --plot graph.png "
                               "--dot fa4.dot")
    _add_loop_args(gr)
    gr.add_argument("--dot", metavar="FILE.dot", help="write the graph as Graphviz text")
    gr.add_argument("--plot", metavar="FILE.png", help="draw the graph (one lane per role)")
    gr.add_argument("--slowed", action="store_true", help="charge units the schedule slows beside the tensor core "
                                                        "at the slowed rate (not a lower bound then)")
    gr.set_defaults(func=cmd_graph)

    so = sub.add_parser("solve", help="a modulo schedule by CP-SAT, its role programs, replayed in the engine",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Find the smallest initiation interval (II) for the schedule's ops, units "
                                    "and edges with OR-Tools CP-SAT, emit each role's program (op order and "
                                    "skew: prologue, steady state, epilogue) and replay it in the engine "
                                    "(docs/schedules-from-constraints.md).",
                        epilog="examples:\n  fa4sim solve --hw b200 --schedule fa4 --json\n"
                               "  fa4sim solve --hw b200 --order compute   # MMA issue order free\n"
                               "  fa4sim solve --hw b200 --set mufu_ex2_per_clk=32")
    _add_loop_args(so)
    so.add_argument("--order", default="code", choices=("code", "hand", "compute", "free"),
                    help="which program order the solver keeps: code (default: each role's MMA issue order "
                         "and its compute ops' order), hand (all of it), compute (the compute ops' order only), "
                         "free (none: a bound; its programs may break hazards the hand order expresses)")
    so.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, metavar="S",
                    help=f"the solver's time limit in seconds, list scheduling and CP-SAT together (default "
                         f"{TIME_LIMIT_S:g}, at most {MAX_TIME_LIMIT_S:g}; loading OR-Tools is not counted)")
    so.set_defaults(func=cmd_solve)
    return top


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        a = parser.parse_args(argv)
        if getattr(a, "compact", False) and not a.json:
            raise InputError("--compact", "only with --json")
        return a.func(a)
    except InputError as e:
        sys.stderr.write(f"fa4sim: error: {e}\n")
        return 2
    except DeadlockError as e:
        sys.stderr.write(f"fa4sim: {e}\n")
        return 3
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as e:  # Ctrl-C: one line (saying what a sweep kept), not a traceback
        kept = f": {e}" if str(e) else ""
        sys.stderr.write(("\n" if sys.stderr.isatty() else "") + f"fa4sim: interrupted{kept}\n")
        return 130
    except OSError as e:  # an output the OS refused to write (/proc/x.png, a full disk)
        if e.filename is None:
            raise
        sys.stderr.write(f"fa4sim: error: {e.filename}: {e.strerror}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
