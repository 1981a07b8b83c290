"""Fit fa4sim's power model (fa4sim/power.py) to a power calibration file; optionally write it.

    python -m lab.tools.calibrate.fit_power RESULTS.json [--profile fa4sim/profiles/h100.json --write]

RESULTS.json is what lab/tools/calibrate/bench_power.py writes (meta.kind "power"): unit loads,
each with its chip-wide activity per SM clock, the clock it ran at (in the kernel: clock64 over
globaltimer; else NVML's) and its board power (NVML's energy counter over the run). The model

    P(f) = static + s (f/fmax) clock_power + 1e-3 f (s sum_u e_u r_u + e_l2 b_l2 + (f/fmax) e_hbm b_hbm),
    s = (1 - voltage_slope (1 - f/fmax))^2

is linear in static, clock_power and the energies once voltage_slope is fixed. So: for every
voltage_slope on a grid over [0, 1] (step 0.005), a non-negative least-squares fit of those nine
to every load's measured power at its measured clock, minimising the relative residuals; the
slope with the least residual wins. A load held at the cap constrains the model through its
clock this way: its power is the cap at the clock measured.

It prints, per load: the measured clock and power, the model's power at that clock, the clock
the model predicts from the load's activity alone (the highest clock under the cap) and, with the
load left out of the fit, that prediction again (leave-one-out). A load's activity per SM clock
is taken as fixed when the clock moves (true of compute loads; a memory-bound load's bytes per SM
clock would rise at a lower clock).

--write puts the fitted values, voltage_slope and clock_min_ghz (the lowest supported clock)
into the profile, each with its source, confidence M. Nothing here looks at an attention timing.

The tensor core's clock ceiling (clock_tensor_ghz, tensor_ceiling below) comes from the same
files: the median in-kernel clock of the loads whose tensor core works (at least 5 % of its rate)
while NVML reports the maximum clock and no clock-event reason (neither the power cap nor a
thermal limit holds them), whose clock is the kernel's own (no warp asleep in nanosleep). The
held cap (cap_held_fraction, cap_held below) is the median board power of the loads the cap
holds over the limit: the cap's controller keeps them a little below it.

The idle tensor core's term: a duty-cycled load's gaps draw tensor_idle_power_fraction of the
tensor core's busy power over its idle cycles, weighted by L0/(L0 + g) for gaps of g cycles
(idle_rate), where the SM stays clocked (the gaps spin on clock64, or stream warps run beside).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from fa4sim import hardware, power

# the linear parameters, in the order of the design matrix's columns
LINEAR = ("static_power_w", "clock_power_w", "energy_tensor_pj_per_flop", "energy_mufu_pj_per_op",
          "energy_fma_pj_per_lane_op", "energy_alu_pj_per_lane_op", "energy_smem_pj_per_byte",
          "energy_l2_pj_per_byte", "energy_hbm_pj_per_byte")
UNIT_OF = {"energy_tensor_pj_per_flop": "tensor", "energy_mufu_pj_per_op": "mufu",
           "energy_fma_pj_per_lane_op": "fma", "energy_alu_pj_per_lane_op": "alu",
           "energy_smem_pj_per_byte": "smem", "energy_l2_pj_per_byte": "l2", "energy_hbm_pj_per_byte": "hbm"}
SLOPES = np.round(np.arange(0.0, 1.0 + 1e-9, 0.005), 3)
MIXED = np.round(np.arange(0.0, 1.0 + 1e-9, 0.05), 3)     # mixed_code_energy_fraction grid
GAP_CYCLES = tuple(2.0 ** k for k in range(10, 19))  # tensor_idle_gap_cycles (L0) grid: 1k .. 256k
KB_WGMMAS = 8  # wgmma per trip of bench_power's tensor loads
IDLE_AND_MIXED = ("tensor_idle_power_fraction", "tensor_idle_gap_cycles", "mixed_code_energy_fraction")

# The B200's power model from the H100's (docs/reference/hardware.md, "Power"): the same TSMC
# 4N-class process; dense BF16 energy per FLOP at the rated points, all in, B200 / H100
TENSOR_RATIO = round((1000 / 2250) / (700 / 989.4), 3)   # 0.444 / 0.708 pJ per FLOP
BOARD_RATIO = round(1000 / 700, 3)                        # board power limits, W


class BadInput(ValueError):
    """A calibration file or option we cannot use: one line."""


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(m, n)
    max_iter = max_iter or 3 * n
    for _ in range(max_iter):
        if passive.all() or (w[~passive] <= tol).all():
            break
        j = np.argmax(np.where(passive, -np.inf, w))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > tol).all():
                break
            neg = passive & (z <= tol)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = z
        w = a.T @ (b - a @ x)
    return x


def idle_rate(ld: dict, L0: float) -> float:
    """A load's weighted idle tensor-core cycles per SM clock x its peak FLOPs per clock (the
    fa4sim.power "tensor_idle" rate): (peak - its FLOPs per clock) x L0/(L0 + g), g the gap
    after each burst from its measured duty; 0 for a load without idle gaps, or whose gaps let
    the SM stop its clock (every warp asleep in nanosleep)."""
    L, peak = ld.get("burst_cycles"), ld.get("tensor_peak", 0.0)
    r = ld["rates"].get("tensor", 0.0)
    if not L or L0 <= 0 or not ld.get("clocked_gaps") or not 0 < r < peak:
        return 0.0
    gap = L * (peak - r) / r
    return (peak - r) * L0 / (L0 + gap)


def design(loads: list[dict], fmax: float, slope: float, mixed: float = 0.0, L0: float = 0.0,
           files: int = 1, idle: float | None = None) -> np.ndarray:
    """The rows of P = row . (static, clock_power, energies, idle energy, per-file static offsets)
    for each load at its measured clock; a mixed-code load's MUFU, FMA and ALU columns x (1 + mixed);
    with `idle` given (a fixed tensor_idle_power_fraction) the tensor column takes its FLOPs plus
    idle x its idle rate and the idle-energy column is 0."""
    rows = []
    for ld in loads:
        f, r = ld["f"], ld["rates"]
        s = (1.0 - slope * (1.0 - f / fmax)) ** 2
        row = [1.0, s * f / fmax]
        for name in LINEAR[2:]:
            u = UNIT_OF[name]
            k = 1.0 + mixed if (ld.get("mixed") and u in ("mufu", "fma", "alu")) else 1.0
            work = r.get(u, 0.0) + (idle * idle_rate(ld, L0) if u == "tensor" and idle is not None else 0.0)
            row.append(1e-3 * f * power.energy_scale(u, f, fmax, s) * k * work)
        # e_idle = fraction x e_tensor
        row.append(0.0 if idle is not None else 1e-3 * f * s * idle_rate(ld, L0))
        for i in range(1, files):  # another host (temperature, board): its own static power, +/-
            on = 1.0 if ld.get("file", 0) == i else 0.0
            row += [on, -on]
        rows.append(row)
    return np.array(rows)


def fit(loads: list[dict], fmax: float, slopes=SLOPES, mixed_grid=MIXED, cycles_grid=GAP_CYCLES,
        idle: float | None = None) -> tuple[dict, float]:
    """(parameter -> value, rms relative residual) of the best voltage_slope, mixed-code fraction and
    idle gap length L0 on their grids (each a non-negative least squares of the linear parameters)."""
    p = np.array([ld["power_w"] for ld in loads])
    files = 1 + max((ld.get("file", 0) for ld in loads), default=0)
    slopes = np.asarray(slopes, dtype=float)
    if len(slopes) > 40 and len(mixed_grid) * len(cycles_grid) > 1:  # coarse to fine: every 4th slope first
        coarse = fit(loads, fmax, slopes[::4], mixed_grid, cycles_grid, idle)[0]
        near = np.abs(slopes - coarse["voltage_slope"]) <= 4 * (slopes[1] - slopes[0]) + 1e-9
        return fit(loads, fmax, slopes[near], [coarse["mixed_code_energy_fraction"]],
                   [coarse["tensor_idle_gap_cycles"] or cycles_grid[0]], idle)
    best = None
    for L0 in cycles_grid:
        for mixed in mixed_grid:
            for slope in slopes:
                a = design(loads, fmax, float(slope), float(mixed), float(L0), files, idle) / p[:, None]
                x = nnls(a, np.ones(len(loads)))
                res = float(np.sqrt(np.mean((a @ x - 1.0) ** 2)))
                if best is None or res < best[4] - 1e-12:
                    best = (x, float(slope), float(mixed), float(L0), res)
    x, slope, mixed, L0, res = best
    values = {**dict(zip(LINEAR, map(float, x[:len(LINEAR)]))), "voltage_slope": slope}
    e_t = values["energy_tensor_pj_per_flop"]
    values["tensor_idle_power_fraction"] = (idle if idle is not None
                                            else float(x[len(LINEAR)]) / e_t if e_t > 0 else 0.0)
    values["tensor_idle_gap_cycles"] = L0 if values["tensor_idle_power_fraction"] > 0 else 0.0
    values["mixed_code_energy_fraction"] = mixed
    values["file_static_offsets_w"] = [float(x[len(LINEAR) + 1 + 2 * i] - x[len(LINEAR) + 2 + 2 * i])
                                       for i in range(files - 1)]
    return values, res


def prepare(loads: list[dict], base) -> None:
    """Give each load what its idle rate needs from the profile: its burst's cycles (burst FLOPs at
    the tensor core's rate) and its peak tensor FLOPs per clock (the rate x its SM count)."""
    for ld in loads:
        ld["burst_cycles"] = ld["burst_flops"] / base.tensor_flops_per_clk if ld.get("burst_flops") else None
        ld["tensor_peak"] = base.tensor_flops_per_clk * (ld.get("sms") or base.num_sms)


