"""bench_decode_sm90.py --predict on the CPU: fa4sim's decode predictions for the selected rows, with
fa4kernel's split count taken from fa4kernel.kvcache's own plan."""
import json

from fa4kernel import kvcache
from lab.tools import bench_decode_sm90 as bench

FIELDS = {"point", "kernel", "us", "kv_read_gbps", "num_splits", "pack_gqa", "clock_ghz", "bottleneck"}
KERNELS = ("flash-attn-3", "flash-attn-4", "fa4kernel.kvcache[auto]")


def test_predict_writes_rows_for_each_kernel(tmp_path):
    out = tmp_path / "pred.json"
    argv = ["--rows", "b8-q4-k32768-h32-kv8-causal", "--problem", "b=1,sq=1,sk=65536,h=16,kv=2",
            "--predict", str(out)]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    meta = doc["meta"]
    assert meta["kind"] == "predictions" and meta["device"] == "NVIDIA H200" and meta["profile"] == "h200"
    assert meta["model_commit"] and "--predict" in meta["command"] and meta["what"]
    rows = bench.parse_args(argv).selected
    assert {(r["point"], r["kernel"]) for r in doc["rows"]} == {(row.name, k) for row in rows for k in KERNELS}
    for r in doc["rows"]:
        assert FIELDS <= set(r)
        assert r["us"] > 0 and r["kv_read_gbps"] > 0 and r["clock_ghz"] > 0 and r["bottleneck"]
    for row in rows:
        ours = next(r for r in doc["rows"] if r["point"] == row.name and r["kernel"] == KERNELS[2])
        plan = kvcache.decode_plan(row.batch, row.seqlen_q, row.seqlen_cache, row.heads, row.heads_kv, row.hdim,
                                   "bfloat16", row.causal, None, kvcache.DEFAULT_SMS)
        assert ours["num_splits"] == plan["num_splits"] == bench.auto_splits(row, kvcache.DEFAULT_SMS)
        assert ours["pack_gqa"] is True
        assert ("combine" in ours.get("note", "")) == plan["combine"]


def test_measured_rows_carry_the_point_name():
    """The measured file's rows name their point as the predictions do (the join key)."""
    import inspect

    assert '"point": row.name' in inspect.getsource(bench.run_row)


def test_pages_add_paged_rows_of_both_peers(tmp_path):
    """--pages: a flash-attn-3 and a flash-attn-4 row per page size, predicted with fa4sim's
    page_size (FlashAttention-3 on its cp.async path at decode, flash-attn-4 on TMA where a page is
    its 128-key tile); a size that does not divide a row's cache is refused (exit 2)."""
    import pytest

    out = tmp_path / "pred.json"
    assert bench.main(["--rows", "b8-q1-k32768-h32-kv8", "--pages", "16,128", "--predict", str(out)]) == 0
    rows = {r["kernel"]: r for r in json.loads(out.read_text())["rows"]}
    want = {f"{impl}[page={n}]" for impl in ("flash-attn-3", "flash-attn-4") for n in (16, 128)}
    assert want <= set(rows) and all(rows[k]["us"] > 0 for k in want)
    assert rows["flash-attn-4[page=128]"]["us"] == rows["flash-attn-4"]["us"]  # pages of its tile: TMA
    assert rows["flash-attn-4[page=16]"]["us"] > rows["flash-attn-4"]["us"]
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--rows", "b8-q1-k32768-h32-kv8", "--pages", "24"])
    assert e.value.code == 2


def test_time_graph_times_replays_of_captured_calls():
    """--graph: GRAPH_CALLS calls captured once (after a warm call on the capture stream), replayed
    back to back; graph_us is the events' time over replays x calls (a stand-in torch: no GPU)."""
    import contextlib
    import types

    log = {"calls": 0, "captured": 0, "replays": 0, "capturing": False}

    class Event:
        def __init__(self, **_):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):
            return 2.0  # ms

    class Graph:
        def replay(self):
            log["replays"] += 1

    @contextlib.contextmanager
    def graph(g):
        log["capturing"] = True
        yield
        log["capturing"] = False

    def fn():
        log["captured" if log["capturing"] else "calls"] += 1

    cuda = types.SimpleNamespace(Stream=lambda: types.SimpleNamespace(wait_stream=lambda s: None),
                                 current_stream=lambda: types.SimpleNamespace(wait_stream=lambda s: None),
                                 stream=lambda s: contextlib.nullcontext(), synchronize=lambda: None,
                                 CUDAGraph=Graph, graph=graph, Event=Event)
    r = bench.time_graph(types.SimpleNamespace(cuda=cuda), fn, reps=3, batch_ms=10.0)
    assert log["calls"] == 1 and log["captured"] == bench.GRAPH_CALLS
    assert r["graph_us"] == 2000.0 / (r["graph_replays"] * bench.GRAPH_CALLS)
    assert log["replays"] == 2 + 3 * r["graph_replays"]


def test_predict_for_an_h100_uses_its_profile(tmp_path):
    """--profile h100: the file says which GPU it predicts (its meta.device is what torch reports for
    an H100 SXM, so a measured file joins it), and a decode row, bound by HBM, takes longer on the
    H100's 3.35 TB/s than on the H200's 4.8 TB/s."""
    row = ["--rows", "b8-q1-k32768-h32-kv8"]
    docs = {}
    for profile in ("h100", "h200"):
        out = tmp_path / f"pred_{profile}.json"
        assert bench.main([*row, "--profile", profile, "--predict", str(out)]) == 0
        docs[profile] = json.loads(out.read_text())
    assert docs["h100"]["meta"]["profile"] == "h100" and docs["h100"]["meta"]["device"] == "NVIDIA H100 80GB HBM3"
    us = {p: {r["kernel"]: r["us"] for r in d["rows"]} for p, d in docs.items()}
    for kernel in KERNELS:
        assert us["h100"][kernel] > us["h200"][kernel]
