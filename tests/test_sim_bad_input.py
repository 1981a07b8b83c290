"""Bad input, from a fuzzing of every subcommand: one line naming the parameter and what is allowed,
exit code 2 in the CLI (130 for Ctrl-C), a ValueError in the Python API; never a traceback, a hang
or a silent nonsense result."""
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fa4sim import hardware, implementation
from fa4sim.cli import main
from fa4sim.errors import InputError
from fa4sim.model import build_cta, setup, simulate
from fa4sim.params import Problem

ROOT = Path(__file__).resolve().parents[1]
from lab.tools.index import path_of  # noqa: E402
RESULTS = ROOT / "lab/campaigns"
SMALL = ["--seqlen", "1024", "--batch", "1", "--heads", "1"]
P = Problem(1, 1, 1024, 1024, 128)


def one_line_exit_2(args, capsys, *words):
    """Run the CLI in this process: exit 2, nothing on stdout, one line on stderr holding `words`."""
    code = main(args)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, (code, err)
    assert lines[0].startswith("fa4sim: error: ") and all(w in lines[0] for w in words), lines[0]
    return lines[0]


# ---- 1. hardware parameters: unit and span beside each one, checked in profiles and --set --------

def profile_file(tmp_path, change):
    data = json.loads((ROOT / "fa4sim/profiles/h100.json").read_text())
    change(data)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    return str(path)


def set_value(name, value):
    def change(data):
        data["params"][name]["value"] = value
    return change


@pytest.mark.parametrize("name,value", [
    ("num_sms", 0), ("num_sms", -1), ("num_sms", float("nan")), ("num_sms", 1.5), ("num_sms", "132"),
    ("num_sms", None), ("num_sms", True), ("num_sms", 1e9), ("mufu_ex2_per_clk", 0), ("clock_ghz", "fast"),
    ("clock_ghz", None), ("clock_ghz", float("inf")), ("energy_tensor_pj_per_flop", -1), ("power_cap_w", -700),
    ("l2_bytes", 0), ("voltage_slope", 2), ("cap_held_fraction", 0), ("mma_queue_depth", 0), ("card_power_w", -1e9)])
def test_a_profile_value_outside_its_span_is_refused(tmp_path, capsys, name, value):
    path = profile_file(tmp_path, set_value(name, value))
    p = hardware.PARAMS[name]
    one_line_exit_2(["run", "--hw", path], capsys, f"{name}: got ", f"from {path}", "; allowed: ",
                    "an integer in " if p.integer else "", p.unit if p.unit not in ("1", "fraction") else "")
    with pytest.raises(ValueError, match=name):
        hardware.load(path)


@pytest.mark.parametrize("change,words", [
    (lambda d: d["params"].update(num_smz={"value": 132, "source": "x"}), ("num_smz", "did you mean num_sms", "fa4sim params")),
    (lambda d: d.update(name=123), ("name must be a string",)),
    (lambda d: d.update(arch=90), ("arch must be a string",)), (lambda d: d.update(arch="sm80"), ("arch must be sm90 or sm100",)),
    (lambda d: d.update(params=["num_sms"]), ("params an object",)),
    (lambda d: d["params"].pop("num_sms"), ("lacks parameters", "num_sms")),
    (lambda d: d["params"]["num_sms"].update(source=5), ("need a value and a source",)),
    (lambda d: d["params"]["tmem_columns"].update(value=512), ("tmem_bytes_per_clk", "TMEM")),
])
def test_a_malformed_profile_is_refused(tmp_path, capsys, change, words):
    one_line_exit_2(["run", "--hw", profile_file(tmp_path, change)], capsys, *words)


@pytest.mark.parametrize("text,why", [("", "not valid JSON"), ("[" * 100000, "not valid JSON"), ("\x80\xff", "cannot read")])
def test_an_unreadable_profile_is_refused(tmp_path, capsys, text, why):
    path = tmp_path / "bad.json"
    path.write_bytes(text.encode("latin-1"))
    one_line_exit_2(["run", "--hw", str(path)], capsys, "hw: ", why)
    (tmp_path / "dir.json").mkdir()
    one_line_exit_2(["run", "--hw", str(tmp_path / "dir.json")], capsys, "hw: cannot read")