def model_hw(base: hardware.HardwareProfile, values: dict, cap: float, fmax: float, fmin: float):
    """The base profile with the fitted values, the device's cap and clock range, and no card term
    (card_power_w 0: the fit is of the cards its files measured)."""
    values = {k: v for k, v in values.items() if k != "file_static_offsets_w"}
    return base.with_values(**values, power_cap_w=cap, clock_ghz=fmax, clock_min_ghz=fmin, card_power_w=0.0)


def load_rates(ld: dict, values: dict) -> dict:
    """A load's activity as fa4sim.power.power_w takes it: its rates, idle rate and mixed flag."""
    return {**ld["rates"], "tensor_idle": idle_rate(ld, values.get("tensor_idle_gap_cycles", 0.0)),
            "mixed": 1.0 if ld.get("mixed") else 0.0}


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read_doc(path: str, kind: str, what: str, writer: str) -> dict:
    """The JSON document of a results file whose meta.kind is `kind` (`what` it is, and the
    script that writes one, for the error); or BadInput."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadInput(f"results: no such file {path!r}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"results: {path} is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("meta"), dict) or doc["meta"].get("kind") != kind:
        raise BadInput(f"results: {path} is not {what} (meta.kind must be \"{kind}\"; {writer} writes one)")
    return doc


def measured_on(meta: dict) -> str:
    """'measured on DEVICE' of a results file's meta, for a profile parameter's source: no date and
    no file name (fa4sim carries neither); campaign(meta) says where the files lie."""
    device = meta.get("device") or meta.get("gpu") or "an unnamed device"
    return f"measured on {device}"


def campaign(meta: dict) -> str:
    """The campaign folder of the results a fit read (meta "files": their paths), by default
    lab/campaigns/power-calibration/; its README keeps the runs' dates and names."""
    from lab.tools.index import campaign_of

    files = meta.get("files") or [""]
    return campaign_of(files[0], "power-calibration") if files[0] else "lab/campaigns/power-calibration/"


