"""Predicted vs measured: recorded GPU evidence (lab/campaigns/) replayed through the
simulator. Every result file says what it holds in `meta.kind`; each kind the model can be
compared with has its module:

  points, knob_points  points.py      end-to-end TFLOP/s per point, knob deltas (bench_fwd_sm90.py)
  loop_intervals       intervals.py   cycles per KV block, per-SM knob deltas, scoreboard (ctas_sm90.py)
  tile_costs           tile_costs.py  cycles per tile of one persistent CTA (ctas_sm90.py --only-tiles)
  idle_wgs             idle_wgs.py    tiles with idle warpgroups (idle_wg_sm90.py)
  cta_log              launches.py    whole launches replayed with mean tile costs (cta_log_sm90.py)
  sustained            sustained.py   each kernel alone under its power-capped clock, predicted with the
                                      model's own clock (sustained_sm90.py; on a B200,
                                      sustained_sm100.py: flash-attn-4's forward and backward)
  sm90_bwd             backward.py    the backward alone, flash-attn-4 and fa4kernel against
                                      fa4sim --pass bwd (bench_bwd_sm90.py)
  bwd_ctas             bwd_launches.py  fa4kernel's backward launches by launch order, at their
                                      in-kernel clock (bwd_ctas_sm90.py)
  contention           contention.py  a unit benchmark, not a kernel: warpgroups that run a softmax-like
                                      mix beside their own wgmma, replayed with the engine's rules
                                      (calibrate/bench_contention.py)
  bursts               issue_sharing.py  a unit benchmark: one to three warps per scheduler running one
                                      code alone, against the rule for warps sharing issue slots
                                      (calibrate/bench_bursts.py)
  published            published.py   figures papers and pull requests print for a GPU we do not
                                      have (B200), each predicted as typed; with --uncertainty, each
                                      one's band and whether the figure falls inside it

common.py holds what they share, among it the one place that turns a kernel's recorded
configuration into model knobs (model_knobs; each kernel is simulated as its implementation).

    fa4sim validate FILE [FILE ...] [--hw PROFILE] [--plot PNG] [--json] [--uncertainty]

load(path) -> doc, compare(doc, hw) -> result, report(result) -> text, plot(result, path) and
main(paths, ...) (the whole command) dispatch on the kind.
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from .. import hardware, implementation
from ..errors import InputError
from . import (backward, bwd_launches, contention, idle_wgs, intervals, issue_sharing, launches, points, published,
               sustained, tile_costs)
from .common import SIMULATED, kernel_knobs, model_knobs, profile_for  # noqa: F401  (the package's public names)
from .intervals import knob_scoreboard, plot_knob_deltas, report_scoreboard
from .points import expand  # noqa: F401

MODULES = {"points": points, "knob_points": points, "loop_intervals": intervals, "tile_costs": tile_costs,
           "idle_wgs": idle_wgs, "cta_log": launches, "sustained": sustained,
           "sm90_bwd": backward, "bwd_ctas": bwd_launches,
           "contention": contention, "bursts": issue_sharing, "published": published}
POINTS = ("points", "knob_points")  # end-to-end points (fa4sim/validate/points.py)
UNCERTAIN = ("published", "sustained")  # kinds whose predictions --uncertainty gives a band
PLOTS = {"points", "knob_points", "loop_intervals", "tile_costs", "sustained"}


def kind(doc: dict) -> str:
    """A loaded result file's evidence kind (meta.kind)."""
    return doc["meta"]["kind"]


def load(path: str) -> dict:
    """A result file (.json or .json.gz) whose meta.kind validate can compare; one-line InputError otherwise."""
    if not path:
        raise InputError("results", "'' is empty: give a result file")
    p = Path(path)
    if p.is_dir():
        raise InputError("results", f"{path} is a folder; give result files (e.g. {path.rstrip('/')}/*.json)")
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError("results", f"no such file: {path}") from None
    except OSError as e:
        raise InputError("results", f"cannot read {path} ({e.strerror})") from None
    try:
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (ValueError, OSError, EOFError) as e:
        raise InputError("results", f"{path} is not JSON ({getattr(e, 'msg', e)})") from None
    except RecursionError:
        raise InputError("results", f"{path} is not JSON this reads (nested too deeply)") from None
    if not isinstance(doc, dict):
        what = {list: "list", str: "string", bool: "true or false", type(None): "null"}.get(type(doc), "number")
        raise InputError("results", f"{path} holds a JSON {what}, not a result file "
                                    "(an object with meta.kind)")
    k = (doc.get("meta") or {}).get("kind") if isinstance(doc.get("meta"), dict) else None
    if k is None:
        raise InputError("results", f"{path} has no meta.kind; validate reads kinds {', '.join(MODULES)}")
    if not isinstance(k, str) or k not in MODULES:
        raise InputError("results", f"{path} is of kind {k!r}, which validate does not compare; "
                                    f"it reads kinds {', '.join(MODULES)}")
    return doc


