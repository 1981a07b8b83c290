"""Draw every figure from the simulator (and recorded measurements where they exist).

    python figures/make_figures.py --out DIR       # all figures into DIR (default build/figures),
                                                   # about half a minute on a laptop CPU
    python figures/make_figures.py --out figures   # refresh the committed ones (a maintainer's step)
    python figures/make_figures.py --list          # what it writes

Figures:
  fa4_b200_timeline.png        FA4 forward on B200, one CTA (the README's figure; same command)
  fa3_h100_timeline.png        FA3-style forward on H100, one CTA
  feeds_and_speeds.png         cycles per 128x128 tile for MMA, exp2 and shared memory, H100 vs B200
  exp_emulation_sweep.png      B200 vs H100: TFLOP/s and MUFU/FMA utilisation over exp_emulation
  pingpong_on_off.png          H100 ping-pong on/off by head dim, datasheet and measured profiles
                               (measured fa4kernel points where recorded)
  pingpong_timelines_h100.png  H100 hd64 timelines with ping-pong on and off
  rescale_rate_vs_tau.png      how often a warp rescales O, against tau (model and numpy count)
  validation_<gpu>.png         predicted vs measured TFLOP/s, newest benchmark per GPU
  sustained_<gpu>.png          as a user times it (settled): TFLOP/s and clock predicted with the
                               model's own clock vs measured, newest settled run per GPU
  knob_deltas_per_sm.png       per-SM knob deltas (one CTA), measured vs predicted, all knob loops
  tile_costs_h100.png          cycles per tile of one persistent CTA by KV blocks and knob, error of the model
  timeline_overlay_<run>.png   simulated vs measured timelines of the trace build (clock64 stamps)
  training_<gpu>.png           a small GPT trained with fa4kernel, SDPA and flash-attn-4: losses,
                               tokens/s, the attention's GPU share; newest run per GPU

Every figure has a legend and axis labels with units. A figure of a build that reads clock64
says so on the figure: the trace build's stamps slow it (by how much, from the run's own
plain-vs-trace timing), the clock-probe build reads the clock only at a CTA's start and end.
Measurements come only from lab/campaigns/, found through the lab's index lab/results.json (by
meta.kind: points, sustained, loop_intervals, tile_costs, timeline, training, attn_host; `python -m lab.tools.index`
lists them); nothing is invented.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fa4sim import Problem, hardware, simulate  # noqa: E402
from fa4sim.cli import main as fa4sim_main  # noqa: E402
from fa4sim.feeds import tile_costs  # noqa: E402
from fa4sim.gantt import draw  # noqa: E402
from fa4sim.rescale import rescale_rate  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIG = os.path.join(ROOT, "build", "figures")  # where the figures go: --out
sys.path.insert(0, ROOT)
from lab.tools import index as lab_index  # noqa: E402  (the lab's index of recorded results)

# FA4LAB_INDEX: another checkout's lab/results.json (its rows' paths are read from that checkout)
INDEX = os.environ.get("FA4LAB_INDEX")
INDEX_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(INDEX))) if INDEX else ROOT
README_CMD = ["run", "--hw", "b200", "--schedule", "fa4", "--hdim", "128", "--seqlen", "32768", "--batch", "1",
              "--heads", "16", "--gantt"]


def set_out(folder: str) -> None:
    """Draw into `folder` (made if missing)."""
    global FIG
    FIG = os.path.abspath(folder)
    os.makedirs(FIG, exist_ok=True)


def out(name: str) -> str:
    return os.path.join(FIG, name)


def recorded(kind: str, where=None, **keys) -> list:
    """(path, doc) of every recorded result file of that kind in the lab's index (keys: device,
    kernel, campaign; lab.tools.index.recorded), sorted by path; with `where`, the files whose
    loaded document where(doc) accepts (one lacking a field it asks for is left out)."""
    out = [(str(path), doc) for path, doc in
           lab_index.documents(lab_index.recorded(kind=kind, index=INDEX, **keys), INDEX_ROOT, where)]
    return sorted(out, key=lambda pd: pd[0])


def sm90_for(device: str):
    """(doc, 'device, campaign') of the newest recorded SM90 benchmark (lab/tools/bench_fwd_sm90.py,
    kind "points") on a device ("H100", "H200"; "" for any), or (None, None)."""
    docs = [(str(doc.get("meta", {}).get("date", "")), path, doc)
            for path, doc in recorded("points", campaign="kernel-sm90-forward")
            if device in str(doc.get("meta", {}).get("device", ""))]
    if not docs:
        return None, None
    _, path, doc = max(docs, key=lambda d: d[:2])
    return doc, f"{doc['meta'].get('device', '?')}, {campaign_dir(path)}"


def campaign_dir(path) -> str:
    """'lab/campaigns/<campaign>/' of a recorded file: where a figure says its data come from."""
    parts = Path(path).parts
    return f"lab/campaigns/{parts[parts.index('campaigns') + 1]}/" if "campaigns" in parts[:-1] else str(path)


def add_caption(path: str, text: str) -> None:
    """Redraw a PNG with `text` in a strip below it (for figures drawn by fa4sim.validate)."""
    import textwrap

    img = mpimg.imread(path)
    h, w = img.shape[:2]
    dpi = 120
    lines = textwrap.wrap(text, width=int(w / 7.2))
    strip = (len(lines) + 1) * 15
    fig = plt.figure(figsize=(w / dpi, (h + strip) / dpi), dpi=dpi)
    ax = fig.add_axes([0, strip / (h + strip), 1, h / (h + strip)])
    ax.imshow(img)
    ax.axis("off")
    fig.text(0.01, (strip - 8) / (h + strip), "\n".join(lines), fontsize=8, va="top", ha="left")
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


PROBE_CAPTION = ("Measured: one CTA of fa4kernel's clock-probe build (lab/tools/ctas_sm90.py). It reads "
                 "clock64 only at the CTA's start and end; its loop's SASS is the plain kernel's, so its "
                 "cycles are the plain kernel's (exact cycles as the difference of two K lengths).")


def knob_point(doc, label: str, causal: bool = False):
    from fa4sim.validate import expand

    for p in expand((doc or {}).get("points", [])):
        if p.get("label") == label and bool(p.get("causal")) == causal:
            t = p.get("results", {}).get("fa4kernel", {}).get("tflops")
            if t is not None:
                return t
    return None


def fig_fa4_timeline():
    # exactly the README's command, so the figure and the README agree
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        rc = fa4sim_main(README_CMD + [out("fa4_b200_timeline.png")])
    assert rc == 0
    return "fa4_b200_timeline.png"


def fig_fa3_timeline():
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        rc = fa4sim_main(["run", "--hw", "h100-datasheet", "--schedule", "fa3", "--hdim", "128", "--seqlen", "8192",
                          "--batch", "2", "--heads", "16", "--gantt", out("fa3_h100_timeline.png")])
    assert rc == 0
    return "fa3_h100_timeline.png"


def fig_graph():
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        rc = fa4sim_main(["graph", "--hw", "b200", "--schedule", "fa4", "--plot", out("graph_fa4_sm100.png")])
    assert rc == 0
    return "graph_fa4_sm100.png"


def fig_feeds():
    rows = [("H100", tile_costs(hardware.load("h100-datasheet"), 128)),
            ("B200 (1-CTA)", tile_costs(hardware.load("b200"), 128)),
            ("B200 (2-CTA)", tile_costs(hardware.load("b200"), 128, two_cta=True))]
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(3)
    for i, (name, c) in enumerate(rows):
        vals = [c["mma"], c["exp_mufu"], c["smem"]]
        bars = ax.bar(x + (i - 1) * 0.27, vals, width=0.27, label=name)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(x, ["tensor core (MMA)", "MUFU (exp2)", "shared memory"])
    ax.set_ylabel("cycles per SM")
    ax.set_title("Feeds and speeds: one 128x128 tile at hd128 (no overlap, no latency)\n"
                 "B200 doubled the tensor core; exp2 and shared memory did not")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out("feeds_and_speeds.png"), dpi=130)
    plt.close(fig)
    return "feeds_and_speeds.png"


def fig_emulation():
    doc, where = sm90_for("H100")
    fracs = [0.0, 0.0625, 0.125, 0.1875, 0.25, 0.375, 0.5, 0.75, 1.0]
    b_prob = Problem(1, 16, 32768, 32768, 128)
    h_prob = Problem(2, 16, 8192, 8192, 128)
    b = [simulate("b200", "fa4", b_prob, {"exp_emulation": f}) for f in fracs]
    h = [simulate("h100-datasheet", "fa3", h_prob, {"exp_emulation": f}) for f in fracs]
    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    ax[0].plot(fracs, [r.tflops for r in b], "-o", label="B200 fa4 (hd128, 32k) predicted")
    ax[0].plot(fracs, [r.tflops for r in h], "-s", label="H100 fa3 (hd128, 8k, b2) predicted, datasheet profile")
    meas = [(f, knob_point(doc, lab)) for f, lab in ((0.0, "default"), (0.125, "exp_emulation=0.125"),
                                                      (0.25, "exp_emulation=0.25"))]
    meas = [(f, t) for f, t in meas if t is not None]
    if meas:
        ax[0].plot(*zip(*meas), "k^", label=f"fa4kernel measured ({where})")
    ax[0].axvspan(0.10, 0.25, color="grey", alpha=0.15, label="FA4's choice (10-25%)")
    ax[0].set(xlabel="exp_emulation (fraction of exp2 on the FMA pipe)", ylabel="TFLOP/s",
              title="exp2 emulation pays only where exp2 is on the critical path")
    ax[0].legend(fontsize=7)
    for rs, hw, st in ((b, "B200", "-o"), (h, "H100", "-s")):
        ax[1].plot(fracs, [r.utilization["mufu"] for r in rs], st, label=f"{hw} MUFU")
        ax[1].plot(fracs, [r.utilization["fma"] for r in rs], st, alpha=0.45, label=f"{hw} FMA pipe")
    ax[1].set(xlabel="exp_emulation (fraction of exp2 on the FMA pipe)", ylabel="busy fraction of the steady-state loop",
              title="MUFU vs FMA utilisation (predicted)")
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out("exp_emulation_sweep.png"), dpi=130)
    plt.close(fig)
    return "exp_emulation_sweep.png"


def fig_pingpong():
    doc, where = sm90_for("H100")
    dims = (64, 128, 256)
    profiles = [p for p in ("h100-datasheet", "h100") if p in hardware.available()]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    x = np.arange(len(dims))
    width = 0.8 / (2 * len(profiles))
    i = 0
    for prof in profiles:
        for pp in (True, False):
            vals = [simulate(prof, "fa3", Problem(16384 // 8192, 2048 // d, 8192, 8192, d), {"pingpong": pp}).tflops
                    for d in dims]
            bars = ax.bar(x - 0.4 + width * (i + 0.5), vals, width, alpha=1.0 if pp else 0.55,
                          color=f"C{profiles.index(prof)}", hatch="" if pp else "//",
                          label=f"{prof} profile, ping-pong {'on' if pp else 'off'} (predicted)")
            ax.bar_label(bars, fmt="%.0f", fontsize=6)
            i += 1
    m_on, m_off = knob_point(doc, "default"), knob_point(doc, "pingpong=False")
    if m_on is not None and m_off is not None:
        j = dims.index(128)
        ax.plot([j - 0.1, j + 0.1], [m_on, m_off], "k^", markersize=9, label=f"fa4kernel on/off, measured ({where})")
    ax.set_xticks(x, ["hd64", "hd128", "hd256\n(fa4kernel runs it without ping-pong)"])
    ax.set_xlabel("head dimension (non-causal, seqlen 8192, 16k tokens)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("FA3-style forward on H100: inter-warpgroup ping-pong on/off\n"
                 "datasheet profile (MMA queue depth 2, a guess) vs measured profile (depth 7)")
    ax.set_ylim(0, 1250)
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(out("pingpong_on_off.png"), dpi=130)
    plt.close(fig)
    return "pingpong_on_off.png"


def fig_pingpong_timelines():
    prob = Problem(2, 32, 8192, 8192, 64)
    tmp = tempfile.mkdtemp(prefix="fa4fig_")
    paths = []
    for pp in (True, False):
        r = simulate("h100-datasheet", "fa3", prob, {"pingpong": pp})
        path = os.path.join(tmp, f"pp{int(pp)}.png")
        draw(r.trace, path, iterations=5, width=14,
             title=f"simulated: fa3 on h100 (datasheet profile), hd64: ping-pong {'ON' if pp else 'OFF'} -> "
                   f"{r.tflops:.0f} TFLOP/s (one CTA, first 5 KV blocks)")
        paths.append(path)
    imgs = [mpimg.imread(p) for p in paths]
    fig, ax = plt.subplots(2, 1, figsize=(14, 14 * sum(i.shape[0] for i in imgs) / imgs[0].shape[1]))
    for a, img in zip(ax, imgs):
        a.imshow(img)
        a.axis("off")
    fig.subplots_adjust(left=0, right=1, top=1, bottom=0, hspace=0.02)
    fig.savefig(out("pingpong_timelines_h100.png"), dpi=110)
    plt.close(fig)
    for p in paths:
        os.unlink(p)
    os.rmdir(tmp)
    return "pingpong_timelines_h100.png"


def fig_rescale():
    taus = np.linspace(0, 10, 41)
    n_kv = 128  # a 16k-key row in 128-key blocks
    fig, ax = plt.subplots(figsize=(7, 4))
    for std in (1.0, 2.0, 4.0):
        rates = np.array([rescale_rate(n_kv, t, score_std=std) for t in taus])
        ax.semilogy(taus, np.where(rates > 0, rates, np.nan), label=f"model, score_std={std:g}")
    # the kernel's rule counted directly on randn scores (stale max, per warp of 32 rows)
    rng = np.random.default_rng(0)
    rows, keys, d = 512, 128 * n_kv, 128
    s = (rng.standard_normal((rows, d)) @ rng.standard_normal((keys, d)).T) / np.sqrt(d) * np.log2(np.e)
    blk = s.reshape(rows, n_kv, 128).max(axis=2)
    pts = []
    for tau in (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0):
        m = blk[:, 0].copy()
        fired = np.zeros((n_kv, rows), bool)
        for j in range(1, n_kv):
            f = blk[:, j] > m + tau
            fired[j] = f
            m = np.where(f, blk[:, j], m)
        pts.append((tau, fired.reshape(n_kv, rows // 32, 32).any(axis=2).mean()))
    seen = [(t, r) for t, r in pts if r > 0]
    never = [t for t, r in pts if r == 0]
    pairs = (n_kv - 1) * rows // 32
    ax.semilogy(*zip(*seen), "ko", label="kernel rule (stale max) counted on randn scores, score_std 1")
    if never:
        ax.plot(never, [2e-9] * len(never), "kv", label=f"counted 0 of {pairs} pairs")
    ax.axvline(8, color="grey", linestyle=":", label="FA4: tau = 8")
    ax.set(xlabel="tau (log2 units)", ylabel="fraction of (warp, KV block) pairs that rescale",
           title="Conditional rescaling: how often the correction warpgroup touches O", ylim=(1e-9, 1.5))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out("rescale_rate_vs_tau.png"), dpi=130)
    plt.close(fig)
    return "rescale_rate_vs_tau.png"


def newest_per_gpu(kind: str, where=None, **keys) -> dict:
    """{'h100' / 'h200' (or the file's name): its newest recorded results file of that kind (and
    keys, where: as recorded())}."""
    from fa4sim import validate

    newest = {}
    for path, _ in recorded(kind, where, **keys):
        doc = validate.load(path)
        device = doc["meta"].get("device", "")
        tag = "h200" if "H200" in device else "h100" if "H100" in device else os.path.basename(path)[:-5]
        if tag not in newest or str(doc["meta"].get("date", "")) > str(newest[tag]["meta"].get("date", "")):
            newest[tag] = doc
    return newest


def fig_validation():
    """Predicted vs measured for every recorded SM90 benchmark (fa4sim validate --plot)."""
    from fa4sim import validate

    # one figure per device: its newest recorded benchmark (lab/tools/bench_fwd_sm90.py)
    newest = newest_per_gpu("points", campaign="kernel-sm90-forward")
    for tag, doc in sorted(newest.items()):
        validate.plot(validate.compare(doc), out(f"validation_{tag}.png"))
    return ", ".join(f"validation_{t}.png" for t in sorted(newest)) or "(no recorded benchmark: no validation figure)"


def fig_sustained():
    """The newest settled sustained run per GPU against the model's own clock (fa4sim validate
    FILE --plot): TFLOP/s, and the predicted clock against the clock-probe build's."""
    from fa4sim import validate

    newest = newest_per_gpu("sustained", where=settled_grid)
    for tag, doc in sorted(newest.items()):
        validate.plot(validate.compare(doc), out(f"sustained_{tag}.png"))
        add_caption(out(f"sustained_{tag}.png"), "Measured: lab/tools/sustained_sm90.py, each kernel back to back "
                    "for 2.5 s, then timed for 1 s; the clock: fa4kernel's clock-probe build, clock64 over globaltimer "
                    "summed over every launch of a window. No measured clock goes into the prediction: the power "
                    "model sets it.")
    return ", ".join(f"sustained_{t}.png" for t in sorted(newest)) or "(no settled run: no sustained figure)"