def read(path: str) -> tuple[dict, list[dict], dict]:
    """(gpu, loads, meta) of a calibration file, each load with f (GHz), power_w and rates; or BadInput."""
    doc = read_doc(path, "power", "a power calibration file", "lab/tools/calibrate/bench_power.py")
    gpu = doc.get("gpu")
    if not isinstance(gpu, dict) or not _number(gpu.get("power_limit_w")) or gpu["power_limit_w"] <= 0:
        raise BadInput("gpu.power_limit_w: must be a number > 0 (W)")
    clocks = gpu.get("supported_clocks_mhz")
    if not isinstance(clocks, list) or not clocks or not all(_number(c) and c > 0 for c in clocks):
        raise BadInput("gpu.supported_clocks_mhz: must be a non-empty list of numbers > 0 (MHz)")
    raw = doc.get("loads")
    if not isinstance(raw, list) or not raw:
        raise BadInput("loads: must be a non-empty list")
    loads = []
    for i, ld in enumerate(raw):
        name = ld.get("name", f"#{i}") if isinstance(ld, dict) else f"#{i}"
        if not isinstance(ld, dict):
            raise BadInput(f"loads[{i}]: must be an object")
        if ld.get("power_w") is None or ld.get("activity_per_clk") is None:
            continue  # a load without a power or an activity does not constrain the fit
        if not _number(ld["power_w"]) or ld["power_w"] <= 0:
            raise BadInput(f"loads[{i}] ({name}).power_w: must be a number > 0 (W)")
        f = ld.get("clock_ghz") if ld.get("clock_ghz") is not None else ld.get("clock_ghz_nvml")
        if not _number(f) or f <= 0:
            raise BadInput(f"loads[{i}] ({name}): needs clock_ghz or clock_ghz_nvml, a number > 0 (GHz)")
        act = ld["activity_per_clk"]
        if not isinstance(act, dict):
            raise BadInput(f"loads[{i}] ({name}).activity_per_clk: must be an object")
        rates = {}
        for key, unit in power.CALIBRATION_KEYS.items():
            v = act.get(key, 0.0)
            if not _number(v) or v < 0:
                raise BadInput(f"loads[{i}] ({name}).activity_per_clk.{key}: must be a number >= 0 (per SM clock)")
            rates[unit] = float(v)
        if ld.get("wgmma_rs") and ld.get("wgmma_n"):
            # an RS wgmma's A operand (2 KiB per m64nNk16, 2 x 64 x N x 16 FLOPs) comes from the
            # registers; the model prices those bytes as shared memory's (fa4sim/power.py)
            rates["smem"] += rates["tensor"] / int(ld["wgmma_n"])
        gap = (ld.get("mma_gap_cycles") or 0) or (ld.get("mma_gap_ns") or 0)
        burst_flops = None  # tensor FLOPs per SM of one burst, when idle gaps separate them
        if gap and ld.get("wgmma_n"):
            burst_flops = (ld.get("burst_trips") or 1) * KB_WGMMAS * 2 * 64 * int(ld["wgmma_n"]) * 16
        awake = ld.get("code") not in (None, "sleep") and (ld.get("stream_warpgroups") or 0) > 0
        loads.append({"name": str(name), "f": float(f), "power_w": float(ld["power_w"]), "rates": rates,
                      "in_kernel": ld.get("clock_ghz") is not None, "burst_flops": burst_flops,
                      "mixed": ld.get("code") == "mix" and (ld.get("stream_warpgroups") or 0) > 0,
                      # the SM stays clocked in the tensor core's gaps: they spin, or stream warps run
                      "clocked_gaps": bool(ld.get("mma_gap_cycles")) or (ld.get("mma_gap_ns") or 0) < 0 or awake,
                      "capped": bool(ld.get("power_capped")),
                      "sms": int(doc["meta"].get("num_sms") or 0)})
    if len(loads) < 3:
        raise BadInput(f"loads: {len(loads)} with a power and an activity; the fit needs at least 3")
    return gpu, loads, doc["meta"]


