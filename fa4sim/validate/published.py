"""Published figures (kind 'published'): TFLOP/s that papers, pull requests and issues print for a
GPU we do not have (lab/campaigns/published-b200/published_b200.json), each predicted as a user types it.

A point holds its source, its problem (batch, heads, seqlen, seqlen_k, hdim, hdim_v, causal), the
pass (fwd or bwd, deterministic or not), any choice the source names (`knobs`: a CTA pair or not)
and the printed TFLOP/s. Sources count 2 b h s s_k (d + d_v) FLOPs, half of it for causal, and a
backward as 2.5 forwards; the printed TFLOP/s becomes a time with that count, and the model's
prediction of that time is compared (its own TFLOP/s count the visible pairs exactly, which at 1k
tokens causal is 0.1 % more). A point with predict false is context (another kernel, FP8, a
variant that does not ship) and says why.

Every prediction runs on the profile's own clock (the power model's, under the cap): the sources
time bursts of a few runs or sustained loops, and none records its clock. No parameter of the
model is taken from these figures. With `uncertainty`, each point also gets its band
(fa4sim/uncertainty.py) and whether the published figure falls inside it.
"""
from __future__ import annotations

import statistics

from ..errors import InputError
from ..params import Problem
from .common import predict, profile_for, progress

PASSES = ("fwd", "bwd")
FLOOR_SHOWN = 0.025  # the report lists launches whose figures lie 5 % or more apart


def problem_of(p: dict) -> Problem:
    return Problem(int(p["batch"]), int(p["heads"]), int(p["seqlen"]), int(p.get("seqlen_k") or p["seqlen"]),
                   int(p["hdim"]), bool(p["causal"]), int(p.get("hdim_v") or p["hdim"]))


def source_flops(p: dict) -> float:
    """The FLOPs the source counts for one call: 2 b h s s_k (d + d_v), causal halved, backward x 2.5."""
    f = 2.0 * p["batch"] * p["heads"] * p["seqlen"] * (p.get("seqlen_k") or p["seqlen"]) \
        * (p["hdim"] + (p.get("hdim_v") or p["hdim"]))
    return f * (0.5 if p["causal"] else 1.0) * (2.5 if p["pass"] == "bwd" else 1.0)


def check_point(p: dict, i: int) -> None:
    """A point the model can take: its fields present and of the right kind (one line otherwise)."""
    need = ("id", "source", "pass", "batch", "heads", "seqlen", "hdim", "causal", "tflops")
    missing = [k for k in need if k not in p]
    if missing:
        raise InputError("results", f"point {i} of a published file lacks {', '.join(missing)}")
    if p["pass"] not in PASSES:
        raise InputError("results", f"point {p['id']}: pass must be fwd or bwd, got {p['pass']!r}")
    if not isinstance(p["tflops"], (int, float)) or isinstance(p["tflops"], bool) or not p["tflops"] > 0:
        raise InputError("results", f"point {p['id']}: tflops must be a number > 0, got {p['tflops']!r}")


def compare(doc: dict, hw: str | None = None, uncertainty: bool = False, jobs: int | None = None) -> dict:
    hw = hw or profile_for(doc["meta"].get("device", ""))
    rows, context = [], []
    todo = [p for p in doc["points"] if p.get("predict", True)]
    for i, p in enumerate(doc["points"]):
        check_point(p, i)
    for i, p in enumerate(todo, 1):
        progress(i, len(todo))
        problem = problem_of(p)
        knobs = dict(p.get("knobs") or {})
        seconds = source_flops(p) / (p["tflops"] * 1e12)
        row = {k: p.get(k) for k in ("id", "source", "pass", "batch", "heads", "seqlen", "hdim", "hdim_v", "causal",
                                     "quality", "tflops")}
        row["knobs"] = knobs
        try:
            r = predict(hw, None, problem, knobs, None, p["pass"])
        except InputError as e:
            rows.append({**row, "predicted_tflops": None, "error": None, "why": str(e)})
            continue
        measured = r.tflops * r.time_us * 1e-6 / seconds  # the published time, in the model's FLOP count
        row.update(measured_tflops=measured, predicted_tflops=r.tflops, error=r.tflops / measured - 1,
                   clock_ghz=r.clock_ghz, bottleneck=r.bottleneck)
        if uncertainty:
            from ..uncertainty import band
            b = band(hw, None, problem, knobs, None, p["pass"], jobs=jobs, nominal=r)
            row.update(tflops_low=b.tflops_low, tflops_high=b.tflops_high,
                       covered=b.tflops_low <= measured <= b.tflops_high,
                       dominant_params=[n for n, _ in b.dominant[:3]])
        rows.append(row)
        row["_same"] = (p["pass"], problem, tuple(sorted(r.knobs.items())))
    for p in doc["points"]:
        if not p.get("predict", True):
            context.append({k: p.get(k) for k in ("id", "source", "kernel", "pass", "tflops", "not_predicted")})
    conflicts = disagreements(rows)
    for r in rows:
        r.pop("_same", None)
    summary = summarize(rows, hw, doc)
    summary["floor_max_abs_error"] = max((c["floor"] for c in conflicts), default=0.0)
    return {"kind": "published", "summary": summary, "points": rows, "disagreements": conflicts,
            "context": context, "sources": doc["meta"].get("sources", {})}


