"""The command line: outputs, parameter listing, sweeps, and one-line errors with exit code 2."""
import json
import subprocess
import sys

import pytest

from fa4sim.cli import main
from fa4sim.hardware import PARAMS
from fa4sim import implementation
from fa4sim.schedules import SCHEDULES

SMALL = ["--seqlen", "2048", "--batch", "1", "--heads", "8"]


def run_cli(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_run_json_contract(capsys):
    code, out, _ = run_cli(["run", "--hw", "b200", "--schedule", "fa4", *SMALL, "--json"], capsys)
    assert code == 0
    j = json.loads(out)
    assert j["tflops"] > 0 and j["time_us"] > 0 and j["cycles"] > 0
    assert j["clock_ghz"] > 0 and j["clock_source"] in ("power model", "--set", "profile")
    assert j["power_w"] > 0 and set(j["power_by_part"]) >= {"static", "clock", "tensor"}
    assert isinstance(j["bottleneck"], str) and j["bottleneck"]
    assert all(0 <= v <= 1 for v in j["utilization"].values())


def test_run_writes_gantt_and_perfetto(tmp_path, capsys):
    png, trace = tmp_path / "g.png", tmp_path / "t.json"
    code, out, _ = run_cli(["run", "--hw", "h100-datasheet", *SMALL, "--gantt", str(png), "--trace", str(trace)], capsys)
    assert code == 0 and "TFLOP/s" in out and "bottleneck" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"tensor", "mufu", "load", "wg0", "wg1"} <= names
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(e["dur"] >= 0 for e in spans)


def test_set_reaches_knobs_and_hardware(capsys):
    base = json.loads(run_cli(["run", "--hw", "b200", *SMALL, "--json"], capsys)[1])
    fast = json.loads(run_cli(["run", "--hw", "b200", *SMALL, "--json", "--set", "clock_ghz=3.72"], capsys)[1])
    assert fast["time_us"] < base["time_us"]
    knob = json.loads(run_cli(["run", "--hw", "b200", *SMALL, "--json", "--set", "kv_stages=2"], capsys)[1])
    assert knob["knobs"]["kv_stages"] == 2


@pytest.mark.parametrize("sched,hw", [("fa4", "b200"), ("fa3", "h100-datasheet")])
def test_params_lists_every_knob_and_hardware_parameter(sched, hw, capsys):
    code, out, _ = run_cli(["params", "--schedule", sched, "--hw", hw], capsys)
    assert code == 0
    for k in SCHEDULES[sched].KNOBS:
        assert k.name in out
    for name in PARAMS:
        assert name in out
    impl = implementation.load(SCHEDULES[sched].DEFAULT_IMPL, SCHEDULES[sched].ARCH)
    for name in impl.params:  # the implementation's measured constants, each with its source
        assert name in out
    assert out.count("source:") == len(PARAMS) + len(impl.params)


@pytest.mark.parametrize("impl", ["fa4kernel", "flash-attn-4"])
def test_params_pass_bwd_lists_the_backward_knobs_and_constants(impl, capsys):
    """--pass bwd shows what `run --pass bwd --set` takes: the backward schedule's knobs and the
    implementation's backward constants (its generated loop counts among them)."""
    from fa4sim.model import BWD_SCHEDULES

    code, out, _ = run_cli(["params", "--hw", "h100", "--impl", impl, "--pass", "bwd", "--hdim", "96"], capsys)
    assert code == 0
    for k in BWD_SCHEDULES["fa3"].KNOBS:
        assert f"  {k.name} " in out
    bwd = implementation.load(impl, "sm90").for_pass("bwd")
    for name in bwd.params:
        assert f"  {name} " in out
    assert "loop_instr_fixed" in bwd.params and "cta_prologue_cycles" in bwd.params


