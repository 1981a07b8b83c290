"""Implementations as data: what a real kernel chooses, for the schedule that models it.

A schedule (schedules/fa3_sm90.py, schedules/fa4_sm100.py) is the pipeline's structure and its
what-if knobs; an implementation (fa4sim/implementations/<name>.json) is one kernel's choices
within it (fa4kernel's SM90 forward, flash-attn-4's SM90 and SM100 forwards): its tile per head
dim, launch style and tile order, and the constants measured on it (prologue cycles, the O
store, bookkeeping instruction counts, where ptxas put the PV wait). Same format as the hardware
profiles: every entry has a value, a source and a confidence (H, M, L).

A value is a constant, or one of two small forms that depend on the problem and the knobs
resolved so far:
  {"by_hdim": {"64": V, "128": V, ...}}              the entry for the problem's head dim
  {"by_hdim_upto": {"64": V, "96": V, ...}}          the first entry whose head dim is >= the problem's
  {"rules": [{"when": {FACT: X, ...}, "value": V}, ...], "else": V}   the first rule that holds
  {"fact": NAME}                                     a fact the schedule derives (below)
FACT is a problem field (hdim, hdim_v, causal, seqlen_q, seqlen_k, page_size; is_varlen: a packed batch
of unequal lengths, whose seqlen_q / seqlen_k are its longest sequence's), a knob resolved before this
one, or a fact the schedule derives (its `facts()`, which schedules/__init__.py registers here:
o_fits, consumer_wgs); a suffix compares instead of testing equality: _gt, _ge, _le, _ne.

Tables measured on a kernel's compiled builds (SASS instruction counts, where ptxas put a wait)
are not written by hand: <name>.sass.json beside the implementation is generated from the
compiled kernels (its "generated" says by which command) and `load` merges it into the constants
of its pass. A table with "columns" gives one constant per column, as the form
  {"compiled": {"keys": [...], "fallbacks": [...], "rows": [...]}, "column": C}
the column of the row whose "build" equals the problem's and knobs' values of every key exactly
(a float written %g), else of the first fallback (knob values substituted) that names a row;
a table without gives its rows as the constant (the schedule matches them: pv_wait_sass).

The backward's choices sit in the file's "bwd" section, in the same form ("head_dims", "knobs",
"params", a "source"); `Implementation.for_pass("bwd")` gives an implementation whose knobs and
constants are those, for the schedule's backward (schedules.BWD_SCHEDULES).
"""
from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import InputError

IMPL_DIR = Path(__file__).parent / "implementations"
# a what-if may set a measured cost (cycles, instructions) from 0 to CONSTANT_SCALE times what was
# measured, a rate down to 1/CONSTANT_SCALE of it: a kernel two orders of magnitude off is another one
CONSTANT_SCALE = 100.0
# (schedule, pass) -> facts(ctx, knobs): what that schedule derives for an implementation's rules
# to test. Each schedule registers its own (schedules/__init__.py): data never imports a schedule.
FACTS: dict = {}
_OPS = {"_gt": lambda a, b: a > b, "_ge": lambda a, b: a >= b, "_le": lambda a, b: a <= b,
        "_ne": lambda a, b: a != b}
# constants the model divides by (a rate, a count per step): a what-if keeps them above 0
DIVISORS = ("_per_clk", "_splits_per_round", "_elems_per_trip", "_warps_per_row", "_splits_per_chunk")
GENERATED_SUFFIX = ".sass.json"  # <name>.sass.json: the tables generated from <name>'s compiled builds