def disagreements(rows: list[dict]) -> list[dict]:
    """Figures of one launch (the same pass, problem and resolved knobs) from more than one source.

    `floor` is the least max |error| any single prediction can have against all of them: with the
    error predicted / published - 1, the best prediction is the harmonic mean of the lowest and
    highest figure, and its error against each is (high - low) / (high + low)."""
    groups: dict = {}
    for r in rows:
        if r.get("error") is not None:
            groups.setdefault(r["_same"], []).append(r)
    out = []
    for same in groups.values():
        if len({r["source"] for r in same}) < 2:
            continue
        t = [r["measured_tflops"] for r in same]
        lo, hi = min(t), max(t)
        out.append({"ids": [r["id"] for r in same], "sources": [r["source"] for r in same],
                    "tflops": [r["tflops"] for r in same], "floor": (hi - lo) / (hi + lo)})
    return sorted(out, key=lambda c: -c["floor"])


def _stats(rows: list[dict]) -> dict | None:
    e = [abs(r["error"]) for r in rows if r.get("error") is not None]
    if not e:
        return None
    out = {"points": len(e), "median_abs_error": statistics.median(e), "max_abs_error": max(e),
           "mean_error": statistics.fmean(r["error"] for r in rows if r.get("error") is not None)}
    banded = [r for r in rows if "covered" in r]
    if banded:
        out["covered"] = sum(r["covered"] for r in banded)
        out["banded"] = len(banded)
    return out


def summarize(rows: list[dict], hw: str, doc: dict) -> dict:
    s = {"hw_profile": hw, "device": doc["meta"].get("device"), "clock": "the profile's own (power model)",
         "all": _stats(rows)}
    for key, pick in (("fwd", lambda r: r["pass"] == "fwd"), ("bwd", lambda r: r["pass"] == "bwd"),
                      ("causal", lambda r: r["causal"]), ("non_causal", lambda r: not r["causal"])):
        s[key] = _stats([r for r in rows if pick(r)])
    s["by_source"] = {src: _stats([r for r in rows if r["source"] == src]) for src in dict.fromkeys(r["source"] for r in rows)}
    return s


def report(res: dict) -> str:
    s = res["summary"]
    lines = [f"published figures on {s['device']}, predicted on profile {s['hw_profile']} at its own clock "
             f"(no parameter taken from them); {len(res['context'])} further figures kept as context"]
    band = any("covered" in r for r in res["points"])
    head = f"{'point':44s} {'published':>9s} {'predicted':>9s} {'error':>7s}" + ("  band           in" if band else "")
    lines.append(head)
    for r in res["points"]:
        if r.get("error") is None:
            lines.append(f"{r['id']:44s} {r['tflops']:9.0f}  not simulated: {r.get('why')}")
            continue
        line = f"{r['id']:44s} {r['measured_tflops']:9.0f} {r['predicted_tflops']:9.0f} {r['error']:+7.1%}"
        if "covered" in r:
            line += f"  {r['tflops_low']:5.0f}..{r['tflops_high']:<5.0f}  {'yes' if r['covered'] else 'NO'}"
        lines.append(line)
    conflicts = [c for c in res.get("disagreements", []) if c["floor"] >= FLOOR_SHOWN]
    if conflicts:
        lines.append(f"sources that disagree on one launch by {2 * FLOOR_SHOWN:.0%} or more (floor: the least max "
                     f"|error| one prediction can have against all of its figures):")
        for c in conflicts:
            figs = ", ".join(f"{i} {t:.0f}" for i, t in zip(c["ids"], c["tflops"]))
            lines.append(f"  floor {c['floor']:5.1%}: {figs}")
    for key in ("all", "fwd", "bwd", "causal", "non_causal"):
        st = s.get(key)
        if st:
            cov = f", {st['covered']} of {st['banded']} inside their bands" if "covered" in st else ""
            lines.append(f"{key:10s} {st['points']:3d} points: median |error| {st['median_abs_error']:.1%}, max "
                         f"{st['max_abs_error']:.1%}, mean {st['mean_error']:+.1%}{cov}")
    if s.get("floor_max_abs_error"):
        lines.append(f"no single model can have a max |error| below {s['floor_max_abs_error']:.1%} on this file: "
                     f"its sources disagree that much on one launch")
    return "\n".join(lines)
