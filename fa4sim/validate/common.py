"""What every evidence kind shares: the profile for a device, the model knobs for a kernel as it
ran (the one place that knows fa4kernel's and flash-attn-4's knob names), progress on stderr and
the plots' common finish."""
from __future__ import annotations

import statistics
import sys

from .. import hardware
from ..errors import InputError
from ..model import simulate

# the kernels a result file names, each simulated as its implementation (fa4sim/implementations/:
# flash-attn-4's one CTA per tile, its LPT order and its SASS's bookkeeping counts are data there)
SIMULATED = {"fa4kernel": "our SM90 kernel", "flash-attn-4": "flash-attn-4 SM90"}
# fields of fa4kernel's recorded configuration that the fa3 schedule takes as knobs of the same
# name (skip_idle_wgs: the kernel idles warpgroups without rows; recorded by the benchmarks)
KNOB_NAMES = {"tile_m", "tile_n", "kv_stages", "pingpong", "intra_wg_overlap", "p_in_registers",
              "exp_emulation", "rescale_threshold", "rescale_before_pv", "early_q_release",
              "defer_o_store_wait", "persistent", "skip_idle_wgs"}
# fa4kernel's ablation builds (its diagnostic ablate) and the fa3 schedule's matching what-ifs
ABLATION_KNOBS = {"max": {"ablate": "max"}, "exp": {"ablate": "exp"}, "sum": {"ablate": "sum"},
                  "rescale": {"rescale_rate": 0.0}}
PV_WAIT = ("model", "sass")


_PREDICTED: dict = {}  # predict's memo: (hw, schedule, problem, knobs, impl, pass) -> Result or InputError
PREDICTED_MAX = 4096


def predict(hw, schedule, problem, knobs: dict, impl=None, pass_: str = "fwd"):
    """simulate(hw, schedule, problem, knobs, impl=impl, pass_=pass_), remembered over the process:
    the recorded files repeat their problems (two runs of one grid per GPU, a probe row beside its
    plain row), and a prediction depends on nothing else. Only for a built-in profile name (a .json
    path may change on disk, a HardwareProfile is the caller's); a knob value that does not hash is
    simulated each time. An InputError is remembered and raised again."""
    try:
        key = (hw, schedule, problem, tuple(sorted(knobs.items())), impl, pass_)
        hash(key)
    except TypeError:
        key = None
    if key is None or not isinstance(hw, str) or hw not in hardware.available():
        return simulate(hw, schedule, problem, knobs, impl=impl, pass_=pass_)
    if key not in _PREDICTED:
        if len(_PREDICTED) >= PREDICTED_MAX:
            _PREDICTED.clear()
        try:
            _PREDICTED[key] = simulate(hw, schedule, problem, knobs, impl=impl, pass_=pass_)
        except InputError as e:
            _PREDICTED[key] = e
    got = _PREDICTED[key]
    if isinstance(got, InputError):
        raise got
    return got


def profile_for(device: str) -> str:
    """Built-in profile for a device name: the calibrated one (h100, h200), else b200."""
    d = device.lower()
    base = "h200" if "h200" in d else "h100" if "h100" in d else "b200" if "b200" in d else None
    if base is None:
        raise InputError("hw", f"cannot tell the profile for device {device!r}; pass --hw")
    return base


def ablations(recorded: dict) -> list[str]:
    """The ablation builds named in a recorded configuration ('max,exp' -> ['max', 'exp'])."""
    return [a for a in (recorded.get("ablate") or "").split(",") if a]


def has_model_twin(recorded: dict) -> bool:
    """Whether the fa3 schedule can stand for this build: not the wgmma skeleton (skip_softmax),
    no ablation without a what-if knob (the vote ablations), no kernel knob it does not model
    (recorded in 'knobs', e.g. a prototype since removed)."""
    return (not recorded.get("skip_softmax") and all(a in ABLATION_KNOBS for a in ablations(recorded))
            and all(k in KNOB_NAMES for k in recorded.get("knobs") or {}))


