"""How much a prediction rests on what is not known: a band on time, TFLOP/s and clock.

Every hardware parameter has a range, the span its value plausibly lies in:
- the range its profile states ("range": [lo, hi]: an assumed value, sources that disagree);
- else one its confidence sets, RELATIVE of the value either side (H: a datasheet or several
  agreeing measurements, M: one measurement, L: an inference or a guess);
- none (the value is exact) for a count (num_sms, the register file: integers), for a value of 0
  (a term not modelled), and for what the user sets (--set).

The band is first order: each parameter moves alone to either end of its range, the others at
their values, and the deviations combine as independent errors do, the root of the sum of their
squares, the slower and the faster side apart. So it is a sensitivity band, not a bound: two
parameters that only matter together (two latencies hiding each other) are missed, and ranges
are taken as plausible, not as hard, limits. The dominant parameters are those with the largest
share of the band's square.

Fast because most parameters do not change the schedule a tile runs (the power model's, the
memory rates'): every prediction of the band remembers engine runs in one memo
(steady_state.shared), and the rest run on worker processes (sweep.map_points).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import hardware, steady_state
from .errors import InputError

RELATIVE = {"H": 0.01, "M": 0.05, "L": 0.25}  # half-width of a range the profile does not state, by confidence
DOMINANT = 5  # parameters named as dominating the band


def range_of(profile: hardware.HardwareProfile, name: str) -> tuple[float, float, str]:
    """(lo, hi, why) of one parameter: the span its value plausibly lies in (lo == hi: exact)."""
    v = profile.values[name]
    if name in profile.ranges:
        lo, hi = profile.ranges[name]
        return lo, hi, "stated in the profile"
    spec = hardware.PARAMS[name]
    conf = profile.confidence.get(name, "?")
    if spec.integer or v == 0 or conf not in RELATIVE:
        why = ("a count" if spec.integer else "0: not modelled" if v == 0
               else "set by the user" if conf == "-" else f"confidence {conf!r}")
        return v, v, f"exact ({why})"
    r = RELATIVE[conf]
    return max(spec.lo, v * (1 - r)), min(spec.hi, v * (1 + r)), f"confidence {conf}: +-{r:.0%}"


@dataclass
class Deviation:
    """One parameter at the ends of its range: the prediction's time there, relative to the
    nominal one (+0.05: 5 % slower), and the clock's, in GHz."""

    name: str
    value: float
    lo: float
    hi: float
    why: str
    time_at_lo: float
    time_at_hi: float
    clock_at_lo: float
    clock_at_hi: float

    @property
    def slower(self) -> float:
        return max(0.0, self.time_at_lo, self.time_at_hi)

    @property
    def faster(self) -> float:
        return max(0.0, -self.time_at_lo, -self.time_at_hi)


@dataclass
class Band:
    time_us: float           # the nominal prediction
    time_low_us: float       # the fastest side of the band
    time_high_us: float      # the slowest
    tflops: float
    tflops_low: float
    tflops_high: float
    clock_ghz: float
    clock_low_ghz: float
    clock_high_ghz: float
    deviations: list         # Deviation per parameter with a range, largest first
    exact: list              # parameters without a range (name, why)

    @property
    def dominant(self) -> list[tuple[str, float]]:
        """(parameter, share of the band's square), the largest first."""
        total = sum(d.slower ** 2 + d.faster ** 2 for d in self.deviations) or 1.0
        return [(d.name, (d.slower ** 2 + d.faster ** 2) / total) for d in self.deviations[:DOMINANT]
                if d.slower or d.faster]

    def to_json(self) -> dict:
        return {"time_low_us": round(self.time_low_us, 3), "time_high_us": round(self.time_high_us, 3),
                "tflops_low": round(self.tflops_low, 3), "tflops_high": round(self.tflops_high, 3),
                "clock_low_ghz": round(self.clock_low_ghz, 4), "clock_high_ghz": round(self.clock_high_ghz, 4),
                "dominant_params": [{"name": n, "share": round(s, 4)} for n, s in self.dominant],
                "params": [{"name": d.name, "value": d.value, "range": [d.lo, d.hi], "why": d.why,
                            "time_at_lo": round(d.time_at_lo, 5), "time_at_hi": round(d.time_at_hi, 5)}
                           for d in self.deviations],
                "exact_params": [n for n, _ in self.exact]}


