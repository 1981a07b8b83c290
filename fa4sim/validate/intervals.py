"""Loop intervals (lab/tools/ctas_sm90.py, kind 'loop_intervals'): exact steady-state cycles per
KV block of our kernel's builds, measured vs simulated, and each knob variant's per-SM change
against the default build; several files together give a scoreboard of those changes."""
from __future__ import annotations

import json
import statistics

from ..model import simulate
from ..params import Problem
from .common import has_model_twin, model_knobs, profile_for, progress, pyplot, save, verdict

# the resolved configuration ctas_sm90.py records beside each point's knobs
RECORDED_FIELDS = ("tile_m", "tile_n", "rescale_threshold", "rescale_before_pv", "early_q_release",
                   "defer_o_store_wait", "ablate", "exp_before_pv_wait")


def recorded_config(p: dict) -> dict:
    """A ctas_sm90.py point's build as it ran: its resolved fields, the knobs it was given over them."""
    return {**{f: p[f] for f in RECORDED_FIELDS if f in p}, **(p.get("knobs") or {})}


def compare(doc: dict, hw: str | None = None) -> dict:
    """Steady-state cycles per KV block, measured (clock-probe build, two K lengths: prologue and
    epilogue cancel, and no clock conversion at all) vs simulated, for every configuration and
    CTA count of a ctas_sm90.py file; plus each knob variant's change against 'default' at the
    same CTA count (the per-SM knob effect, free of clock and power changes)."""
    hw = hw or profile_for(doc["meta"].get("device", ""))
    rows, cache, no_twin = [], {}, []
    sk = int(doc["meta"]["seqlens_k"][-1])
    for i, p in enumerate(doc["points"], 1):
        progress(i, len(doc["points"]))
        rec = recorded_config(p)
        if p.get("variant") == "skip_softmax" or not has_model_twin({**rec, "knobs": p.get("knobs")}):
            no_twin.append(p.get("variant", "?"))
            continue
        hd, n, pattern, causal = int(p["hdim"]), int(p["n_ctas"]), p.get("pattern", "shared"), bool(p["causal"])
        knobs = model_knobs("fa4kernel", rec)
        key = (hd, causal, json.dumps(knobs, sort_keys=True))
        if key not in cache:
            cache[key] = simulate(hw, "fa3", Problem(1, 1, int(p["tile_m"]), sk, hd, causal), knobs).interval
        sim = cache[key]
        meas = p["cycles_per_kv_block"]
        rows.append({"hdim": hd, "causal": causal, "n_ctas": n, "pattern": pattern,
                     "variant": p.get("variant", "default"), "knobs": knobs, "measured_cycles": meas,
                     "predicted_cycles": sim, "error": (sim - meas) / meas if sim else None})
    deltas = []
    for r in rows:
        if r["variant"] == "default" or r["pattern"] != "shared":
            continue
        b = next((x for x in rows if x["variant"] == "default" and x["hdim"] == r["hdim"] and x["causal"] == r["causal"]
                  and x["n_ctas"] == r["n_ctas"] and x["pattern"] == "shared"), None)
        if b is None or not b["predicted_cycles"] or not r["predicted_cycles"]:
            continue  # no periodic regime found in the simulated blocks: no interval to compare
        # as a change of throughput (cycles per key down = faster), like the TFLOP/s deltas; per
        # key, not per block, so a variant with another tile_n compares fairly
        keys = r["knobs"]["tile_n"] / b["knobs"]["tile_n"]
        meas = keys * b["measured_cycles"] / r["measured_cycles"] - 1
        pred = keys * b["predicted_cycles"] / r["predicted_cycles"] - 1
        deltas.append({"knob": r["variant"], "hdim": r["hdim"], "causal": r["causal"], "n_ctas": r["n_ctas"],
                       "measured_delta": meas,
                       "predicted_delta": pred, "same_sign": (meas >= 0) == (pred >= 0) or abs(meas) < 0.005,
                       "difference_pp": 100 * (pred - meas)})
    shared = [abs(r["error"]) for r in rows if r["error"] is not None and r["pattern"] == "shared"]
    summary = {"hw_profile": hw, "device": doc["meta"].get("device"), "date": doc["meta"].get("date"),
               "median_abs_error": statistics.median(shared) if shared else None,
               "max_abs_error": max(shared) if shared else None, "points": len(shared),
               "not_simulated": [v for v in no_twin if v != "skip_softmax"]}
    return {"kind": "loop_intervals", "summary": summary, "intervals": rows, "knob_deltas": deltas}


