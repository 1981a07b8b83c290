"""Sustained timings: the benchmark's CPU side (lab/tools/sustained_sm90.py: its points, plan,
options, fp32 reference and warm-up / timing loop on a fake GPU) and `fa4sim validate` of a small
synthetic file of kind "sustained" (fa4sim/validate/sustained.py). No GPU needed."""
import json
import os
import re
import subprocess
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lab.tools import sustained_sm90 as bench  # noqa: E402
from lab.tools.nvml_clock import ClockSampler, reason_names  # noqa: E402

# ---------------------------------------------------------------------------------------------
# the benchmark


def test_grid_is_docs_accuracy_grid_and_names_are_unique():
    grid = bench.grid_points()
    assert len(grid) == 18
    assert {(p.hdim, p.seqlen_q, p.causal) for p in grid} == {(d, s, c) for d in (64, 128, 256)
                                                                for s in (1024, 4096, 16384) for c in (False, True)}
    assert all(p.batch * p.seqlen_q == 16384 and p.heads * p.hdim == 2048 for p in grid)
    names = [p.name for p in bench.all_points()]
    assert len(names) == len(set(names))
    new = bench.new_points()
    assert any(p.seqlen_q < p.seqlen_k and p.causal for p in new)  # chunked prefill
    assert any(p.hdim_v != p.hdim for p in new)


def test_candidates_follow_what_each_kernel_runs():
    ds = next(p for p in bench.new_points() if p.hdim == 192)
    assert ds.candidates() == (bench.FA3, bench.PEER, bench.CUDNN)  # fa4kernel has hdim_v = hdim only
    assert bench.grid_points()[0].candidates() == (bench.OURS, bench.PROBE, bench.FA3, bench.PEER, bench.CUDNN)
    hd96 = bench.parse_problem("b=2,h=16,sq=4096,d=96")  # FlashAttention-3's package runs it in its hd128 kernel
    assert bench.FA3 in hd96.candidates() and bench.OURS in hd96.candidates()
    chunk = bench.parse_problem("b=4,h=16,sq=1500,sk=10000,d=128,causal")  # cuDNN's causal is top-left
    assert bench.CUDNN not in chunk.candidates() and bench.FA3 in chunk.candidates()


def test_points_count_flops_as_the_model_does():
    from fa4sim import Problem

    for p in bench.all_points():
        problem = Problem(p.batch, p.heads, p.seqlen_q, p.seqlen_k, p.hdim, p.causal, p.hdim_v)
        assert p.flops == problem.flops


def test_select_points():
    assert [p.name for p in bench.select("hd128-4k-b4-h16", False)] == ["hd128-4k-b4-h16"]
    assert len(bench.select("grid", False)) == 18
    assert all("causal" in p.name for p in bench.select("causal", False))
    assert {p.name for p in bench.select(None, True)} == set(bench.QUICK)
    with pytest.raises(ValueError, match="--points: 'hd100' names no point"):
        bench.select("hd100", False)


def test_a_users_own_problem():
    p = bench.parse_problem("b=4,h=16,sq=1500,sk=10000,d=128,causal")
    assert (p.batch, p.heads, p.seqlen_q, p.seqlen_k, p.hdim, p.hdim_v, p.causal) == (4, 16, 1500, 10000, 128, 128, True)
    assert p.group == "asked" and p.name == "hd128-q1500-k10000-b4-h16-causal"
    assert bench.OURS not in bench.parse_problem("b=2,h=16,sq=4096,d=192,dv=128").candidates()
    args = bench.parse_args(["--problem", "b=5,h=16,sq=3000,d=96", "--points", "hd128-4k-b4-h16"])
    assert [p.name for p in args.selected] == ["hd128-4k-b4-h16", "hd96-3000-b5-h16"]
    assert [p.name for p in bench.parse_args(["--problem", "b=5,h=16,sq=3000,d=96"]).selected] == ["hd96-3000-b5-h16"]


