"""One index of the recorded results: lab/results.json, made from the files' own meta.

    python -m lab.tools.index --write     # rewrite lab/results.json from lab/campaigns/
    python -m lab.tools.index --check     # exit 1 when lab/results.json is stale

Readers: `recorded(kind=..., device=..., kernel=..., campaign=...)` (rows of the index, newest
first; figures/make_figures.py) and `path_of(name)` (a result file or folder by its name, in
whichever campaign keeps it). The lessons read the same file (lessons/lessonkit, `recorded`).
fa4sim never imports this (tests/test_layout.py); it takes result files by path.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGNS = ROOT / "lab" / "campaigns"
INDEX = ROOT / "lab" / "results.json"
SUFFIXES = (".json", ".json.gz")


def _meta(path: Path) -> dict | None:
    try:
        with (gzip.open(path, "rt") if path.name.endswith(".gz") else open(path)) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    meta = doc.get("meta") if isinstance(doc, dict) else None
    return meta if isinstance(meta, dict) and meta.get("kind") else None


def gpu_of(device: str | None, name: str) -> str:
    """A short device name: h100, h200, b200, cpu... from meta.device, else from the file name."""
    d = (device or "").upper()
    for g in ("H100", "H200", "B200", "B300"):
        if g in d:
            return g.lower()
    for part in name.replace(".", "_").split("_"):
        if part in ("h100", "h200", "b200", "b300") or part.startswith("cpu"):
            return "cpu" if part.startswith("cpu") else part
    return "unknown"


def build() -> list[dict]:
    rows = []
    for path in sorted(CAMPAIGNS.rglob("*")):
        if not path.is_file() or not path.name.endswith(SUFFIXES):
            continue
        meta = _meta(path)
        if meta is None:
            continue
        rel = path.relative_to(ROOT).as_posix()
        kernel = meta.get("kernel", "unknown")
        rows.append({"path": rel, "campaign": path.relative_to(CAMPAIGNS).parts[0], "kind": meta["kind"],
                     "device": meta.get("device", "unknown"), "gpu": gpu_of(meta.get("device"), path.name),
                     "kernel": kernel if isinstance(kernel, str) else ",".join(map(str, kernel)),
                     "date": str(meta.get("date", ""))[:10]})
    return rows


def text(rows: list[dict]) -> str:
    return json.dumps({"generated": "by python -m lab.tools.index --write from each file's meta; do not edit",
                       "files": rows}, indent=1) + "\n"


def load(index: Path | None = None) -> list[dict]:
    """The index's rows: lab/results.json (built from lab/campaigns/ when it is missing), or the
    rows of another checkout's index file (their paths are relative to that checkout)."""
    if index is not None:
        return json.loads(Path(index).read_text())["files"]
    return json.loads(INDEX.read_text())["files"] if INDEX.is_file() else build()


def recorded(kind: str | None = None, device: str | None = None, kernel: str | None = None,
             campaign: str | None = None, index: Path | None = None) -> list[dict]:
    """Index rows of that kind / device (short name or meta.device) / kernel / campaign (its
    folder under lab/campaigns/), newest first; `index`: another checkout's lab/results.json."""
    out = [r for r in load(index)
           if (kind is None or r["kind"] == kind)
           and (device is None or device.lower() in (r["gpu"], r["device"].lower()))
           and (kernel is None or kernel in r["kernel"].split(","))
           and (campaign is None or r["campaign"] == campaign)]
    return sorted(out, key=lambda r: (r["date"], r["path"]), reverse=True)


def documents(rows: list[dict], root: Path = ROOT, where=None) -> list[tuple[Path, dict]]:
    """(path, loaded doc) of index rows, in their order (.json or gzipped .json.gz; an unreadable
    file is left out); with `where`, the docs where(doc) accepts (one lacking a field it asks
    for, a KeyError, IndexError or TypeError, is left out). `root`: the checkout the rows are in."""
    out = []
    for r in rows:
        path = Path(root) / r["path"]
        try:
            with (gzip.open(path, "rt") if path.name.endswith(".gz") else open(path)) as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            continue
        try:
            if where is not None and not where(doc):
                continue
        except (KeyError, IndexError, TypeError):
            continue
        out.append((path, doc))
    return out


def campaign_of(path: str | Path, default: str) -> str:
    """'lab/campaigns/NAME/' of a result file inside a campaign folder, else of campaign `default`
    (where such results go): what a profile parameter's source cites instead of a dated file
    (fa4sim carries no dates, tests/test_layout.py; the campaign's README keeps the dated record)."""
    try:
        name = Path(path).resolve().relative_to(CAMPAIGNS).parts[0]
    except (ValueError, IndexError):
        name = default
    return f"lab/campaigns/{name}/"


def path_of(name: str) -> Path:
    """A recorded file or folder by its name (or folder/name), wherever its campaign keeps it; a
    path under lab/campaigns/unsorted/ (absent) when none does."""
    for camp in sorted(p for p in CAMPAIGNS.iterdir() if p.is_dir()):
        if (camp / name).exists():
            return camp / name
    return CAMPAIGNS / "unsorted" / name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite lab/results.json")
    ap.add_argument("--check", action="store_true", help="exit 1 when lab/results.json is stale")
    a = ap.parse_args(argv)
    new = text(build())
    if a.write:
        INDEX.write_text(new)
        print(f"{INDEX.relative_to(ROOT)}: {len(json.loads(new)['files'])} files")
    elif a.check:
        if not INDEX.is_file() or INDEX.read_text() != new:
            print("lab/results.json is stale: python -m lab.tools.index --write")
            return 1
        print("lab/results.json is current")
    else:
        for r in json.loads(new)["files"]:
            print(f"{r['date']}  {r['gpu']:7} {r['kind']:16} {r['kernel']:9} {r['path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