def report(result: dict) -> str:
    s = result["summary"]
    lines = [f"device {s['device']} ({s['date']}), profile {s['hw_profile']}: steady-state cycles per KV block "
             "(clock-probe build; 'own' = every CTA its own K/V, from HBM: a chip-level limit)"]
    lines.append(f"{'hd':>4s} {'CTAs':>5s} {'K/V':>6s} {'variant':24s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
    for r in result["intervals"]:
        pred = (f"{r['predicted_cycles']:9.0f} {r['error']:+7.1%}" if r["predicted_cycles"]
                else f"{'no period':>9s} {'':>7s}")  # the simulated blocks never settled
        lines.append(f"{r['hdim']:4d} {r['n_ctas']:5d} {r['pattern']:>6s} {r['variant']:24s} {r['measured_cycles']:9.0f} "
                     + pred)
    if s["median_abs_error"] is not None:
        lines.append(f"shared K/V: median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%} over {s['points']} points")
    if s.get("not_simulated"):
        lines.append("not simulated (builds without a model twin): " + ", ".join(s["not_simulated"]))
    if result["knob_deltas"]:
        lines.append("per-SM knob deltas (throughput change vs default at the same CTA count, measured / predicted):")
        for d in result["knob_deltas"]:
            lines.append(f"  {d['knob']:24s} hd{d['hdim']:<3d}{' causal' if d.get('causal') else '       '} "
                         f"{d['n_ctas']:3d} CTAs {d['measured_delta']:+7.1%} / {d['predicted_delta']:+7.1%}  {verdict(d)}")
    return "\n".join(lines)


def knob_scoreboard(results: list[dict]) -> dict:
    """The per-SM knob deltas of several ctas_sm90.py files together: how many have the right sign
    and lie within 3 percentage points, per head dim and causal or not, and overall."""
    groups: dict = {}
    for res in results:
        for d in res["knob_deltas"]:
            for key in ("all", f"hd{d['hdim']}{' causal' if d.get('causal') else ''}"):
                g = groups.setdefault(key, {"deltas": 0, "same_sign": 0, "within_3pp": 0})
                g["deltas"] += 1
                g["same_sign"] += bool(d["same_sign"])
                g["within_3pp"] += abs(d["difference_pp"]) <= 3.0
    return groups


def report_scoreboard(groups: dict, files: int) -> str:
    lines = [f"per-SM knob deltas over {files} files: right sign / within 3 pp"]
    for key in sorted(groups, key=lambda k: (k == "all", k)):
        g = groups[key]
        lines.append(f"  {key:12s} {g['same_sign']:3d} / {g['within_3pp']:3d} of {g['deltas']}")
    return "\n".join(lines)


def plot_knob_deltas(results: list[dict], path: str) -> str:
    """Measured vs predicted per-SM knob deltas (ctas_sm90.py files), the +-3 pp band around y = x."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 6))
    ds = [d for res in results for d in res["knob_deltas"]]
    lim = max([abs(100 * d[k]) for d in ds for k in ("measured_delta", "predicted_delta")] + [5.0]) * 1.1
    ax.fill_between([-lim, lim], [-lim - 3, lim - 3], [-lim + 3, lim + 3], color="0.9", label="within 3 pp")
    ax.plot([-lim, lim], [-lim, lim], "k--", linewidth=0.8, label="y = x")
    colors = {64: "#4C72B0", 128: "#55A868", 256: "#C44E52"}
    for hd in sorted({d["hdim"] for d in ds}):
        for causal, marker in ((False, "o"), (True, "^")):
            sel = [d for d in ds if d["hdim"] == hd and bool(d.get("causal")) == causal]
            if sel:
                ax.scatter([100 * d["measured_delta"] for d in sel], [100 * d["predicted_delta"] for d in sel],
                           color=colors.get(hd, "0.4"), marker=marker, alpha=0.8,
                           label=f"hd{hd}{', causal' if causal else ''}")
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    devices = sorted({str(res["summary"]["device"]) for res in results})
    g = knob_scoreboard(results).get("all", {"deltas": 0, "same_sign": 0, "within_3pp": 0})
    ax.set_title(f"per-SM knob deltas, one CTA ({', '.join(devices)})\n"
                 f"right sign {g['same_sign']} / {g['deltas']}, within 3 pp {g['within_3pp']} / {g['deltas']}",
                 fontsize=8)
    ax.set_xlabel("measured throughput change vs default (%)")
    ax.set_ylabel("predicted throughput change vs default (%)")
    return save(fig, ax, path)


def plot(result: dict, path: str) -> str:
    return plot_knob_deltas([result], path)
