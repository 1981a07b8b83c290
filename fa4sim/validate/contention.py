"""The softmax beside its own wgmma (lab/tools/calibrate/bench_contention.py, kind 'contention'):
the unit benchmark's "intra" kernel replayed through the engine with the profile's rules.

In that kernel each of 1, 2 or 3 warpgroups loops: issue 8 wgmma m64n128k16 (512 tensor cycles),
run `nb` blocks of the softmax-like mix (32 elements, 180 instructions per warp each), wait for
its wgmma. Nothing in it is attention, and it is the shape of FA3's intra-warpgroup overlap: the
warps that issue a GEMM run a softmax beside it. The replay gives each op the units the fa3
schedule would (MUFU, FMA, ALU lane-ops, SM and per-warpgroup issue slots) and the same
interference rules (softmax.beside_gemm) and mix limits (softmax.mix_limits), so it checks those
rules on the benchmark family they come from, at softmax loads the kernels reach (hd64's loop
issues about 2.3 mix blocks of instructions per warp beside 512 tensor cycles per warpgroup).
"""
from __future__ import annotations

import statistics

from .. import hardware
from ..engine import Edge, Op, Schedule, simulate
from ..softmax import beside_gemm, mix_limits
from .common import profile_for

MIX_PIPES = {"FMNMX": "alu", "F2FP": "alu", "FFMA": "fma", "FADD": "fma", "FMUL": "fma", "MUFU.EX2": "mufu"}
COUNT = {1: "one", 2: "two", 3: "three"}  # the warpgroup counts the kernel runs
TRIPS, WARMUP = 48, 16  # simulated trips, and those left out of the steady-state mean
# the mix is served in pieces of about 3 instructions per warp, where the replay converges (a
# piece runs slowed when it starts while the tensor core is busy: in 8 pieces per trip the mix
# runs at full rate through most of the GEMMs, their cost 40-70 % low at 3-4 blocks; 16 per block
# gives three warpgroups' GEMMs 695-764 cycles, 64 and 128 per block 784-793)
PIECES_PER_BLOCK = 64


def schedule(hw, warpgroups: int, blocks: int, with_mma: bool, per_trip: dict, wgmma_per_trip: int,
             wgmma_cycles: float, rs: bool, pingpong: bool = False) -> Schedule:
    """One CTA of the intra kernel: each warpgroup's trip is [wgmma x wgmma_per_trip], the mix x
    `blocks`, [wait]. per_trip: SASS instructions of one mix block per thread (one warp).
    pingpong: warpgroup w issues its wgmmas after w - 1 has issued its own (a named barrier's
    hand-off, as the fa3 schedule's PP ops)."""
    pp = pingpong and with_mma and warpgroups > 1
    lanes = {"alu": hw.alu_lanes_per_clk, "fma": hw.fma_lanes_per_clk, "mufu": hw.mufu_ex2_per_clk}
    instr = sum(per_trip.values())
    ops, edges = [], []
    for w in range(warpgroups):
        role = f"wg{w}"
        uses: dict[str, float] = {}
        for name, count in per_trip.items():
            pipe = MIX_PIPES[name]
            uses[pipe] = uses.get(pipe, 0.0) + count * 128 * blocks / lanes[pipe]  # 128 threads
        uses["issue"] = 4 * instr * blocks / hw.issue_per_clk  # 4 warps' instructions on 4 schedulers
        if with_mma:
            ops.append(Op(f"MMA{w}", role, (("tensor", wgmma_per_trip * wgmma_cycles),),
                          hw.mma_latency_rs if rs else hw.mma_latency_ss, "mma", asynchronous=True,
                          issue_cycles=wgmma_per_trip * hw.mma_issue_cycles, chunks=wgmma_per_trip))
            if pp:
                ops.append(Op(f"PP{w}", role, (), hw.named_barrier_latency, "sync"))
                edges.append(Edge(f"PP{(w - 1) % warpgroups}", f"MMA{w}", distance=0 if w else 1,
                                  lag=hw.named_barrier_latency))
        ops.append(mix_limits(hw, Op(f"MIX{w}", role, tuple(uses.items()), hw.mufu_latency, "softmax",
                                     chunks=max(1, PIECES_PER_BLOCK * blocks))))
        if with_mma:
            ops.append(Op(f"WAIT{w}", role, (), 0.0, "sync"))
            edges.append(Edge(f"MMA{w}", f"WAIT{w}"))
    roles = [f"wg{w}" for w in range(warpgroups)]
    units = {"tensor": 1, "mufu": 1, "fma": 1, "alu": 1, "issue": 1, **{f"issue:{r}": 1 for r in roles}}
    return Schedule("intra", units, roles, ops, edges, marker=ops[0].name,
                    issue_depth={"tensor": int(hw.mma_queue_depth)},
                    interference=beside_gemm(hw, roles))


