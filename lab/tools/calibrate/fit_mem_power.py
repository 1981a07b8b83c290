"""Energy per byte of the memory paths a backward's dQ takes, from bench_mem_power's loads.

    python -m lab.tools.calibrate.fit_mem_power RESULTS.json [--profile fa4sim/profiles/h100.json --write]

RESULTS.json is what lab/tools/calibrate/bench_mem_power.py writes (meta.kind "mem_power"): each
load keeps one path busy on every SM, with its chip-wide bytes per SM clock, its clock and its
board power. fa4sim's power model (fa4sim/power.py) is linear in each path's bytes, so with every
other parameter as the profile has it (fit_power.py's fit of bench_power's unit loads), each load
gives its path's energy directly:

    e_path = (P_measured - P_model(the load's other activity)) / (1e-3 f b_path)   [pJ/B]

    bulk_reduce  energy_l2_reduce_pj_per_byte   TMA bulk reduce-adds (its smem source read is smem)
    red          energy_red_pj_per_byte         RED.ADD from registers, its instructions included
    dsmem        energy_dsmem_pj_per_byte       st.async into the peer's smem (the write is smem)

The tma_l2 load is the control: with the profile's energy per loaded byte (bench_power counts a
TMA load's bytes as L2 bytes only, its smem write inside that energy), the model's power for it
should match the measurement; the table prints both. The loads run near idle temperature, cooler
than the unit loads that set the profile's static power, so the energies come out a little low
if anything. Nothing here looks at an attention timing.

--write puts the three energies into the profile, each with its source, confidence M.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fa4sim import hardware, power

from .fit_power import BadInput, campaign, measured_on, read_doc

# load name -> (the profile parameter it measures, its unit in fa4sim/power.py)
PATHS = {"bulk_reduce": ("energy_l2_reduce_pj_per_byte", "l2_reduce"),
         "red": ("energy_red_pj_per_byte", "red"),
         "dsmem": ("energy_dsmem_pj_per_byte", "dsmem")}
CONTROL = "tma_l2"


def read(path: str) -> tuple[dict, list[dict]]:
    """(meta, loads) of a bench_mem_power file; each load with f (GHz), power_w and rates (unit ->
    chip-wide bytes per SM clock); or BadInput."""
    doc = read_doc(path, "mem_power", "a memory-path power file", "lab/tools/calibrate/bench_mem_power.py")
    loads = []
    for i, ld in enumerate(doc.get("loads") or []):
        if not isinstance(ld, dict) or ld.get("power_w") is None or not isinstance(ld.get("activity_per_clk"), dict):
            continue
        f = ld.get("clock_ghz") or ld.get("clock_ghz_nvml")
        if not f or f <= 0 or ld["power_w"] <= 0:
            raise BadInput(f"loads[{i}] ({ld.get('name')}): needs power_w > 0 (W) and clock_ghz > 0 (GHz)")
        rates = {unit: float(ld["activity_per_clk"].get(key, 0.0) or 0.0) for key, unit in power.CALIBRATION_KEYS.items()}
        loads.append({"name": str(ld.get("name")), "f": float(f), "power_w": float(ld["power_w"]), "rates": rates,
                      "temperature_c": ld.get("temperature_c")})
    if not any(ld["name"] in PATHS for ld in loads):
        raise BadInput(f"loads: none of {', '.join(PATHS)} has a power and an activity")
    return doc["meta"], loads


def energies(hw, loads: list[dict]) -> tuple[dict, list[tuple]]:
    """(parameter -> pJ/B, rows) from the loads, every other parameter as hw has it. rows:
    (load, clock GHz, measured W, the model's W without the path (the control: with it), path
    bytes per SM per clock, the energy or None)."""
    out, rows = {}, []
    for ld in loads:
        rates, f = dict(ld["rates"]), ld["f"]
        if ld["name"] == CONTROL:  # bench_power's convention: a TMA load's bytes are L2 bytes only
            rates["smem"] = 0.0
            rows.append((ld["name"], f, ld["power_w"], power.power_w(hw, rates, f)[0], rates["l2"] / hw.num_sms, None))
            continue
        if ld["name"] not in PATHS:
            continue
        param, unit = PATHS[ld["name"]]
        b = rates.pop(unit, 0.0)
        if b <= 0:
            raise BadInput(f"loads ({ld['name']}): no {unit} bytes per clock to price")
        rest = power.power_w(hw, rates, f)[0]
        out[param] = (ld["power_w"] - rest) / (1e-3 * f * b)
        rows.append((ld["name"], f, ld["power_w"], rest, b / hw.num_sms, out[param]))
    return out, rows


def write(profile_path: str, values: dict, meta: dict, hw) -> None:
    doc = json.loads(Path(profile_path).read_text())
    for k, v in values.items():
        doc["params"][k] = {
            "value": round(v, 2), "confidence": "M",
            "source": f"{measured_on(meta)} by lab/tools/calibrate/bench_mem_power.py + fit_mem_power.py "
                      f"(its load alone on every SM for 2.5 s, random data; the power above what the profile's other "
                      f"parameters give that load, static {hw.static_power_w:.1f} W, over its bytes; "
                      f"{campaign(meta)}); "
                      f"lab/findings/power-and-clock.md"}
    Path(profile_path).write_text(json.dumps(doc, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fit_mem_power", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="memory-path power JSON (lab/tools/calibrate/bench_mem_power.py)")
    ap.add_argument("--profile", default="fa4sim/profiles/h100.json",
                    help="the profile whose other power parameters price the rest of each load, and that --write "
                         "updates (default: fa4sim/profiles/h100.json)")
    ap.add_argument("--write", action="store_true", help="write the three energies into --profile")
    args = ap.parse_args(argv)
    try:
        if not Path(args.profile).exists():
            raise BadInput(f"--profile: no such file {args.profile!r}")
        hw = hardware.load(args.profile).with_values(card_power_w=0.0)  # the fitted card, as the energies are
        if not power.has_model(hw):
            raise BadInput(f"--profile: {args.profile} has no power model (power_cap_w 0); use a measured profile")
        meta, loads = read(args.results)
        values, rows = energies(hw, loads)
    except (BadInput, hardware.InputError) as e:
        print(f"fit_mem_power: {e}", file=sys.stderr)
        return 2
    print(f"{meta.get('device') or meta.get('gpu', '')} ({meta.get('date') or meta.get('date_utc', '')}), "
          f"data {meta.get('data', 'not recorded')}; other parameters from {args.profile}")
    print(f"{'load':12s} {'GHz':>6s} {'W meas':>7s} {'W rest':>7s} {'B/clk/SM':>9s} {'pJ/B':>7s}")
    for name, f, w, rest, b, e in rows:
        tail = f"{e:7.1f}" if e is not None else f"  (the model with e_l2 {hw.values['energy_l2_pj_per_byte']:.1f} " \
                                                   f"pJ/B: {100 * (rest / w - 1):+.1f} %)"
        print(f"{name:12s} {f:6.3f} {w:7.1f} {rest:7.1f} {b:9.2f} {tail}")
    if args.write:
        write(args.profile, values, {**meta, "files": [args.results]}, hw)
        print("wrote", ", ".join(values), "into", args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