def model_knobs(kernel: str, recorded: dict | None = None) -> dict:
    """The what-ifs over `kernel`'s implementation (simulate(..., impl=kernel)) that stand for it
    as it ran. fa4kernel: the fields of its recorded configuration that are knobs (KNOB_NAMES; the
    kernel's rescale_threshold 0 means 'always rescale', the model's None), its ablation builds, and
    the recorded build that forced the exp2s ahead of the PV wait (pv_wait=after_softmax).
    flash-attn-4: none (nothing is recorded; its implementation has its choices)."""
    if kernel == "flash-attn-4":
        return {}
    if kernel != "fa4kernel":
        raise InputError("kernel", f"no model of {kernel!r}; one of {', '.join(SIMULATED)}")
    rec = recorded or {}
    knobs = {k: v for k, v in rec.items() if k in KNOB_NAMES}
    # a record without rescale_threshold ran before conditional rescaling became the default
    # (the benches record the resolved configuration since): it rescaled always
    if knobs.get("rescale_threshold", 0.0) in (0, 0.0):
        knobs["rescale_threshold"] = None
    free = [ABLATION_KNOBS[a].get("ablate") for a in ablations(rec)]
    if any(free):
        knobs["ablate"] = ",".join(sorted(a for a in free if a))
    if "rescale" in ablations(rec):
        knobs.update(ABLATION_KNOBS["rescale"])
    if rec.get("exp_before_pv_wait"):
        knobs["pv_wait"] = "after_softmax"
    return knobs


def recorded_tau(rec: dict) -> dict:
    """The rescale_threshold a record carries, as a knob ({} where it has none: model_knobs then
    takes it as always rescaling)."""
    return {"rescale_threshold": rec["rescale_threshold"]} if "rescale_threshold" in rec else {}


def kernel_knobs(point: dict) -> dict:
    """Our kernel's configuration at an end-to-end point as it ran (its recorded fa4kernel_config
    over the knobs it was given), as model knobs."""
    return model_knobs("fa4kernel", {**(point.get("knobs") or {}), **(point.get("fa4kernel_config") or {})})


# --pv-wait sass: each build at the position ptxas compiled it to (its implementation's
# pv_wait_sass table; its head dim's default build where the variant is not in the table)
COMPILED_PV_WAIT = {"pv_wait": "compiled"}


def progress(i: int, n: int, what: str = "point") -> None:
    """'point i/n' on stderr while a file's simulations run: one updating line on a terminal,
    about ten lines otherwise; nothing for a single simulation."""
    if n < 2:
        return
    if sys.stderr.isatty():
        print(f"\rvalidate: {what} {i}/{n}", end="\n" if i == n else "", file=sys.stderr, flush=True)
    elif i == n or i == 1 or i % max(1, n // 10) == 0:
        print(f"validate: {what} {i}/{n}", file=sys.stderr, flush=True)


def verdict(d: dict) -> str:
    return f"{'same sign' if d['same_sign'] else 'WRONG SIGN'}, off by {d['difference_pp']:+.1f} pp"


def pyplot():
    """matplotlib's pyplot on the file backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, ax, path: str, **legend) -> str:
    """The validation plots' common finish: legend (extra keywords place it), grid, PNG at 120 dpi."""
    plt = pyplot()
    ax.legend(fontsize=7, **legend)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def error_stats(values: list[float]) -> dict | None:
    """The median and largest |relative error| of the values given (None skipped; none: None)."""
    v = [abs(x) for x in values if x is not None]
    return {"median_abs_error": statistics.median(v), "max_abs_error": max(v), "count": len(v)} if v else None


def error_line(label: str, s: dict | None, what: str = "points") -> str:
    """One report line for error_stats' summary."""
    return (f"{label}: median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%} over {s['count']} "
            f"{what}" if s else f"{label}: none")
