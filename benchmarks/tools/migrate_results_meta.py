"""Give every file in benchmarks/results/ its `meta.kind` and `meta.kernel`, and write the fields
that later files record but earlier ones lack into the earlier files' recorded configurations, so
that readers need no defaults for them (run once; kept as the record of how):

    python benchmarks/tools/migrate_results_meta.py [--check]

meta.kernel: the newest commit at or before the commit that added the file that touched
fa4kernel/ (the kernel the measurement ran). Files without a `meta` get one, holding the
top-level device, date and versions. Every rewrite keeps the file's layout (indented or compact,
gzipped or not). --check lists what would change and exits 1 if anything would.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

from benchmarks.provenance import KINDS  # noqa: E402
from fa4sim.params import Problem, resolve  # noqa: E402
from fa4sim.schedules import fa3_sm90  # noqa: E402

# top-level fields of meta-less files that describe the run, not the measurement
RUN_FIELDS = ("device", "date", "torch", "cutlass_dsl", "sms")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def added_by(rel: str) -> str | None:
    """The commit that first added `rel`, through renames (exact renames only, not copies)."""
    for _ in range(20):
        added = git("log", "--diff-filter=A", "--format=%h", "--", rel).splitlines()
        if not added:
            return None
        renamed = [ln.split("\t") for ln in git("show", "-M", "--name-status", "--format=", added[-1]).splitlines()
                   if ln.startswith("R") and ln.endswith("\t" + rel)]
        if not renamed:
            return added[-1]
        rel = renamed[0][1]
    return None


def kernel_commit(path: Path) -> str:
    """The last commit touching fa4kernel/ at or before the one that added `path`."""
    added = added_by(str(path.relative_to(ROOT)))
    if added is None:
        return "unknown"
    return git("log", "-1", "--format=%h", added, "--", "fa4kernel") or "unknown"


def kind_of(rel: str, doc) -> str:
    """The evidence kind, from the script that wrote the file (its name and its fields)."""
    name = os.path.basename(rel)
    if rel.startswith("ab_") and not name.startswith("sm90_fwd"):
        return "ab"
    if name.startswith(("sm90_fwd", "fwd_knobs_sm90")):
        return "knob_points" if name.startswith("fwd_knobs") else "points"
    if name.startswith("cta_log"):
        return "cta_log"
    if name.endswith(".json.gz"):
        return "timeline"
    if name.startswith("bursts_"):
        return "bursts"
    if name.startswith("contention_"):
        return "contention"
    if name.startswith(("calibrate_", "two_chains_", "cta_turnover_")):
        return "calibration"
    if name.startswith(("tile_choice_", "pingpong_")):
        return "tile_choice"
    if name.startswith("causal_"):
        return "causal_launches"
    if name.startswith("loop_vs_fa4"):
        return "loop_vs_fa4"
    if name.startswith("sim_speed"):
        return "sim_speed"
    if name.startswith("idle_wg"):
        return "idle_wgs"
    if doc.get("points") and "cycles_per_kv_block" in doc["points"][0]:
        return "loop_intervals"
    if doc.get("tile_costs"):
        return "tile_costs"
    if doc.get("short_tiles"):
        return "short_tiles"
    if doc.get("light_traces"):
        return "light_traces"
    raise SystemExit(f"{rel}: cannot tell its kind")


def complete_config(point: dict, cfg: dict) -> None:
    """Write into a recorded fa4kernel configuration what the kernel of its time did where the
    configuration has no field for it: idle warpgroups did their work before the change that
    brought rescale_before_pv; before rescale_before_pv O was rescaled after the PV wait; before
    early_q_release Q went back after the whole KV loop; before defer_o_store_wait each O store
    was waited for at once; launches were persistent where O had its own smem buffer."""
    merged = {**(point.get("knobs") or {}), **cfg}
    if "skip_idle_wgs" not in cfg:
        cfg["skip_idle_wgs"] = "rescale_before_pv" in merged
    for field in ("rescale_before_pv", "early_q_release", "defer_o_store_wait"):
        if field not in merged:
            cfg[field] = False
    if "tile_m" in merged and "persistent" not in merged and "hdim" in point:
        knobs = {k: v for k, v in {**merged, **cfg}.items() if k in {x.name for x in fa3_sm90.KNOBS}}
        prob = Problem(1, 1, 128, 128, int(point["hdim"]), bool(point["causal"]))
        cfg["persistent"] = fa3_sm90._o_fits(prob, resolve(fa3_sm90.KNOBS, prob, knobs))


def complete(kind: str, doc: dict) -> None:
    if kind in ("points", "knob_points"):
        for p in doc["points"]:
            p.setdefault("clock_probes_span_launch", False)  # files before the CTA-log clock probe
            cfg = p.setdefault("fa4kernel_config", {})
            complete_config(p, cfg)
            for name, c in (p.get("configs") or {}).items():
                if c:
                    complete_config(p, c)
    elif kind == "idle_wgs":  # one persistent CTA, tile_n 128, the kernel that idles warpgroups without rows
        for c in doc["cases"]:
            c.setdefault("fa4kernel_config", {"tile_m": c["tile_m"], "tile_n": 128, "persistent": True,
                                              "skip_idle_wgs": True})
    elif kind == "loop_intervals":
        for p in doc["points"]:
            p.setdefault("causal", False)
            for field in ("rescale_before_pv", "early_q_release", "defer_o_store_wait"):
                p.setdefault(field, False)


def read(path: Path):
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = raw.decode()
    return json.loads(text), text.startswith("{\n") or text.startswith("[\n")


def write(path: Path, doc, indented: bool) -> bytes:
    text = json.dumps(doc, indent=1) if indented else json.dumps(doc, separators=(",", ":") if path.suffix == ".gz" else None)
    if indented:
        text += "\n" if path.read_bytes()[-1:] == b"\n" else ""
    data = text.encode()
    return gzip.compress(data, mtime=0) if path.suffix == ".gz" else data


def migrate(path: Path) -> bytes | None:
    doc, indented = read(path)
    rel = str(path.relative_to(RESULTS))
    kind = kind_of(rel, doc)
    assert kind in KINDS, kind
    if "meta" not in doc:  # meta-less files: their run fields become the meta
        meta = {k: doc.pop(k) for k in RUN_FIELDS if k in doc}
        doc = {"meta": meta, **doc}
    meta = doc["meta"]
    if meta.get("kind") == kind and "kernel" in meta and not str(meta["kernel"]).startswith("fa4kernel at"):
        before = json.dumps(doc, sort_keys=True)
        complete(kind, doc)
        if json.dumps(doc, sort_keys=True) == before:
            return None
    else:
        note = meta.get("kernel")
        meta["kind"] = kind
        meta["kernel"] = kernel_commit(path)
        if isinstance(note, str) and note.startswith("fa4kernel at commit "):  # recorded by hand: trust it
            meta["kernel"] = note.split()[3]
            meta["kernel_note"] = note[len("fa4kernel at commit ") + len(meta["kernel"]):].strip(" ()")
        complete(kind, doc)
    return write(path, doc, indented)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only list the files that would change")
    a = ap.parse_args(argv)
    changed = 0
    for path in sorted(p for p in RESULTS.rglob("*") if p.name.endswith((".json", ".json.gz"))):
        data = migrate(path)
        if data is None:
            continue
        changed += 1
        print(path.relative_to(ROOT))
        if not a.check:
            path.write_bytes(data)
    print(f"{changed} file(s) {'to change' if a.check else 'changed'}", file=sys.stderr)
    return 1 if a.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