@dataclass(frozen=True)
class Implementation:
    name: str          # e.g. fa4kernel-sm90
    kernel: str        # e.g. fa4kernel (what --impl accepts, with the arch from --hw)
    arch: str          # sm90 | sm100
    schedule: str      # the fa4sim schedule that models it
    description: str
    head_dims: tuple   # supported (hdim, hdim_v) pairs
    knobs: dict        # knob -> {"value", "source", "confidence"}: its choice of each what-if
    params: dict       # constant -> {"value", "source", "confidence"}: measured on it
    bwd: dict | None = None  # its backward's section ("head_dims", "knobs", "params"), if it has one
    varlen: bool = True      # it runs packed batches of unequal lengths (cu_seqlens); for_pass("bwd"):
                             # its backward does ("bwd" section's "varlen"; absent: it does not)
    paged_kv: bool = False   # its forward reads a paged KV cache through a page table ("paged_kv")
    pass_: str = "fwd"       # the pass these knobs and constants are for: fwd | bwd
    kernel_head_dims: tuple = ()  # the (hdim, hdim_v) pairs its build has a kernel for ("compiled_head_dims";
                                  # empty: every supported pair); another runs in the smallest that holds it

    def for_pass(self, pass_: str) -> "Implementation":
        """The implementation's choices for one pass: itself for the forward, its "bwd" section's
        head dims, knobs and constants (and whether it runs a varlen batch) for the backward."""
        if pass_ == "fwd":
            return self
        if not self.bwd:
            raise InputError("pass", f"{self.name} has no backward in fa4sim; allowed: --pass fwd")
        return replace(self, description=self.bwd.get("description", self.description),
                       head_dims=_head_dims(self.bwd["head_dims"]), knobs=self.bwd.get("knobs", {}),
                       params=self.bwd.get("params", {}), bwd=None, varlen=self.varlen_bwd, pass_=pass_)

    @property
    def varlen_bwd(self) -> bool:
        """Its backward runs packed batches of unequal lengths: the "bwd" section's "varlen" (absent: no)."""
        return bool(self.bwd and self.bwd.get("varlen", {"value": False})["value"])

    def check(self, problem) -> None:
        if (problem.hdim, problem.hdim_v) not in self.head_dims:
            dims = _describe(self.head_dims)
            raise InputError("hdim", f"{self.name} runs head dims {dims} (one number: hdim = hdim_v; "
                                     f"else hdim/hdim_v); got {problem.hdim}/{problem.hdim_v}")

    def kernel_problem(self, problem):
        """The problem as its kernel computes it: a supported head dim its build compiles no kernel
        for runs in the smallest compiled one that holds it (the extra columns zero-filled by the
        loads), with that head dim's tiles, GEMMs and loop; the FLOPs that count stay the asked ones."""
        dims = (problem.hdim, problem.hdim_v)
        if not self.kernel_head_dims or dims in self.kernel_head_dims:
            return problem
        holds = [d for d in self.kernel_head_dims if d[0] >= dims[0] and d[1] >= dims[1]]
        if not holds:
            raise InputError("hdim", f"{self.name} has no compiled kernel holding head dims {dims[0]}/{dims[1]}; "
                                     f"its build has {_describe(self.kernel_head_dims)}")
        h, hv = min(holds, key=lambda d: (d[0] + d[1], d[0]))
        return replace(problem, hdim=h, hdim_v=hv)

    def choose(self, knob: str, ctx, so_far: dict) -> tuple[bool, object]:
        """(True, value) where this implementation chooses `knob`, else (False, None)."""
        if knob not in self.knobs:
            return False, None
        return True, _evaluate(self.knobs[knob]["value"], ctx, so_far, f"{self.name}: {knob}")

    def value(self, name: str, ctx, knobs: dict):
        """One of its measured constants for this problem."""
        if name not in self.params:
            raise InputError("impl", f"{self.name} has no parameter {name!r}")
        return _evaluate(self.params[name]["value"], ctx, knobs, f"{self.name}: {name}")

    def check_value(self, name: str, value, origin: str = "--set"):
        """A what-if value for one of its measured constants (a number, or a --set string), of the
        kind its own value is: true or false for a flag; else a number (a whole one for bytes) from
        0 to CONSTANT_SCALE times what was measured, or for a rate or a count per step (a divisor:
        ..._per_clk, ..._splits_per_round, ..._elems_per_trip, ..._warps_per_row,
        ..._splits_per_chunk) at least 1/CONSTANT_SCALE of it, as large as
        wanted (1e9: free)."""
        if name not in self.params or isinstance(self.params[name]["value"], list):
            known = [n for n, e in self.params.items() if not isinstance(e["value"], list)]
            raise InputError(name, f"unknown parameter of {self.name}; known: {', '.join(known)}")
        measured = list(_leaves(self.params[name]["value"]))
        if all(isinstance(m, bool) for m in measured):
            text = str(value).strip().lower()
            if isinstance(value, bool) or text in ("true", "false"):
                return value if isinstance(value, bool) else text == "true"
            raise InputError(name, f"got {value!r} from {origin}; allowed: true or false")
        most = max(abs(m) for m in measured)
        lo, hi = (most / CONSTANT_SCALE, math.inf) if name.endswith(DIVISORS) else (0, most * CONSTANT_SCALE)
        integer = name.endswith("_bytes")
        try:
            v = float(value) if isinstance(value, str) else value
        except ValueError:
            v = None
        if (isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not lo <= v <= hi
                or (integer and v != int(v))):
            span = f">= {_num(lo)}" if hi == math.inf else f"{_num(lo)}..{_num(hi)}"
            raise InputError(name, f"got {value!r} from {origin}; allowed: {'an integer in ' if integer else ''}{span} "
                                   f"(measured on {self.name}: {_num(most)}{' at most' if len(measured) > 1 else ''})")
        return int(v) if integer else v

    def with_values(self, **values) -> "Implementation":
        """A copy with some measured constants changed (a what-if); their source becomes 'user override'."""
        params = {**self.params, **{k: {"value": self.check_value(k, v), "source": "user override (--set)",
                                        "confidence": "-"} for k, v in values.items()}}
        return replace(self, params=params)

    def to_json(self) -> dict:
        out = {"name": self.name, "kernel": self.kernel, "arch": self.arch, "schedule": self.schedule,
               "description": self.description, "head_dims": [list(d) for d in self.head_dims],
               "knobs": self.knobs, "params": self.params}
        if self.pass_ != "fwd":
            out["pass"] = self.pass_
        return out


