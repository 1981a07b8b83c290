"""Measured-timeline plumbing: stamps -> trace, steady-state interval, overlay figure."""
import json

import pytest

from fa4sim import hardware, timeline
from fa4sim.engine import simulate
from fa4sim.errors import InputError
from fa4sim.model import build_cta
from fa4sim.params import Problem


def sim_trace():
    return simulate(build_cta(hardware.load("h100-datasheet"), Problem(1, 16, 4096, 4096, 128), n_kv=24), [24])


def test_stamps_round_trip_give_the_simulated_interval(tmp_path):
    sim = sim_trace()
    # pretend the kernel stamped every consumer op, with an offset clock
    events = [{"role": r.role, "op": r.name, "tile": r.tile, "iter": r.iter, "start": r.start + 10**9,
               "end": r.end + 10**9} for r in sim.ops if r.role.startswith("wg")]
    f = tmp_path / "stamps.json"
    f.write_text(json.dumps({"meta": {"device": "test"}, "events": events}))
    measured = timeline.to_trace(timeline.load_stamps(str(f)), sim.schedule)
    assert min(r.start for r in measured.ops) == 0
    assert timeline.interval(measured, "QK0") == pytest.approx(timeline.interval(sim, "QK0"))
    png = tmp_path / "overlay.png"
    timeline.overlay(sim, measured, str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bad_stamps(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"events": [{"role": "wg0", "op": "QK0", "iter": 0, "start": 5, "end": 1}]}))
    with pytest.raises(InputError):
        timeline.load_stamps(str(f))
    f.write_text(json.dumps({"events": [{"role": "warp99", "op": "X", "iter": 0, "start": 0, "end": 1}]}))
    with pytest.raises(InputError):
        timeline.to_trace(timeline.load_stamps(str(f)), sim_trace().schedule)


def test_stamps_load_gzipped(tmp_path):
    """Recorded timelines are kept gzipped (lab/campaigns/timelines/timeline_*/*.json.gz): same doc."""
    import gzip

    doc = {"meta": {"device": "test"}, "events": [{"role": "wg0", "op": "QK0", "iter": 0, "start": 0, "end": 5}]}
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_text(json.dumps(doc))
    packed.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert timeline.load_stamps(str(packed)) == timeline.load_stamps(str(plain)) == doc
    with pytest.raises(InputError):
        timeline.load_stamps(str(tmp_path / "missing.json.gz"))