def test_every_shipped_profile_lies_within_the_spans():
    for name in hardware.available():
        hw = hardware.load(name)
        for k, p in hardware.PARAMS.items():
            assert p.lo <= hw.values[k] <= p.hi, (name, k)
            assert not p.integer or isinstance(hw.values[k], int), (name, k)


@pytest.mark.parametrize("name,value", [
    # what-ifs of the repo's tests, lessons and README: they stay allowed
    ("mufu_ex2_per_clk", "32"), ("clock_ghz", "1.789"), ("clock_ghz", "3.72"), ("card_power_w", "-10"),
    ("card_power_w", 41.3), ("hbm_bandwidth_tbps", 100.0), ("power_cap_w", 2000), ("power_cap_w", 0),
    ("num_sms", 1), ("smem_bytes_per_clk", 96.0), ("tensor_idle_gap_cycles", 0.0), ("mma_min_cycles", 20),
    ("clock_tensor_ghz", 0), ("l2_mixed_time_fraction", 1.0), ("cap_held_fraction", 0.98)])
def test_the_repos_what_ifs_stay_allowed(name, value):
    assert hardware.check_value(name, value, "--set") == pytest.approx(float(value))


@pytest.mark.parametrize("kv,words", [
    ("clock_ghz=1e6", ("clock_ghz: got '1e6' from --set; allowed: 0.1..5 GHz",)),
    ("card_power_w=-1e9", ("card_power_w: got '-1e9' from --set; allowed: -500..500 W",)),
    ("num_sms=0", ("num_sms: got '0' from --set, not > 0; allowed: an integer in 1..1024 SMs",)), ("num_sms=1.5", ("num_sms",)), ("num_sms=true", ("num_sms",)),
    ("clock_ghz=nan", ("clock_ghz",)), ("clock_ghz=inf", ("clock_ghz",)), ("clock_ghz=", ("clock_ghz: got ''",)),
    ("power_cap_w=-700", ("power_cap_w",)), ("energy_tensor_pj_per_flop=-1", ("energy_tensor_pj_per_flop",)),
    ("warp_issue_ipc=0", ("warp_issue_ipc",)), ("l2_latency=1e12", ("l2_latency",)),
    # the implementation's measured constants: a flag, a rate (a divisor), a cost within 100 x the measured one
    ("o_store_bytes_per_clk=0", ("o_store_bytes_per_clk", "measured on fa4kernel-sm90: 36")),
    ("cta_prologue_cycles=1e15", ("cta_prologue_cycles", "0..157000")), ("tau_test_instr=-1", ("tau_test_instr",)),
    # knobs: an int knob without a maximum of its own (kv_stages: the fit check walked 1e9 stages)
    ("kv_stages=1e9", ("kv_stages: must be in 1..4096",)),
])
def test_set_values_outside_their_span_are_refused(capsys, kv, words):
    one_line_exit_2(["run", "--hw", "h100", *SMALL, "--set", kv], capsys, *words)


def test_set_b200_checks(capsys):
    one_line_exit_2(["run", "--hw", "b200", *SMALL, "--set", "tmem_bytes_per_clk=0"], capsys, "tmem_bytes_per_clk")
    one_line_exit_2(["run", "--hw", "b200", *SMALL, "--set", "o_reuses_q_smem=maybe"], capsys, "true or false")
    one_line_exit_2(["run", "--hw", "b200", *SMALL, "--set", "kv_smem_budget_bytes=1.5"], capsys, "an integer")
    impl = setup("b200", None, P, {"o_reuses_q_smem": "true"}, None)[3]
    assert impl.params["o_reuses_q_smem"]["value"] is True