_REPLAYED: dict = {}  # (repr of the schedule, TRIPS, WARMUP) -> cycles per trip


def cycles_per_trip(s: Schedule) -> float:
    """Steady-state cycles per trip: the mean spacing of the marker's starts after the warm-up.
    Each distinct schedule is replayed once per process (the recorded files repeat the same
    cases: their mix and wgmma constants are the benchmark's), keyed by its whole value (repr:
    every op, edge, unit and rule)."""
    key = (repr(s), TRIPS, WARMUP)
    if key not in _REPLAYED:
        starts = simulate(s, [TRIPS]).starts(s.marker)
        if len(_REPLAYED) >= 4096:
            _REPLAYED.clear()
        _REPLAYED[key] = (starts[-1] - starts[WARMUP]) / (len(starts) - 1 - WARMUP)
    return _REPLAYED[key]


def compare(doc: dict, hw: str | None = None) -> dict:
    hw_name = hw or profile_for(doc["meta"].get("device", ""))
    prof = hardware.load(hw_name)
    bench = doc["benchmarks"]["contention"]
    const = bench["constants"]
    mix = const["per_trip"]["mix"]
    pingpong = bool(const.get("pingpong", False))
    rows = []
    for mode in ("intra_ss", "intra_rs"):
        for wg_key, runs in sorted((bench.get(mode) or {}).items()):
            wgs = int(wg_key.removeprefix("WG"))
            for key, run in sorted(runs.items()):
                if "cycles_per_trip" not in run:
                    continue
                with_mma, blocks = key.removeprefix("mma").split("_nb")
                with_mma, blocks = with_mma == "1", int(blocks)
                if blocks == 0 and not with_mma:
                    continue
                s = schedule(prof, wgs, blocks, with_mma, mix if blocks else {},
                             int(const["wgmma_per_trip"]), float(const["ideal_wgmma_cycles"]), mode.endswith("rs"),
                             pingpong)
                pred = cycles_per_trip(s)
                meas = float(run["cycles_per_trip"])
                rows.append({"operand_a": "registers" if mode.endswith("rs") else "smem", "warpgroups": wgs,
                             "blocks": blocks, "with_mma": with_mma, "measured": meas, "predicted": pred,
                             "error": pred / meas - 1.0,
                             # stamped builds: a warp's mean cycles per trip up to the mix's end, then
                             # in the wgmma wait
                             "measured_mix": run.get("mix_cycles_per_trip"),
                             "measured_wait": run.get("wait_cycles_per_trip")})

    # what the GEMMs add to a trip: the trip with them less the same mix without (the benchmark's
    # own per-trip cost, its stamps and loop, cancels), its error as a share of the measured trip
    alone = {(r["operand_a"], r["warpgroups"], r["blocks"]): r for r in rows if not r["with_mma"]}
    for r in rows:
        a = alone.get((r["operand_a"], r["warpgroups"], r["blocks"])) if r["with_mma"] else None
        if a is not None:
            r["gemm_cost_measured"] = r["measured"] - a["measured"]
            r["gemm_cost_predicted"] = r["predicted"] - a["predicted"]
            r["gemm_cost_error"] = (r["gemm_cost_predicted"] - r["gemm_cost_measured"]) / r["measured"]

    def group(pred, key="error"):
        errs = [abs(r[key]) for r in rows if pred(r) and key in r]
        return {"median_abs_error": statistics.median(errs), "max_abs_error": max(errs), "n": len(errs)} if errs else None

    # bench_contention --only mix3: the mix in two and three warpgroups beside one wgmma warpgroup,
    # the SM's issue rate there against the profile's issue_under_mma (measured with two)
    mix3 = {}
    for mode in ("ss", "rs"):
        for nsf in (2, 3):
            run = (bench.get(f"mix3_{mode}") or {}).get(f"F{nsf}_beside_wgmma")
            if run:
                share = float(run["sf_warp_instr_per_clk"]) / prof.issue_per_clk
                mix3[f"{mode}_F{nsf}"] = {"operand_a": "registers" if mode == "rs" else "smem", "warpgroups": nsf,
                                          "issue_share_beside_wgmma": share,
                                          "vs_profile": share / prof.issue_under_mma - 1.0,
                                          "wgmma_slowdown": run.get("wgmma_slowdown")}
    return {"kind": "contention",
            "summary": {"hw_profile": hw_name, "device": doc["meta"].get("device"), "pingpong": pingpong,
                        "date": doc["meta"].get("date_utc") or doc["meta"].get("date"),
                        "alone": group(lambda r: not r["with_mma"]),
                        **{f"{COUNT[n]}_warpgroup{'s' if n > 1 else ''}_with_mma":
                           group(lambda r, n=n: r["with_mma"] and r["warpgroups"] == n) for n in COUNT},
                        **{f"{COUNT[n]}_warpgroup{'s' if n > 1 else ''}_gemm_cost":
                           group(lambda r, n=n: r["warpgroups"] == n, "gemm_cost_error") for n in COUNT}},
            "cases": rows, "mix3": mix3}


