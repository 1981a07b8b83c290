"""The attention problem and the schedule knobs: names, defaults, units, allowed values.

Every knob is reachable from the CLI as `--set NAME=VALUE`; `fa4sim params` prints this table.
Parsing and checking live here so every bad value gets the same one-line error.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from .errors import InputError
from .flops import attention_flops


# the longest sequence, and the most Q tiles in a launch, fa4sim simulates: beyond them one
# prediction takes seconds to minutes (a property of the simulator, not of the GPU); past a few
# waves of tiles per SM the TFLOP/s hardly change, so fewer heads or a smaller batch answer the same
MAX_SEQLEN = 1 << 20
MAX_TILES = 1 << 17
# the most an integer knob without a maximum of its own counts (kv_stages: stages of a shared-memory
# ring, hundreds at most before they overflow any SM's shared memory; the fit check walks them all)
MAX_COUNT = 1 << 12


@dataclass(frozen=True)
class Problem:
    """Attention forward: q (batch, seqlen_q, heads, hdim), k (batch, seqlen_k, heads_kv, hdim) and
    v (batch, seqlen_k, heads_kv, hdim_v); hdim_v defaults to hdim (it differs in DeepSeek's 192/128),
    heads_kv to heads (fewer: grouped K/V heads, GQA; 1: MQA). heads_kv divides heads: q head h
    reads K/V head h // (heads // heads_kv)."""

    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    hdim: int
    causal: bool = False
    hdim_v: int | None = None
    heads_kv: int | None = None
    # a packed batch of unequal lengths (varlen): one (seqlen_q, seqlen_k) pair per sequence; batch
    # is then their count and seqlen_q, seqlen_k the longest (Problem.varlen builds it)
    seqlens: tuple | None = None
    # tokens per page of a paged KV cache (K and V in pages read through a page table, as vLLM and
    # SGLang keep them); 0: one contiguous cache per sequence
    page_size: int = 0

    def __post_init__(self):
        if self.seqlens is not None:
            object.__setattr__(self, "seqlens", check_seqlens(self.seqlens))
            want = {"batch": len(self.seqlens), "seqlen_q": max(q for q, _ in self.seqlens),
                    "seqlen_k": max(k for _, k in self.seqlens)}
            for name, v in want.items():
                if getattr(self, name) != v:
                    raise InputError(name, f"with seqlens it is {v} (the sequences' {'count' if name == 'batch' else 'longest'}), "
                                           f"got {getattr(self, name)!r}; Problem.varlen sets it")
        if self.hdim_v is None:
            object.__setattr__(self, "hdim_v", self.hdim)
        if self.heads_kv is None:
            object.__setattr__(self, "heads_kv", self.heads)
        for name in ("batch", "heads", "seqlen_q", "seqlen_k", "hdim", "hdim_v", "heads_kv"):
            v = getattr(self, name)
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
                raise InputError(name, f"must be a positive integer, got {v!r}")
            object.__setattr__(self, name, int(v))  # numpy's integers too
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, numbers.Integral) or \
                not 0 <= self.page_size <= MAX_SEQLEN:
            raise InputError("page_size", f"tokens per page of a paged KV cache, 0 (contiguous) to {MAX_SEQLEN}; "
                                          f"got {self.page_size!r}")
        object.__setattr__(self, "page_size", int(self.page_size))
        if self.heads % self.heads_kv:
            raise InputError("heads_kv", f"must divide heads ({self.heads}): one of "
                                         f"{', '.join(str(d) for d in _divisors(self.heads))}; got {self.heads_kv}")
        for name in ("seqlen_q", "seqlen_k"):
            if getattr(self, name) > MAX_SEQLEN:
                raise InputError(name, f"at most {MAX_SEQLEN} tokens per sequence (a longer one has millions of "
                                       f"tiles to simulate), got {getattr(self, name)}")
        if not isinstance(self.causal, bool):  # numpy's bool (a 0-d bool) is one too
            if getattr(getattr(self.causal, "dtype", None), "kind", None) != "b" or getattr(self.causal, "shape", ()) != ():
                raise InputError("causal", f"must be true or false, got {self.causal!r}")
            object.__setattr__(self, "causal", bool(self.causal))

    @classmethod
    def varlen(cls, heads: int, hdim: int, seqlens, seqlens_k=None, causal: bool = False, hdim_v: int | None = None,
               heads_kv: int | None = None, page_size: int = 0) -> "Problem":
        """A packed batch of unequal lengths: seqlens the per-sequence query lengths (or (seqlen_q,
        seqlen_k) pairs), seqlens_k the key lengths (default: the query lengths)."""
        pairs = pair_seqlens(seqlens, seqlens_k)
        return cls(len(pairs), heads, max(q for q, _ in pairs), max(k for _, k in pairs), hdim, causal, hdim_v,
                   heads_kv, pairs, page_size)

    @property
    def is_paged(self) -> bool:
        """K and V in pages of page_size tokens, read through a page table."""
        return self.page_size > 0

    @property
    def is_varlen(self) -> bool:
        """A packed batch of unequal lengths (seqlens given)."""
        return self.seqlens is not None

    @property
    def sequences(self) -> tuple:
        """(seqlen_q, seqlen_k) per sequence: the varlen pairs, or batch equal ones."""
        return self.seqlens if self.seqlens is not None else ((self.seqlen_q, self.seqlen_k),) * self.batch

    @property
    def heads_per_kv(self) -> int:
        """Q heads sharing one K/V head (1: MHA; heads: MQA)."""
        return self.heads // self.heads_kv

    @property
    def flops(self) -> float:
        """2 * b * h * (d + dv) * the (query, key) pairs the mask leaves visible (the two GEMMs;
        causal: bottom-right aligned as in flash_attn and fa4kernel, counted exactly: fa4sim/flops.py)."""
        if self.seqlens is not None:
            return sum(attention_flops(1, self.heads, q, k, self.hdim, self.hdim_v, self.causal) for q, k in self.seqlens)
        return attention_flops(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.hdim, self.hdim_v,
                               self.causal)

    @property
    def kv_bytes(self) -> int:
        """K and V of every sequence in bf16: sum of seqlen_k x heads_kv x (hdim + hdim_v) x 2 bytes."""
        return sum(k for _, k in self.sequences) * self.heads_kv * (self.hdim + self.hdim_v) * 2