def attention_gpu_us(training: dict) -> dict | None:
    """{backend: GPU us of one layer's attention forward + backward} from the newest attn_host
    file (lab/tools/attn_host_sm90.py) on the training run's device at its shape, or None."""
    meta, c = training["meta"], training["meta"]["config"]
    shape = {"batch": c["batch"], "seq": c["seq"], "heads": c["width"] // c["head_dim"], "kv_heads": c["kv_heads"],
             "head_dim": c["head_dim"]}
    docs = [doc for _, doc in recorded("attn_host") if doc["meta"].get("device") == meta.get("device")
            and all(doc["meta"]["config"].get(k) == v for k, v in shape.items())]
    if not docs:
        return None
    doc = max(docs, key=lambda d: str(d["meta"].get("date", "")))
    return {r["backend"]: r["fwd_bwd"]["gpu_us"] for r in doc["runs"] if "fwd_bwd" in r}


def fig_training():
    """The newest training run per GPU (lab/tools/train_gpt_sm90.py's own figure), with the
    attention's GPU share from attn_host where a file of its shape is recorded."""
    from lab.tools.train_gpt_sm90 import plot

    newest = {}
    for path, doc in recorded("training"):
        device = doc["meta"].get("device", "")
        tag = "h200" if "H200" in device else "h100" if "H100" in device else os.path.basename(path)[:-5]
        if tag not in newest or str(doc["meta"].get("date", "")) > str(newest[tag]["meta"].get("date", "")):
            newest[tag] = doc
    for tag, doc in sorted(newest.items()):
        plot(doc, out(f"training_{tag}.png"), attention_gpu_us(doc))
    return ", ".join(f"training_{t}.png" for t in sorted(newest)) or "(no recorded training run: no training figure)"


