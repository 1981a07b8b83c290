"""Write tests/data/prediction_grid.json: fa4sim's predictions on a fixed grid of problems.

tests/test_prediction_grid.py holds the simulator to these numbers (0.1 %), so a change of
structure cannot move a prediction unnoticed. Regenerate only when a prediction is meant to
move, and say which and why in the commit (`--refresh`: recompute the points already in the
file, keeping their corrected defaults, and print those that move). Each point: hw, schedule,
impl (None = the schedule's default implementation), problem, overrides (--set pairs) ->
TFLOP/s, cycles.

Profiles with a power model (h100, h200, b200) predict their clock from the load; their points
force the fixed clock they had before the power model (OLD_CLOCK, as a clock_ghz override), so
the grid pins the cycle model, not the power model (tests/test_sim_power.py tests that).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from fa4sim import Problem, simulate

# the knobs flash-attn-4's SM90 forward differs by from the fa3 defaults (how validate ran it)
# the fixed clock_ghz of the profiles that now have a power model, before they had one
OLD_CLOCK = {"h100": 1.789, "h200": 1.789, "b200": 1.86}

FA4_SM90 = {"persistent": False, "loop_overhead_fixed": 60.0, "loop_overhead_per_kstep": 2.5,
            "tile_order": "flash-attn-4"}


def points():
    for hd in (64, 96, 128):
        for causal in (False, True):
            for s in (1024, 8192):
                yield dict(hw="b200", schedule="fa4", problem=(2, 16, s, s, hd, causal), overrides={})
    yield dict(hw="b200", schedule="fa4", problem=(1, 16, 32768, 32768, 128, False), overrides={})
    for ov in ({"mufu_ex2_per_clk": 32, "exp_emulation": 0}, {"kv_stages": 4}, {"q_tiles": 1},
               {"two_cta": False}, {"rescale_threshold": None}, {"split_p": False}):
        yield dict(hw="b200", schedule="fa4", problem=(2, 16, 8192, 8192, 128, False), overrides=ov)
    for hw in ("h100", "h200", "h100-datasheet", "h200-datasheet"):
        for hd in (64, 96, 128, 256):
            for causal in (False, True):
                for s in ((1024, 16384) if hw.endswith("measured") else (4096,)):
                    yield dict(hw=hw, schedule="fa3", problem=(4, 16, s, s, hd, causal), overrides={})
    for hd in (64, 128, 256):
        yield dict(hw="h100", schedule="fa3", problem=(2, 16, 3000, 3000, hd, True), overrides={})
        yield dict(hw="h100", schedule="fa3", problem=(2, 16, 1000, 5000, hd, False), overrides={})
    for ov in ({"pingpong": False}, {"intra_wg_overlap": False}, {"p_in_registers": False}, {"kv_stages": 3},
               {"exp_emulation": 0.25}, {"rescale_threshold": 8.0}, {"persistent": False}, {"tile_n": 64},
               {"mufu_ex2_per_clk": 32}):
        for causal in (False, True):
            yield dict(hw="h100", schedule="fa3", problem=(4, 16, 8192, 8192, 128, causal), overrides=ov)
    for hw in ("h100", "h200"):
        for hd in (64, 128, 256):
            for causal in (False, True):
                for s in (1024, 8192):
                    yield dict(hw=hw, schedule="fa3", impl="flash-attn-4", problem=(4, 16, s, s, hd, causal),
                               overrides={}, old_overrides=FA4_SM90)


def main(path: str) -> None:
    out = []
    for pt in points():
        b, h, sq, sk, d, c = pt["problem"]
        if pt["hw"] in OLD_CLOCK:
            pt["overrides"] = {**pt["overrides"], "clock_ghz": OLD_CLOCK[pt["hw"]]}
        ov = {**pt.get("old_overrides", {}), **pt["overrides"]}
        r = simulate(pt["hw"], pt["schedule"], Problem(b, h, sq, sk, d, c), ov)
        out.append({"hw": pt["hw"], "schedule": pt["schedule"], "impl": pt.get("impl"),
                    "problem": dict(batch=b, heads=h, seqlen_q=sq, seqlen_k=sk, hdim=d, causal=c),
                    "overrides": pt["overrides"], "tflops": round(r.tflops, 4), "cycles": round(r.cycles, 2)})
    Path(path).write_text(json.dumps({"points": out}, indent=1) + "\n")
    print(f"wrote {len(out)} points to {path}")


def refresh(path: str) -> None:
    """Recompute the numbers of the points already in `path`, keeping each point's `corrected`
    entry (old defaults and why), and print every point that moves by more than 0.1 %."""
    doc = json.loads(Path(path).read_text())
    for pt in doc["points"]:
        problem = Problem(**pt["problem"])
        fixed = pt.get("corrected")
        targets = [(pt, {**pt["overrides"], **(fixed or {}).get("old_defaults", {})})]
        if fixed:
            targets.append((fixed, pt["overrides"]))
        for where, ov in targets:
            r = simulate(pt["hw"], pt["schedule"], problem, ov, impl=pt.get("impl"))
            if abs(r.tflops / where["tflops"] - 1) > 1e-3:
                print(f"{pt['hw']} {pt.get('impl') or pt['schedule']} {pt['problem']} {ov}: "
                      f"{where['tflops']:.1f} -> {r.tflops:.1f} TFLOP/s ({100 * (r.tflops / where['tflops'] - 1):+.1f} %)")
            where["tflops"], where["cycles"] = round(r.tflops, 4), round(r.cycles, 2)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="make_prediction_grid", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=str(Path(__file__).with_name("prediction_grid.json")),
                    help="the grid file to write (default: tests/data/prediction_grid.json)")
    ap.add_argument("--refresh", action="store_true", help="recompute the points already in the file, keeping "
                    "their corrected defaults, and print those that move")
    a = ap.parse_args()
    if a.refresh:
        refresh(a.out)
    else:
        main(a.out)