def _num(x) -> str:
    """A number as a person writes it: 22937600 rather than 2.29376e+07."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _leaves(spec):
    """The values a constant's form (a value, by_hdim, rules) can give."""
    if isinstance(spec, dict) and ("by_hdim" in spec or "by_hdim_upto" in spec):
        for v in spec.get("by_hdim", spec.get("by_hdim_upto")).values():
            yield from _leaves(v)
    elif isinstance(spec, dict) and "compiled" in spec:
        for row in spec["compiled"]["rows"]:
            yield row[spec["column"]]
    elif isinstance(spec, dict) and "rules" in spec:
        for rule in spec["rules"]:
            yield from _leaves(rule["value"])
        yield from _leaves(spec["else"])
    else:
        yield spec


def _describe(pairs: tuple) -> str:
    """'64, 96, 128, 192/128' with runs of equal-step head dims shortened to '16-128 (step 16)'."""
    same = [d for d, dv in pairs if d == dv]
    parts, i = [], 0
    while i < len(same):
        j = i
        while j + 1 < len(same) and same[j + 1] - same[j] == 16:
            j += 1
        parts.append(f"{same[i]}-{same[j]} (step 16)" if j - i >= 3 else ", ".join(map(str, same[i:j + 1])))
        i = j + 1
    parts += [f"{d}/{dv}" for d, dv in pairs if d != dv]
    return ", ".join(parts)


def _evaluate(spec, ctx, knobs: dict, where: str):
    if not isinstance(spec, dict):
        return spec
    if "by_hdim" in spec:
        table = spec["by_hdim"]
        key = str(ctx.problem.hdim)
        if key not in table:
            raise InputError("hdim", f"{where} has no entry for head dim {ctx.problem.hdim}; "
                                     f"allowed: {', '.join(table)}")
        return _evaluate(table[key], ctx, knobs, where)
    if "by_hdim_upto" in spec:
        table = spec["by_hdim_upto"]
        bound = next((b for b in sorted(table, key=int) if ctx.problem.hdim <= int(b)), None)
        if bound is None:
            raise InputError("hdim", f"{where} covers head dims up to {max(table, key=int)}; got {ctx.problem.hdim}")
        return _evaluate(table[bound], ctx, knobs, where)
    if "fact" in spec:
        return _fact(spec["fact"], ctx, knobs)
    if "compiled" in spec:
        return compiled_row(spec["compiled"], ctx, knobs, where)[spec["column"]]
    if "rules" in spec:
        for rule in spec["rules"]:
            if all(_holds(fact, want, ctx, knobs) for fact, want in rule["when"].items()):
                return _evaluate(rule["value"], ctx, knobs, where)
        return _evaluate(spec["else"], ctx, knobs, where)
    return spec  # a plain mapping is a value (e.g. a table the schedule reads)


def discrete(value):
    """A value as the generated tables key it: a float (exp_emulation, rescale_threshold) written %g."""
    return format(value, "g") if isinstance(value, float) else value


def compiled_row(table: dict, ctx, knobs: dict, where: str) -> dict:
    """The row of a generated table for this problem and these knobs: the one whose build has
    their value of every key, else the first of the table's fallbacks (knob values substituted)
    that names a row."""
    want = {key: discrete(_fact(key, ctx, knobs)) for key in table["keys"]}
    for swap in [{}, *table.get("fallbacks", [])]:
        probe = {**want, **swap}
        row = next((r for r in table["rows"] if r["build"] == probe), None)
        if row is not None:
            return row
    shown = ", ".join(f"{k}={v}" for k, v in want.items())
    raise InputError("impl", f"{where}: no compiled build has {shown} (nor a fallback of it); the builds are "
                             f"those its generated SASS table lists")


def _holds(fact: str, want, ctx, knobs: dict) -> bool:
    op = next((s for s in _OPS if fact.endswith(s)), None)
    name = fact[: -len(op)] if op else fact
    have = _fact(name, ctx, knobs)
    return _OPS[op](have, want) if op else have == want