def settled_grid(doc) -> bool:
    """lab/tools/sustained_sm90.py's default run (its grid and new points), settled: each kernel
    2.5 s back to back before it is timed."""
    return ({p["group"] for p in doc["points"]} <= {"grid", "new"}
            and doc["meta"]["settings"]["warm_s"] >= 2.5)


# The one-CTA knob loops (lab/tools/ctas_sm90.py, kind "loop_intervals", lab/campaigns/one-sm-loop/)
# of the builds whose loop is the kernel's today, as (the build's commit, head dims taken from its
# files): hd128 and hd64 measured with tau's rescale before the PV GEMM; hd256's loop compiles the
# same in the build before it (the rescale after the PV wait)
CURRENT_KNOB_LOOPS = (("162f99a", None), ("cacc3d6", {256}))


def fig_knob_deltas_per_sm():
    """Measured vs predicted per-SM knob deltas of the current kernel's one-CTA knob loops (fa4sim
    validate FILES --plot)."""
    from fa4sim import validate

    results = current_knob_loops()
    if not results:
        return "(no recorded knob loops: no per-SM knob figure)"
    validate.plot_knob_deltas(results, out("knob_deltas_per_sm.png"))
    add_caption(out("knob_deltas_per_sm.png"), PROBE_CAPTION + " Each point: one knob variant's throughput change "
                "against the default (from cycles per KV block), measured (x) and predicted (y).")
    return "knob_deltas_per_sm.png"


