"""How much one tile's cycles vary from tile to tile in a full-chip persistent launch: the
profile's tile_jitter_q_loads, from fa4kernel's tile log (CPU only).

    python3 -m lab.tools.calibrate.tile_jitter CTA_LOG.json --profile fa4sim/profiles/h100.json [--write]

CTA_LOG.json is lab/tools/cta_log_sm90.py's output. Its persistent points carry the host table
and, per launch, every tile's cycles (the tile log: consumer warpgroup 0 stamps each tile's
start). A tile's cycles are compared with the mean of its kind (KV blocks, query rows) in the
same point; a CTA's first tile (the launch's cold start) and its last (no next tile start) are
left out. The spread does not grow with a tile's length (hd128 1k causal, H100: 331 cycles at 1
KV block, 303 at 8), but it does with the tile's Q and O bytes (about 310-370 cycles at hd64 and
hd128, 930-1070 at hd256): it comes with the memory traffic at the tile's boundary. So the
profile holds it in units of the tile's Q load (tile_m x head_dim x 2 bytes at the profile's
tma_bytes_per_clk), pooled over the file's persistent launches:

    tile_jitter_q_loads = sqrt(sum residual^2 / sum q_load^2).

Residuals of one CTA's tiles add up independently (measured: a CTA's summed residuals spread as
sqrt(tiles) x one tile's), which is what the kernel model's E[max] assumes
(fa4sim/kernel_model.py). With --write, the value and its source go into the profile.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from fa4sim.validate.launches import tile_kinds  # noqa: E402  (a tile's kind: KV blocks, rows)
from lab.tools.index import campaign_of  # noqa: E402


def point_residuals(p: dict) -> tuple[list[float], list[float]]:
    """(residuals, means of its kind) of every middle tile of one persistent point, in cycles."""
    kinds, num_m = tile_kinds(p), p["num_m"]
    last = {cta: len(row) - 1 for cta, row in enumerate(p["table"])}
    by_kind = defaultdict(list)
    for launch in p["tile_logs"]:
        for cta, tile, k, cycles in launch:
            if 0 < k < last[cta]:
                by_kind[kinds[tile % num_m]].append(cycles)
    res, med = [], []
    for cycles in by_kind.values():
        if len(cycles) < 10:  # too few to take a mean from
            continue
        m = statistics.fmean(cycles)
        res += [c - m for c in cycles]
        med += [m] * len(cycles)
    return res, med


def tile_jitter(doc: dict, tma_bytes_per_clk: float) -> tuple[float, str]:
    """(spread in Q loads, details) pooled over the file's persistent points."""
    rows, res2, q2, n = [], 0.0, 0.0, 0
    for p in doc.get("points", []):
        if "tile_logs" not in p:
            continue
        r, _ = point_residuals(p)
        if not r:
            continue
        q_load = p["tile_m"] * p["head_dim"] * 2 / tma_bytes_per_clk
        rms = math.sqrt(sum(x * x for x in r) / len(r))
        rows.append(f"hd{p['head_dim']} {p['seqlen']}{' causal' if p['causal'] else ''} {rms:.0f} cycles = "
                    f"{rms / q_load:.2f} x {q_load:.0f}")
        res2 += sum(x * x for x in r)
        q2 += len(r) * q_load * q_load
        n += len(r)
    if not n:
        raise ValueError("no persistent point with a tile log in this file (lab/tools/cta_log_sm90.py "
                         "records one for persistent launches)")
    return math.sqrt(res2 / q2), (f"{n} middle tiles of {len(rows)} persistent launches, rms spread per launch: "
                                  f"{'; '.join(rows)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cta_log", help="lab/tools/cta_log_sm90.py output with persistent points")
    ap.add_argument("--profile", required=True,
                    help="profile JSON whose tma_bytes_per_clk sizes a Q load (e.g. fa4sim/profiles/h100.json)")
    ap.add_argument("--write", action="store_true", help="write tile_jitter_q_loads and its source into --profile")
    a = ap.parse_args(argv)
    try:
        doc = json.loads(Path(a.cta_log).read_text())
        prof = json.loads(Path(a.profile).read_text())
        value, details = tile_jitter(doc, float(prof["params"]["tma_bytes_per_clk"]["value"]))
    except (OSError, json.JSONDecodeError, ValueError, KeyError) as e:
        ap.error(f"{e}")
    print(f"tile_jitter_q_loads {value:.3f} ({details})")
    if a.write:
        prof["params"]["tile_jitter_q_loads"] = {
            "value": round(value, 3),
            "source": f"measured on {doc['meta'].get('device', '?')} by lab/tools/cta_log_sm90.py's tile log "
                      f"({Path(a.cta_log).name}, {campaign_of(a.cta_log, 'launch-jitter')}), "
                      f"lab/tools/calibrate/tile_jitter.py: a tile's cycles against the mean of its kind "
                      f"(KV blocks, rows), sqrt(sum residual^2 / sum q_load^2), q_load = tile_m x head_dim x 2 B / "
                      f"tma_bytes_per_clk; {details}",
            "confidence": "M"}
        Path(a.profile).write_text(json.dumps(prof, indent=1) + "\n")
        print(f"wrote tile_jitter_q_loads into {a.profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
