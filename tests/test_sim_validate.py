"""fa4sim validate on small synthetic result files of each evidence kind (fa4sim/validate/), and
its one-line errors for files it cannot read."""
import json

import pytest

from fa4sim import validate
from fa4sim.cli import main
from fa4sim.errors import InputError


def point(label, knobs, ours, peer=None, causal=False):
    res = {"fa4kernel": {"tflops": ours}}
    if peer:
        res["flash-attn-4"] = {"tflops": peer}
    res["sdpa-cudnn"] = {"tflops": 1.0}  # not simulated: ignored
    return {"batch": 2, "seqlen": 8192, "heads": 16, "hdim": 128, "causal": causal, "label": label,
            "knobs": knobs, "results": res}


DOC = {"meta": {"kind": "points", "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-22T00:00:00+00:00"},
       "points": [point("main", {}, 600.0, 650.0), point("main", {}, 300.0, 320.0, causal=True),
                  {"batch": 2, "seqlen": 8192, "heads": 16, "hdim": 128, "causal": False, "label": "knobs",
                   "configs": {"default": {}, "pingpong=False": {"pingpong": False}},
                   "results": {"fa4kernel[default]": {"tflops": 600.0},
                               "fa4kernel[pingpong=False]": {"tflops": 560.0},
                               "flash-attn-4": {"tflops": 620.0}}}]}