def _length(name: str, i: int, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise InputError(name, f"sequence {i}: a length must be a positive integer, got {v!r}")
    if v < 1:
        raise InputError(name, f"sequence {i}: a length must be >= 1 token, got {v}")
    if v > MAX_SEQLEN:
        raise InputError(name, f"sequence {i}: at most {MAX_SEQLEN} tokens, got {v}")
    return int(v)


def check_seqlens(seqlens) -> tuple:
    """A varlen batch's (seqlen_q, seqlen_k) pairs, checked: at least one sequence, each length
    a positive integer."""
    if isinstance(seqlens, (str, bytes)) or not hasattr(seqlens, "__iter__"):
        raise InputError("seqlens", f"a list of (seqlen_q, seqlen_k) pairs, got {seqlens!r}")
    pairs = list(seqlens)
    if not pairs:
        raise InputError("seqlens", "empty: a varlen batch needs at least one sequence")
    out = []
    for i, pr in enumerate(pairs):
        if not isinstance(pr, (tuple, list)) or len(pr) != 2:
            raise InputError("seqlens", f"sequence {i}: a (seqlen_q, seqlen_k) pair, got {pr!r}")
        out.append((_length("seqlens", i, pr[0]), _length("seqlens_k", i, pr[1])))
    return tuple(out)


def pair_seqlens(seqlens, seqlens_k=None) -> tuple:
    """Query lengths (or pairs) and optional key lengths -> checked (seqlen_q, seqlen_k) pairs."""
    if isinstance(seqlens, (str, bytes)) or not hasattr(seqlens, "__iter__"):
        raise InputError("seqlens", f"a list of lengths, got {seqlens!r}")
    qs = list(seqlens)
    if qs and all(isinstance(x, (tuple, list)) for x in qs):
        if seqlens_k is not None:
            raise InputError("seqlens_k", "given twice: the pairs in seqlens already hold the key lengths")
        return check_seqlens(qs)
    if seqlens_k is None:
        return check_seqlens([(q, q) for q in qs])
    if isinstance(seqlens_k, (str, bytes)) or not hasattr(seqlens_k, "__iter__"):
        raise InputError("seqlens_k", f"a list of lengths, got {seqlens_k!r}")
    ks = list(seqlens_k)
    if len(ks) != len(qs):
        raise InputError("seqlens_k", f"{len(ks)} key lengths for {len(qs)} sequences: give one per sequence")
    return check_seqlens(list(zip(qs, ks)))


@dataclass(frozen=True)
class Context:
    """What a knob's default may depend on: the problem, the hardware profile and the
    implementation being simulated (fa4sim/implementation.py)."""

    problem: Problem
    hw: Any
    impl: Any


@dataclass(frozen=True)
class Knob:
    """A schedule parameter: a what-if a user can --set. `default` is a value or a function
    (ctx, knobs) -> value, where knobs holds the values given and the defaults of the knobs listed
    before it; an implementation's own choice (its JSON) comes before this default."""

    name: str
    default: Any
    unit: str
    doc: str
    kind: str = "int"  # int | float | bool | fraction | float_or_none | choice | text (see `convert`)
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple = field(default=())
    convert: Any = None  # kind "text": str -> canonical value, raises InputError

    def default_for(self, ctx: Context, knobs: dict | None = None):
        return self.default(ctx, knobs or {}) if callable(self.default) else self.default

    def parse(self, text: str):
        """Turn a --set string into a checked value."""
        t = str(text).strip()
        if self.kind in ("choice", "text"):
            return self.check(t)
        if self.kind == "bool":
            return parse_bool(self.name, t)
        if self.kind == "float_or_none" and t.lower() in ("none", "off", "always"):
            return None
        try:
            v = float(t)
        except ValueError:
            allowed = f"a {self.describe()}" if self.kind == "float_or_none" else f"a number ({self.describe()})"
            raise InputError(self.name, f"must be {allowed}, got {text!r}") from None
        return self.check(v)

    def check(self, v):
        """Check a value (from --set or from Python) and normalise its type."""
        if self.kind == "bool":
            if isinstance(v, bool):
                return v
            raise InputError(self.name, f"must be true or false, got {v!r}")
        if self.kind == "choice":
            if v in self.choices:
                return v
            raise InputError(self.name, f"must be one of {', '.join(map(str, self.choices))}, got {v!r}")
        if self.kind == "text":
            if not isinstance(v, str):
                raise InputError(self.name, f"must be a string, got {v!r}")
            return self.convert(v)
        if v is None:
            if self.kind == "float_or_none":
                return None
            raise InputError(self.name, f"must be a number ({self.describe()}), got None")
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            raise InputError(self.name, f"must be a finite number ({self.describe()}), got {v!r}")
        if self.kind == "int":
            if v != int(v):
                raise InputError(self.name, f"must be an integer ({self.describe()}), got {v}")
            v = int(v)
        lo, hi = self.minimum, self.maximum
        if self.kind == "fraction":
            lo, hi = 0.0, 1.0
        if self.kind == "int" and hi is None:
            hi = MAX_COUNT
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            if hi is None:
                raise InputError(self.name, f"must be >= {lo:g}, got {_num(v)}")
            if lo is None:
                raise InputError(self.name, f"must be <= {hi:g}, got {_num(v)}")
            raise InputError(self.name, f"must be in {lo:g}..{hi:g}, got {_num(v)}")
        if self.choices and v not in self.choices:
            raise InputError(self.name, f"must be one of {list(self.choices)}, got {v}")
        return v

    def describe(self) -> str:
        if self.kind == "bool":
            return "true|false"
        if self.kind == "fraction":
            return "0..1"
        if self.choices:
            return "|".join(str(c) for c in self.choices)
        if self.kind == "text":
            return "text"
        hi = MAX_COUNT if self.kind == "int" and self.maximum is None else self.maximum
        span = ("" if self.minimum is None and hi is None else f"<= {hi:g}" if self.minimum is None
                else f">= {self.minimum:g}" if hi is None else f"{self.minimum:g}..{hi:g}")
        return ("number or none " if self.kind == "float_or_none" else f"{self.kind} ") + span


def _divisors(n: int, most: int = 12) -> list:
    """n's divisors, the first and last few where it has many (an error message's list)."""
    ds = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    ds = sorted(set(ds) | {n // d for d in ds})
    return ds if len(ds) <= most else ds[:most // 2] + ["..."] + ds[-(most // 2):]


def _num(x) -> str:
    """A number as given: 1000000000 rather than 1e+09."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def parse_bool(name: str, text: str) -> bool:
    """A true/false written on the command line (--set, --grid)."""
    low = str(text).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise InputError(name, f"must be true or false, got {text!r}")


def resolve(knobs: list[Knob], ctx: Context, given: dict[str, Any]) -> dict[str, Any]:
    """The knobs for this problem, in order: the value given (a --set string or a Python value),
    else the implementation's choice, else the schedule's default."""
    by_name = {k.name: k for k in knobs}
    chosen = {}
    for name, v in given.items():
        if name not in by_name:
            raise InputError(name, f"unknown schedule knob; known: {', '.join(by_name)}")
        chosen[name] = by_name[name].parse(v) if isinstance(v, str) else by_name[name].check(v)
    out: dict[str, Any] = {}
    for k in knobs:
        if k.name in chosen:
            out[k.name] = chosen[k.name]
            continue
        so_far = {**out, **chosen}
        chosen_by_impl, value = ctx.impl.choose(k.name, ctx, so_far) if ctx.impl is not None else (False, None)
        out[k.name] = k.check(value) if chosen_by_impl else k.default_for(ctx, so_far)
    return out