def report(base, gpu: dict, loads: list[dict], fmax: float, cycles_grid=GAP_CYCLES, mixed_grid=MIXED,
           idle: float | None = None) -> tuple[dict, float, list[dict]]:
    """The fit, its residual and a row per load (printed by main). Leave-one-out refits the
    linear parameters with the grid values (slope, mixed fraction, L0) of the full fit."""
    values, res = fit(loads, fmax, cycles_grid=cycles_grid, mixed_grid=mixed_grid, idle=idle)
    cap, fmin = float(gpu["power_limit_w"]), min(gpu["supported_clocks_mhz"]) / 1e3
    grid = dict(slopes=[values["voltage_slope"]], mixed_grid=[values["mixed_code_energy_fraction"]],
                cycles_grid=[values["tensor_idle_gap_cycles"] or GAP_CYCLES[0]], idle=idle)

    def host_hw(v, ld):  # a load of another host: that host's static power
        offs = v.get("file_static_offsets_w", [])
        extra = offs[ld["file"] - 1] if ld.get("file", 0) and ld["file"] - 1 < len(offs) else 0.0
        return model_hw(base, {**v, "static_power_w": v["static_power_w"] + extra}, cap, fmax, fmin)

    rows = []
    for i, ld in enumerate(loads):
        hw = host_hw(values, ld)
        p_model = power.power_w(hw, load_rates(ld, values), ld["f"])[0]
        pred = power.predict_clock(hw, load_rates(ld, values)).clock_ghz
        others = loads[:i] + loads[i + 1:]
        loo = None
        if len(others) >= 3:
            v = fit(others, fmax, **grid)[0]
            loo = power.predict_clock(host_hw(v, ld), load_rates(ld, v)).clock_ghz
        rows.append({"name": ld["name"], "clock_ghz": ld["f"], "in_kernel": ld["in_kernel"],
                     "power_w": ld["power_w"], "model_power_w": p_model, "predicted_clock_ghz": pred,
                     "loo_clock_ghz": loo, "file": ld.get("file", 0)})
    return values, res, rows