@pytest.mark.parametrize("spec,says", [
    ("b=4,h=16,sq=1500", "give d=N"),
    ("b=4,h=16,sq=1500,d=100", "d=100, dv=100: allowed 8-256 in steps of 8"),
    ("b=4,h=16,sq=15k,d=128", "sq='15k' is not a whole number"),
    ("b=4,h=16,sq=0,d=128", "sq=0 must be positive"),
    ("b=4,heads=16,sq=1500,d=128", "'heads=16' is not one of b=N, h=N"),
])
def test_bad_problem_fails_in_one_line(spec, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        bench.parse_problem(spec)


def test_default_plan_fits_the_time_budget():
    """The plan's arithmetic (COMPILE_S per build, warm-up + timing + host work per candidate)
    for the default run stays within the 8 minutes the device run may take."""
    plan = bench.estimate_s(bench.all_points(), 1.0, 0.5)
    assert plan["candidate_runs"] == sum(len(p.candidates()) for p in bench.all_points())
    assert plan["total_s"] < 8 * 60


def test_dry_run_lists_points_without_a_gpu():
    res = subprocess.run([sys.executable, os.path.join(ROOT, "lab", "tools", "sustained_sm90.py"), "--dry-run"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    for p in bench.all_points():
        assert p.name in res.stdout
    assert "plan: 30 points" in res.stdout


@pytest.mark.parametrize("args,says", [
    (["--points", "hd100"], "--points: 'hd100' names no point"),
    (["--warm-s", "0.2"], "--warm-s 0.2: at least 1.0 s"),
    (["--timed-s", "0.1"], "--timed-s 0.1: at least 0.5 s"),
    (["--window-ms", "5"], "--window-ms 5.0: allowed 10-1000"),
])
def test_bad_options_fail_in_one_line(args, says):
    res = subprocess.run([sys.executable, os.path.join(ROOT, "lab", "tools", "sustained_sm90.py"), "--dry-run", *args],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert says in res.stderr.strip().splitlines()[-1]


def brute_attention(q, k, v, causal):
    """Row by row, key by key: bottom-right causal (key j visible to query i iff j <= i + sk - sq)."""
    import torch

    b, sq, h, d = q.shape
    sk = k.shape[1]
    out = torch.zeros(b, sq, h, v.shape[3], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(sq):
                keys = [j for j in range(sk) if not causal or j <= i + sk - sq]
                if not keys:
                    continue
                s = torch.stack([q[bi, i, hi].double() @ k[bi, j, hi].double() for j in keys]) / d ** 0.5
                p = torch.softmax(s, 0)
                out[bi, i, hi] = sum(p[n] * v[bi, j, hi].double() for n, j in enumerate(keys))
    return out


@pytest.mark.parametrize("sq,sk,causal", [(7, 7, True), (5, 11, True), (11, 5, True), (6, 9, False)])
def test_reference_is_bottom_right_causal(sq, sk, causal):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, sq, 3, 16, generator=g), torch.randn(2, sk, 3, 16, generator=g)
    v = torch.randn(2, sk, 3, 8, generator=g)
    ref = bench.reference_check(q, k, v, causal, [(0, 0), (1, 2)])
    want = brute_attention(q, k, v, causal)
    for (b, h), r in ref.items():
        assert torch.allclose(r.double(), want[b, :, h], atol=1e-5)
    good = want.float()
    assert bench.check_output(good, ref)["ok"]
    bad = good.clone()
    bad[1, :, 2] += 1.0
    assert not bench.check_output(bad, ref)["ok"]
    nan = good.clone()
    nan[0, 0, 1, 0] = float("nan")  # outside the checked slices: still caught
    c = bench.check_output((nan, None), ref)
    assert c["nonfinite"] and not c["ok"]


class FakeGPU:
    """Just enough of torch.cuda for Sustained.run: a GPU clock that each call advances by
    call_ms, events that read it, and CUDA graphs that record the calls made while capturing."""

    def __init__(self, call_ms, capture="works"):
        self.now_ms, self.call_ms, self.capture, self.capturing = 0.0, call_ms, capture, None
        self.buffer = types.SimpleNamespace(value=0.0)
        gpu = self

        class Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self):
                self.t = gpu.now_ms

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return other.t - self.t

        class CUDAGraph:
            def __init__(self):
                self.calls = []

            def replay(self):
                for f in self.calls:
                    f()

        class graph:
            def __init__(self, g):
                self.g = g

            def __enter__(self):
                if gpu.capture == "raises":
                    raise RuntimeError("operation not permitted when stream is capturing")
                gpu.capturing = self.g

            def __exit__(self, *exc):
                gpu.capturing = None
                return False

        zero = lambda: setattr(gpu.buffer, "value", 0.0)  # noqa: E731
        self.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event, CUDAGraph=CUDAGraph, graph=graph,
                                                                      synchronize=lambda: None),
                                           equal=lambda a, b: a.value == b.value)
        self.buffer.zero_ = zero

    def kernel(self):
        self.now_ms += self.call_ms
        self.buffer.value = 1.0

    def fn(self):
        """One call of the attention: run now, or be recorded into the graph being captured
        (capture 'elsewhere': the call runs now instead, as a kernel sent to another stream)."""
        if self.capturing is not None and self.capture != "elsewhere":
            self.capturing.calls.append(self.kernel)
        else:
            self.kernel()
        return self.buffer


@pytest.mark.parametrize("capture,launch", [("works", "cuda graph"), ("raises", "eager"), ("elsewhere", "eager")])
def test_sustained_loop_times_enough_windows(monkeypatch, capture, launch):
    gpu = FakeGPU(call_ms=0.25, capture=capture)
    monkeypatch.setattr(bench, "_torch", lambda: gpu.torch)
    clocks = []
    read = lambda: clocks.append(1.6)  # noqa: E731  (the probe's read after each window)
    read.reset = lambda: clocks.append("reset")  # the probe's sums zeroed once the warm-up is over
    gpu.fn()
    eager_out = types.SimpleNamespace(value=gpu.buffer.value)  # the first call's output, its own memory
    rec = bench.Sustained(None, warm_s=0.0, timed_s=0.5, window_ms=100.0, launch="graph").run(
        "fa4kernel", gpu.fn, eager_out, read)
    assert rec["launch"] == launch
    assert ("graph_refused" in rec) == (launch == "eager")
    assert rec["windows"] >= 5 and rec["timed_s"] >= 0.5
    assert rec["ms"] == pytest.approx(0.25)  # every call advanced the fake GPU clock by 0.25 ms
    assert rec["calls_per_window"] * 0.25 == pytest.approx(100.0, rel=0.2)
    assert clocks == ["reset"] + [1.6] * rec["windows"]


def test_nvml_power_from_the_energy_counter_and_reasons():
    s = ClockSampler.__new__(ClockSampler)  # no NVML, no thread: feed samples by hand
    s.ok, s.error = True, None
    s._t, s._mhz = [0.5, 1.5], [1700, 1650]
    s._pt, s._pw = [0.5, 1.0, 1.5, 3.0], [690.0, 700.0, 710.0, 100.0]
    s._windows = {"run": [(0.0, 1.0), (1.0, 2.0)]}
    s._ends = {"run": [{"t0": 0.0, "t1": 1.0, "e0": 0, "e1": 690_000, "temperature_c": 60, "reasons": 0x4},
                       {"t0": 1.0, "t1": 2.0, "e0": 690_000, "e1": 1_400_000, "temperature_c": 62, "reasons": 0x0}]}
    out = s.summary()["run"]
    assert out["power_w_energy"] == pytest.approx(700.0)
    assert out["power_w_mean"] == pytest.approx(700.0) and out["power_n"] == 3
    assert out["temperature_c"] == 62 and out["clock_event_reasons"] == ["sw_power_cap"]
    assert reason_names(0x4 | 0x40 | 0x10000) == ["sw_power_cap", "hw_thermal_slowdown", "0x10000"]


# ---------------------------------------------------------------------------------------------
# fa4sim validate, kind "sustained"

from fa4sim import Problem, simulate, validate  # noqa: E402
from fa4sim.cli import main as cli_main  # noqa: E402
from fa4sim.validate import sustained as vs  # noqa: E402


def sustained_point(name, b, h, sq, sk, d, causal, results, dv=None, clock=None, config=None):
    dv = dv or d
    p = {"name": name, "group": "new", "batch": b, "heads": h, "seqlen": sq, "seqlen_k": sk, "hdim": d, "hdim_v": dv,
         "causal": causal, "results": {}}
    flops = Problem(b, h, sq, sk, d, causal, dv).flops
    for kernel, (tflops, ok) in results.items():
        p["results"][kernel] = {"ms": flops / (tflops * 1e12) * 1e3, "tflops": tflops, "sm_mhz": 1755.0,
                                "power_w": 690.0, "check": {"ok": ok, "rel_error": 3e-3 if ok else 0.5}}
    if clock:
        p["clock_ghz_in_kernel"] = clock
    if config:
        p["fa4kernel_config"] = config
    return p


SUSTAINED = {"meta": {"kind": "sustained", "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-24T00:00:00+00:00"},
             "points": [
                 sustained_point("hd128-4k-b4-h16-causal", 4, 16, 4096, 4096, 128, True,
                                 {"fa4kernel": (560.0, True), "fa4kernel[clock probe]": (562.0, True),
                                  "flash-attn-4": (540.0, True)}, clock=1.62,
                                 config={"tile_m": 128, "tile_n": 128, "persistent": True, "skip_idle_wgs": True}),
                 sustained_point("hd128-q1k-k4k-b4-h16-causal", 4, 16, 1024, 4096, 128, True,
                                 {"fa4kernel": (520.0, True), "flash-attn-4": (500.0, False)}, clock=1.70),
                 sustained_point("hd192v128-2k-b2-h16", 2, 16, 2048, 2048, 192, False, {"flash-attn-4": (600.0, True)},
                                 dv=128)],
             "skipped": ["hd128-32k-b1-h16"]}


def test_sustained_predicts_with_the_models_own_clock():
    r = validate.compare(SUSTAINED)
    assert r["kind"] == "sustained" and r["summary"]["hw_profile"] == "h100"
    rows = {(x["name"], x["kernel"]): x for x in r["points"]}
    # the probe is timed but not simulated; flash-attn-4's wrong output is left out
    assert set(rows) == {("hd128-4k-b4-h16-causal", "fa4kernel"), ("hd128-4k-b4-h16-causal", "flash-attn-4"),
                         ("hd128-q1k-k4k-b4-h16-causal", "fa4kernel"), ("hd192v128-2k-b2-h16", "flash-attn-4")}
    assert r["summary"]["wrong_output_left_out"] == ["hd128-q1k-k4k-b4-h16-causal:flash-attn-4"]
    x = rows[("hd128-4k-b4-h16-causal", "fa4kernel")]
    problem = Problem(4, 16, 4096, 4096, 128, True)
    alone = simulate("h100", "fa3", problem, x["knobs"], impl="fa4kernel")  # no clock given
    assert x["predicted_tflops"] == pytest.approx(alone.tflops)
    assert x["measured_tflops"] == pytest.approx(560.0)
    assert x["error"] == pytest.approx(alone.tflops / 560.0 - 1)
    assert x["predicted_clock_ghz"] == pytest.approx(vs.model_clock(alone)[0])
    assert x["clock_error"] == pytest.approx(x["predicted_clock_ghz"] / 1.62 - 1)
    at = simulate("h100", "fa3", problem, {**x["knobs"], "clock_ghz": 1.62}, impl="fa4kernel")
    assert x["error_at_measured_clock"] == pytest.approx(at.tflops / 560.0 - 1)
    # the power model alone: its clock for the launch's work over the measured time at the probe's clock
    from fa4sim import hardware

    hw = hardware.load("h100")
    # the probe build's own time (its clock's windows), not the default build's
    ms = SUSTAINED["points"][0]["results"]["fa4kernel[clock probe]"]["ms"]
    assert ms != SUSTAINED["points"][0]["results"]["fa4kernel"]["ms"]
    assert x["clock_at_measured_cycles"] == pytest.approx(vs.clock_at_measured_cycles(hw, at.activity, 1.62, ms * 1e3))
    assert x["error_at_probe_run"] == pytest.approx(at.tflops / 562.0 - 1)
    # a point without a probe build's result falls back to the default build's time
    q = rows[("hd128-q1k-k4k-b4-h16-causal", "fa4kernel")]
    assert "error_at_probe_run" not in q and q["clock_at_measured_cycles"] is not None
    assert x["clock_error_at_measured_cycles"] == pytest.approx(x["clock_at_measured_cycles"] / 1.62 - 1)
    ds = rows[("hd192v128-2k-b2-h16", "flash-attn-4")]
    assert ds["hdim_v"] == 128 and ds["measured_clock_ghz"] is None and ds["clock_error"] is None
    assert "clock_at_measured_cycles" not in ds
    s = r["summary"]
    assert s["clock"]["count"] == 2  # the two points with an in-kernel clock
    assert s["fa4kernel"]["count"] == 2 and s["flash-attn-4"]["count"] == 2
    errs = [abs(x["error"]) for x in r["points"]]
    assert s["tflops"]["max_abs_error"] == pytest.approx(max(errs))
    text = validate.report(r)
    assert "clock vs the probe's in-kernel clock" in text and "hd128-32k-b1-h16" in text
    assert "clock at the measured cycles (the power model alone)" in text and "of 2 configurations" in text
    assert "the same against the probe build's own time" in text


def test_the_power_model_alone_takes_the_measured_cycles():
    """At the model's own time the clock is the power model's for its own activity; the same work
    over a longer measured time draws less power per second, so the cap allows a higher clock; a
    measured time the launch gap takes whole gives none."""
    from fa4sim import hardware, power

    hw = hardware.load("h100")
    problem = Problem(4, 16, 4096, 4096, 128, True)
    at = simulate("h100", "fa3", problem, {"clock_ghz": 1.5}, impl="fa4kernel")
    own = at.activity.time_us(1.5)
    same = vs.clock_at_measured_cycles(hw, at.activity, 1.5, own)
    assert same == pytest.approx(power.predict_clock(hw, at.activity).clock_ghz)
    slower = vs.clock_at_measured_cycles(hw, at.activity, 1.5, own * 1.05)
    assert slower > same
    assert vs.clock_at_measured_cycles(hw, at.activity, 1.5, at.activity.gap_us) is None


def test_model_clock_reads_the_power_models_result_fields():
    hw = types.SimpleNamespace(clock_ghz=1.789)
    assert vs.model_clock(types.SimpleNamespace(hw=hw)) == (1.789, "profile", None)
    powered = types.SimpleNamespace(hw=hw, clock_ghz=1.61, clock_source="power model", power_w=699.0)
    assert vs.model_clock(powered) == (1.61, "power model", 699.0)


def test_cli_validate_sustained_file(tmp_path, capsys):
    small = {**SUSTAINED, "points": SUSTAINED["points"][:1]}
    f = tmp_path / "sustained.json"
    f.write_text(json.dumps(small))
    png = tmp_path / "s.png"
    assert cli_main(["validate", str(f), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "median |error|" in out and "fa4kernel" in out and f"wrote {png}" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert cli_main(["validate", str(f), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "sustained" and len(doc["points"]) == 2


def test_validate_set_predicts_a_sustained_file_for_one_card(tmp_path, capsys):
    """--set card_power_w: a card that draws more gets a lower predicted clock on every point,
    and the report says so; --set on another kind of file is one line."""
    small = {**SUSTAINED, "points": SUSTAINED["points"][:1]}
    base = vs.compare(small)
    hot = vs.compare(small, overrides={"card_power_w": "40"})
    assert hot["summary"]["overrides"] == {"card_power_w": "40"}
    assert all(h["predicted_clock_ghz"] < b["predicted_clock_ghz"] for h, b in zip(hot["points"], base["points"]))
    f = tmp_path / "sustained.json"
    f.write_text(json.dumps(small))
    assert cli_main(["validate", str(f), "--set", "card_power_w=40"]) == 0
    assert "--set card_power_w=40" in capsys.readouterr().out
    other = tmp_path / "grid.json"
    other.write_text(json.dumps({"meta": {"kind": "points", "device": "NVIDIA H100 80GB HBM3"}, "points": []}))
    assert cli_main(["validate", str(other), "--set", "card_power_w=40"]) == 2
    assert "--set: applies to sustained files" in capsys.readouterr().err


def test_holdout_points_run_only_when_asked_and_are_new():
    held = bench.select("holdout", False)
    assert len(held) == 9 and all(p.group == "holdout" for p in held)
    known = {p.name for p in bench.all_points()}
    assert not known & {p.name for p in held}
    assert not any(p.group == "holdout" for p in bench.select("all", False))


def test_unseen_points_run_only_when_asked_and_are_new():
    unseen = bench.select("unseen", False)
    assert len(unseen) == 8 and all(p.group == "unseen" for p in unseen)
    known = {p.name for p in bench.all_points() + bench.holdout_points()}
    assert not known & {p.name for p in unseen}
    assert not any(p.group in bench.ASKED_FOR for p in bench.select("all", False) + bench.select(None, False))


@pytest.mark.parametrize("group, before", [("fresh", ("all", "holdout", "unseen")),
                                           ("blind", ("all", "holdout", "unseen", "fresh")),
                                           ("untried", ("all", "holdout", "unseen", "fresh", "blind")),
                                           ("novel", ("all", "holdout", "unseen", "fresh", "blind", "untried")),
                                           ("paired", ("all", "holdout", "unseen", "fresh", "blind", "untried",
                                                       "novel"))])
def test_later_point_groups_are_new_to_every_earlier_run(group, before):
    """Each later group holds problems no earlier group measured, and runs only when named."""
    pts = bench.select(group, False)
    assert len(pts) == {"untried": 10, "novel": 9, "paired": 10}.get(group, 8) and all(p.group == group for p in pts)
    known = {p.name for g in before for p in bench.select(g, False)}
    assert not known & {p.name for p in pts}
    assert group in bench.ASKED_FOR


def test_paired_points_were_first_measured_by_their_own_run():
    """The ten problems of the group "paired" were predicted before the run that first measured
    them: no settled results file holds one of them outside that group unless it is dated after
    the paired run (a later run may measure them again, with predictions of its own)."""
    import glob

    names = {p.name for p in bench.select("paired", False)}
    assert any(p.heads_kv < p.heads for p in bench.select("paired", False))  # GQA and MQA among them
    paired_dates, others = [], []
    for path in glob.glob(os.path.join(ROOT, "lab", "campaigns", "*", "*.json")):
        if os.path.basename(path).startswith("predicted_"):
            continue
        try:
            doc = json.load(open(path))
        except ValueError:
            continue
        pts = doc.get("points") if isinstance(doc, dict) else None
        if isinstance(pts, list) and (doc.get("meta") or {}).get("kind") == "sustained":
            date = str(doc["meta"].get("date", ""))[:10]
            groups = {p.get("group") for p in pts if isinstance(p, dict) and p.get("name") in names}
            if "paired" in groups:
                paired_dates.append(date)
            if groups - {"paired"}:
                others.append((date, path))
    assert paired_dates, "the paired run's file"
    first = min(paired_dates)
    assert all(date > first for date, _ in others), [p for d, p in others if d <= first]


def test_predict_writes_each_modelled_candidate_without_a_gpu(tmp_path):
    out = tmp_path / "pred.json"
    assert bench.main(["--problem", "b=2,h=16,kv=4,sq=1000,d=128,causal", "--problem", "b=2,h=8,sq=900,d=96",
                       "--predict", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["kind"] == "predictions" and doc["meta"]["model_commit"]
    got = {(r["point"], r["kernel"]) for r in doc["rows"]}
    # FlashAttention-3 runs hd96 in its hd128 kernel: predicted there too
    assert got == {(p, k) for p in ("hd128-1000-b2-h16-kv4-causal", "hd96-900-b2-h8")
                   for k in ("fa4kernel", "flash-attn-3", "flash-attn-4")}
    assert all(r["tflops"] > 0 and 0.5 < r["clock_ghz"] < 2.5 for r in doc["rows"])


def test_predict_for_an_h100_names_it_and_uses_its_profile(tmp_path):
    """--profile h100: meta.device is the H100's name (so an H100 run joins it); the rows are fa4sim's
    h100 predictions (the H100's power cap and clock, not the H200's relabelled)."""
    from fa4sim.params import Problem
    from fa4sim.validate.common import predict

    out = tmp_path / "pred.json"
    assert bench.main(["--problem", "b=2,h=16,sq=2000,d=128", "--candidates", "ours", "--profile", "h100",
                       "--predict", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["profile"] == "h100" and doc["meta"]["device"] == "NVIDIA H100 80GB HBM3"
    (row,) = doc["rows"]
    problem = Problem(2, 16, 2000, 2000, 128, False)
    assert row["time_us"] == pytest.approx(predict("h100", "fa3", problem, {}, impl="fa4kernel").time_us, abs=0.01)


def test_predict_writes_each_variant_where_fa4kernel_runs_it(tmp_path):
    """--predict with --variant: a 'fa4kernel[LABEL]' row per point the build runs at, fa4sim's
    fa4kernel with those knobs (so the measured candidate joins it); a head dim the variant does
    not name gets none."""
    from fa4sim.params import Problem
    from fa4sim.validate.common import predict

    out = tmp_path / "pred.json"
    assert bench.main(["--problem", "b=2,h=16,sq=1000,d=128", "--problem", "b=2,h=8,sq=900,d=256",
                       "--variant", "rescale_threshold=8", "--variant", "hd256:tile_n=80", "--predict", str(out)]) == 0
    rows = {(r["point"], r["kernel"]): r for r in json.loads(out.read_text())["rows"]}
    assert ("hd128-1000-b2-h16", "fa4kernel[rescale_threshold=8]") in rows
    assert ("hd128-1000-b2-h16", "fa4kernel[tile_n=80]") not in rows
    tau = rows[("hd256-900-b2-h8", "fa4kernel[rescale_threshold=8]")]
    want = predict("h200", "fa3", Problem(2, 8, 900, 900, 256), {"rescale_threshold": 8}, impl="fa4kernel")
    assert tau["tflops"] == round(want.tflops, 1) and tau["tflops"] != rows[("hd256-900-b2-h8", "fa4kernel")]["tflops"]
    assert rows[("hd256-900-b2-h8", "fa4kernel[tile_n=80]")]["tile_n"] == 80


def test_variants_parse_and_run_where_fa4kernel_runs_their_head_dim():
    label, knobs, hdim = bench.parse_variant("hd256:tile_n=80,persistent=False,exp_emulation=0.25")
    assert (label, knobs, hdim) == ("tile_n=80,persistent=False,exp_emulation=0.25",
                                    {"tile_n": 80, "persistent": False, "exp_emulation": 0.25}, 256)
    every = bench.parse_variant("tile_n=160")
    assert every[2] is None
    pts = {p.name: p for p in bench.all_points()}
    v = [every, (label, knobs, hdim)]
    assert bench.variants_at(pts["hd256-16k-b1-h8"], v) == [("tile_n=160", {"tile_n": 160}), (label, knobs)]
    assert bench.variants_at(pts["hd128-16k-b1-h16"], v) == [("tile_n=160", {"tile_n": 160})]
    assert bench.variants_at(pts["hd192v128-4k-b4-h16"], v) == []  # fa4kernel does not run hdim_v != hdim
    # each variant is one more run (and build) at the points it runs
    base = bench.estimate_s([pts["hd256-16k-b1-h8"]], 1.0, 0.5)
    more = bench.estimate_s([pts["hd256-16k-b1-h8"]], 1.0, 0.5, variants=v)
    assert more["candidate_runs"] == base["candidate_runs"] + 2 and more["builds"] == base["builds"] + 2
    only = bench.estimate_s([pts["hd256-16k-b1-h8"]], 1.0, 0.5, only=(bench.OURS, bench.FA3))
    assert only["candidate_runs"] == 2


@pytest.mark.parametrize("spec,says", [
    ("tile_q=3", "'tile_q=3' is not KNOB=VALUE"),
    ("tile_n", "'tile_n' is not KNOB=VALUE"),
    ("tile_n=big", "tile_n='big' is not a number"),
    ("h256:tile_n=80", "'h256' before ':' must name a head dim"),
    ("hd128:", "give at least one KNOB=VALUE"),
])
def test_bad_variant_fails_in_one_line(spec, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        bench.parse_variant(spec)


def test_dry_run_plans_variants_and_a_subset_of_candidates():
    res = subprocess.run([sys.executable, os.path.join(ROOT, "lab", "tools", "sustained_sm90.py"), "--dry-run",
                          "--points", "hd256-16k-b1-h8,hd128-16k-b1-h16", "--candidates", "ours,fa3",
                          "--variant", "hd256:tile_n=80"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = {ln.split()[0]: ln for ln in res.stdout.splitlines() if ln.startswith("hd")}
    assert lines["hd256-16k-b1-h8"].endswith("fa4kernel, flash-attn-3, fa4kernel[tile_n=80]")
    assert lines["hd128-16k-b1-h16"].endswith("fa4kernel, flash-attn-3")
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "lab", "tools", "sustained_sm90.py"), "--dry-run",
                          "--candidates", "ours,fa5"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--candidates 'ours,fa5': allowed a comma-separated subset of ours, probe, fa3, fa4, cudnn" in bad.stderr


def test_a_variant_is_predicted_from_its_own_recorded_configuration():
    """A variant row (sustained_sm90.py --variant) is simulated as fa4kernel with the configuration
    that build resolved to (configs[label]), not the default build's."""
    p = sustained_point("hd256-16k-b1-h8", 1, 8, 16384, 16384, 256, False,
                        {"fa4kernel": (700.0, True), "fa4kernel[tile_n=80]": (720.0, True)},
                        config={"tile_m": 128, "tile_n": 64, "persistent": False, "skip_idle_wgs": True})
    p["configs"] = {"tile_n=80": {"tile_m": 128, "tile_n": 80, "persistent": False, "skip_idle_wgs": True}}
    r = validate.compare({"meta": {"kind": "sustained", "device": "NVIDIA H200"}, "points": [p]})
    rows = {x["kernel"]: x for x in r["points"]}
    assert rows["fa4kernel[tile_n=80]"]["knobs"]["tile_n"] == 80 and rows["fa4kernel"]["knobs"]["tile_n"] == 64
    want = simulate("h200", "fa3", Problem(1, 8, 16384, 16384, 256, False), rows["fa4kernel[tile_n=80]"]["knobs"],
                    impl="fa4kernel")
    assert rows["fa4kernel[tile_n=80]"]["predicted_tflops"] == pytest.approx(want.tflops)
    assert rows["fa4kernel[tile_n=80]"]["predicted_tflops"] != pytest.approx(rows["fa4kernel"]["predicted_tflops"])
