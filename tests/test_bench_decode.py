"""bench_decode_sm90.py --predict on the CPU: fa4sim's decode predictions for the selected rows, with
fa4kernel's split count taken from fa4kernel.kvcache's own plan."""
import json

from fa4kernel import kvcache
from fa4kernel.sm90.config import make_config
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
        tail = row.causal and row.seqlen_q > 1
        body = row.seqlen_cache - (row.seqlen_q if tail else 0)
        tile_m = make_config("bfloat16", row.hdim, False, True, {}).tile_m
        want = kvcache.split_heuristic(row.batch, row.heads_kv, row.seqlen_q * (row.heads // row.heads_kv), body,
                                       tile_m, kvcache.DEFAULT_SMS, row.seqlen_cache if row.batch > 1 else None)
        assert ours["num_splits"] == want
        assert ours["pack_gqa"] is True
        runs = kvcache.plan_runs([body] * row.batch, want, row.seqlen_cache)
        assert ours["chunks"] == max(pc.used for _, _, plan in runs for pc in plan)
        assert ("tail" in ours.get("note", "")) == tail


def test_measured_rows_carry_the_point_name():
    """The measured file's rows name their point as the predictions do (the join key)."""
    import inspect

    assert '"point": row.name' in inspect.getsource(bench.run_row)