def test_python_api_values_are_checked_as_set_is():
    with pytest.raises(ValueError, match="num_sms"):
        hardware.check_value("num_sms", True, "a profile")
    with pytest.raises(ValueError, match="num_sms"):
        hardware.load("h100").with_values(num_sms=0)
    with pytest.raises(ValueError, match="clock_ghz"):
        setup("h100", None, P, {"clock_ghz": 1e6}, None)
    assert hardware.load("h100").with_values(num_sms=1.0).num_sms == 1  # a whole float is the integer


def test_set_given_twice_is_refused(capsys):
    one_line_exit_2(["run", "--set", "clock_ghz=1.5", "--set", "clock_ghz=9"], capsys, "--set: clock_ghz given twice")
    one_line_exit_2(["run", "--set", "=1"], capsys, "--set: expected NAME=VALUE")


# ---- 2. Ctrl-C: exit 130, one line, a sweep keeps what finished -----------------------------------

def _sigint_default():
    """In the child: Ctrl-C as a terminal gives it. A pytest-xdist worker ignores SIGINT, and a
    child inherits that (Python then installs no KeyboardInterrupt at all)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt(args, ready, tmp_path):
    """Start the CLI, send SIGINT once `ready` shows on its stderr (then a moment); (code, stderr)."""
    p = subprocess.Popen([sys.executable, "-m", "fa4sim.cli", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         cwd=tmp_path, preexec_fn=_sigint_default)
    os.set_blocking(p.stderr.fileno(), False)
    seen, t0 = b"", time.time()
    while not re.search(ready, seen.decode(errors="replace")) and time.time() - t0 < 120 and p.poll() is None:
        try:
            seen += os.read(p.stderr.fileno(), 1 << 16)
        except BlockingIOError:
            time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    os.set_blocking(p.stderr.fileno(), True)
    _, rest = p.communicate(timeout=60)  # a hang fails here
    return p.returncode, (seen + rest).decode(errors="replace")


def test_ctrl_c_in_a_sweep_writes_the_points_that_finished(tmp_path):
    # 40 points on 2 workers, interrupted once one has finished; 20 more the model refuses
    # (kv_stages=4 on hd128 does not fit)
    out = tmp_path / "sw"
    code, err = interrupt(["sweep", "--hw", "h100", "--batch", "4", "--jobs", "2",
                           "--grid", "seqlen=8192,16384,32768,65536,131072", "--grid", "kv_stages=2,3,4",
                           "--grid", "heads=16,32,48,64", "--out", str(out)], r" [1-9]\d*/40 points", tmp_path)
    last = err.strip().splitlines()[-1]
    assert code == 130 and "Traceback" not in err, err
    m = re.fullmatch(r"fa4sim: interrupted: (\d+) of 60 points finished \((\d+) of them invalid\), written to "
                     r"\S+sw\.csv and \S+sw\.json", last)
    assert m, last
    rows = json.loads((tmp_path / "sw.json").read_text())["points"]
    assert len(rows) == int(m[1]) and int(m[2]) == 20 and 21 <= len(rows) < 60
    assert (tmp_path / "sw.csv").read_text().count("\n") == len(rows) + 1
    assert all(r["tflops"] > 0 for r in rows if not r["error"])


def test_ctrl_c_stops_the_points_running_now(tmp_path):
    """The workers of the points running at Ctrl-C are stopped, not left to finish (a point may
    take minutes): here each point never ends, and the workers are gone once map_points returns.
    The Ctrl-C comes once one point runs (the second worker may still be starting), or both."""
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent("""
        import os, signal, sys, threading, time
        from fa4sim.sweep import Interrupted, map_points
        def forever(x):
            with open(os.path.join(sys.argv[1], f"{os.getpid()}.pid"), "w"):
                pass
            parent = os.getppid()
            while os.getppid() == parent:  # until stopped; should the test fail, until its script is gone
                pass
        if __name__ == "__main__":
            here, running = sys.argv[1], int(sys.argv[2])
            def when_running():  # Ctrl-C once `running` points have started
                while len([f for f in os.listdir(here) if f.endswith(".pid")]) < running:
                    time.sleep(0.02)
                os.kill(os.getpid(), signal.SIGINT)
            threading.Thread(target=when_running, daemon=True).start()
            try:
                map_points(forever, list(range(4)), jobs=2, progress=False)
            except Interrupted as e:
                print(e.results, flush=True)
    """))
    for when in ("1", "2"):
        here = tmp_path / when
        here.mkdir()
        p = subprocess.run([sys.executable, str(script), str(here), when], capture_output=True, text=True,
                           timeout=120, cwd=ROOT, preexec_fn=_sigint_default)  # a worker left running would hold the pool open: a hang
        assert p.stdout.strip() == "[None, None, None, None]", (when, p.stdout, p.stderr)
        for pid in (int(f.stem) for f in here.glob("*.pid")):
            with pytest.raises(ProcessLookupError):  # stopped and reaped
                os.kill(pid, 0)


def test_ctrl_c_in_validate_is_one_line_exit_130(tmp_path):
    code, err = interrupt(["validate", str(path_of("sm90_fwd_h100_2026-11-22.json"))], r"point 1/51", tmp_path)
    assert code == 130 and err.strip().splitlines()[-1] == "fa4sim: interrupted" and "Traceback" not in err
    assert "point 51/51" not in err  # it stopped


# ---- 3. sweep grids: every value checked before any simulation ----------------------------------

SWEEP = ["sweep", "--hw", "h100", *SMALL, "--no-progress", "--jobs", "1"]


@pytest.mark.parametrize("grid,words", [
    (["seqlen=1024,abc"], ("seqlen: must be an integer, got 'abc'",)),
    (["hw=h100,bogus"], ("hw: unknown hardware 'bogus'",)),
    (["seqlen=1024", "seqlen=2048"], ("seqlen: given twice in --grid",)),
    (["seqlen=1024", "seqlen_q=2048"], ("seqlen_q: given twice in --grid (as seqlen)",)),
    (["seqlen=1024,1024"], ("1024 given twice",)),
    (["hdim=72,80"], ("--grid: every point is invalid; the first (hdim=72): hdim:",)),
    (["causal=maybe"], ("causal: must be true or false",)),
    (["seqlen=-1,1024"], ("seqlen_q: must be a positive integer",)),
    (["impl=bogus"], ("impl: unknown implementation 'bogus'",)),
    (["kv_stages=0,2"], ("kv_stages",)), (["clock_ghz=1e6"], ("clock_ghz: got '1e6' from --grid",)),
    (["num_sms=0,132"], ("num_sms",)), (["seqlen="], ("needs at least one value",)), (["="], ("--grid: expected",)),
    (["warp_speed=1"], ("warp_speed: unknown grid dimension",)),
    (["tile_m=64,abc"], ("tile_m: must be a number (int 64..256), got 'abc'",)),
    # refused only as simulate() starts (too many tiles): still every point, so still an error, and no output
    (["batch=99999999999999999999"], ("--grid: every point is invalid; the first (batch=99999999999999999999): batch: ",
                                      "fa4sim simulates at most 131072")),
])
def test_a_bad_grid_is_refused_before_any_simulation(tmp_path, capsys, grid, words):
    args = [*SWEEP, *[x for g in grid for x in ("--grid", g)], "--out", str(tmp_path / "sw")]
    one_line_exit_2(args, capsys, *words)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("jobs", ["0", "-1", "2000"])
def test_sweep_jobs_out_of_range(tmp_path, capsys, jobs):
    one_line_exit_2(["sweep", "--hw", "h100", "--grid", "seqlen=1024", "--jobs", jobs, "--out", str(tmp_path / "s")],
                    capsys, "--jobs: must be in 1..1024")


# ---- 4. outputs: the folder must exist, for every option that writes ------------------------------

@pytest.mark.parametrize("args,option", [
    (["sweep", "--grid", "seqlen=1024", "--out", "{missing}/sw"], "--out"),
    (["validate", str(path_of("tile_costs_h200_2026-11-22.json")), "--plot", "{missing}/p.png"], "--plot"),
    (["run", "--gantt", "{missing}/g.png"], "--gantt"), (["run", "--trace", "{missing}/t.json"], "--trace"),
    (["graph", "--dot", "{missing}/g.dot"], "--dot"), (["graph", "--plot", "{missing}/g.png"], "--plot"),
])
def test_an_output_folder_must_exist(tmp_path, capsys, args, option):
    missing = tmp_path / "no" / "such"
    one_line_exit_2([a.format(missing=missing) for a in args], capsys, f"{option}: folder", "does not exist")
    assert not (tmp_path / "no").exists()  # nothing created it


@pytest.mark.parametrize("args,words", [
    (["sweep", "--grid", "seqlen=1024", "--out", ""], ("--out: '' is empty",)),
    (["sweep", "--grid", "seqlen=1024", "--out", "{tmp}/"], ("--out:", "is a folder")),
    (["run", "--trace", "{tmp}/d.json"], ("--trace:", "is a folder")),
    (["run", "--gantt", ""], ("--gantt: '' is empty",)),
    (["sweep", "--grid", "seqlen=1024", "--out", "{tmp}/sw.csv"], ("--out: a prefix: sweep writes PREFIX.csv",
                                                                  "sw', not ", "sw.csv'")),
])
def test_an_output_must_name_a_file(tmp_path, capsys, args, words):
    (tmp_path / "d.json").mkdir()
    one_line_exit_2([a.format(tmp=tmp_path) for a in args], capsys, *words)


def test_an_output_the_os_refuses_is_one_line(capsys):
    one_line_exit_2(["run", "--hw", "h100", *SMALL, "--trace", "/proc/fa4sim_trace.json"], capsys,
                    "/proc/fa4sim_trace.json: ")


# ---- 5. options of validate and run -------------------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (["validate", "--hw", "bogus", str(path_of("tile_costs_h200_2026-11-22.json"))], ("--hw: unknown hardware 'bogus'",)),
    (["validate", str(path_of("sustained_blind_h200_2026-11-28.json")), "--set", "bogus=1"], ("bogus: unknown parameter",)),
    (["validate", str(path_of("sustained_blind_h200_2026-11-28.json")), "--set", "card_power_w=-1e9"], ("card_power_w",)),
    (["run", "--gantt-iters", "0"], ("--gantt-iters: only with --gantt",)),
    (["run", "--gantt", "x.png", "--gantt-iters", "0"], ("--gantt-iters: must be in 1..64, got 0",)),
    (["run", "--gantt", "x.png", "--gantt-iters", "-1"], ("--gantt-iters: must be in 1..64",)),
    (["run", "--gantt", "x.png", "--gantt-iters", "1000000"], ("--gantt-iters: must be in 1..64",)),
    (["run", "--impl", ""], ("impl: unknown implementation ''",)), (["params", "--impl", ""], ("impl:",)),
    (["params", "--hw", "h100", "--schedule", "fa4"], ("schedule: fa4 is an sm100 schedule",)),
    (["params", "--hw", "h100", "--impl", "flash-attn-3", "--pass", "bwd"], ("pass: flash-attn-3-sm90 has no backward",)),
    (["run", "--compact"], ("--compact: only with --json",)), (["graph", "--compact"], ("--compact: only with --json",)),
    (["solve", "--compact"], ("--compact: only with --json",)),
    (["solve", "--time-limit", "0"], ("--time-limit",)), (["solve", "--time-limit", "nan"], ("--time-limit",)),
    (["solve", "--time-limit", "1e9"], ("--time-limit: must be in (0, 3600]",)),
    # options of one kind of results file, given with another: refused, not ignored
    (["validate", str(path_of("tile_costs_h200_2026-11-22.json")), "--at-profile-clock"],
     ("--at-profile-clock: applies to points and knob_points files only, not tile_costs",)),
    (["validate", str(path_of("tile_costs_h200_2026-11-22.json")), "--pv-wait", "sass"], ("--pv-wait: applies to",)),
    (["validate", str(path_of("tile_costs_h200_2026-11-22.json")), "--set", "card_power_w=1"],
     ("--set: applies to sustained files only, not tile_costs",)),
])
def test_option_values_are_checked(tmp_path, capsys, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    one_line_exit_2(args, capsys, *words)


@pytest.mark.parametrize("doc,words", [
    ({"meta": {"kind": "tile_costs", "device": "H100"}}, ("not a complete tile_costs file", "no field 'tile_costs'")),
    ({"meta": {"kind": "points", "device": "H100"}, "points": [{"batch": 1}]}, ("not a complete points file",)),
    ({"meta": {"kind": "points", "device": "H100"}, "points": "x"}, ("not a complete points file",)),
    ({"meta": {"kind": "sustained", "device": "H100"}, "points": [{}]}, ("sustained",)),
    ({"meta": {"kind": ["points"]}}, ("which validate does not compare",)),
    ({"meta": "x"}, ("no meta.kind",)), ([1, 2], ("JSON list",)), (None, ("JSON null",)), ("x", ("JSON string",)),
])
def test_validate_refuses_a_file_of_its_kind_that_is_incomplete(tmp_path, capsys, doc, words):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    one_line_exit_2(["validate", str(path)], capsys, "results: ", *words)


def test_validate_refuses_nested_json(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text("[" * 100000)
    one_line_exit_2(["validate", str(path)], capsys, "results: ", "not JSON")
    one_line_exit_2(["validate", ""], capsys, "results: '' is empty: give a result file")


# ---- 6. Ray: an address without a cluster fails fast ---------------------------------------------

@pytest.mark.parametrize("address,words", [(":", ("expected HOST:PORT",)), ("127.0.0.1:99999", ("expected HOST:PORT",)),
                                           ("http://127.0.0.1:6379", ("expected HOST:PORT",)),
                                           ("[::1]:{closed}", ("no Ray cluster answers at [::1]:",)),
                                           ("", ("expected HOST:PORT",)), ("127.0.0.1:{closed}", ("no Ray cluster answers",)),
                                           ("127.0.0.1:{silent}", ("127.0.0.1",))])
def test_a_ray_address_without_a_cluster_fails_fast(tmp_path, capsys, address, words):
    with socket.socket() as closed, socket.socket() as silent:  # a port nothing listens on; one that never answers
        closed.bind(("127.0.0.1", 0))
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        address = address.format(closed=closed.getsockname()[1], silent=silent.getsockname()[1])
        closed.close()
        t0 = time.time()
        one_line_exit_2(["sweep", "--grid", "seqlen=1024", "--backend", "ray", "--ray-address", address,
                         "--out", str(tmp_path / "sw")], capsys, "--ray-address: ", *words)
    assert time.time() - t0 < 10


# ---- 7. the Python API: a ValueError naming the argument -----------------------------------------

@pytest.mark.parametrize("call,param", [
    (lambda: simulate([], problem=P), "hw"), (lambda: simulate(None, problem=P), "hw"), (lambda: simulate(123, problem=P), "hw"),
    (lambda: simulate("h100", problem={"batch": 1}), "problem"), (lambda: simulate("h100"), "problem"),
    (lambda: simulate("h100", problem=P, overrides=["a"]), "overrides"),
    (lambda: simulate("h100", problem=P, impl=5), "impl"), (lambda: simulate("h100", problem=P, impl=""), "impl"),
    (lambda: simulate("h100", problem=P, impl=[]), "impl"), (lambda: simulate("h100", 3, problem=P), "schedule"),
    (lambda: simulate("h100", [], problem=P), "schedule"), (lambda: simulate("h100", problem=P, pass_=[]), "pass"),
    (lambda: hardware.load(None), "hw"), (lambda: hardware.load(["x"]), "hw"), (lambda: implementation.load(None), "impl"),
    (lambda: build_cta([], P), "hw"), (lambda: build_cta("h100", {"batch": 1}), "problem"),
    (lambda: build_cta("h100", P, ["a"]), "overrides"),
    (lambda: build_cta("h100", P, n_kv=0), "n_kv"), (lambda: build_cta("h100", P, n_kv=1.5), "n_kv"),
    (lambda: build_cta("h100", P, n_kv="3"), "n_kv"), (lambda: build_cta("h100", P, n_kv=None), "n_kv"),
    (lambda: build_cta("h100", P, masked=-1), "masked"), (lambda: build_cta("h100", P, n_kv=4, masked=5), "masked"),
    (lambda: Problem(1, 1, 1024, 1024, 128, [True]), "causal"),
    (lambda: Problem(0, 1, 1024, 1024, 128), "batch"), (lambda: Problem(1, 1, -1, 1024, 128), "seqlen_q"),
    (lambda: Problem(1, 1, 1024, 1024, "128"), "hdim"), (lambda: Problem(1, 1, 1024, 1024, 128, "yes"), "causal"),
    (lambda: Problem(1, 1, 1024, 1024, 128.0), "hdim"), (lambda: Problem(True, 1, 1024, 1024, 128), "batch"),
])
def test_the_python_api_names_the_argument(call, param):
    with pytest.raises(ValueError) as e:
        call()
    assert isinstance(e.value, InputError) and e.value.param == param, e.value


def test_numpy_integers_make_a_problem():
    np = pytest.importorskip("numpy")
    p = Problem(np.int64(1), 1, np.int32(1024), 1024, 128)
    assert p == P and type(p.batch) is int
    c = Problem(1, 1, 1024, 1024, 128, np.bool_(True))
    assert c.causal is True
    with pytest.raises(ValueError, match="causal"):
        Problem(1, 1, 1024, 1024, 128, np.array([True, False]))


def test_any_mapping_serves_as_overrides():
    from types import MappingProxyType
    assert setup("h100", None, P, MappingProxyType({"kv_stages": 3}), None)[4]["kv_stages"] == 3
    assert build_cta("h100", P, MappingProxyType({}), n_kv=np_int(4)) is not None


def np_int(n):
    np = pytest.importorskip("numpy")
    return np.int64(n)


# ---- 8. solve: the time limit it ran out of ------------------------------------------------------

def test_solve_out_of_time_names_time_limit(capsys, monkeypatch):
    from fa4sim import modulo

    def out_of_time(g, order, time_limit_s):
        raise InputError("solve", f"no schedule found within {time_limit_s:g} s for x (order={order}; II from 1 to 2 "
                                  f"cycles, up to 3 stages)")
    monkeypatch.setattr(modulo, "solve", out_of_time)
    one_line_exit_2(["solve", "--hw", "h100", "--pass", "bwd"], capsys,
                    "--time-limit: no schedule found within 0.7 s", "give it more time, e.g. --time-limit 2.1 (default 0.7)")


def test_solve_out_of_time_for_real(capsys):
    pytest.importorskip("ortools")
    one_line_exit_2(["solve", "--hw", "b200", "--time-limit", "0.001"], capsys,
                    "--time-limit: no schedule found within 0.001 s", "e.g. --time-limit 2.1 (default 0.7)")


# ---- 9., 10. help texts and progress -------------------------------------------------------------

def test_help_describes_the_profiles_there_are(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "-measured" not in out and "*-datasheet: datasheet numbers" in out
    for name in hardware.available():
        assert name in out


def test_validate_progress_never_passes_its_total(capsys):
    assert main(["validate", str(path_of("tile_costs_h200_2026-11-22.json"))]) == 0
    counts = [tuple(map(int, m)) for m in re.findall(r"tile (\d+)/(\d+)", capsys.readouterr().err)]
    assert counts and all(i <= n for i, n in counts) and counts[-1][0] == counts[-1][1]


def test_spans_are_finite_and_ordered():
    for name, p in hardware.PARAMS.items():
        assert math.isfinite(p.lo) and math.isfinite(p.hi) and p.lo < p.hi, name
