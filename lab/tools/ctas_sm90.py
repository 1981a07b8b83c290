"""Where do the missing cycles of the SM90 forward live: inside one SM, or on the chip?
(diagnosis; device script)

    python3 lab/tools/ctas_sm90.py --out $OUT/ctas.json [--quick]

Runs fa4kernel's forward with N = 1, 8, 33, 66, 132 CTAs, one Q tile each, on an otherwise idle
GPU, in its clock-probe build (the normal kernel plus clock64 / globaltimer at CTA 0's start and
end: cycles exactly, whatever the power cap does to the clock). "shared": all CTAs read the same
K/V (one head, like the CTAs of one head in a real run: L2 hits); "own": every CTA its own head
(its own K/V stream from HBM). Steady-state cycles per KV block come from two lengths,
(cycles(sk2) - cycles(sk1)) / (blocks2 - blocks1), so prologue and epilogue cancel.
If one CTA alone already needs the full-chip cycles per block, the missing cycles are inside
the SM; if they appear as N grows, they are a chip-level effect (L2 / HBM). skip_softmax times
the wgmma + TMA skeleton without the softmax; the knob variants at 1 and 132 CTAs separate each
knob's per-SM effect from the chip's.

Does NOT import fa4sim. Compare with `fa4sim run --schedule fa3 ...` on the CPU.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import sys


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

N_CTAS = [1, 8, 33, 66, 132]
# knob variants timed at 1 CTA and at 132 CTAs (hd128): the per-SM part of each knob's effect
VARIANTS = [("default", {}, False), ("skip_softmax", {}, True),
            ("pingpong=False", {"pingpong": False}, False),
            ("intra_wg_overlap=False", {"intra_wg_overlap": False}, False),
            ("p_in_registers=False", {"p_in_registers": False}, False),
            ("kv_stages=3", {"kv_stages": 3}, False),
            ("exp_emulation=0.25", {"exp_emulation": 0.25}, False),
            ("rescale_threshold=8", {"rescale_threshold": 8.0}, False)]


# --only-knobs: the benchmark's hd128 8k knob set and the FA4 tricks alone and together
KNOB_VARIANTS = VARIANTS + [("exp_emulation=0.125", {"exp_emulation": 0.125}, False),
                            ("fa4_tricks(emu0.125,tau8)", {"exp_emulation": 0.125, "rescale_threshold": 8.0}, False)]

ABLATIONS = ["max", "exp", "sum", "rescale", "exp,max,rescale,sum"]


def probe_cycles(q, k, v, knobs, skip, reps, ablate="", causal=False):
    """Median (cycles, ghz) of CTA 0 over `reps` launches of the clock-probe build."""
    import torch

    from fa4kernel.interface import attention_probed
    from fa4kernel.trace import header_clock
    from fa4kernel.trace_layout import TRACE_WORDS

    st = torch.zeros((TRACE_WORDS,), dtype=torch.int64, device=q.device)  # traces CTA 0
    kw = dict(causal=causal, skip_softmax=skip, stamps=st, ablate=ablate, **knobs)
    attention_probed(q, k, v, **kw)
    cyc, ghz = [], []
    for _ in range(reps):
        attention_probed(q, k, v, **kw)
        torch.cuda.synchronize()
        h = header_clock(st[:5].tolist())
        cyc.append(h["cycles"])
        ghz.append(h["ghz"])
    return statistics.median(cyc), statistics.median(ghz)


LIGHT_TRACES = [(128, "default", {}), (128, "pingpong=False", {"pingpong": False}),
                (128, "rescale_threshold=8", {"rescale_threshold": 8.0}),
                (128, "intra_wg_overlap=False", {"intra_wg_overlap": False}), (64, "default", {}),
                (256, "default", {})]


def light_trace(hd, knobs, n, sk):
    """Light-trace build (QK, PV, softmax span per warpgroup and block) of CTA 0, one Q tile per
    CTA, `n` CTAs on shared K/V: decoded events, per-phase medians and cycles per block."""
    import torch

    from fa4kernel import trace as ftrace
    from fa4kernel import make_config
    from fa4kernel.interface import attention_traced

    cfg = make_config("bfloat16", hd, False, False, knobs)
    q = torch.randn(1, cfg.tile_m * n, 1, hd, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, sk, 1, hd, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, sk, 1, hd, device="cuda", dtype=torch.bfloat16)
    attention_traced(q, k, v, light=True, **knobs)
    _, st = attention_traced(q, k, v, light=True, **knobs)
    torch.cuda.synchronize()
    dec = ftrace.decode(st.cpu().tolist(), num_wg=cfg.tile_m // 64, pingpong=cfg.pingpong)
    ev = dec["events"]
    out = {"hdim": hd, "knobs": knobs, "n_ctas": n, "seqlen_k": sk, "tile_m": cfg.tile_m, "tile_n": cfg.tile_n,
           "kernel_cycles_cta0": dec["kernel_cycles"], "clock_ghz_in_kernel": dec["clock_ghz_in_kernel"],
           "events": ev, "phases": {}}
    for w in range(cfg.tile_m // 64):
        def spans(op):
            return {e["iter"]: e for e in ev if e["op"] == f"{op}{w}" and e["tile"] == 0}
        qk, exp, pv = spans("QK"), spans("EXP"), spans("PV")
        its = sorted(i for i in qk if 4 <= i < max(qk) - 2)
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        out["phases"][f"wg{w}"] = {
            "qk_issue_interval": med([qk[i + 1]["start"] - qk[i]["start"] for i in its if i + 1 in qk]),
            "s_wait_after_issue": med([qk[i]["end"] - qk[i]["start"] for i in its]),
            "softmax": med([exp[i]["end"] - exp[i]["start"] for i in its if i in exp]),
            "s_ready_to_softmax": med([exp[i]["start"] - qk[i]["end"] for i in its if i in exp]),
            "softmax_end_to_next_issue": med([qk[i + 1]["start"] - exp[i]["end"] for i in its if i in exp and i + 1 in qk]),
            "pv_wait_after_softmax": med([pv[i - 1]["end"] - exp[i]["end"] for i in its if i in exp and i - 1 in pv]),
        }
    return out


def parse_variant(label: str, option: str = "--tile-knobs") -> dict:
    """'default' -> {}; 'pingpong=False+tile_m=128' -> {'pingpong': False, 'tile_m': 128}."""
    if label == "default":
        return {}
    out = {}
    for part in label.split("+"):
        k, sep, v = part.partition("=")
        if not sep:
            raise SystemExit(f"{option}: {part!r} is not k=v; allowed: 'default' or k=v[+k=v...]")
        out[k] = {"True": True, "False": False, "None": None}.get(v, v)
        if isinstance(out[k], str):
            try:
                out[k] = int(v)
            except ValueError:
                try:
                    out[k] = float(v)
                except ValueError:
                    raise SystemExit(f"{option}: {part!r}: value must be True/False/None or a number")
    return out


def tile_costs(hd, blocks, tiles=(1, 9), reps=5, knobs=None):
    """One persistent CTA (interface.MAX_CTAS = 1) walking T tiles of `blocks` KV blocks each:
    cycles per tile = (cycles(T2) - cycles(T1)) / (T2 - T1), no clock conversion. None where the
    build is not persistent (hd96 and hd192 by default): its tiles run as CTAs of their own."""
    import torch

    from fa4kernel import interface
    from fa4kernel import make_config

    knobs = dict(knobs or {})
    cfg = make_config("bfloat16", hd, False, False, knobs)
    if not cfg.separate_o:  # O staged in Q's buffer: one CTA per tile, so no CTA walks tiles
        return None
    sk = blocks * cfg.tile_n
    cyc = {}
    interface.MAX_CTAS = 1
    try:
        for t in tiles:
            q = torch.randn(1, cfg.tile_m * t, 1, hd, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(1, sk, 1, hd, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(1, sk, 1, hd, device="cuda", dtype=torch.bfloat16)
            cyc[t] = probe_cycles(q, k, v, knobs, False, reps)[0]
    finally:
        interface.MAX_CTAS = None
    t1, t2 = tiles
    return {"hdim": hd, "kv_blocks": blocks, "knobs": knobs, "tile_m": cfg.tile_m, "tile_n": cfg.tile_n,
            "rescale_threshold": cfg.rescale_threshold,
            "persistent": cfg.separate_o, "cycles_by_tiles": {str(t): c for t, c in cyc.items()},
            "cycles_per_tile": (cyc[t2] - cyc[t1]) / (t2 - t1)}


SHORT_CASES = [  # (label, batch, heads, seqlen_q, seqlen_k): hd128, 8 KV blocks per tile, 2048 tiles
    ("bench 1k: 256 heads, Q and K/V from HBM", 16, 16, 1024, 1024),
    ("K/V L2-resident (16 heads x 1k keys), Q from HBM", 1, 16, 16384, 1024),
    ("one head: K/V L2-resident", 1, 1, 262144, 1024),
]


def short_tiles(reps=7, max_ctas=None):
    """Full-chip persistent launches with 8-block tiles: CTA 0's cycles per tile (clock probe)."""
    import torch

    from fa4kernel import interface
    from fa4kernel import make_config

    out = []
    cfg = make_config("bfloat16", 128, False, False, {})
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for label, b, h, sq, sk in SHORT_CASES:
        q = torch.randn(b, sq, h, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, h, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, sk, h, 128, device="cuda", dtype=torch.bfloat16)
        tiles = b * h * (sq // cfg.tile_m)
        grid = min(tiles, max_ctas or sms)
        interface.MAX_CTAS = max_ctas
        try:
            cyc, ghz = probe_cycles(q, k, v, {}, False, reps)
        finally:
            interface.MAX_CTAS = None
        n0 = -(-tiles // grid)  # CTA 0 runs tiles 0, grid, 2 grid, ...
        out.append({"case": label, "batch": b, "heads": h, "seqlen_q": sq, "seqlen_k": sk, "tiles": tiles,
                    "grid": grid, "tiles_cta0": n0, "cycles_cta0": cyc, "cycles_per_tile": cyc / n0,
                    "clock_ghz_in_kernel": ghz})
        print(f"{label:50s} grid {grid:3d}: {cyc / n0:8.0f} cycles per tile (CTA 0: {n0} tiles, {ghz:.3f} GHz)",
              flush=True)
        del q, k, v
    return out


def cta_spread(ctas=(0, 1, 66, 67, 68, 131), reps=5):
    """The bench's 1k case (b16 h16 hd128): start and end (globaltimer, ns) of several CTAs,
    relative to CTA 0's start, against the CUDA-event time of the same launches."""
    import torch

    from fa4kernel.interface import attention_probed
    from fa4kernel.trace_layout import TRACE_WORDS

    q, k, v = (torch.randn(16, 1024, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bufs = {c: torch.zeros((TRACE_WORDS,), dtype=torch.int64, device="cuda") for c in ctas}
    for c, b in bufs.items():
        b[0] = c
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rows = []
    for _ in range(reps):
        for c in ctas:  # one launch per traced CTA; also timed
            attention_probed(q, k, v, stamps=bufs[c])
        torch.cuda.synchronize()
        e0.record()
        for c in ctas:
            attention_probed(q, k, v, stamps=bufs[c])
        e1.record()
        torch.cuda.synchronize()
        ms = e0.elapsed_time(e1) / len(ctas)
        h = {c: bufs[c][:5].tolist() for c in ctas}
        rows.append({"event_ms_per_launch": ms,
                     "cta": {str(c): {"start_ns": h[c][2], "end_ns": h[c][4], "ns": h[c][4] - h[c][2],
                                      "ghz": (h[c][3] - h[c][1]) / max(h[c][4] - h[c][2], 1)} for c in ctas}})
    # dead time between back-to-back launches as CTA 0 sees it: start(i + 1) - end(i)
    a, b = (torch.zeros((TRACE_WORDS,), dtype=torch.int64, device="cuda") for _ in range(2))
    gaps = []
    for _ in range(reps):
        attention_probed(q, k, v, stamps=a)
        attention_probed(q, k, v, stamps=b)
        torch.cuda.synchronize()
        gaps.append(b[2].item() - a[4].item())
    rows.append({"launch_dead_time_ns_cta0": gaps})
    print("CTA 0: next launch starts", [round(g / 1e3, 2) for g in gaps], "us after this one ended", flush=True)
    last = rows[-2]
    print("event ms per launch", round(last["event_ms_per_launch"] * 1e3, 1), "us;",
          {c: (round(x["ns"] / 1e3, 1), round(x["ghz"], 3)) for c, x in last["cta"].items()}, flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hdims", default="128,64,256")
    ap.add_argument("--seqlens", default="16384,32768", help="two K lengths (difference method)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--light-traces", action="store_true",
                    help="also record light-trace timelines (1 and 132 CTAs) of a few configurations")
    ap.add_argument("--only-traces", action="store_true", help="light traces only")
    ap.add_argument("--tiles", action="store_true",
                    help="also: per-tile cycles of one persistent CTA walking 1 and 9 tiles of 8 / 32 KV blocks")
    ap.add_argument("--only-tiles", action="store_true", help="the per-tile measurement only")
    ap.add_argument("--tile-blocks", default="1,8,32",
                    help="with --tiles / --only-tiles: the KV blocks per tile to time (comma-separated)")
    ap.add_argument("--tile-knobs", default="default",
                    help="with --tiles / --only-tiles: knob variants to time, comma-separated, each "
                         "'default' or k=v[+k=v...] (e.g. default,pingpong=False,tile_m=128)")
    ap.add_argument("--only-short", action="store_true",
                    help="full-chip 8-block tiles (the 1k-token case): where K/V and Q come from")
    ap.add_argument("--only-loop", action="store_true",
                    help="one CTA, default build: the steady-state cycles per KV block of each head dim")
    ap.add_argument("--only-knobs", action="store_true",
                    help="one CTA, hd128: the knob variants of the benchmark (bench_fwd_sm90's hd128 8k set) "
                         "with the current kernel, cycles per KV block")
    ap.add_argument("--causal", action="store_true",
                    help="with --only-knobs / --only-ablations: the causal builds (one Q tile at the bottom of K, bottom-right "
                         "aligned: its unmasked blocks are the loop)")
    ap.add_argument("--knob-hdims", default="128",
                    help="with --only-knobs: the head dims to run the variants at (comma-separated; default 128)")
    ap.add_argument("--knobs", default="",
                    help="with --only-knobs: only these variants, by name (comma-separated, e.g. "
                         "default,rescale_threshold=8,exp_emulation=0.25; default all)")
    ap.add_argument("--only-ablations", action="store_true",
                    help="one CTA: default, skip_softmax and each softmax ablation (fa4kernel diagnostics.ABLATIONS)")
    ap.add_argument("--ablate-knobs", default="default",
                    help="with --only-ablations: the knob variants to ablate, comma-separated, each 'default' or "
                         "k=v[+k=v...] (e.g. default,exp_emulation=0.125)")
    ap.add_argument("--ablations", default="",
                    help="with --only-ablations: which ablations, ';'-separated (e.g. 'rescale;sum'; default: "
                         + "; ".join(ABLATIONS) + ")")
    args = ap.parse_args()
    variants = KNOB_VARIANTS
    wanted = [w for w in re.split(r",(?![^(]*\))", args.knobs) if w]  # names may hold commas in ()
    unknown = sorted(set(wanted) - {name for name, _, skip in variants if not skip})
    if unknown:
        ap.error(f"--knobs: unknown variant(s) {', '.join(unknown)}; allowed: "
                 + ", ".join(name for name, _, skip in variants if not skip))
    bad = [h for h in args.knob_hdims.split(",") if h not in ("64", "128", "256")]
    if bad:
        ap.error(f"--knob-hdims: {', '.join(bad)} not allowed; allowed: 64, 128, 256")
    from fa4kernel.diagnostics import ABLATIONS as KERNEL_ABLATIONS  # plain Python, no GPU

    bad = sorted({a for x in args.ablations.split(";") for a in x.split(",") if a} - set(KERNEL_ABLATIONS))
    if bad:
        ap.error(f"--ablations: unknown {', '.join(bad)}; allowed: {', '.join(KERNEL_ABLATIONS)} "
                 "(';' between ablations, ',' inside a combined one)")
    for opt, labels in (("--ablate-knobs", args.ablate_knobs), ("--tile-knobs", args.tile_knobs)):
        for label in labels.split(","):
            try:
                parse_variant(label, opt)  # a malformed variant stops here, before the GPU
            except SystemExit as e:
                ap.error(str(e.code))
    from lab.tools.hopper import require_hopper

    require_hopper("ctas_sm90.py")  # after the options: a wrong one says so on any machine
    import torch

    from fa4kernel import make_config

    torch.manual_seed(0)
    dev = torch.device("cuda")
    sk1, sk2 = (int(x) for x in args.seqlens.split(","))
    from lab.tools.provenance import stamp

    res = {"meta": {"device": torch.cuda.get_device_name(), "date": dt.datetime.now(dt.timezone.utc)
                    .isoformat(timespec="seconds"), "torch": torch.__version__, "seqlens_k": [sk1, sk2],
                    "reps": args.reps, "method": __doc__.strip().split("\n\n")[1]}, "points": []}
    # what the file holds: one measurement with --only-tiles / --only-short / --only-traces, else the loops
    stamp(res["meta"], "tile_costs" if args.only_tiles else "short_tiles" if args.only_short
          else "light_traces" if args.only_traces else "loop_intervals")

    def point(hd, pattern, n, label, knobs, skip, ablate="", causal=False):
        # causal: the causal build; one Q tile at the bottom of a long K (bottom-right aligned), so
        # every block but the last is unmasked and the difference of two K lengths is its loop
        cfg = make_config("bfloat16", hd, causal, False, knobs)
        tm, tn = cfg.tile_m, cfg.tile_n
        row = {"hdim": hd, "pattern": pattern, "n_ctas": n, "variant": label, "knobs": knobs, "causal": causal,
               "ablate": ablate, "tile_m": tm, "tile_n": tn,
               "rescale_threshold": cfg.rescale_threshold, "rescale_before_pv": cfg.rescale_before_pv,
               "early_q_release": cfg.early_q_release, "defer_o_store_wait": cfg.defer_o_store_wait, "runs": {}}
        for sk in (sk1, sk2):
            heads = 1 if pattern == "shared" else n
            sq = tm * n if pattern == "shared" else tm
            q = torch.randn(1, sq, heads, hd, device=dev, dtype=torch.bfloat16)
            k = torch.randn(1, sk, heads, hd, device=dev, dtype=torch.bfloat16)
            v = torch.randn(1, sk, heads, hd, device=dev, dtype=torch.bfloat16)
            # the tile recorded above, pinned: attention() would give a causal hd64 launch with
            # seqlen_q <= 1024 its short-causal tile (128 rows; interface.SHORT_CAUSAL_TILES)
            tiled = {"tile_m": tm, "tile_n": tn, **knobs}
            cyc, ghz = probe_cycles(q, k, v, tiled, skip, args.reps, ablate, causal)
            row["runs"][str(sk)] = {"cycles_cta0": cyc, "clock_ghz_in_kernel": ghz,
                                    "kv_blocks": -(-sk // tn)}
            del q, k, v
        a, b = row["runs"][str(sk1)], row["runs"][str(sk2)]
        row["cycles_per_kv_block"] = (b["cycles_cta0"] - a["cycles_cta0"]) / (b["kv_blocks"] - a["kv_blocks"])
        row["fixed_cycles"] = a["cycles_cta0"] - a["kv_blocks"] * row["cycles_per_kv_block"]
        res["points"].append(row)
        print(f"hd{hd:3d}{' causal' if causal else ''} {pattern:6s} n={n:3d} {label:24s} cycles/KV block {row['cycles_per_kv_block']:7.0f}"
              f"  fixed {row['fixed_cycles']:7.0f}  clock {a['clock_ghz_in_kernel']:.3f}/"
              f"{b['clock_ghz_in_kernel']:.3f} GHz", flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    if args.only_short:
        res["short_tiles"] = short_tiles()
        res["cta_spread_1k"] = cta_spread()
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        return
    if args.only_loop:
        for hd in (int(x) for x in args.hdims.split(",")):
            point(hd, "shared", 1, "default", {}, False)
            if hd == 256:  # its default (tile_n 64, O rescaled before PV) against the former one
                for kn in ({"rescale_before_pv": False}, {"tile_n": 80, "rescale_before_pv": False},
                           {"tile_n": 80}):
                    point(hd, "shared", 1, ",".join(f"{a}={b}" for a, b in kn.items()), kn, False)
        return
    if args.only_knobs:  # the per-SM part of each knob delta the end-to-end benchmark records
        for hd in (int(x) for x in args.knob_hdims.split(",")):
            for name, kn, skip in variants:
                if not skip and (not wanted or name in wanted):
                    point(hd, "shared", 1, name, kn, False, causal=args.causal)
        return
    if args.only_ablations:
        ablations = [a for a in re.split(r";", args.ablations) if a] if args.ablations else ABLATIONS
        for hd in (int(x) for x in args.hdims.split(",")):
            for label in args.ablate_knobs.split(","):
                knobs = parse_variant(label, "--ablate-knobs")
                point(hd, "shared", 1, label, knobs, False, causal=args.causal)
                if label == "default":
                    point(hd, "shared", 1, "skip_softmax", {}, True, causal=args.causal)
                for a in ablations:
                    point(hd, "shared", 1, f"{label} ablate={a}", knobs, False, a, causal=args.causal)
        return
    if args.tiles or args.only_tiles:
        res["tile_costs"] = []
        for hd in (int(x) for x in args.hdims.split(",")):
            for label in args.tile_knobs.split(","):
                knobs = parse_variant(label)
                for blocks in (int(x) for x in args.tile_blocks.split(",")):
                    t = tile_costs(hd, blocks, knobs=knobs)
                    if t is None:
                        print(f"tiles hd{hd} {label}: skipped, not persistent (O has no shared-memory buffer of its "
                              "own, so each tile is its own CTA)", flush=True)
                        break
                    res["tile_costs"].append(t)
                    print(f"tiles hd{hd} {label} {blocks:3d} KV blocks: {t['cycles_per_tile']:.0f} cycles "
                          f"per tile ({t['cycles_by_tiles']})", flush=True)
                with open(args.out, "w") as f:
                    json.dump(res, f, indent=1)
        if args.only_tiles:
            return
    if args.light_traces or args.only_traces:
        res["light_traces"] = []
        for hd, label, knobs in LIGHT_TRACES:
            for n in (1, 132):
                t = light_trace(hd, knobs, n, sk1)
                t["variant"] = label
                res["light_traces"].append(t)
                print(f"light trace hd{hd} {label:24s} n={n:3d}: " + json.dumps(t["phases"]), flush=True)
                with open(args.out, "w") as f:
                    json.dump(res, f, indent=1)
    for hd in ([] if args.only_traces else (int(x) for x in args.hdims.split(","))):
        for n in N_CTAS:
            for label, knobs, skip in VARIANTS[:2]:
                point(hd, "shared", n, label, knobs, skip)
        if hd == 128:
            for n in (1, 132):
                for label, knobs, skip in VARIANTS[2:]:
                    point(hd, "shared", n, label, knobs, skip)
            for n in (33, 66, 132):
                point(hd, "own", n, "default", {}, False)


if __name__ == "__main__":
    main()
