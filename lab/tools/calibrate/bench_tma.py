"""TMA (cp.async.bulk.tensor, UTMALDG) tile loads into one SM: latency and bandwidth.

A bf16 tensor of R x 64 elements (128 B rows) is loaded in 64 x 64 boxes (8 KB, 128B swizzle)
by one thread; completion through an mbarrier with expect_tx (SYNCS in SASS).
 mode 0 (latency): for each listed tile: t0; arrive.expect_tx(nreq x 8 KB); nreq boxes;
   wait(mbarrier); t1 -> one request at a time. Tiles cold in L2 (after a flush) give the
   HBM latency, the same tiles again the L2-hit latency; nreq = 1, 2, 4 (8, 16, 32 KB) gives
   latency vs bytes.
 mode 3 (latency under load): CTA 0 runs mode 0 on cold tiles of its own (tile i * MAX_REQ, stamps
   from PROBE_STAMPS on) while CTAs 1 .. ctas-1 stream disjoint HBM regions as mode 1 does: the
   time of a Q-sized load (32 or 64 KB) while the rest of the chip keeps HBM busy.
 mode 1 (bandwidth): a ring of STAGES x 8 KB stages, each with its own mbarrier, kept full:
   wait(stage), re-issue. `ctas` CTAs (1 = per-SM rate, 132 = whole chip); CTA b reads tiles
   b * stride + (i mod region). stride 0 and a small region: L2 hits; disjoint regions after a
   flush: HBM; the same over 8 to all SMs and 32 MB to 537 MB (hbm_by_ctas): the chip's read rate
   against the CTAs streaming and the bytes of one pass.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import BFloat16, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.utils import LayoutEnum

from .common import clk, gtimer

BOX = 64
TILE_BYTES = BOX * BOX * 2
STAGES = 24
ROWS = 1 << 23  # 1 GiB of bf16 at 64 columns
MAX_REQ = 8
LAT_MASK = (ROWS // BOX // 2) - 1  # latency tiles stay in the first half (+ MAX_REQ)
HBM_SWEEP_MB = (32, 134, 537)  # bytes read (MiB): a small decode step, MQA 4 x 65536 (hd128), 1 x 131072 32/8
HBM_SWEEP_CTAS = (8, 16, 32, 48, 64, 96, 116)  # CTAs streaming (with the SM count): split-KV launches' sizes
PROBES = 40  # mode 3: the probe's loads (n counts the streamers' boxes)
PROBE_STAMPS = 4096  # mode 3: the probe's stamps start here, past the streaming CTAs' 4 per CTA
LOAD_STREAMERS = (0, 16, 33, 66, 99, 131)  # mode 3: CTAs streaming beside the probe (131: every other SM)


def _smem_layout(stages):
    atom = warpgroup.make_smem_layout_atom(
        sm90_helpers.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, BFloat16, BOX), BFloat16)
    return cute.tile_to_shape(atom, (BOX, BOX, stages), order=(0, 1, 2))


def make():
    @cute.kernel
    def kernel(tma_atom: cute.CopyAtom, mT: cute.Tensor, stamps: cute.Tensor,
               mode: Int32, n: Int32, nreq: Int32, stride: Int32, region: Int32,
               s_layout: cute.ComposedLayout):
        tid = cute.arch.thread_idx()[0]
        bid = cute.arch.block_idx()[0]
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        @cute.struct
        class Storage:
            mbar: cute.struct.MemRange[cutlass.Int64, STAGES]
            sT: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(s_layout)], 1024]

        alloc = cutlass.utils.SmemAllocator()
        storage = alloc.allocate(Storage)
        bars = storage.mbar.data_ptr()
        if warp == 0:
            cpasync.prefetch_descriptor(tma_atom)
        if tid == 0:
            for s in cutlass.range_constexpr(STAGES):
                cute.arch.mbarrier_init(bars + s, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        sT = storage.sT.get_tensor(s_layout.outer, swizzle=s_layout.inner)
        gT = cute.local_tile(mT, (BOX, BOX), (None, 0))
        tTs, tTg = cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(sT, 0, 2),
                                         cute.group_modes(gT, 0, 2))
        if tid == 0:
            probe = mode // 3  # 1: mode 3, where CTA 0 probes and the others stream
            if mode == 0 or (mode == 3 and bid == 0):
                phase = Int32(0)
                for i in cutlass.range(n * (1 - probe) + PROBES * probe, unroll=1):
                    # tile index by a mask (one LOP3), no memory load or division in the timed path;
                    # mode 3: consecutive tiles below CTA 1's region, which no streamer reads
                    tile = ((stride + i * region) & LAT_MASK) * (1 - probe) + i * MAX_REQ * probe
                    t0 = clk()
                    cute.arch.mbarrier_arrive_and_expect_tx(bars, nreq * TILE_BYTES)
                    for r in cutlass.range_constexpr(MAX_REQ):
                        if r < nreq:
                            cute.copy(tma_atom, tTg[None, tile + r], tTs[None, r], tma_bar_ptr=bars)
                    cute.arch.mbarrier_wait(bars, phase)
                    t1 = clk()
                    phase = phase ^ 1
                    stamps[i + probe * PROBE_STAMPS] = t1 - t0
            else:
                # ring of STAGES boxes, unrolled over the stages; n = rounds * STAGES boxes;
                # CTA b reads tiles b * stride + (k & region), region = a power of two minus 1
                base = bid * stride
                rounds = n // STAGES
                t0 = clk()
                g0 = gtimer()
                for s in cutlass.range_constexpr(STAGES):
                    cute.arch.mbarrier_arrive_and_expect_tx(bars + s, TILE_BYTES)
                    cute.copy(tma_atom, tTg[None, base + (s & region)], tTs[None, s], tma_bar_ptr=bars + s)
                for rnd in cutlass.range(1, rounds, unroll=1):
                    par = (rnd - 1) & 1
                    k0 = rnd * STAGES
                    for s in cutlass.range_constexpr(STAGES):
                        if mode != 2:
                            cute.arch.mbarrier_wait(bars + s, par)
                        else:
                            done = cute.arch.mbarrier_test_wait(bars + s, par)
                            while not done:
                                done = cute.arch.mbarrier_test_wait(bars + s, par)
                        cute.arch.mbarrier_arrive_and_expect_tx(bars + s, TILE_BYTES)
                        cute.copy(tma_atom, tTg[None, base + ((k0 + s) & region)], tTs[None, s],
                                  tma_bar_ptr=bars + s)
                for s in cutlass.range_constexpr(STAGES):
                    cute.arch.mbarrier_wait(bars + s, (rounds - 1) & 1)
                t1 = clk()
                g1 = gtimer()
                stamps[bid * 4 + 0] = t0
                stamps[bid * 4 + 1] = t1
                stamps[bid * 4 + 2] = g0
                stamps[bid * 4 + 3] = g1

    @cute.jit
    def host(mG: cute.Tensor, stamps: cute.Tensor, mode: Int32, n: Int32,
             nreq: Int32, stride: Int32, region: Int32, ctas: Int32, stream):
        s_layout = _smem_layout(STAGES)
        tma_atom, tma_T = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mG, cute.select(s_layout, mode=[0, 1]), (BOX, BOX), 1)
        smem = STAGES * TILE_BYTES + 2048  # MAX_REQ <= STAGES
        kernel(tma_atom, tma_T, stamps, mode, n, nreq, stride, region, s_layout).launch(
            grid=[ctas, 1, 1], block=[32, 1, 1], smem=smem, stream=stream)

    return host


def fake_args():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(BFloat16, (ROWS, BOX)), fake_tensor(Int64, (8192,)),
            Int32(0), Int32(4), Int32(1), Int32(0), Int32(16), Int32(1), fake_stream())


def run(dev):
    from .common import median

    torch = dev.torch
    g = torch.randn(ROWS, BOX, device="cuda").to(torch.bfloat16)
    scratch = torch.empty(512 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    stamps = torch.zeros(8192, dtype=torch.int64, device="cuda")
    fn = make()
    ntiles = ROWS // BOX
    out = {"tile_bytes": TILE_BYTES, "box": [BOX, BOX], "dtype": "bf16", "stages": STAGES, "latency": {}}

    def flush():
        scratch.add_(1.0)  # 512 MB read + write: evicts the L2
        torch.cuda.synchronize()

    def call(mode, n, nreq, stride, region, ctas):
        secs = dev.call("tma", fn, g, stamps, Int32(mode), Int32(n), Int32(nreq), Int32(stride),
                        Int32(region), Int32(ctas))
        return secs, stamps.cpu().tolist()

    # ---- latency: tile i = (start + i * step) & LAT_MASK, one request (nreq boxes) at a time
    n = 48
    patterns = {"seq": (1000, MAX_REQ), "far": (4099, 4099)}  # consecutive / 32 MB apart
    for pname, (start, step) in patterns.items():
        for nreq in (1, 2, 4, 8):
            if pname == "far" and nreq not in (1, 4):
                continue
            flush()
            _, cold = call(0, n, nreq, start, step, 1)
            _, warm = call(0, n, nreq, start, step, 1)
            cold, warm = cold[1:n], warm[1:n]  # the first sample also fetches the descriptor
            out["latency"][f"{pname}_{nreq * TILE_BYTES // 1024}KB"] = dict(
                hbm_median=median(cold), hbm_min=min(cold), hbm_max=max(cold),
                l2_median=median(warm), l2_min=min(warm), l2_max=max(warm))

    def ring(mode, n, stride, region, ctas, events=False):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        conv = [dev.ct(g), dev.ct(stamps), Int32(mode), Int32(n), Int32(1), Int32(stride), Int32(region), Int32(ctas)]
        torch.cuda.synchronize()
        e0.record()
        dev.cache["tma"](*conv, dev.stream())
        e1.record()
        torch.cuda.synchronize()
        st = stamps.cpu().tolist()
        per_sm = [n * TILE_BYTES / max(1, st[b * 4 + 1] - st[b * 4]) for b in range(ctas)]
        return e0.elapsed_time(e1), per_sm

    # ---- one SM, L2-resident 1 MB region (128 tiles), try_wait ring and test_wait spin ring
    nb = STAGES * 600
    for mode, name in ((1, "sm_l2"), (2, "sm_l2_spin")):
        ring(mode, nb, 0, 127, 1)
        vals = [ring(mode, nb, 0, 127, 1)[1][0] for _ in range(3)]
        out[name] = dict(bytes=nb * TILE_BYTES, bytes_per_clk=max(vals), samples=vals,
                         stages=STAGES, bytes_in_flight=STAGES * TILE_BYTES)
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    # ---- whole chip, L2 hits: every CTA loops over the same 2 MB
    nc = STAGES * 200
    ring(1, nc, 0, 255, nsm)
    ms, per_sm = ring(1, nc, 0, 255, nsm)
    out["chip_l2"] = dict(bytes=nsm * nc * TILE_BYTES, event_ms=ms, tbps=nsm * nc * TILE_BYTES / (ms * 1e-3) / 1e12,
                          per_sm_bytes_per_clk_median=median(per_sm))
    # ---- whole chip from HBM: disjoint regions, one pass each, after a flush
    region = (ntiles // nsm) // STAGES * STAGES
    res = []
    for _ in range(2):
        flush()
        res.append(ring(1, region, region, 0x7FFFFFFF, nsm))
    ms, per_sm = min(res)
    out["chip_hbm"] = dict(bytes=nsm * region * TILE_BYTES, event_ms=ms,
                           tbps=nsm * region * TILE_BYTES / (ms * 1e-3) / 1e12,
                           per_sm_bytes_per_clk_median=median(per_sm))
    # ---- HBM reads by the number of SMs reading and by the bytes: a split-KV decode launch keeps
    # batch x heads_kv x splits CTAs streaming, often fewer than the SMs, and a decode step reads tens
    # of MB to GBs, where a pass's ramp and tail are a share of it. Disjoint regions, one pass each
    # after a flush; the kernel's span from the global timer (first CTA's start to last CTA's end)
    # beside the CUDA-event time (launch included).
    sweep = []
    for total_mb in HBM_SWEEP_MB:
        for ctas in sorted({*HBM_SWEEP_CTAS, nsm}):
            tiles = total_mb * 2**20 // TILE_BYTES // ctas // STAGES * STAGES
            if tiles < 2 * STAGES:
                continue
            runs = []
            for _ in range(2):
                flush()
                ms, per_sm = ring(1, tiles, tiles, 0x7FFFFFFF, ctas)
                st = stamps.cpu().tolist()
                span_ns = max(st[b * 4 + 3] for b in range(ctas)) - min(st[b * 4 + 2] for b in range(ctas))
                runs.append((span_ns, ms, per_sm))
            span_ns, ms, per_sm = min(runs)
            nbytes = ctas * tiles * TILE_BYTES
            sweep.append(dict(ctas=ctas, bytes=nbytes, event_ms=ms, kernel_us=span_ns / 1e3,
                              tbps=nbytes / (span_ns * 1e-9) / 1e12,
                              per_sm_bytes_per_clk_median=median(per_sm)))
    out["hbm_by_ctas"] = sweep
    # ---- a Q-sized load while other SMs stream HBM: CTA 0 times PROBES cold loads of 32 and 64 KB,
    # one at a time, while CTAs 1 .. s stream disjoint regions once; the streamers' bytes over their
    # span against chip_hbm's rate is the HBM share the rest of the chip takes (fa4sim's hbm_busy)
    stride = (ntiles // nsm) // STAGES * STAGES
    under = []
    for streamers in sorted({s for s in LOAD_STREAMERS if s < nsm} | {nsm - 1}):
        for nreq in (4, 8):
            flush()
            _, st = call(3, stride, nreq, stride, 0x7FFFFFFF, 1 + streamers)
            lat = st[PROBE_STAMPS + 1:PROBE_STAMPS + PROBES]  # the first also fetches the descriptor
            row = dict(streamers=streamers, bytes=nreq * TILE_BYTES, probe_median=median(lat),
                       probe_min=min(lat), probe_max=max(lat), samples=len(lat))
            if streamers:
                span = max(st[b * 4 + 1] for b in range(1, 1 + streamers)) - min(st[b * 4] for b in range(1, 1 + streamers))
                ns = max(st[b * 4 + 3] for b in range(1, 1 + streamers)) - min(st[b * 4 + 2] for b in range(1, 1 + streamers))
                tbps = streamers * stride * TILE_BYTES / (ns * 1e-9) / 1e12
                row.update(streamer_span_cycles=span, streamer_tbps=tbps, hbm_busy=tbps / out["chip_hbm"]["tbps"],
                           probe_span_cycles=sum(lat))
            under.append(row)
    out["latency_under_load"] = under
    # ---- device-to-device copy for comparison (bytes read + written)
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(5):
        b.copy_(a)
    e1.record()
    torch.cuda.synchronize()
    out["d2d_copy_tbps"] = 5 * 2 * a.numel() / (e0.elapsed_time(e1) * 1e-3) / 1e12
    del a, b, scratch, g
    return out