def _fact(name: str, ctx, knobs: dict):
    if name in knobs:
        return knobs[name]
    if hasattr(ctx.problem, name):
        return getattr(ctx.problem, name)
    derive = FACTS.get((ctx.impl.schedule, ctx.impl.pass_))  # the schedule derives the rest (o_fits, consumer_wgs)
    facts = derive(ctx, knobs) if derive is not None else {}
    if name not in facts:
        raise InputError("impl", f"{ctx.impl.name}: a rule tests {name!r}, which is neither a problem field, "
                                 f"a knob resolved before it, nor a fact of the {ctx.impl.schedule} schedule "
                                 f"({', '.join(facts)})")
    return facts[name]


def register_facts(schedule: str, pass_: str, facts) -> None:
    """Let the rules of implementations of `schedule` (pass_ "fwd" | "bwd") test what its
    facts(ctx, knobs) -> dict derives."""
    FACTS[(schedule, pass_)] = facts


def available() -> list[str]:
    return sorted(p.stem for p in IMPL_DIR.glob("*.json") if not p.name.endswith(GENERATED_SUFFIX))


def _merge_generated(data: dict, path: Path) -> dict:
    """The implementation's data with its generated tables (<name>.sass.json) among the constants
    of their pass: a table with "columns" as one "compiled" constant per column, else its rows."""
    if not path.exists():
        return data
    gen = json.loads(path.read_text())
    data = {**data, "params": dict(data.get("params", {}))}
    if "bwd" in data:
        data["bwd"] = {**data["bwd"], "params": dict(data["bwd"].get("params", {}))}
    for pass_, tables in gen.items():
        if pass_ == "generated":
            continue
        params = data["params"] if pass_ == "fwd" else data["bwd"]["params"]
        for name, table in tables.items():
            source = f"{path.name} ({gen['generated']}): {table['source']}"
            lookup = {k: table[k] for k in ("keys", "fallbacks", "rows") if k in table}
            entries = ({param: {"value": {"compiled": lookup, "column": column}, "source": source, "confidence": "H"}
                        for param, column in table["columns"].items()} if "columns" in table
                       else {name: {"value": table["rows"], "source": source, "confidence": "H"}})
            clash = sorted(set(entries) & set(params))
            if clash:
                raise InputError("impl", f"{data['name']}: {', '.join(clash)} both in its file and in {path.name}")
            params.update(entries)
    return data


def _head_dims(entries: list) -> tuple:
    """(hdim, hdim_v) pairs from a list of pairs and ranges {"hdim": [lo, hi, step]} (hdim_v = hdim)."""
    out = []
    for e in entries:
        if isinstance(e, dict):
            lo, hi, step = e["hdim"]
            out += [(d, d) for d in range(lo, hi + 1, step)]
        else:
            out.append(tuple(e))
    return tuple(dict.fromkeys(out))


def _from_json(data: dict) -> Implementation:
    return Implementation(name=data["name"], kernel=data["kernel"], arch=data["arch"], schedule=data["schedule"],
                          description=data.get("description", ""), head_dims=_head_dims(data["head_dims"]),
                          knobs=data.get("knobs", {}), params=data.get("params", {}), bwd=data.get("bwd"),
                          varlen=bool(data.get("varlen", {"value": True})["value"]),
                          paged_kv=bool(data.get("paged_kv", {"value": False})["value"]),
                          kernel_head_dims=_head_dims(data.get("compiled_head_dims", {"value": []})["value"]))


def load(name: str, arch: str | None = None) -> Implementation:
    """An implementation by its full name (fa4kernel-sm90) or its kernel's name (fa4kernel,
    flash-attn-4) with the architecture of the hardware it runs on."""
    names = available()
    kernels = sorted({n.rsplit("-", 1)[0] for n in names})
    if not isinstance(name, str):
        raise InputError("impl", f"a kernel name ({', '.join(kernels)}), an implementation ({', '.join(names)}) "
                                 f"or an Implementation, got {name!r} ({type(name).__name__})")
    full = name if name in names else f"{name}-{arch}" if arch else name
    if full not in names:
        here = f" on {arch}" if arch else ""
        raise InputError("impl", f"unknown implementation {name!r}{here}; allowed: {', '.join(kernels)} "
                                 f"(with the arch of --hw) or {', '.join(names)}")
    impl = _from_json(_merge_generated(json.loads((IMPL_DIR / f"{full}.json").read_text()),
                                       IMPL_DIR / f"{full}{GENERATED_SUFFIX}"))
    if arch and impl.arch != arch:
        raise InputError("impl", f"{full} is an {impl.arch} kernel but the hardware is {arch}")
    return impl
