"""How much more (or less) power a card draws than the profile's own card, from capped GEMM loads.

    python -m lab.tools.calibrate.card_power --profile fa4sim/profiles/h200.json \
        --reference lab/campaigns/power-calibration/power_h200_2026-11-27.json CARD.json [CARD.json ...]

Cards of one model differ: their leakage, voltage bin and cooling. Under the same capped load
(wgmma back to back, bench_power.py's tensor256) one H200 holds 1.57 GHz where another holds 1.62.
The power model's energies and static power come from the card its fit measured (--reference); this
script says where other cards sit against it, each from its own power calibration file
(bench_power.py; its capped loads with tensor work that the reference also ran):

    offset(card) = median over those loads of [(card's power - the model's at the card's clock)
                                               - (reference's power - the model's at its clock)]

in W: what that card draws above the reference at the same activity and clock. Taking the
difference of residuals cancels the model's own error on each load. A card runs its loads at
the clock the cap leaves it: each 10 W costs a capped attention kernel about 1 % of its clock.

It prints each card's offset, which `--set card_power_w=...` gives fa4sim for that card, and the
median card: the median offset over the files, the reference counted (offset 0). A profile's
card_power_w is the median card, for a user who is lent a card nobody measured
(lab/findings/power-cards.md, "Cards"). Nothing here looks at an attention timing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from fa4sim import hardware, power

from .fit_power import BadInput, load_rates, read


def residuals(hw, loads: list[dict]) -> dict:
    """name -> measured power - the profile's power at the load's measured clock (W), for the
    loads the cap holds that have tensor work."""
    out = {}
    for ld in loads:
        if ld.get("capped") and ld["rates"].get("tensor", 0.0) > 0:
            out[ld["name"]] = ld["power_w"] - power.power_w(hw, load_rates(ld, hw.values), ld["f"])[0]
    return out


def offset(hw, card: list[dict], reference: list[dict]) -> tuple[float, list[str]]:
    """(the card's offset over the reference in W, the loads it is the median of); BadInput when
    they share no capped load with tensor work."""
    mine, ref = residuals(hw, card), residuals(hw, reference)
    shared = [n for n in mine if n in ref]
    if not shared:
        raise BadInput("the card and the reference share no capped load with tensor work (bench_power.py's "
                       "tensor256, say)")
    return statistics.median(mine[n] - ref[n] for n in shared), shared


def median_card(offsets: list[float]) -> float:
    """The median offset over the reference (0) and the card files, each file one measurement of
    a card (a card measured twice counts twice: the files do not name their card)."""
    return statistics.median([0.0, *offsets])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="card_power", description=__doc__.split("\n\n")[0])
    ap.add_argument("cards", nargs="+", help="power calibration JSON(s) of other cards (bench_power.py)")
    ap.add_argument("--reference", required=True, help="the calibration file the profile's fit measured")
    ap.add_argument("--profile", default=str(hardware.PROFILE_DIR / "h100.json"), help="the profile (default: h100)")
    a = ap.parse_args(argv)
    try:
        hw = hardware.load(a.profile)
        ref = read(a.reference)[1]
        offsets, rows = {}, []
        for path in a.cards:
            off, shared = offset(hw, read(path)[1], ref)
            offsets[path] = off
            rows.append((Path(path).name, off, shared))
    except (BadInput, hardware.InputError) as e:
        print(f"card_power: error: {e}", file=sys.stderr)
        return 2
    print(f"against {Path(a.reference).name}, the card {Path(a.profile).name}'s energies were fitted on "
          f"(its card_power_w now: {float(hw.card_power_w):+.1f} W)")
    print(f"{'card':44s} {'--set card_power_w=':>19s}  (the median of)")
    for name, off, shared in rows:
        print(f"{name:44s} {off:+17.1f} W  ({', '.join(shared)})")
    m = median_card(list(offsets.values()))
    print(f"the median card, over the reference and {len(offsets)} files: card_power_w = {m:+.1f} W")
    return 0


if __name__ == "__main__":
    sys.exit(main())