def _predict(task) -> tuple[float, float]:
    """(time_us, clock_ghz) of one prediction: a worker's task, module level so that it pickles."""
    from .model import simulate
    profile, schedule, problem, overrides, impl, pass_ = task
    with steady_state.shared():
        r = simulate(profile, schedule, problem, overrides, impl, pass_)
    return r.time_us, r.clock_ghz


def band(hw, schedule=None, problem=None, overrides: dict | None = None, impl=None, pass_: str = "fwd",
         jobs: int | None = None, progress: bool = False, nominal=None) -> Band:
    """The band of one prediction (simulate's arguments). `nominal`: that prediction's Result, if
    already made (else it is made here). jobs: worker processes (None: one per core)."""
    from .model import simulate
    from .sweep import map_points
    profile = hw if isinstance(hw, hardware.HardwareProfile) else hardware.load(hw)
    overrides = dict(overrides or {})
    set_here = {k for k in overrides if k in hardware.PARAMS}
    with steady_state.shared():  # forked workers inherit the nominal prediction's engine runs
        if nominal is None:
            nominal = simulate(profile, schedule, problem, overrides, impl, pass_)
        forced = "clock_ghz" in overrides
        spans, exact = [], []
        for name in hardware.PARAMS:
            lo, hi, why = range_of(profile, name)
            if name in set_here:
                lo = hi = profile.values[name]
                why = "exact (set by the user)"
            elif forced and name in hardware.POWER_PARAMS:
                lo = hi = profile.values[name]
                why = "exact (no power model: the clock is set)"
            if lo == hi:
                exact.append((name, why))
            else:
                spans.append((name, lo, hi, why))
        impl_name = getattr(nominal.impl, "name", impl)
        tasks = [(profile.with_values(**{n: end}), schedule, problem, overrides, impl_name, pass_)
                 for n, lo, hi, _ in spans for end in (lo, hi)]
        try:
            out = map_points(_predict, tasks, jobs=jobs, progress=progress, what="predictions")
        except InputError as e:  # a parameter at an end of its range that the model refuses
            raise InputError(e.param, f"{str(e).split(': ', 1)[-1]} (at an end of its range, in --uncertainty)") from None
    t0, f0 = nominal.time_us, nominal.clock_ghz
    devs = []
    for i, (n, lo, hi, why) in enumerate(spans):
        (t_lo, f_lo), (t_hi, f_hi) = out[2 * i], out[2 * i + 1]
        devs.append(Deviation(n, profile.values[n], lo, hi, why, t_lo / t0 - 1, t_hi / t0 - 1, f_lo, f_hi))
    devs.sort(key=lambda d: -(d.slower ** 2 + d.faster ** 2))
    slow = math.sqrt(sum(d.slower ** 2 for d in devs))
    fast = math.sqrt(sum(d.faster ** 2 for d in devs))
    t_hi, t_lo = t0 * (1 + slow), t0 * max(1e-3, 1 - fast)
    df_up = math.sqrt(sum(max(0.0, d.clock_at_lo - f0, d.clock_at_hi - f0) ** 2 for d in devs))
    df_dn = math.sqrt(sum(max(0.0, f0 - d.clock_at_lo, f0 - d.clock_at_hi) ** 2 for d in devs))
    tf = nominal.tflops
    return Band(t0, t_lo, t_hi, tf, tf * t0 / t_hi, tf * t0 / t_lo, f0, max(0.0, f0 - df_dn), f0 + df_up,
                devs, exact)