def test_sweep_writes_csv_json_png(tmp_path, capsys):
    prefix = tmp_path / "sw"
    code, out, _ = run_cli(["sweep", "--hw", "b200", *SMALL, "--grid", "exp_emulation=0,0.25",
                            "--grid", "hdim=64,72", "--out", str(prefix), "--jobs", "1", "--no-progress"], capsys)
    assert code == 0
    rows = json.loads((tmp_path / "sw.json").read_text())["points"]
    assert len(rows) == 4
    assert all("hdim" in r["error"] for r in rows if r["hdim"] == "72")  # an unsupported head dim: per point
    assert all(r["tflops"] > 0 for r in rows if r["hdim"] == "64")
    # each point's clock and the power model's power there (b200 has a power model)
    assert all(0 < r["clock_ghz"] <= 1.965 and r["power_w"] > 0 for r in rows if r["hdim"] == "64")
    assert "clock_ghz,power_w" in (tmp_path / "sw.csv").read_text().splitlines()[0]
    assert (tmp_path / "sw.csv").read_text().count("\n") == 5
    assert (tmp_path / "sw.png").exists()


BAD = [
    (["run", "--hw", "a100"], "hw"),
    (["run", "--schedule", "fa9"], "schedule"),
    (["run", "--hw", "h100-datasheet", "--schedule", "fa4"], "schedule"),
    (["run", "--hw", "b200", "--schedule", "fa3", "--pass", "bwd"], "schedule"),
    (["run", "--hdim", "0"], "hdim"),
    (["run", "--seqlen", "-5"], "seqlen_q"),
    (["run", "--batch", "two"], "--batch"),
    (["run", "--set", "nope=1"], "nope"),
    (["run", "--set", "kv_stages"], "--set"),
    (["run", "--set", "kv_stages=0"], "kv_stages"),
    (["run", "--set", "kv_stages=2.5"], "kv_stages"),
    (["run", "--set", "kv_stages=40"], "smem"),
    (["run", "--set", "exp_emulation=1.5"], "exp_emulation"),
    (["run", "--set", "exp_emulation=lots"], "exp_emulation"),
    (["run", "--set", "tile_n=100"], "tile_n"),
    (["run", "--hdim", "256", "--set", "q_tiles=2"], "tmem"),
    (["run", "--hdim", "72"], "hdim"),
    (["run", "--hdim", "192"], "hdim"),                      # flash-attn-4 on SM100 runs 192 only with hdim_v 128
    (["run", "--impl", "fa3000"], "impl"),
    (["run", "--hw", "b200", "--impl", "fa4kernel"], "impl"),  # fa4kernel's SM100 kernel is not modelled
    (["run", "--hw", "h100-datasheet", "--set", "pv_wait=soon"], "pv_wait"),
    (["run", "--hw", "h100-datasheet", "--set", "ablate=rescale"], "ablate"),
    (["run", "--hw", "h100-datasheet", "--set", "hbm_busy=0.5"], "hbm_busy"),  # internal, not a knob
    (["run", "--gantt", "no/such/folder/x.png"], "--gantt"),
    (["run", "--trace", "trace.txt"], "--trace"),
    (["run", "--hw", "no_such_profile.json"], "hw"),
    (["run", "--seqlen", "1000000000"], "seqlen_q"),
    (["run", "--seqlen", "1000000", "--batch", "64", "--heads", "128"], "batch"),
    (["run", "--hw", "h100-datasheet", "--set", "tile_m=96"], "tile_m"),
    (["run", "--hw", "h100-datasheet", "--set", "tile_n=256", "--hdim", "256"], "smem"),
    (["run", "--hw", "h100-datasheet", "--hdim", "256", "--set", "tile_n=128", "--set", "kv_stages=1"], "registers"),
    (["run", "--set", "two_cta=maybe"], "two_cta"),
    (["run", "--set", "clock_ghz=-1"], "clock_ghz"),
    (["run", "--set", "num_sms=1.5"], "num_sms"),
    (["sweep", "--grid", "warp_speed=1,2"], "warp_speed"),
]


@pytest.mark.parametrize("text,why", [("{not json", "not valid JSON"), ("[1, 2]", "not a hardware profile"),
                                      ('{"name": "x", "arch": "sm90", "params": {"clock_ghz": 1}}', "value and a source")])
def test_corrupt_profile_is_one_line_exit_2(tmp_path, text, why):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    p = subprocess.run([sys.executable, "-m", "fa4sim.cli", "run", "--hw", str(bad)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and why in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,param", BAD)
def test_bad_input_is_one_line_exit_2(args, param):
    p = subprocess.run([sys.executable, "-m", "fa4sim.cli", *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and param in lines[0] and "Traceback" not in p.stderr
    assert p.stdout == ""


def test_help_teaches(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "examples:" in out and "--set" in out and "--gantt" in out