def check(base, loads: list[dict]) -> list[dict]:
    """Each load against a profile as it is (no fit): the profile's power at the load's clock and
    the clock it predicts from the load's activity. A file with a "sleep" load gets that host's
    static power (its sleep's measured power less the profile's for it), so a host that idles a
    few watts warmer does not shift every load."""
    offsets = {}
    for ld in loads:
        if ld["name"].split(" [")[0] == "sleep":
            offsets[ld.get("file", 0)] = ld["power_w"] - power.power_w(base, load_rates(ld, base.values), ld["f"])[0]
    rows = []
    for ld in loads:
        hw = base.with_values(static_power_w=float(base.static_power_w) + offsets.get(ld.get("file", 0), 0.0))
        rates = load_rates(ld, base.values)
        p_model = power.power_w(hw, rates, ld["f"])[0]
        rows.append({"name": ld["name"], "clock_ghz": ld["f"], "in_kernel": ld["in_kernel"], "power_w": ld["power_w"],
                     "model_power_w": p_model, "power_error": p_model / ld["power_w"] - 1.0,
                     "predicted_clock_ghz": power.predict_clock(hw, rates).clock_ghz,
                     "file": ld.get("file", 0), "static_offset_w": offsets.get(ld.get("file", 0), 0.0)})
    return rows


def cap_held(loads: list[dict], limit: float) -> tuple[float, int]:
    """(cap_held_fraction, how many loads it is the median of): the median board power of the
    loads the cap holds (most of their clock-event samples name the power cap) over the limit;
    (1.0, 0) when none is held."""
    held = sorted(ld["power_w"] for ld in loads if ld.get("capped"))
    if not held:
        return 1.0, 0
    return float(np.median(held)) / limit, len(held)


CEILING_MIN_TENSOR_SHARE = 0.05  # a load counts for the ceiling with at least this share of the tensor rate


def tensor_ceiling(paths: list[str], tensor_flops_per_clk: float) -> tuple[float, list[str]]:
    """(clock_tensor_ghz, the loads it is the median of) from power calibration files; (0, [])
    when no load qualifies. A load qualifies when its tensor core does at least
    CEILING_MIN_TENSOR_SHARE of tensor_flops_per_clk per SM, its clock is the in-kernel one
    (clock_ghz equals clock_ghz_in_kernel: no warp sleeps), NVML reads the device's maximum clock
    and every clock-event reason sampled is 0x0 (no cap, no thermal limit)."""
    clocks, names = [], []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        fmax = (doc.get("gpu") or {}).get("clock_max_mhz")
        nsm = (doc.get("gpu") or {}).get("num_sms") or (doc.get("meta") or {}).get("num_sms")
        for ld in doc.get("loads") or []:
            act, f, f_in = ld.get("activity_per_clk") or {}, ld.get("clock_ghz"), ld.get("clock_ghz_in_kernel")
            if not (nsm and fmax and _number(f) and _number(f_in) and abs(f - f_in) < 1e-9):
                continue
            tensor = (act.get("tensor_flops") or 0.0) / nsm
            reasons = set((ld.get("clock_event_reasons") or {"?": 1}).keys())
            nvml_at_max = _number(ld.get("clock_ghz_nvml")) and ld["clock_ghz_nvml"] >= 0.995 * fmax / 1e3
            if tensor >= CEILING_MIN_TENSOR_SHARE * tensor_flops_per_clk and reasons == {"0x0"} and nvml_at_max:
                clocks.append(float(f))
                names.append(str(ld.get("name")))
    if not clocks:
        return 0.0, []
    return float(np.median(clocks)), names


