"""`fa4sim sweep --backend ray`: the same points as the process pool, through Ray tasks, and its one-line errors."""
import socket
import sys
import time

import pytest

from fa4sim.cli import main
from fa4sim.sweep import map_points

# 2 valid head dims and 1 the schedule refuses (kept per point with its error), at 2 emulation fractions
GRID = ["--hw", "b200", "--seqlen", "2048", "--batch", "1", "--heads", "8",
        "--grid", "exp_emulation=0,0.25", "--grid", "hdim=64,72,128", "--no-progress"]


def _sleep_then_echo(item):
    time.sleep(item[1])
    return item[0]


def test_map_points_keeps_the_items_order():
    # the first item finishes last: the results still come back in the items' order
    items = [(i, 0.3 if i == 0 else 0.0) for i in range(4)]
    assert map_points(_sleep_then_echo, items, backend="process", jobs=2, progress=False) == [0, 1, 2, 3]


def test_ray_sweep_matches_the_process_pool(tmp_path, capsys, monkeypatch):
    ray = pytest.importorskip("ray", reason="CI installs the cluster extra; here: pip install ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a local cluster of 2 CPUs, as on the CI machine
    assert main(["sweep", *GRID, "--jobs", "2", "--out", str(tmp_path / "proc")]) == 0
    assert main(["sweep", *GRID, "--jobs", "2", "--backend", "ray", "--out", str(tmp_path / "ray")]) == 0
    capsys.readouterr()
    assert not ray.is_initialized()  # the local cluster it started is shut down
    for ext in (".json", ".csv"):
        assert (tmp_path / f"ray{ext}").read_bytes() == (tmp_path / f"proc{ext}").read_bytes()
    import json
    rows = json.loads((tmp_path / "ray.json").read_text())["points"]
    assert [(r["exp_emulation"], r["hdim"]) for r in rows] == [(e, h) for e in ("0", "0.25") for h in ("64", "72", "128")]
    assert all(r["tflops"] > 0 and not r["error"] for r in rows if r["hdim"] != "72")
    assert all("hdim" in r["error"] for r in rows if r["hdim"] == "72")


def test_missing_ray_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as without the package
    code = main(["sweep", *GRID, "--backend", "ray", "--out", str(tmp_path / "sw")])
    err = capsys.readouterr().err
    assert code == 2 and "pip install ray" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sw.json").exists()


def test_unreachable_address_is_one_line_exit_2(tmp_path, capsys):
    pytest.importorskip("ray", reason="CI installs the cluster extra; here: pip install ray")
    with socket.socket() as s:  # a port that nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["sweep", *GRID, "--backend", "ray", "--ray-address", f"127.0.0.1:{port}", "--out", str(tmp_path / "sw")])
    err = capsys.readouterr().err
    assert code == 2 and f"--ray-address: no Ray cluster answers at 127.0.0.1:{port}" in err
    assert len(err.strip().splitlines()) == 1


def test_ray_address_needs_the_ray_backend(tmp_path, capsys):
    code = main(["sweep", *GRID, "--ray-address", "127.0.0.1:6379", "--out", str(tmp_path / "sw")])
    err = capsys.readouterr().err
    assert code == 2 and "--ray-address: needs --backend ray" in err and len(err.strip().splitlines()) == 1
