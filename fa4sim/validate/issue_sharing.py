"""Warps sharing a scheduler (lab/tools/calibrate/bench_bursts.py, kind 'bursts'): a unit
benchmark, not a kernel. One to three warps per scheduler run bursts of one code alone (no
wgmma); each warp's rate inside its bursts against the engine's rule for issuers that share the
SM's issue slots (engine.shared_rate, a softmax op's `concurrency`): k warps, each ready to issue
with the probability of its rate alone p, fill 1 - (1 - p)^k of the slots, within what the
code's pipes allow. Beside it the rule the engine had before: k warps add their rates, up to
every slot (min(k p, 1)).

A warp's bursts overlap the others' only part of the time (their measured burst duty d), so a
warp in a burst shares the scheduler with j of the k - 1 others with binomial probability; its
rate is the mean of shared / (j + 1) over j. The pipes: per warp-instruction, 8 scheduler cycles
of MUFU over the profile's mix_mufu_utilization, 4 per clock over alu_lanes_per_clk of ALU
(FMNMX, F2FP, LEA, the integer chain) and over fma_lanes_per_clk of FMA (FFMA, FADD, FMUL), as
each code compiles (bench_bursts' docstring and --check-sass)."""
from __future__ import annotations

from math import comb

from .. import hardware
from ..engine import shared_rate
from .common import error_stats, profile_for

# warp instructions per block of each code by pipe (bench_bursts: 128-instruction blocks; the mix
# is bench_contention's, 180 per block; an emulated exp2 is 8 instructions in place of a MUFU.EX2:
# 1 FMNMX, 3 FADD, 3 FFMA, 1 LEA)
MIX = {"alu": 35 + 16, "fma": 32 + 32 + 33, "mufu": 32}
CODES = {"fmul": {"fma": 128}, "ffma": {"fma": 128}, "fmnmx": {"alu": 128}, "f2fp": {"alu": 128},
         "int": {"alu": 129}, "mix": MIX}
for _name, _n in (("mix_emu25", 8), ("mix_emu12", 4)):
    CODES[_name] = {"alu": MIX["alu"] + 2 * _n, "fma": MIX["fma"] + 6 * _n, "mufu": MIX["mufu"] - _n}


def pipe_cap(hw, code: str) -> float:
    """The most warp-instructions per clock one scheduler can issue of `code` by its pipes."""
    plan = CODES[code]
    per_lane = {"alu": 4 * 32 / hw.alu_lanes_per_clk, "fma": 4 * 32 / hw.fma_lanes_per_clk,
                "mufu": 4 * 32 / hw.mufu_ex2_per_clk / hw.mix_mufu_utilization}
    return sum(plan.values()) / max(n * per_lane[pipe] for pipe, n in plan.items())


def warp_rate(p: float, k: int, duty: float, cap: float, rule) -> float:
    """A warp's rate in its bursts with k - 1 other warps on its scheduler, each in a burst a
    share `duty` of the time; rule(p, n): n warps' share of the slots."""
    return sum(comb(k - 1, j) * duty ** j * (1 - duty) ** (k - 1 - j) * min(rule(p, j + 1), cap) / (j + 1)
               for j in range(k))


def additive(p: float, k: int) -> float:
    return min(k * p, 1.0)


def _alone_runs(bench: dict):
    """{(code, warps): run} of the warps-alone runs, wherever the file keeps them."""
    out = {}
    for section in [bench] + [v for k, v in bench.items() if k == "duty"]:
        for run in section.values():
            if isinstance(run, dict) and not run.get("do_mma", 1) and run.get("op") in CODES \
                    and "in_burst_rate_per_warp" in run:
                out[(run["op"], int(run["nsf"]))] = run
    return out


def compare(doc: dict, hw: str | None = None) -> dict:
    hw_name = hw or profile_for(doc["meta"].get("device", ""))
    prof = hardware.load(hw_name)
    bench = doc["benchmarks"].get("bursts", {})  # an --inline run keeps "inline": no alone runs
    alone = _alone_runs(bench)
    rows = []
    for (code, k), run in sorted(alone.items()):
        one = alone.get((code, 1))
        if k < 2 or one is None:
            continue
        p, duty, cap = float(one["in_burst_rate_per_warp"]), float(run["burst_duty"]), pipe_cap(prof, code)
        meas = float(run["in_burst_rate_per_warp"])
        shared, added = warp_rate(p, k, duty, cap, shared_rate), warp_rate(p, k, duty, cap, additive)
        rows.append({"code": code, "warps": k, "alone_rate": p, "duty": duty, "pipe_cap": cap, "measured": meas,
                     "shared": shared, "shared_error": shared / meas - 1.0,
                     "additive": added, "additive_error": added / meas - 1.0})

    return {"kind": "bursts",
            "summary": {"hw_profile": hw_name, "device": doc["meta"].get("device"),
                        "date": doc["meta"].get("date_utc") or doc["meta"].get("date"),
                        "threads": bench.get("constants", {}).get("threads"),
                        "shared": error_stats([r["shared_error"] for r in rows]),
                        "additive": error_stats([r["additive_error"] for r in rows])},
            "cases": rows}


def report(result: dict) -> str:
    s = result["summary"]
    if not result["cases"]:
        return (f"device {s['device']} ({s['date']}): no code here ran alone in one warp and in more per scheduler; "
                "nothing to compare (bench_bursts' alone runs: --stream-warps 1,2[,3])")
    lines = [f"device {s['device']} ({s['date']}), profile {s['hw_profile']}, a {s['threads']}-thread build: warps "
             "sharing a scheduler, alone; each warp's rate in its bursts (warp-instructions per clock)",
             f"{'code':>10s} {'warps':>5s} {'alone':>6s} {'duty':>5s} {'pipes':>6s} {'measured':>9s} "
             f"{'shared':>7s} {'error':>7s} {'added':>7s} {'error':>7s}"]
    for r in result["cases"]:
        lines.append(f"{r['code']:>10s} {r['warps']:5d} {r['alone_rate']:6.3f} {r['duty']:5.2f} {r['pipe_cap']:6.3f} "
                     f"{r['measured']:9.3f} {r['shared']:7.3f} {100 * r['shared_error']:+6.1f}% "
                     f"{r['additive']:7.3f} {100 * r['additive_error']:+6.1f}%")
    for key, what in (("shared", "1 - (1 - p)^k, the engine's rule"), ("additive", "min(k p, 1), added rates")):
        g = s[key]
        lines.append(f"{what}: median |error| {100 * g['median_abs_error']:.1f}%, "
                     f"max {100 * g['max_abs_error']:.1f}% over {g['count']} cases")
    return "\n".join(lines)