def test_compare_errors_and_knob_deltas(tmp_path):
    r = validate.compare(DOC, "h100-datasheet")
    main_rows = [x for x in r["points"] if x["label"] == "main"]
    assert len(main_rows) == 4  # two points x (ours, flash-attn-4); cuDNN is not simulated
    for x in main_rows:
        assert x["error"] == pytest.approx((x["predicted_tflops"] - x["measured_tflops"]) / x["measured_tflops"])
    s = r["summary"]
    assert s["max_abs_error"] == max(abs(x["error"]) for x in main_rows)
    (d,) = r["knob_deltas"]
    assert d["knob"] == "pingpong=False" and d["measured_delta"] == pytest.approx(560 / 600 - 1)
    png = tmp_path / "c.png"
    validate.plot(r, str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_validate(tmp_path, capsys):
    f = tmp_path / "r.json"
    f.write_text(json.dumps(DOC))
    assert main(["validate", str(f), "--hw", "h100-datasheet"]) == 0
    out = capsys.readouterr().out
    assert "median |error|" in out and "pingpong=False" in out


def test_bad_results_file(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("{}")
    with pytest.raises(InputError, match="no meta.kind"):
        validate.load(str(f))
    with pytest.raises(InputError, match="no such file"):
        validate.load(str(tmp_path / "missing.json"))
    assert validate.profile_for("NVIDIA H200") in ("h200-datasheet", "h200")


@pytest.mark.parametrize("case, expect", [
    ("folder", "is a folder"),
    ("missing", "no such file"),
    ("list", "JSON list"),
    ("not_json", "not JSON"),
    ("no_kind", "no meta.kind"),
    ("unknown_kind", "'power'"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case, expect):
    """What validate cannot read: exit code 2 and one line on stderr that says why, no traceback."""
    files = {"folder": tmp_path, "missing": tmp_path / "missing.json", "list": "[1, 2]", "not_json": "{oops",
             "no_kind": json.dumps({"meta": {"device": "H100"}, "points": []}),
             "unknown_kind": json.dumps({"meta": {"kind": "power"}})}
    target = files[case]
    if isinstance(target, str):
        path = tmp_path / f"{case}.json"
        path.write_text(target)
        target = path
    assert main(["validate", str(target)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and expect in err[0] and "Traceback" not in captured.err and not captured.out


def test_progress_on_stderr(tmp_path, capsys):
    """A file of several points says how far the simulations are, on stderr (stdout stays the report)."""
    f = tmp_path / "r.json"
    f.write_text(json.dumps(DOC))
    assert validate.main([str(f)], "h100-datasheet") == 0
    captured = capsys.readouterr()
    assert "point 1/" in captured.err and "point" not in captured.out.splitlines()[0]


def test_prediction_at_the_points_measured_clock():
    """A point that recorded its in-kernel clock is predicted at that clock (time ~ 1 / clock for
    this compute-bound point); the clock-probe run itself is neither a point nor a knob delta."""
    p = point("main", {}, 600.0)
    p["results"]["fa4kernel[clock probe]"] = {"tflops": 590.0}
    doc = {"meta": DOC["meta"], "points": [dict(p, clock_ghz_in_kernel=1.5)]}
    slow = validate.compare(doc, "h100-datasheet")
    fast = validate.compare({"meta": DOC["meta"], "points": [dict(p, clock_ghz_in_kernel=1.8)]}, "h100-datasheet")
    prof = validate.compare(doc, "h100-datasheet", at_profile_clock=True)
    (a,), (b,), (c,) = slow["points"], fast["points"], prof["points"]
    assert a["clock_ghz"] == 1.5 and c["clock_ghz"] is None
    assert a["predicted_tflops"] / b["predicted_tflops"] == pytest.approx(1.5 / 1.8, rel=0.01)
    assert not slow["knob_deltas"] and "measured in-kernel" in slow["summary"]["clock"]


def interval_point(variant, knobs, n, cycles, hdim=128, pattern="shared"):
    return {"hdim": hdim, "causal": False, "pattern": pattern, "n_ctas": n, "variant": variant, "knobs": knobs,
            "tile_m": 128, "tile_n": 128, "rescale_before_pv": False, "early_q_release": False,
            "defer_o_store_wait": False, "cycles_per_kv_block": cycles}


INTERVAL_META = {"kind": "loop_intervals", "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-22",
                 "seqlens_k": [2048, 4096]}


def test_compare_intervals(capsys, tmp_path):
    """lab/tools/ctas_sm90.py files: cycles per KV block against the simulated steady state, and
    the per-SM knob deltas against 'default' at the same CTA count."""
    doc = {"meta": INTERVAL_META,
           "points": [interval_point("default", {}, 1, 2400.0), interval_point("skip_softmax", {}, 1, 2048.0),
                      interval_point("pingpong=False", {"pingpong": False}, 1, 2300.0)]}
    assert validate.kind(doc) == "loop_intervals" and validate.kind(DOC) != "loop_intervals"
    r = validate.intervals.compare(doc, "h100-datasheet")
    assert [x["variant"] for x in r["intervals"]] == ["default", "pingpong=False"]  # no twin for skip_softmax
    for x in r["intervals"]:
        assert x["error"] == pytest.approx((x["predicted_cycles"] - x["measured_cycles"]) / x["measured_cycles"])
    (d,) = r["knob_deltas"]
    assert d["measured_delta"] == pytest.approx(2400 / 2300 - 1)
    f = tmp_path / "c.json"
    f.write_text(json.dumps(doc))
    assert main(["validate", str(f), "--hw", "h100-datasheet"]) == 0
    assert "per-SM knob deltas" in capsys.readouterr().out


def test_idle_warpgroup_file(tmp_path, capsys):
    """lab/tools/idle_wg_sm90.py's file: a tile with idle warpgroups vs a full one, measured and
    simulated (skip_idle_wgs); fewer live warpgroups cost less, never less than in proportion."""
    doc = {"meta": {"kind": "idle_wgs", "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-22", "heads": 4,
                    "seqlen_k": 1024},
           "cases": [{"head_dim": 64, "tile_m": 192, "warpgroups": 3,
                      "ratio_to_full": {"1": 0.59, "2": 0.85, "3": 1.0},
                      "fa4kernel_config": {"tile_m": 192, "tile_n": 128, "persistent": True, "skip_idle_wgs": True}}]}
    path = tmp_path / "idle.json"
    path.write_text(json.dumps(doc))
    r = validate.idle_wgs.compare(validate.load(str(path)), "h100")
    pred = {c["live"]: c["predicted_ratio"] for c in r["cases"]}
    assert set(pred) == {1, 2} and 1 / 3 <= pred[1] < pred[2] < 1.0
    assert main(["validate", str(path), "--hw", "h100"]) == 0
    assert "1 of 3" in capsys.readouterr().out


def test_pv_wait_sass_what_if(tmp_path, capsys):
    """--pv-wait sass: every build with the PV wait where ptxas put it (pv_wait=compiled: its
    implementation's SASS table), ours and flash-attn-4's each from their own rows; the default
    keeps the model's order (after_max)."""
    p = point("main", {}, 600.0, 650.0)
    p["fa4kernel_config"] = {"tile_m": 128, "tile_n": 128, "rescale_before_pv": False}
    doc = {"meta": DOC["meta"], "points": [p]}
    model = validate.compare(doc, "h100-datasheet")
    sass = validate.compare(doc, "h100-datasheet", pv_wait="sass")
    assert all("pv_wait" not in r["knobs"] for r in model["points"])
    ours, peer = ({r["impl"]: r for r in sass["points"]}[k] for k in ("fa4kernel", "flash-attn-4"))
    assert ours["knobs"]["pv_wait"] == peer["knobs"]["pv_wait"] == "compiled"
    before = {r["impl"]: r["predicted_tflops"] for r in model["points"]}
    assert ours["predicted_tflops"] != before["fa4kernel"] and peer["predicted_tflops"] != before["flash-attn-4"]
    with pytest.raises(InputError, match="pv_wait"):
        validate.compare(doc, "h100-datasheet", pv_wait="ptx")
    f = tmp_path / "r.json"
    f.write_text(json.dumps(doc))
    assert main(["validate", str(f), "--hw", "h100-datasheet", "--pv-wait", "sass"]) == 0
    assert "median |error|" in capsys.readouterr().out


def test_each_variant_is_predicted_at_its_own_clock():
    """bench_fwd_sm90 probes the in-kernel clock of each variant too ("fa4kernel[clock probe:<v>]",
    point["clock_ghz_in_kernel_by_variant"]). A variant is predicted at its own clock where its
    launch and its baseline's are persistent (CTA 0, which the probe reads, spans the launch);
    a one-CTA-per-tile variant keeps the default's. The probes are neither knobs nor points."""
    on = {"persistent": True}
    p = {"batch": 2, "seqlen": 8192, "heads": 16, "hdim": 128, "causal": False, "label": "knobs",
         "configs": {"default": on, "pingpong=False": {**on, "pingpong": False},
                     "kv_stages=3": {"kv_stages": 3, "persistent": False}},
         "results": {"fa4kernel[default]": {"tflops": 600.0}, "fa4kernel[pingpong=False]": {"tflops": 610.0},
                     "fa4kernel[kv_stages=3]": {"tflops": 580.0}, "fa4kernel[clock probe]": {"tflops": 600.0},
                     "fa4kernel[clock probe:pingpong=False]": {"tflops": 610.0},
                     "fa4kernel[clock probe:kv_stages=3]": {"tflops": 580.0}},
         "clock_ghz_in_kernel": 1.60,
         "clock_ghz_in_kernel_by_variant": {"pingpong=False": 1.70, "kv_stages=3": 1.50}}
    rows = {r["label"]: r for r in validate.compare({"meta": DOC["meta"], "points": [p]}, "h100-datasheet")["points"]}
    assert set(rows) == {"default", "pingpong=False", "kv_stages=3"}
    assert rows["default"]["clock_ghz"] == 1.60 and rows["pingpong=False"]["clock_ghz"] == 1.70
    assert rows["kv_stages=3"]["clock_ghz"] == 1.60  # its probe saw the first tile only
    same = {r["label"]: r for r in validate.compare({"meta": DOC["meta"], "points": [
        {**p, "clock_ghz_in_kernel_by_variant": {}}]}, "h100-datasheet")["points"]}
    assert rows["pingpong=False"]["predicted_tflops"] == pytest.approx(
        same["pingpong=False"]["predicted_tflops"] * 1.70 / 1.60, rel=0.02)
    # files whose probes all span their launch (the CTA log for one CTA per tile): every variant's own
    spans = {r["label"]: r for r in validate.compare({"meta": DOC["meta"], "points": [
        {**p, "clock_probes_span_launch": True}]}, "h100-datasheet")["points"]}
    assert spans["kv_stages=3"]["clock_ghz"] == 1.50


def test_pv_wait_table_has_flash_attn_4_causal_builds():
    """flash-attn-4's causal hd128 build waits for the PV GEMM earlier than its non-causal one (its
    own SASS); at hd 64 and 256 the causal builds match the non-causal rows, which they share."""
    from fa4sim import Problem, implementation
    from fa4sim.model import setup
    from fa4sim.schedules.fa3_sm90 import pv_wait_fractions

    impl = implementation.load("flash-attn-4", "sm90")

    def fractions(hd, causal):
        p = Problem(1, 1, 128, 128, hd, causal)
        return pv_wait_fractions(impl, p, setup("h100-datasheet", "fa3", p, {"pv_wait": "compiled"}, impl)[4])

    causal, plain = fractions(128, True), fractions(128, False)
    assert causal["fma"] < plain["fma"] and causal["mufu"] < plain["mufu"]
    assert fractions(64, True) == fractions(64, False)


def test_several_knob_loop_files_give_a_scoreboard_and_a_plot(tmp_path, capsys):
    """fa4sim validate FILE FILE ... --plot: each ctas_sm90.py file reported, then their per-SM knob
    deltas counted together (right sign, within 3 pp) per head dim and causal, and drawn."""
    off = {"intra_wg_overlap": False}

    def doc(causal, cycles_off):
        pts = [interval_point("default", {}, 1, 2400.0), interval_point("intra_wg_overlap=False", off, 1, cycles_off)]
        for p in pts:
            p["causal"] = causal
        return {"meta": INTERVAL_META, "points": pts}
    files = []
    # non-causal: 7 % slower without overlap (as the model says); causal: 10 % *faster* (it does not)
    for i, (causal, cycles) in enumerate(((False, 2400 / 0.93), (True, 2400 / 1.10))):
        f = tmp_path / f"k{i}.json"
        f.write_text(json.dumps(doc(causal, cycles)))
        files.append(str(f))
    results = [validate.intervals.compare(validate.load(f), "h100") for f in files]
    deltas = [d for r in results for d in r["knob_deltas"]]
    assert [d["causal"] for d in deltas] == [False, True]
    assert all(-0.09 < d["predicted_delta"] < -0.05 for d in deltas)  # the model: overlap off costs about 7 %
    board = validate.knob_scoreboard(results)
    assert board == {"all": {"deltas": 2, "same_sign": 1, "within_3pp": 1},
                     "hd128": {"deltas": 1, "same_sign": 1, "within_3pp": 1},
                     "hd128 causal": {"deltas": 1, "same_sign": 0, "within_3pp": 0}}
    png = tmp_path / "kd.png"
    assert main(["validate", *files, "--hw", "h100", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "per-SM knob deltas over 2 files" in out and "1 /   1 of 2" in out and png.stat().st_size > 0


def test_plot_of_several_files_needs_knob_loops(tmp_path, capsys):
    f = tmp_path / "b.json"
    f.write_text(json.dumps(DOC))
    assert main(["validate", str(f), str(f), "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plot with several files" in err[0]


def test_tile_cost_file(tmp_path, capsys):
    """lab/tools/ctas_sm90.py --only-tiles: cycles per tile of one persistent CTA, measured vs the
    fa3 schedule walking the same tiles; two tile lengths split a tile into per-block and per-tile
    parts, and a tile without knob variants reads as the default build; Q
    comes from L2 there (the launches repeat on the same tensors)."""
    from fa4sim import hardware
    from fa4sim.engine import simulate
    from fa4sim.model import build_cta
    from fa4sim.params import Problem

    def tile(blocks, cycles, knobs=None):
        t = {"hdim": 128, "kv_blocks": blocks, "tile_m": 128, "tile_n": 128, "persistent": True,
             "cycles_by_tiles": {"1": 0.0, "3": 0.0}, "cycles_per_tile": cycles}
        return {**t, "knobs": knobs} if knobs is not None else t

    doc = {"meta": {"kind": "tile_costs", "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-22"}, "points": [],
           "tile_costs": [tile(1, 4100.0), tile(2, 7300.0), tile(2, 7000.0, {"pingpong": False})]}
    assert validate.kind(doc) == "tile_costs"
    r = validate.tile_costs.compare(doc, "h100")
    assert [x["variant"] for x in r["tiles"]] == ["default", "default", "pingpong=False"]
    hw = hardware.load("h100")
    hw = hw.with_values(hbm_latency=hw.l2_latency)  # the benchmark's repeated launches: Q from L2
    p = Problem(1, 1, 128 * 3, 2 * 128, 128, False)
    # a record without rescale_threshold predates conditional rescaling as the default: it rescaled always
    sched = build_cta(hw, p, {"tile_m": 128, "tile_n": 128, "rescale_threshold": None}, 2, 0)
    direct = (simulate(sched, [2, 2, 2]).end - simulate(sched, [2]).end) / 2
    assert r["tiles"][1]["predicted_cycles"] == pytest.approx(direct)
    (line,) = r["lines"]  # only the default has two lengths
    for w in ("measured", "predicted"):
        longest = r["tiles"][1][f"{w}_cycles"]
        assert line[f"{w}_per_tile"] + 2 * line[f"{w}_per_block"] == pytest.approx(longest)
    assert line["measured_per_block"] == pytest.approx(3200.0)
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps(doc))
    assert main(["validate", str(path), "--hw", "h100"]) == 0
    out = capsys.readouterr().out
    assert "cycles per tile" in out and "per block" in out
    assert main(["validate", str(path), "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["validate", str(path), str(path), "--plot", str(tmp_path / "q.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plot" in err[0]


def test_tiles_of_a_build_that_is_not_persistent_are_left_out(tmp_path, capsys):
    """A build whose tiles each run as their own CTA (hd96, hd192: O staged in Q's buffer) has no
    walk of tiles to compare: its records are left out, and a file of only those is refused in
    one line."""
    walk = {"hdim": 128, "kv_blocks": 2, "tile_m": 128, "tile_n": 128, "persistent": True,
            "cycles_by_tiles": {"1": 0.0, "9": 0.0}, "cycles_per_tile": 7300.0}
    own = {**walk, "hdim": 192, "tile_n": 112, "persistent": False, "cycles_per_tile": -79.0}
    doc = {"meta": {"kind": "tile_costs", "device": "NVIDIA H200", "date": "2026-11-29"}, "points": [],
           "tile_costs": [walk, own]}
    assert [r["hdim"] for r in validate.tile_costs.compare(doc, "h200")["tiles"]] == [128]
    path = tmp_path / "own.json"
    path.write_text(json.dumps({**doc, "tile_costs": [own]}))
    assert main(["validate", str(path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err) and "no walk of tiles on one persistent CTA" in err[-1]