def current_knob_loops() -> list:
    """fa4sim validate's comparison of each current knob-loop file, keeping the head dims whose
    loop it still describes (CURRENT_KNOB_LOOPS; older files describe the kernel before)."""
    from fa4sim import validate

    results = []
    for kernel, hdims in CURRENT_KNOB_LOOPS:
        for path, _ in recorded("loop_intervals", campaign="one-sm-loop", kernel=kernel):
            r = validate.compare(validate.load(path))
            if hdims is not None:
                r["knob_deltas"] = [d for d in r["knob_deltas"] if d["hdim"] in hdims]
            results.append(r)
    return results


def fig_tile_costs():
    """The model's error on whole tiles of one persistent CTA, by blocks per tile and knob
    variant (fa4sim validate FILE --plot, FILE the newest H100 run of lab/tools/ctas_sm90.py
    --only-tiles with knob variants)."""
    from fa4sim import validate

    runs = newest_per_gpu("tile_costs", where=lambda d: any(t.get("knobs") for t in d["tile_costs"]), device="h100")
    if "h100" not in runs:
        return "(no recorded tile costs by knob: no tile-cost figure)"
    validate.plot(validate.compare(runs["h100"]), out("tile_costs_h100.png"))
    add_caption(out("tile_costs_h100.png"), PROBE_CAPTION.replace("one CTA", "one persistent CTA") +
                " A tile's cycles: the difference of walks over 9 tiles and over 1, divided by 8.")
    return "tile_costs_h100.png"


