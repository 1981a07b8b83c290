"""Small helpers shared by the fa4lab lessons (kept here so each notebook stays about ideas).

- `live()`: True when a CUDA GPU is present (guarded torch import); the lessons' LIVE flag.
- `recorded(kind=..., gpu=..., campaign=..., where=...)`: recorded measurements, found through the
  lab's one index (lab/results.json), newest first; never invented.
- `gantt(result)`: draw one CTA's timeline with fa4sim.gantt.draw and show it inline.
- `check(cond, msg)`: an exercise check with a readable message.
- `time_cuda(fn)`: median milliseconds of a CUDA callable (live runs only).
- `sm100_compiler()`, `sass_count(text, op)`, `mma_sequence(text)`: read the SM100 kernel's SASS
  (compiled on the CPU; None, with the reason printed, when the CuTe DSL or nvdisasm is missing).
"""
from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path


def repo_root() -> Path:
    """The fa4lab checkout: the first parent of the working directory holding pyproject.toml."""
    here = Path.cwd().resolve()
    for p in (here, *here.parents):
        if (p / "pyproject.toml").exists() and (p / "fa4sim").is_dir():
            return p
    return Path(__file__).resolve().parents[2]


# the index of the recorded measurements (`python -m lab.tools.index --write` keeps it); FA4LAB_INDEX
# points the lessons at another checkout's lab/results.json (its paths are read from that checkout)
INDEX = Path(os.environ.get("FA4LAB_INDEX") or repo_root() / "lab" / "results.json")


def live() -> bool:
    """A CUDA GPU is present (set FA4LAB_LIVE=0 to force the recorded/simulated path)."""
    if os.environ.get("FA4LAB_LIVE", "1") == "0":
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def blackwell() -> bool:
    """live() and the GPU is of compute capability 10.x (B200, GB200): the lessons' B200 cells run."""
    if not live():
        return False
    import torch

    return torch.cuda.get_device_capability(0)[0] == 10


def recorded(kind: str | None = None, gpu: str | None = None, device: str | None = None,
             kernel: str | None = None, campaign: str | None = None, where=None) -> list[tuple[Path, dict]]:
    """Recorded result files, as (path, doc), newest first, found through the lab's index
    (lab/results.json, one row per file: its meta.kind, the device, the kernel commit, the
    campaign under lab/campaigns/). Each argument given narrows the rows: `kind` (meta.kind),
    `gpu` (the short name: "h100", "h200", "b200", "cpu"), `device` (a part of meta.device),
    `kernel` (a commit), `campaign` (its folder name); `where(doc)`, when given, keeps the
    files whose content holds what the caller reads (a file that lacks a field it asks for,
    a KeyError, IndexError or TypeError, is left out). Files are .json or gzipped .json.gz."""
    try:
        rows = json.loads(INDEX.read_text())["files"]
    except (OSError, ValueError, KeyError) as e:
        print(f"no readable index of recorded results ({INDEX}: {e}); run `python -m lab.tools.index --write`")
        return []
    root = INDEX.parent.parent
    out = []
    for r in rows:
        if ((kind is not None and r["kind"] != kind) or (gpu is not None and r["gpu"] != gpu.lower())
                or (device is not None and device.lower() not in r["device"].lower())
                or (kernel is not None and kernel not in r["kernel"].split(","))
                or (campaign is not None and r["campaign"] != campaign)):
            continue
        path = root / r["path"]
        try:
            with (gzip.open(path, "rt") if path.name.endswith(".gz") else open(path)) as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as e:
            print(f"skipping unreadable {path}: {e}")
            continue
        if where is not None:
            try:
                if not where(doc):
                    continue
            except (KeyError, IndexError, TypeError):
                continue
        out.append((path, doc))
    out.sort(key=lambda pd: (str(describe(pd[1])[1]), pd[0].name), reverse=True)
    return out


def describe(doc: dict) -> tuple[str, str]:
    """(device, date) of a recorded result, looking in the usual places."""
    meta = doc.get("meta", doc) if isinstance(doc, dict) else {}
    device = meta.get("device") or meta.get("gpu") or doc.get("device") or "unknown device"
    date = meta.get("date") or meta.get("date_utc") or doc.get("date") or "unknown date"
    return str(device), str(date)