def write_ceiling(profile_path: str, value: float, names: list[str], meta: dict) -> None:
    doc = json.loads(Path(profile_path).read_text())
    doc["params"]["clock_tensor_ghz"] = {
        "value": round(value, 3), "confidence": "M",
        "source": f"{measured_on(meta)} by lab/tools/calibrate/bench_power.py + fit_power.py: the median "
                  f"in-kernel clock (clock64 / globaltimer) of the {len(names)} loads whose tensor core works while "
                  f"NVML reports the maximum clock with no clock-event reason ({', '.join(names)}); "
                  f"lab/findings/power-and-clock.md; {campaign(meta)}"}
    Path(profile_path).write_text(json.dumps(doc, indent=1) + "\n")


def write_held(profile_path: str, fraction: float, n: int, limit: float, meta: dict) -> None:
    doc = json.loads(Path(profile_path).read_text())
    doc["params"]["cap_held_fraction"] = {
        "value": round(fraction, 4),
        "source": f"{measured_on(meta)} by lab/tools/calibrate/bench_power.py + fit_power.py: the median NVML board "
                  f"power of the {n} loads the power cap holds ({fraction * limit:.1f} W) over the {limit:g} W "
                  f"limit; {campaign(meta)}",
        "confidence": "M"}
    Path(profile_path).write_text(json.dumps(doc, indent=1) + "\n")


def write_terms_from(profile_path: str, donor_path: str, own: dict, own_res: float, res: float) -> None:
    """The three terms taken with --terms-from: their donor's values and sources, and what this
    file's own loads would have put them at."""
    doc = json.loads(Path(profile_path).read_text())
    donor = json.loads(Path(donor_path).read_text())["params"]
    mine = ", ".join(f"{k} {own[k]:g}" for k in IDLE_AND_MIXED)
    for k in IDLE_AND_MIXED:
        doc["params"][k] = {
            "value": donor[k]["value"], "confidence": donor[k].get("confidence", "M"),
            "source": f"the value of {Path(donor_path).name} (fit_power.py --terms-from: the same die, whose "
                      f"duty-cycled loads resolve it); this profile's own loads alone give {mine} (rms "
                      f"{own_res:.1%} against {res:.1%} with the donor's terms). Donor: {donor[k]['source']}"}
    Path(profile_path).write_text(json.dumps(doc, indent=1) + "\n")


def write(profile_path: str, values: dict, meta: dict, gpu: dict, n: int, res: float, files: int = 1) -> None:
    doc = json.loads(Path(profile_path).read_text())
    hosts = f"; {files} runs on {files} hosts, each with its own static power" if files > 1 else ""
    how = (f"{measured_on(meta)} by lab/tools/calibrate/bench_power.py + fit_power.py "
           f"({n} unit loads{hosts}, non-negative least squares on relative power with voltage_slope on a 0.005 "
           f"grid, mixed_code_energy_fraction on a 0.05 grid and tensor_idle_gap_cycles on a powers-of-2 grid; "
           f"rms residual {res:.1%}; {campaign(meta)})")
    for k, v in values.items():
        if k in hardware.PARAMS:
            doc["params"][k] = {"value": round(v, 4), "source": how, "confidence": "M"}
    fmin = min(gpu["supported_clocks_mhz"]) / 1e3
    doc["params"]["clock_min_ghz"] = {"value": fmin, "source": f"{measured_on(meta)}: the lowest of the "
                                      f"driver's supported SM clocks (lab/tools/calibrate/bench_power.py; "
                                      f"{campaign(meta)})",
                                      "confidence": "M"}
    Path(profile_path).write_text(json.dumps(doc, indent=1) + "\n")


