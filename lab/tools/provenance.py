"""What a result file holds and which kernel made it: every file in lab/campaigns/ carries
`meta.kind` (one of KINDS) and `meta.kernel` (the commit of the repository that ran it).

    from lab.tools.provenance import stamp
    res = {"meta": stamp({"device": ..., "date": ...}, "loop_intervals"), ...}
"""
from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# kind -> what a file of that kind holds (and the script that writes it)
KINDS = {
    "points": "end-to-end TFLOP/s per problem and implementation, with our kernel's knob variants "
              "(bench_fwd_sm90.py)",
    "knob_points": "end-to-end TFLOP/s of our kernel's knob variants at a few problems (bench_fwd_sm90.py --only-knobs)",
    "loop_intervals": "exact steady-state cycles per KV block of one or more CTAs, by build and knob (ctas_sm90.py)",
    "tile_costs": "cycles per tile of one persistent CTA walking tiles of B KV blocks (ctas_sm90.py --only-tiles)",
    "short_tiles": "cycles of short tiles and the CTA spread of a 1k launch (ctas_sm90.py --only-short)",
    "light_traces": "per-phase stamps of the light-trace build (ctas_sm90.py --only-traces)",
    "idle_wgs": "cost of a tile whose consumer warpgroups are not all live (idle_wg_sm90.py)",
    "cta_log": "every CTA's SM, start, end and cycles of whole launches, with the tile log (cta_log_sm90.py)",
    "timeline": "stamped per-warp events of the instrumented build (timeline_sm90.py)",
    "sm90_bwd": "backward-only TFLOP/s of fa4kernel, flash-attn-4 and cuDNN side by side, gradients checked "
                "against fp32 (bench_bwd_sm90.py)",
    "tile_choice": "TFLOP/s of tile shapes and schedule knobs per sequence length (tile_choice_sm90.py)",
    "causal_launches": "where a causal launch spends its time: tile walks, full launches, persistent or not "
                       "(causal_sm90.py)",
    "loop_vs_fa4": "our KV loop against flash-attn-4's, one CTA, same run (loop_vs_fa4_sm90.py)",
    "calibration": "unit microbenchmarks of the SM (calibrate/run_all.py, bench_two_chains.py, bench_cta_turnover.py)",
    "bursts": "issue rate of instruction bursts beside a wgmma (calibrate/bench_bursts.py)",
    "contention": "the softmax mix's and exp2's rate beside a full-rate wgmma (calibrate/bench_contention.py)",
    "ab": "same-run A/B of kernel versions or host-side variants (scripts in lab/campaigns/kernel-sm90-forward/)",
    "sim_speed": "wall time of the simulator itself (bench_sim_speed.py)",
    "power": "board power and SM clock under sustained unit loads (calibrate/bench_power.py)",
    "bwd_loop": "cycles per query block of fa4kernel's backward, every SM loaded, from its clock probe's per-CTA "
                "stamps (bwd_loop_sm90.py)",
    "bwd_ctas": "every CTA of fa4kernel's backward launch from its clock probe: per-CTA overhead and cycles per "
                "query block, the SMs' busy share and the tail, by launch order (bwd_ctas_sm90.py)",
    "bwd_units": "the backward's unit facts: wgmma at small N and narrow swizzles, TMA bulk reduce-add and "
                 "RED.ADD.F32 rates (calibrate/bench_bwd_units.py)",
    "sustained": "attention timed as a user times it, after the power cap has settled the clock: TFLOP/s, NVML "
                 "clock and power and the in-kernel clock of each kernel run alone (sustained_sm90.py)",
    "bwd_power": "NVML power and clock and the in-kernel clock of fa4kernel's backward main kernel alone, launched "
                 "back to back until the cap settles the clock (bwd_power_sm90.py; older files: against its whole "
                 "call, in short batches)",
    "dram_bytes": "HBM and L2 bytes per launch of fa4kernel's forward counted by Nsight Compute, back to back "
                  "(dram_bytes_sm90.py)",
    "loop_sass": "static SASS counts of the SM90 forward KV loop per KV block: fa4kernel, flash-attn-4 and "
                 "FlashAttention-3 side by side, compiled or extracted on the CPU (loop_sass_peers.py)",
    "decode": "decode over a KV cache (1-16 new tokens, long caches): us and KV-read GB/s of "
              "fa4kernel.attention_with_kvcache (split counts), fa4kernel.attention, FlashAttention-3, "
              "flash-attn-4 and torch SDPA, checked against fp32 (bench_decode_sm90.py)",
    "training": "a small GPT trained from one seed with each attention backend: losses, step times, "
                "tokens/s, the attention's share and a deterministic repeat (train_gpt_sm90.py)",
    "varlen": "packed batches of unequal sequences, forward: fa4kernel, FlashAttention-3 and flash-attn-4 "
              "checked against fp32 and timed settled (bench_varlen_sm90.py)",
    "attn_host": "host time against GPU time of one attention call (forward, forward + backward) at a training "
                 "shape per backend, and the kernels each call launches (attn_host_sm90.py)",
    "decode_host": "where the host time of a decode call goes: fa4kernel.attention_with_kvcache and torch SDPA's "
                   "wall, host and GPU time per call at decode rows, fa4kernel's cProfile and its per-call pieces "
                   "timed alone (decode_host_sm90.py)",
    "decode_kernels": "a decode call's kernels apart: the split decode kernel's, the combine's and the others' GPU "
                      "time and the gap between them per split count, from CUDA profiler records "
                      "(decode_kernels_sm90.py)",
    "mem_power": "board power and clock under sustained memory-path loads: TMA bulk reduce-adds, RED.ADD from "
                 "registers, the SM-to-SM network, TMA loads (calibrate/bench_mem_power.py)",
}


def kernel_version() -> str:
    """The repository commit that runs (short hash, '+dirty' when fa4kernel/ has uncommitted
    changes); FA4LAB_COMMIT where there is no git checkout (a copied tree); else 'unknown'."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(["git", "status", "--porcelain", "--", "fa4kernel"], cwd=ROOT,
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("FA4LAB_COMMIT") or "unknown"


def stamp(meta: dict, kind: str) -> dict:
    """`meta` with its kind and the kernel version added (the same dict, for chaining)."""
    if kind not in KINDS:
        raise ValueError(f"unknown result kind {kind!r}; one of {', '.join(KINDS)}")
    meta["kind"] = kind
    meta["kernel"] = kernel_version()
    return meta