def profile_for(device: str, measured: bool = True) -> str | None:
    """fa4sim profile for a device name: the calibrated one (h100, h200) when `measured`, else
    the datasheet one (h100-datasheet); None if we have no profile for the device."""
    from fa4sim import hardware

    d = device.upper()
    for name in ("H200", "H100", "B200"):
        if name in d:
            base = name.lower()
            if not measured and f"{base}-datasheet" in hardware.available():
                return f"{base}-datasheet"
            return base
    return None


def find_keys(doc, suffix: str, prefix: str = "") -> dict[str, float]:
    """Every numeric value whose key ends with `suffix`, by its path in the JSON document."""
    found = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if str(k).endswith(suffix) and isinstance(v, (int, float)) and not isinstance(v, bool):
                found[path] = float(v)
            else:
                found.update(find_keys(v, suffix, path))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found.update(find_keys(v, suffix, f"{prefix}[{i}]"))
    return found


def sm90_points(doc: dict, causal: bool = False) -> dict[str, dict]:
    """Knob-variant points of a recorded sm90_fwd benchmark: label -> point (fa4kernel timings)."""
    from fa4sim.validate import expand

    out = {}
    for p in expand(doc.get("points", [])):
        if bool(p.get("causal")) != causal or p.get("label") == "main":
            continue
        if "tflops" in p.get("results", {}).get("fa4kernel", {}):
            out[p["label"]] = p
    return out


def gantt(result, iterations: int = 6, width: float = 14.0, title: str = ""):
    """Draw one CTA's timeline of a fa4sim Result and display it inline (outside Jupyter: keep the PNG)."""
    from fa4sim.gantt import draw

    try:
        from IPython import get_ipython
        from IPython.display import Image, display
        inline = get_ipython() is not None
    except ImportError:
        inline = False

    fd, path = tempfile.mkstemp(suffix=".png", prefix="fa4lesson_")
    os.close(fd)
    p = result.problem
    draw(result.trace, path, iterations=iterations, width=width,
         title=title or f"{result.schedule} on {result.hw.name}, hd{p.hdim}: {result.tflops:.0f} TFLOP/s "
                        f"(one CTA, first {iterations} KV iterations)")
    if not inline:
        print(f"(timeline written to {path})")
        return path
    display(Image(filename=path))
    os.unlink(path)
    return None


def check(cond: bool, msg: str) -> None:
    """An exercise check: passes silently with a tick, or fails with a hint."""
    assert cond, "Not yet: " + msg
    print("correct!")


def time_cuda(fn, reps: int = 10) -> float:
    """Median milliseconds per call of a CUDA callable (one warm-up call first)."""
    import statistics

    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def sm100_compiler():
    """fa4kernel.sm100.fwd.compile_sm100_sass, or None (reason printed) when nvidia-cutlass-dsl
    is not importable or no nvdisasm is found: the lessons then skip their SASS cells."""
    try:
        from fa4kernel.sm100.fwd import compile_sm100_sass
    except ImportError as e:
        print(f"nvidia-cutlass-dsl is not importable ({e}): skipping the SM100 SASS cells "
              "(install it with `pip install -e \".[kernels]\"`).")
        return None
    try:
        from cutlass.base_dsl.env_manager import _find_nvdisasm_binary

        _find_nvdisasm_binary()
    except Exception as e:  # the DSL raises its own error type when nvdisasm is missing/too old
        print(f"no usable nvdisasm ({str(e).splitlines()[0]}): skipping the SM100 SASS cells "
              "(`pip install nvidia-cuda-nvdisasm`).")
        return None
    return compile_sm100_sass


def sass_count(text: str, op: str) -> int:
    """How many instructions with opcode `op` the SASS text holds. Modifiers count with it
    ("FADD2" counts FADD2.RM, "MUFU" counts MUFU.EX2); longer opcodes do not ("FMNMX" is not FMNMX3)."""
    import re

    return len(re.findall(r"\s" + re.escape(op) + r"[\s.]", text))


def mma_sequence(text: str, commits: bool = False) -> str:
    """tcgen05.mma instructions in code order: 'Q' = SS UMMA (A from shared memory: S = Q K^T),
    'P' = TS UMMA (A = P from TMEM: O += P V); with commits, 'c' marks each tcgen05.commit (UTCBAR)."""
    import re

    out = []
    for line in text.splitlines():
        m = re.search(r"\s(UTC[HQ]MMA|UTCBAR)[\s.]\s*(\S*)", line)
        if not m:
            continue
        if m.group(1) == "UTCBAR":
            if commits:
                out.append("c")
        else:
            out.append("P" if m.group(2).startswith("tmem[") else "Q")
    return "".join(out)

