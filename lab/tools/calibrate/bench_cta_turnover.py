"""CTA turnover: when one CTA retires, how long until the next CTA of the grid starts on that SM?

A kernel that launches one CTA per tile (our SM90 kernel for causal masks and large head dims)
pays this gap once per tile; a persistent kernel pays it once per SM. Grid of `ctas` CTAs with
384 threads (three warpgroups, like FA3) and ~200 KB of dynamic shared memory, so one CTA fits
on an SM at a time. Thread 0 of each CTA stamps %smid, %globaltimer and %clock64 at its first
instruction and after a fixed spin of `spin` cycles, then the CTA exits. Per SM, CTAs sorted by
start: gap = start(k+1) - end(k), in ns (globaltimer) and in cycles (ns x the clock measured by
the same CTAs' clock64/globaltimer).

    python3 lab/tools/calibrate/bench_cta_turnover.py --out FILE.json           (on the GPU)
    CUTE_DSL_ARCH=sm_90a python3 -m lab.tools.calibrate.bench_cta_turnover --check-sass
"""
from __future__ import annotations

import argparse
import os
import sys

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass.cutlass_dsl import T, dsl_user_op

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
from lab.tools.calibrate.common import _asm, clk, gtimer  # noqa: E402

THREADS = 384
SMEM = 200 * 1024
WORDS = 5  # smid, g_start, g_end, c_start, c_end


@dsl_user_op
def smid(*, loc=None, ip=None):
    return Int32(_asm(T.i32(), [], "mov.u32 $0, %smid;", "=r"))


def make():
    @cute.kernel
    def kernel(stamps: cute.Tensor, spin: Int32):
        tid = cute.arch.thread_idx()[0]
        bid = cute.arch.block_idx()[0]
        g0 = gtimer()
        c0 = clk()
        if tid == 0:
            c = clk()
            while c - c0 < Int64(spin):
                c = clk()
            g1 = gtimer()
            c1 = clk()
            o = bid * WORDS
            stamps[o] = Int64(smid())
            stamps[o + 1] = g0
            stamps[o + 2] = g1
            stamps[o + 3] = c0
            stamps[o + 4] = c1
        cute.arch.sync_threads()

    @cute.jit
    def host(stamps: cute.Tensor, spin: Int32, ctas: Int32, stream):
        kernel(stamps, spin).launch(grid=[ctas, 1, 1], block=[THREADS, 1, 1], smem=SMEM, stream=stream)

    return host


def fake_args():
    from lab.tools.calibrate.common import fake_stream, fake_tensor

    return fake_tensor(Int64, (132 * 16 * WORDS,)), Int32(2000), Int32(132 * 16), fake_stream()


def run(dev, per_sm=16, spin=4000):
    from lab.tools.calibrate.common import median

    torch = dev.torch
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ctas = sms * per_sm
    stamps = torch.zeros(ctas * WORDS, dtype=torch.int64, device="cuda")
    fn = make()
    for _ in range(3):  # the last launch is the measured one
        dev.call(("cta_turnover",), fn, stamps, Int32(spin), Int32(ctas))
    rows = stamps.view(ctas, WORDS).cpu().tolist()
    by_sm: dict[int, list] = {}
    for r in rows:
        by_sm.setdefault(int(r[0]), []).append(r)
    gaps_ns, clocks = [], []
    for lst in by_sm.values():
        lst.sort(key=lambda r: r[1])
        for a, b in zip(lst, lst[1:]):
            gaps_ns.append(b[1] - a[2])
        clocks += [(r[4] - r[3]) / max(r[2] - r[1], 1) for r in lst]
    ghz = median(clocks)
    out = {"what": "per SM: next CTA's first instruction minus previous CTA's last stamp (thread 0); "
                   f"{THREADS} threads, {SMEM // 1024} KB smem (1 CTA/SM), spin {spin} cycles",
           "ctas": ctas, "sms_seen": len(by_sm), "clock_ghz": ghz,
           "gap_ns_median": median(gaps_ns), "gap_ns_min": min(gaps_ns), "gap_ns_max": max(gaps_ns),
           "gap_cycles_median": median(gaps_ns) * ghz}
    print(f"  CTA turnover: median {out['gap_ns_median']:.0f} ns = {out['gap_cycles_median']:.0f} cycles at "
          f"{ghz:.3f} GHz (min {out['gap_ns_min']} ns, max {out['gap_ns_max']} ns; {ctas} CTAs on {len(by_sm)} SMs)",
          flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--check-sass", action="store_true")
    a = ap.parse_args(argv)
    if a.check_sass:
        from lab.tools.calibrate.common import compile_for_sass

        sass = compile_for_sass(make(), *fake_args())
        ok = "SMID" in sass and "SR_GLOBALTIMER" in sass
        print("%smid and %globaltimer read:", "ok" if ok else "MISSING")
        return 0 if ok else 1
    from lab.tools.calibrate.common import Device, write_result

    return write_result("cta_turnover", run(Device()), a.out)


if __name__ == "__main__":
    sys.exit(main())