def fig_timeline_overlays():
    """Simulated vs measured per-warp timelines for every recorded trace-build run, with a legend
    of op kinds and a caption that says how much the stamps slow the traced build."""
    sys.path.insert(0, os.path.join(ROOT, "lab", "tools"))
    import timeline_compare as tc

    from fa4sim import timeline

    names = []
    # the first CTA of a whole launch; not a walk of one CTA over every tile (timeline_sm90.py
    # --max-ctas 1: a grid of 1, tile-boundary stamps read in lesson 07 and
    # lab/findings/tile-turnover.md, no launch to simulate beside it) nor a later CTA's tiles
    for path, _ in recorded("timeline", where=lambda d: d["meta"]["cta"] == 0 and d["meta"]["trace_header"]["grid"] > 1):
        doc = timeline.load_stamps(path)
        meta = doc.get("meta", {})
        label = meta.get("label") or os.path.basename(path).split(".")[0][len("timeline_"):]
        hw = tc.hw_for(meta)
        over = tc.sim_overrides(meta)
        res = simulate(hw, "fa3", tc.problem_of(meta), over)
        sel, _ = tc.select_tile(doc, res.trace.schedule, 0)
        measured = timeline.to_trace(sel, res.trace.schedule)
        name = f"timeline_overlay_{label}.png"
        draw_overlay(res, measured, meta, os.path.relpath(path, ROOT), out(name))
        names.append(name)
    return ", ".join(names) or "(no recorded timeline: no overlay)"


