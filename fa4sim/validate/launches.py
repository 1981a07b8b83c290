"""Launches (lab/tools/cta_log_sm90.py, kind 'cta_log'): a whole launch, CTA by CTA, against
fa4kernel's CTA log: does the
kernel model's picture of a launch hold, and what does tile jitter cost a table fixed on the host?

Every tile gets the mean cycles of its kind (KV blocks, rows) taken from the log itself, and the
launch is replayed as the kernel ran it:
  one CTA per tile   the hardware hands each CTA, in launch order, to the SM that frees up first
                     (kernel_model.assign) after the log's own first-wave extra and CTA turnover;
  persistent         the host's table as recorded; a CTA's first and last tiles get the means
                     of first and last tiles (the cold start; no next tile to overlap).
That is when each CTA would end if no tile of a kind varied. The measured end against it is what
the tiles' jitter cost the launch; for persistent launches fa4sim predicts it
(KernelTime.jitter_cycles: E[max] over CTAs, the profile's tile_jitter_q_loads). All in cycles:
no clock is involved.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

from .. import hardware
from ..kernel_model import assign, work_units
from ..model import simulate
from ..params import Problem
from .common import model_knobs, profile_for, progress, recorded_tau


def tile_kinds(p: dict) -> list[tuple[int, int]]:
    """(KV blocks, rows) of each Q tile of one head, as the kernel cuts them."""
    prob = Problem(1, 1, int(p["seqlen"]), int(p["seqlen"]), int(p["head_dim"]), bool(p["causal"]))
    return [(u.n_kv, u.rows) for u in work_units(prob, int(p["tile_m"]), int(p["tile_n"]))]


def replay_one_cta_per_tile(p: dict) -> tuple[float, float]:
    """(replayed end, measured end) of a launch of one CTA per tile, in cycles."""
    kinds = tile_kinds(p)
    ghz = float(p["clock_ghz_in_kernel"])
    rows = p["ctas"]  # [cta, sm, start_ns, end_ns, cycles, m_block, n_kv, tiles_in_cta]
    first_on_sm = {}
    for r in sorted(rows, key=lambda r: r[2]):
        first_on_sm.setdefault(r[1], r[0])
    later = defaultdict(list)
    for r in rows:
        if first_on_sm[r[1]] != r[0]:
            later[kinds[r[5]]].append(r[4])
    mean = {k: statistics.fmean(v) for k, v in later.items()}
    cold = statistics.fmean(r[4] - mean[kinds[r[5]]] for r in rows
                             if first_on_sm[r[1]] == r[0] and kinds[r[5]] in mean)
    turnover = float(p["gap_ns_median"] or 0.0) * ghz
    order = sorted(rows, key=lambda r: r[0])  # launch order: blockIdx.x
    end, _ = assign([(mean[kinds[r[5]]], 0.0) for r in order], len(first_on_sm), False, turnover, cold)
    return end, max(r[3] for r in rows) * ghz


def replay_persistent(p: dict) -> tuple[float, float]:
    """(slowest replayed load, measured slowest CTA averaged over the launches) of a persistent
    launch, in cycles, from its tile log (each tile from its start stamp to the next one's)."""
    kinds = tile_kinds(p)
    num_m = int(p["num_m"])
    last = {c: len(row) - 1 for c, row in enumerate(p["table"])}

    def where(cta, k):
        return "first" if k == 0 else "last" if k == last[cta] else "middle"

    cycles = defaultdict(lambda: defaultdict(list))
    for launch in p["tile_logs"]:
        for cta, tile, k, c in launch:
            cycles[where(cta, k)][kinds[tile % num_m]].append(c)
    mean = {pos: {kind: statistics.fmean(v) for kind, v in d.items()} for pos, d in cycles.items()}

    def cost(cta, k, tile):
        kind = kinds[tile % num_m]
        return mean.get(where(cta, k), {}).get(kind, mean["middle"].get(kind, 0.0))

    loads = [sum(cost(c, k, t) for k, t in enumerate(row)) for c, row in enumerate(p["table"])]
    ends = []
    for launch in p["tile_logs"]:
        per_cta = defaultdict(int)
        for cta, _, _, c in launch:
            per_cta[cta] += c
        ends.append(max(per_cta.values()))
    return max(loads), statistics.mean(ends)


def compare(doc: dict, hw: str | None = None) -> dict:
    """Each launch's measured end against its replay (in cycles), and for persistent launches the
    model's tile-jitter term beside the measured excess."""
    hw = hw or profile_for(doc["meta"].get("device", ""))
    profile = hardware.load(hw)
    rows = []
    for i, p in enumerate(doc["points"], 1):
        progress(i, len(doc["points"]), "launch")
        base = {"hdim": p["head_dim"], "seqlen": p["seqlen"], "causal": p["causal"], "ctas": p["grid"],
                "tiles": p["tiles"]}
        if "tile_logs" in p:
            load, end = replay_persistent(p)
            prob = Problem(int(p["batch"]), int(p["heads"]), int(p["seqlen"]), int(p["seqlen"]),
                           int(p["head_dim"]), bool(p["causal"]))
            # the kernel that logs tiles idles warpgroups without rows and takes the host's table
            knobs = model_knobs("fa4kernel", {"tile_m": p["tile_m"], "tile_n": p["tile_n"], "persistent": True,
                                              "skip_idle_wgs": True, **recorded_tau(p)})
            k = simulate(profile, "fa3", prob, knobs).kernel
            rows.append({**base, "launch": "persistent", "replayed": load, "measured": end,
                         "measured_later": end / load - 1,
                         "predicted_later": k.jitter_cycles / (k.cycles - k.jitter_cycles)})
        elif not p.get("persistent") and p.get("gap_ns_median") is not None:
            replayed, end = replay_one_cta_per_tile(p)
            rows.append({**base, "launch": "one CTA per tile", "replayed": replayed, "measured": end,
                         "measured_later": end / replayed - 1, "predicted_later": 0.0})
    return {"kind": "cta_log",
            "summary": {"hw_profile": hw, "device": doc["meta"].get("device"), "date": doc["meta"].get("date"),
                        "tile_jitter_q_loads": profile.tile_jitter_q_loads}, "launches": rows}


def report(result: dict) -> str:
    s = result["summary"]
    lines = [f"device {s['device']} ({s['date']}), profile {s['hw_profile']} (tile_jitter_q_loads "
             f"{s['tile_jitter_q_loads']:g}): whole launches from the CTA log, in cycles",
             "measured end vs a replay with every tile at its kind's mean (what tile jitter cost), "
             "and the model's tile-jitter term",
             f"{'launch':17s} {'hd':>4s} {'seqlen':>6s} {'causal':>6s} {'CTAs':>5s} {'replayed':>9s} "
             f"{'measured':>9s} {'later':>7s} {'predicted':>9s}"]
    for r in result["launches"]:
        lines.append(f"{r['launch']:17s} {r['hdim']:4d} {r['seqlen']:6d} {str(r['causal']):>6s} {r['ctas']:5d} "
                     f"{r['replayed']:9.0f} {r['measured']:9.0f} {r['measured_later']:+7.1%} "
                     f"{r['predicted_later']:+9.1%}")
    if any(r["launch"] == "persistent" for r in result["launches"]):
        lines.append("(one CTA per tile: the hardware balances, the model adds no jitter; persistent: "
                     "the host fixed each CTA's tiles, E[max] over CTAs)")
    return "\n".join(lines)