def compare(doc: dict, hw: str | None = None, at_profile_clock: bool = False, pv_wait: str = "model",
            overrides: dict | None = None, uncertainty: bool = False, jobs: int | None = None) -> dict:
    """Predicted vs measured for one loaded file; at_profile_clock and pv_wait concern end-to-end
    points only (fa4sim/validate/points.py), overrides (--set) sustained files only, uncertainty
    (each point's band) and jobs (its worker processes) published and sustained files only."""
    k = kind(doc)
    if overrides and k != "sustained":
        raise InputError("--set", f"applies to sustained files (lab/tools/sustained_sm90.py) only, not {k!r}")
    if k == "published":
        return published.compare(doc, hw, uncertainty, jobs)
    if k in ("points", "knob_points"):
        return points.compare(doc, hw, at_profile_clock, pv_wait)
    if k == "sustained":
        _check_overrides(overrides or {})
        return MODULES[k].compare(doc, hw, overrides, uncertainty, jobs)
    return MODULES[k].compare(doc, hw)


def _check_overrides(overrides: dict) -> None:
    """--set names and values as each simulated kernel takes them (every point would refuse a bad
    one: said once, before any work)."""
    from ..model import split_overrides
    from ..schedules import SCHEDULES
    module = SCHEDULES["fa3"]
    knobs = {k.name: k for k in module.KNOBS}
    for kernel in SIMULATED:
        _, knob_over, _ = split_overrides(module, implementation.load(kernel, module.ARCH), overrides)
        for name, v in knob_over.items():
            if isinstance(v, str):
                knobs[name].parse(v)
            else:
                knobs[name].check(v)


def _guarded(path: str, doc: dict, work):
    """work() (comparing, reporting or plotting `doc`, read from `path`), with a file of a known
    kind that lacks a field or holds one of another type (an edited or truncated file) refused in
    one line."""
    try:
        return work()
    except InputError:
        raise
    except (KeyError, IndexError, TypeError, AttributeError, ValueError, ZeroDivisionError) as e:
        why = f"no field {e.args[0]!r}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        raise InputError("results", f"{path} is not a complete {kind(doc)} file ({why}); validate reads "
                                    f"what its benchmark writes") from None


def report(result: dict) -> str:
    return MODULES[result["kind"]].report(result)


def plot(result: dict, path: str) -> str:
    if result["kind"] not in PLOTS:
        raise InputError("plot", f"files of kind {result['kind']!r} have no plot; --plot draws kinds "
                                 f"{', '.join(sorted(PLOTS))}")
    return MODULES[result["kind"]].plot(result, path)


def main(paths: list[str], hw: str | None = None, plot_path: str | None = None, as_json: bool = False,
         at_profile_clock: bool = False, pv_wait: str = "model", out=None, overrides: dict | None = None,
         uncertainty: bool = False, jobs: int | None = None) -> int:
    """The whole `fa4sim validate`: every file compared and reported; several loop-interval files
    add a scoreboard of their per-SM knob deltas, and --plot draws them together."""
    out = out or sys.stdout
    if hw is not None:  # every point would be refused: say so once, before any work
        try:
            hardware.load(hw)
        except InputError as e:
            raise InputError("--hw", str(e).removeprefix("hw: ")) from None
    docs = [(path, load(path)) for path in paths]
    kinds = [kind(doc) for _, doc in docs]
    # options that concern one kind of file only: refused for another, before any work (else ignored)
    for option, given, concern in (("--set", bool(overrides), ("sustained",)),
                                   ("--at-profile-clock", at_profile_clock, POINTS),
                                   ("--pv-wait", pv_wait != "model", POINTS),
                                   ("--uncertainty", uncertainty, UNCERTAIN),
                                   ("--jobs", jobs is not None, UNCERTAIN)):
        other = sorted({k for k in kinds if k not in concern})
        if given and other:
            raise InputError(option, f"applies to {' and '.join(concern)} files only, not {', '.join(other)}")
    if plot_path:
        if any(k not in PLOTS for k in kinds):
            raise InputError("plot", f"--plot draws kinds {', '.join(sorted(PLOTS))}; "
                                     f"{', '.join(sorted(set(kinds) - PLOTS))} files have no plot")
        if len(docs) > 1 and any(k != "loop_intervals" for k in kinds):
            raise InputError("plot", "--plot with several files needs them all to be loop_intervals files "
                                     "(their per-SM knob deltas are drawn together); give one file otherwise")
    results, per_sm = [], []
    for path, doc in docs:
        if len(docs) > 1 and not as_json:
            print(f"== {path}", file=out)
        result = _guarded(path, doc, lambda: compare(doc, hw, at_profile_clock, pv_wait, overrides, uncertainty, jobs))
        if result["kind"] == "loop_intervals":
            per_sm.append(result)
        elif plot_path:
            _guarded(path, doc, lambda: plot(result, plot_path))
        results.append(result)
        if not as_json:
            print(_guarded(path, doc, lambda: report(result)), file=out)
    several = (", ".join(paths), {"meta": {"kind": "loop_intervals"}})  # what the per-SM deltas come from
    if plot_path and per_sm:
        _guarded(*several, lambda: plot_knob_deltas(per_sm, plot_path))
    if as_json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=1), file=out)
        return 0
    if len(per_sm) > 1:
        print(_guarded(*several, lambda: report_scoreboard(knob_scoreboard(per_sm), len(per_sm))), file=out)
    if plot_path:
        print(f"wrote {plot_path}", file=out)
    return 0