def draw_overlay(res, measured, meta: dict, source: str, path: str, iterations: int = 6) -> None:
    """Two Gantt panels on one cycle axis, simulated (top) and measured (bottom), from the third
    KV iteration on; a legend of op kinds; a caption on what the stamps cost."""
    from fa4sim import timeline
    from fa4sim.gantt import KIND_COLORS

    sched = res.trace.schedule
    roles = [r for r in sched.roles if any(x.role == r for x in measured.ops)]
    fig, axes = plt.subplots(2, 1, figsize=(14, 2.2 + 0.9 * len(roles)), sharex=True)
    kinds = set()

    def panel(ax, trace, name):
        starts = trace.starts(sched.marker) or [0.0]
        first = starts[min(2, len(starts) - 1)]
        last = starts[min(2 + iterations, len(starts) - 1)]
        for i, role in enumerate(roles):
            for r in trace.ops:
                if r.role == role and r.end > first and r.start < last and not sched.op(r.name).asynchronous:
                    ax.barh(i, r.end - r.start, left=r.start - first, height=0.7,
                            color=KIND_COLORS.get(r.kind, "#999999"), edgecolor="white", linewidth=0.3)
                    kinds.add(r.kind)
        ax.set_yticks(range(len(roles)), roles, fontsize=8)
        ax.set_ylabel("warp role", fontsize=8)
        ax.set_title(name, fontsize=9, loc="left")
        return last - first

    m_int, s_int = timeline.interval(measured, sched.marker), res.interval
    def per_block(x):
        return f"{x:.0f} cycles per KV block" if x else "no steady state in the window"

    span = max(panel(axes[0], res.trace, f"simulated: fa3 schedule, {res.impl.name} on {res.hw.name} "
                                         f"({per_block(s_int)})"),
               panel(axes[1], measured, f"measured: fa4kernel's trace build, {meta.get('device', '?')}, "
                                        f"CTA {meta.get('cta', '?')} tile 0 "
                                        f"({per_block(m_int)})"))
    axes[1].set_xlim(0, span)
    axes[1].set_xlabel("cycles from the start of the third KV iteration")
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLORS.get(k, "#999999")) for k in sorted(kinds)]
    fig.legend(handles, sorted(kinds), loc="upper right", ncol=len(kinds), fontsize=8, frameon=False)
    p = res.problem
    fig.suptitle(f"hd{p.hdim}, seqlen {p.seqlen_k}{', causal' if p.causal else ''}: simulated vs measured warp "
                 f"timelines (recorded run {meta.get('label', '?')!r})", fontsize=10, x=0.01, ha="left")
    normal, traced = meta.get("ms_normal_build"), meta.get("ms_trace_build")
    cost = (f"on this launch the trace build ran {traced / normal - 1:.0%} slower than the plain kernel "
            f"({traced:.3f} against {normal:.3f} ms, recorded with the stamps in {campaign_dir(source)})"
            if normal and traced else "this file does not record by how much on this launch")
    fig.text(0.01, 0.01, "The measured panel is a trace build: clock64 stamps around every op, one thread per "
             f"role. The stamps cost issue slots, so it runs slower than the plain kernel: {cost}; "
             "six stamps per warpgroup and KV block alone slow the hd128 loop by 20 % (2953 against 2462 cycles, "
             "lab/campaigns/tile-costs/, the light traces). Read it for the order of ops and tile boundaries, "
             "not for cycles inside the loop.", fontsize=8, wrap=True, va="bottom")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", action="store_true", help="list the figures and exit")
    ap.add_argument("--out", default=FIG, metavar="DIR",
                    help="the folder to draw into (default build/figures; figures/ holds the committed ones)")
    a = ap.parse_args(argv)
    if a.list:
        print(__doc__)
        return 0
    set_out(a.out)
    print(f"drawing into {FIG}")
    doc, where = sm90_for("")
    print(f"recorded SM90 measurement: {where}" if doc else "no recorded SM90 measurement: simulation only")
    jobs = [fig_fa4_timeline, fig_fa3_timeline, fig_graph, fig_feeds, fig_emulation,
            fig_pingpong, fig_pingpong_timelines, fig_rescale, fig_validation, fig_sustained,
            fig_knob_deltas_per_sm, fig_tile_costs, fig_timeline_overlays, fig_training]
    t_all = time.time()
    for job in jobs:
        t = time.time()
        name = job()
        print(f"wrote {name} ({time.time() - t:.1f} s)")
    print(f"done in {time.time() - t_all:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
