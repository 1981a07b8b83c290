"""Distributed shared memory: how fast one SM writes into its cluster peer's shared memory with
st.async (fa4sim's dsmem_bytes_per_clk), the path fa4kernel's CTA pair (dq_sum="pair") sends
half of a query block's dQ over.

Kernel: clusters of 2 CTAs, one per SM, `threads` threads each. A round: thread 0 arms its own
mbarrier for `chunk` bytes (arrive + expect_tx), a cluster barrier (both CTAs armed, the last
round's bytes landed), then every thread st.asyncs its share of `chunk` bytes, 16 at a time
(st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32, SASS STAS), into the peer's buffer,
completing on the peer's mbarrier; then every thread waits for its own mbarrier (the peer's bytes
have landed). Both CTAs of a pair send and receive at once, as the pair's two owners do. Thread 0
stamps clock64 and %globaltimer around `rounds` rounds after `warm` untimed ones, and counts
its own cycles from its first st.async of a round to past its last (issue: how long the sending
warps are held, against the round's whole transfer).

facts() turns a result file into fa4sim's dsmem_bytes_per_clk and dsmem_queue_bytes.

The rate is the slope: (chunk - chunk0) / (cycles per round at chunk - at chunk0) over the
measured chunks, so the round's fixed part (the cluster barrier, the mbarrier) drops out; both
the slope and the cycles per round of each chunk are recorded, for one pair (2 SMs) and for
pairs on every SM (the backward's case).

    CUTE_DSL_ARCH=sm_90a python3 -m lab.tools.calibrate.bench_dsmem --check-sass   # CPU
    python3 -m lab.tools.calibrate.bench_dsmem --out D.json                        # GPU, ~20 s
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script path
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
    __package__ = "lab.tools.calibrate"

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32, Int64, const_expr  # noqa: E402

from fa4kernel.sm90.bwd import st_async_peer_f32x4  # noqa: E402
from .common import clk, gtimer, run_sass_checks  # noqa: E402

CHUNK_MAX = 64 * 1024          # bytes one CTA sends per round, at most
CHUNKS = (4096, 16384, 32768, 65536)  # the pair sends 32 KB (half of a 64 x 256 fp32 dQ) per Q block
THREADS = (128, 256)           # the pair's sender is one warpgroup
ROUNDS, WARM = 200, 20


def make(smem_floor: int = 0, random_data: bool = False):
    """smem_floor: reserve at least this much shared memory per CTA (more than half an SM's keeps
    one CTA per SM, so pairs on every SM put every SM's sender on the SM-to-SM network).
    random_data: each thread's 16-byte st.async carries four pseudo-random words (random sign and
    mantissa) instead of one value four times."""
    smem = max(CHUNK_MAX + 1024, smem_floor)

    @cute.kernel
    def kernel(stamps: cute.Tensor, chunk: Int32, rounds: Int32, warm: Int32):
        tid = cute.arch.thread_idx()[0]
        nthr = cute.arch.block_dim()[0]
        bid = cute.arch.block_idx()[0]

        @cute.struct
        class Storage:
            mbar: cute.struct.MemRange[cutlass.Int64, 2]
            buf: cute.struct.Align[cute.struct.MemRange[Float32, CHUNK_MAX // 4], 128]

        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        full = storage.mbar.data_ptr()
        buf = storage.buf.data_ptr()
        if tid == 0:
            cute.arch.mbarrier_init(full, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()
        peer = 1 - cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        per_thread = chunk // (16 * nthr)  # 16-byte st.async per thread per step
        v = Float32(1.0) + Float32(tid)
        w = [v, v, v, v]
        if const_expr(random_data):
            for j in cutlass.range_constexpr(4):
                h = (tid * 40503 + bid * 7919 + j * 2654435) * 1103515245 + 12345
                w[j] = Float32(h) * Float32(2.0 ** -31)
        t0 = Int64(0)
        g0 = Int64(0)
        issue = Int64(0)  # thread 0's cycles from its first st.async of a round to past its last
        for r in cutlass.range(warm + rounds, unroll=1):
            if r == warm:
                t0 = clk()
                g0 = gtimer()
            if tid == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(full, chunk)
            cute.arch.cluster_arrive_relaxed()  # both armed; the last round's bytes were waited for
            cute.arch.cluster_wait()
            i0 = clk()
            for k in cutlass.range(per_thread, unroll=1):
                st_async_peer_f32x4(buf + 4 * (k * nthr + tid), w[0], w[1], w[2], w[3], full, peer)
            i1 = clk()
            if r >= warm:
                issue = issue + (i1 - i0)
            cute.arch.mbarrier_wait(full, r % 2)
        t1 = clk()
        g1 = gtimer()
        if tid == 0:
            stamps[bid * 4 + 0] = t1 - t0
            stamps[bid * 4 + 1] = g1 - g0
            stamps[bid * 4 + 2] = issue
        cute.arch.cluster_arrive_relaxed()  # no CTA leaves while its peer may still write to it
        cute.arch.cluster_wait()

    @cute.jit
    def host(stamps: cute.Tensor, chunk: Int32, rounds: Int32, warm: Int32, ctas: Int32, threads: Int32, stream):
        kernel(stamps, chunk, rounds, warm).launch(grid=[ctas, 1, 1], block=[threads, 1, 1], cluster=[2, 1, 1],
                                                   smem=smem, stream=stream)

    return host


def fake_args():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Int64, (4 * 264,)), Int32(32768), Int32(ROUNDS), Int32(WARM), Int32(2), Int32(128),
            fake_stream())


def check_sass() -> int:
    """The round's loop holds the st.async (STAS) and the cluster barrier."""
    return run_sass_checks([("dsmem", lambda: (make(), fake_args()), {"STAS": 1})])


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares d(bytes) / d(cycles) through (bytes, cycles) points: bytes per clock."""
    n = len(points)
    mb, mc = sum(b for b, _ in points) / n, sum(c for _, c in points) / n
    num = sum((c - mc) * (b - mb) for b, c in points)
    den = sum((c - mc) ** 2 for _, c in points)
    return num / den if den > 0 else float("nan")


def facts(res: dict, threads: int = 128) -> dict:
    """fa4sim's two DSMEM facts from a result file, in the backward's case (pairs on every SM,
    one warpgroup sending): dsmem_bytes_per_clk, the slope; dsmem_queue_bytes, the bytes still
    in flight when the sending warp is let go, the median over the chunks of 16 KB and more of
    chunk - issue cycles x rate."""
    case = next(c for c in res["benchmarks"]["dsmem"]["cases"] if c["label"] == "every_sm" and c["threads"] == threads)
    rate = case["bytes_per_clk_per_sm_slope"]
    queued = sorted(r["chunk_bytes"] - r["issue_cycles_per_round_median"] * rate
                    for r in case["rows"] if r["chunk_bytes"] >= 16384)
    return {"dsmem_bytes_per_clk": rate, "dsmem_queue_bytes": queued[len(queued) // 2]}


def run(dev) -> dict:
    from .common import median

    torch = dev.torch
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    pairs_all = nsm // 2
    stamps = torch.zeros(4 * 2 * pairs_all, dtype=torch.int64, device="cuda")
    fn = make()
    out = {"instruction": "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 (SASS STAS), clusters of 2",
           "rounds": ROUNDS, "warm_rounds": WARM, "cases": []}
    for threads in THREADS:
        for ctas, label in ((2, "one_pair"), (2 * pairs_all, "every_sm")):
            rows = []
            for chunk in CHUNKS:
                stamps.zero_()
                dev.call("dsmem", fn, stamps, Int32(chunk), Int32(ROUNDS), Int32(WARM), Int32(ctas), Int32(threads))
                st = stamps.cpu().tolist()
                cyc = [st[4 * b] / ROUNDS for b in range(ctas) if st[4 * b] > 0]
                ns = [st[4 * b + 1] / ROUNDS for b in range(ctas) if st[4 * b] > 0]
                issue = [st[4 * b + 2] / ROUNDS for b in range(ctas) if st[4 * b] > 0]
                rows.append({"chunk_bytes": chunk, "ctas": len(cyc), "cycles_per_round_median": median(cyc),
                             "issue_cycles_per_round_median": median(issue),
                             "cycles_per_round_max": max(cyc), "ns_per_round_median": median(ns),
                             "clock_ghz": median(cyc) / median(ns) if median(ns) > 0 else None,
                             "bytes_per_clk_per_sm": chunk / median(cyc)})
            rate = slope([(r["chunk_bytes"], r["cycles_per_round_median"]) for r in rows])
            case = {"threads": threads, "ctas": ctas, "label": label, "rows": rows,
                    "bytes_per_clk_per_sm_slope": rate}
            out["cases"].append(case)
            print(f"  {label:9s} {threads:3d} threads: {rate:6.2f} B/clk/SM (slope); per round "
                  + ", ".join(f"{r['chunk_bytes'] // 1024} KB {r['cycles_per_round_median']:.0f} cyc "
                              f"(issue {r['issue_cycles_per_round_median']:.0f})" for r in rows),
                  flush=True)
    return out


def main(argv=None) -> int:
    import argparse
    import json
    import time

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="results JSON (GPU run)")
    ap.add_argument("--check-sass", action="store_true", help="CPU: compile for sm_90a and check the SASS")
    args = ap.parse_args(argv)
    if args.check_sass:
        return check_sass()
    if not args.out:
        ap.error("--out FILE.json (GPU) or --check-sass (CPU)")
    from .common import Device

    from .run_all import meta

    t0 = time.perf_counter()
    dev = Device()
    res = {"meta": meta("bwd_units"), "scripts": {"dsmem": "bench_dsmem.py"}, "benchmarks": {"dsmem": run(dev)}}
    res["seconds"] = round(time.perf_counter() - t0, 2)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"[dsmem] {res['seconds']} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