def report(result: dict) -> str:
    s = result["summary"]
    if not result["cases"] and result.get("mix3"):
        lines = [f"device {s['device']} ({s['date']}), profile {s['hw_profile']}: the mix in 2 and 3 warpgroups "
                 f"beside one warpgroup of back-to-back wgmma (bench_contention --only mix3)",
                 f"{'A from':>9s} {'mix WGs':>8s} {'issue share beside wgmma':>25s} {'vs issue_under_mma':>19s} "
                 f"{'wgmma slowed':>13s}"]
        for r in result["mix3"].values():
            lines.append(f"{r['operand_a']:>9s} {r['warpgroups']:8d} {r['issue_share_beside_wgmma']:25.3f} "
                         f"{100 * r['vs_profile']:+18.1f}% {r['wgmma_slowdown']:12.3f}x")
        return "\n".join(lines)
    lines = [f"device {s['device']} ({s['date']}), profile {s['hw_profile']}: bench_contention's intra kernel "
             "(each warpgroup: " + ("its turn (ping-pong), " if s.get("pingpong") else "")
             + "8 wgmma m64n128k16, nb mix blocks, wait), cycles per trip",
             f"{'A from':>9s} {'WGs':>4s} {'nb':>3s} {'wgmma':>6s} {'measured':>9s} {'predicted':>9s} {'error':>7s}"
             "   GEMMs' cost: measured / predicted   measured per warp: to the mix's end + in the wait"]
    for r in result["cases"]:
        cost = (f"   {r['gemm_cost_measured']:6.0f} / {r['gemm_cost_predicted']:6.0f} ({100 * r['gemm_cost_error']:+5.1f}%)"
                if "gemm_cost_error" in r else " " * 29)
        phases = (f"   {r['measured_mix']:6.0f} + {r['measured_wait']:4.0f}" if r.get("measured_mix") is not None
                  else "")
        lines.append(f"{r['operand_a']:>9s} {r['warpgroups']:4d} {r['blocks']:3d} {'yes' if r['with_mma'] else 'no':>6s} "
                     f"{r['measured']:9.0f} {r['predicted']:9.0f} {100 * r['error']:+6.1f}%{cost}{phases}")
    for key, what in (("alone", "the mix alone"), ("one_warpgroup_with_mma", "one warpgroup beside its wgmma"),
                      ("two_warpgroups_with_mma", "two warpgroups beside their wgmmas"),
                      ("three_warpgroups_with_mma", "three warpgroups beside their wgmmas")):
        g = s.get(key)
        if g:
            lines.append(f"{what}: median |error| {100 * g['median_abs_error']:.1f}%, "
                         f"max {100 * g['max_abs_error']:.1f}% over {g['n']} cases")
    for n in COUNT:
        g = s.get(f"{COUNT[n]}_warpgroup{'s' if n > 1 else ''}_gemm_cost")
        if g:
            lines.append(f"the GEMMs' cost (a trip with them less the same mix without), {COUNT[n]} warpgroup"
                         f"{'s' if n > 1 else ''}: median |error| {100 * g['median_abs_error']:.1f}% of the trip, "
                         f"max {100 * g['max_abs_error']:.1f}% over {g['n']} cases")
    return "\n".join(lines)