def derive_b200(h100: dict, how: str) -> dict:
    """The B200 profile's power parameters from the H100's values (parameter -> value):
    tensor energy x TENSOR_RATIO, static and clock power x BOARD_RATIO, the rest as they are."""
    out = {}
    for k in ("voltage_slope", *LINEAR, *IDLE_AND_MIXED):
        if k == "energy_tensor_pj_per_flop":
            v, why = h100[k] * TENSOR_RATIO, (f"x {TENSOR_RATIO}: at the rated point the B200 does 2.25 dense BF16 "
                                              f"PFLOP/s at 1000 W (0.444 pJ/FLOP), the H100 SXM 989 TFLOP/s at 700 W "
                                              f"(0.708 pJ/FLOP), on the same TSMC 4N-class process")
        elif k in ("static_power_w", "clock_power_w"):
            v, why = h100[k] * BOARD_RATIO, f"x {BOARD_RATIO} (1000 W / 700 W board limits)"
        else:
            v, why = h100[k], "(the same pipe, memory or DVFS range per operation on a 4N-class process)"
        out[k] = {"value": round(v, 4), "source": f"the H100's value {why}; H100 {how}; "
                                                  f"docs/reference/hardware.md, \"Power\"", "confidence": "L"}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fit_power", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="power calibration JSON(s) (lab/tools/calibrate/bench_power.py); "
                    "the first is the profile's host, each further file (another host or temperature) gets its "
                    "own static power")
    ap.add_argument("--profile", default=None, help="the profile to write (default: fa4sim/profiles/h100.json)")
    ap.add_argument("--write", action="store_true", help="write the fitted values into --profile")
    ap.add_argument("--b200", default=None, metavar="PROFILE.json",
                    help="with --write: also derive this B200 profile's power parameters from the fitted ones "
                         "(docs/reference/hardware.md, \"Power\"), e.g. fa4sim/profiles/b200.json")
    ap.add_argument("--terms-from", default=None, metavar="PROFILE.json",
                    help="take tensor_idle_power_fraction, tensor_idle_gap_cycles and mixed_code_energy_fraction from "
                         "this profile (the same die measured with the burst loads) and fit the rest")
    ap.add_argument("--check", action="store_true",
                    help="fit nothing: each load against --profile as it is (its power at the load's clock, the "
                         "clock it predicts), e.g. new loads against the profile fitted without them")
    ap.add_argument("--gap-cycles", type=float, default=None, metavar="L0",
                    help="fix tensor_idle_gap_cycles instead of searching it (a file whose duty-cycled loads all "
                         "have one burst length cannot tell L0 from the idle power)")
    a = ap.parse_args(argv)
    try:
        gpu, loads, meta = read(a.results[0])
        for i, extra in enumerate(a.results[1:], start=1):
            more = read(extra)[1]
            loads += [{**ld, "file": i, "name": f"{ld['name']} [{i}]"} for ld in more]
        path = a.profile or str(hardware.PROFILE_DIR / "h100.json")
        if not Path(path).exists():
            raise BadInput(f"--profile: no such file {path!r}")
        base = hardware.load(path)
    except (BadInput, hardware.InputError) as e:
        print(f"fit_power: error: {e}", file=sys.stderr)
        return 2
    prepare(loads, base)
    fmax = float(gpu["clock_max_mhz"]) / 1e3 if _number(gpu.get("clock_max_mhz")) else base.clock_ghz
    if abs(fmax - base.clock_ghz) > 1e-3:
        print(f"note: the device's maximum clock {fmax} GHz differs from the profile's clock_ghz {base.clock_ghz}")
    if abs(float(gpu["power_limit_w"]) - float(base.power_cap_w)) > 0.5:
        print(f"note: the device's power limit {gpu['power_limit_w']} W differs from the profile's "
              f"power_cap_w {base.power_cap_w}")
    if a.check:
        rows = check(base, loads)
        print(f"{len(loads)} loads on {meta.get('device', '?')} against {path} as it is (no fit)")
        for f, off in sorted({(r["file"], r["static_offset_w"]) for r in rows}):
            print(f"  file [{f}]: static power {off:+.1f} W from its sleep load")
        print(f"\n{'load':34s} {'clock':>7s} {'':1s} {'power':>7s} {'model':>7s} {'error':>7s} {'pred.':>7s}")
        for r in rows:
            print(f"{r['name'][:34]:34s} {r['clock_ghz']:7.3f} {'' if r['in_kernel'] else '*':1s} {r['power_w']:7.1f} "
                  f"{r['model_power_w']:7.1f} {r['power_error']:+7.1%} {r['predicted_clock_ghz']:7.3f}")
        print("clock: measured (* = NVML's); model: the profile's power at that clock; error: model / measured - 1; "
              "pred.: the clock the profile predicts from the load's activity")
        return 0
    if a.gap_cycles is not None and not a.gap_cycles > 0:
        print(f"fit_power: error: --gap-cycles: {a.gap_cycles}; must be > 0 (cycles)", file=sys.stderr)
        return 2
    grids = {"cycles_grid": (a.gap_cycles,) if a.gap_cycles is not None else GAP_CYCLES}
    if a.terms_from:
        try:
            donor = hardware.load(a.terms_from)
        except hardware.InputError as e:
            print(f"fit_power: error: --terms-from: {e}", file=sys.stderr)
            return 2
        grids = {"cycles_grid": (donor.tensor_idle_gap_cycles,), "mixed_grid": (donor.mixed_code_energy_fraction,),
                 "idle": float(donor.tensor_idle_power_fraction)}
    values, res, rows = report(base, gpu, loads, fmax, **grids)
    print(f"{len(loads)} loads on {meta.get('device', '?')}; fmax {fmax} GHz, cap {gpu['power_limit_w']} W; "
          f"rms relative power residual {res:.2%}")
    for k in ("voltage_slope", *LINEAR, *IDLE_AND_MIXED):
        unit = hardware.PARAMS[k][0]
        print(f"  {k:28s} = {values[k]:10.4f} {unit}")
    for i, off in enumerate(values["file_static_offsets_w"], start=1):
        print(f"  static power of {a.results[i]}: {off:+.1f} W")
    print(f"\n{'load':28s} {'clock':>7s} {'':1s} {'power':>7s} {'model':>7s} {'pred.':>7s} {'loo':>7s}")
    print(f"{'':28s} {'GHz':>7s} {'':1s} {'W':>7s} {'W':>7s} {'GHz':>7s} {'GHz':>7s}")
    for r in rows:
        loo = f"{r['loo_clock_ghz']:7.3f}" if r["loo_clock_ghz"] is not None else f"{'-':>7s}"
        print(f"{r['name'][:28]:28s} {r['clock_ghz']:7.3f} {'' if r['in_kernel'] else '*':1s} {r['power_w']:7.1f} "
              f"{r['model_power_w']:7.1f} {r['predicted_clock_ghz']:7.3f} {loo}")
    print("clock: measured in the kernel (* = NVML's); model: the fit's power at that clock; pred.: the clock the "
          "model predicts from the activity; loo: the same, fitted without that load")
    fraction, n_held = cap_held(loads, float(gpu["power_limit_w"]))
    print(f"the cap holds {n_held} loads at a median {fraction * float(gpu['power_limit_w']):.1f} W: "
          f"cap_held_fraction {fraction:.4f}")
    ceiling, held = tensor_ceiling(a.results, base.tensor_flops_per_clk)
    print(f"tensor clock ceiling: {ceiling:.3f} GHz, the median of {len(held)} loads ({', '.join(held) or 'none'})"
          if held else "tensor clock ceiling: no load qualifies (clock_tensor_ghz stays as it is)")
    if a.write:
        meta = {**meta, "files": [str(p) for p in a.results]}
        write(path, values, meta, gpu, len(loads), res, len(a.results))
        if n_held:
            write_held(path, fraction, n_held, float(gpu["power_limit_w"]), meta)
        if a.terms_from:
            own, own_res = fit(loads, fmax)
            write_terms_from(path, a.terms_from, own, own_res, res)
        if held:
            write_ceiling(path, ceiling, held, meta)
        print(f"wrote {path}")
        if a.b200:
            doc = json.loads(Path(a.b200).read_text())
            doc["params"].update(derive_b200(values, f"{measured_on(meta)} by "
                                                     f"lab/tools/calibrate/bench_power.py + fit_power.py "
                                                     f"({campaign(meta)})"))
            Path(a.b200).write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {a.b200}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
