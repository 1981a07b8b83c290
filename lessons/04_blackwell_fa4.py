# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 04: FlashAttention-4 on Blackwell (about 30 minutes)
#
# Lesson 02 showed the problem: on a B200 a 128x128 tile at hd128 takes the tensor core 1024
# cycles and the MUFU 1024 cycles of exp2. Nothing can be hidden behind anything any more
# unless the whole SM is organised around it. FA4's forward kernel (SM100) does this with:
#
# - **TMEM**, tensor memory: 128 lanes x 512 columns x 32 bit = 256 KB per SM, where the MMA
#   writes S and accumulates O. Registers no longer hold the accumulator, so the softmax
#   warpgroups have room (one thread owns one whole 128-element row: no shuffles).
# - **One-thread MMA issue**: a single elected thread of one warp issues every `tcgen05.mma` for
#   the whole CTA, asynchronously; completion is signalled through an mbarrier.
# - **Two Q tiles** (256 query rows) per CTA in ping-pong: the MMA warp issues
#   `PV0(j-1), QK0(j), PV1(j-1), QK1(j)`, so the tensor core works for one tile while the other
#   tile's softmax warpgroup runs exp2.
# - A **correction warpgroup** that rescales O in TMEM (only when needed: lesson 01) and does the
#   final `1/row_sum`, off the softmax warpgroups' critical path.
# - **Split P**: softmax signals "3/4 of P written" so `PV` can start before the last quarter.
#
# Our own SM100 kernel (`fa4kernel/sm100/fwd.py`) exists and compiles for `sm_100a` on a
# CPU, but **it has never run**: there is no Blackwell GPU in our lab, so its speed and even its
# correctness on a B200 are unknown. This lesson therefore simulates (sections 1-3), reads the
# kernel's compiled machine code (section 4: instructions, not timings), and shows what will be
# compared once a B200 is available (section 5). The simulator's B200 numbers are predictions:
# none of them has been checked against a measurement of ours.

# %%
import itertools
import time

import matplotlib.pyplot as plt

import lessonkit as kit
from fa4sim import InputError, Problem, simulate
from fa4sim.schedules import fa4_sm100

LIVE = kit.live()  # unused: section 5 asks kit.blackwell() (a B200) instead; our SM100 kernel only compiles here
PROBLEM = Problem(batch=1, heads=16, seqlen_q=32768, seqlen_k=32768, hdim=128)

# %% [markdown]
# ## 1. TMEM is a budget
#
# Each Q tile needs its S (tile_n fp32 columns; P, as bf16 packed two per column, overlays the
# second half of S) and its O accumulator (hdim fp32 columns).
#
# ### Exercise 4.1
# How many TMEM columns does FA4 use at hd128 with two Q tiles and 128-key blocks? How many are
# free on a B200?

# %%
columns_used = None  # <- your answer
columns_free = None  # <- your answer

# %%
# SOLUTION (try the exercise first).
if columns_used is None:
    columns_used = 2 * (128 + 128)
if columns_free is None:
    columns_free = 512 - columns_used

# %%
r = simulate("b200", "fa4", PROBLEM)
need = fa4_sm100.tmem_columns(PROBLEM, r.knobs)
kit.check(columns_used == need, f"the schedule allocates {need} columns")
kit.check(columns_free == r.hw.tmem_columns - need, "B200 has 512 columns")
print("S0 = 0-127, S1 = 128-255, O0 = 256-383, O1 = 384-511: every column is used. "
      "Lesson 06 asks what happens if you want a third Q tile.")

# %% [markdown]
# ## 2. The simulation

# %%
print(f"{r.tflops:.0f} TFLOP/s ({r.tflops / r.hw.peak_tflops:.0%} of {r.hw.peak_tflops:.0f} peak at {r.hw.clock_ghz} GHz)")
print("knobs:", r.knobs)
print(f"steady state: {r.interval:.0f} cycles per KV block for 256 rows (tensor work: 2 x 1024 = 2048)")
for unit, busy in sorted(r.utilization.items(), key=lambda kv: -kv[1]):
    print(f"  {unit:7s} {busy:6.1%} {'#' * int(round(busy * 40))}")
print("bottleneck:", r.bottleneck)
kit.gantt(r, iterations=6)

# %% [markdown]
# Read the chart: the tensor row alternates tile 0 and tile 1 MMAs; the MUFU row shows the two
# softmax warpgroups' exp2 (`EXPa`/`EXPb` are the parts before and after the "P 3/4" signal).
# The gaps in the tensor row are where the next MMA waits for a softmax: the kernel is
# latency-bound at ~84 % tensor utilisation, with the MUFU close behind.
#
# ## 3. Take one idea away at a time
#
# Each row removes one of FA4's ideas. Predict the order before you run the cell.

# %%
ABLATIONS = {
    "FA4 default": {},
    "one Q tile (no ping-pong)": {"q_tiles": 1, "s_stages": 1},
    "one Q tile, two S slots": {"q_tiles": 1, "s_stages": 2},
    "always rescale (no threshold)": {"rescale_threshold": None},
    "no split P": {"split_p": False},
    "no exp2 emulation": {"exp_emulation": 0.0},
    "1-CTA instead of 2-CTA": {"two_cta": False},
}
ablated = {}
for label, knobs in ABLATIONS.items():
    a = simulate("b200", "fa4", PROBLEM, knobs)
    ablated[label] = a
    top = max(a.utilization, key=a.utilization.get)
    print(f"{label:31s} {a.tflops:6.0f} TFLOP/s  ({a.tflops / r.tflops - 1:+6.1%})  busiest: {top} {a.utilization[top]:.0%}")

# %% [markdown]
# - **One Q tile**: with nothing to switch to, the tensor core waits for every softmax: about
#   half the throughput. Ping-pong between two tiles is the single most important idea.
# - **One Q tile, two S slots**: flash-attn-4's own fallback where two tiles do not fit (hdim_v
#   256, or a query of one tile): the MMA warp computes S(j) into a second TMEM slot while the
#   softmax works on S(j-1) ("S ping-pong"). It wins most of the loss back, not all: the PV GEMM
#   still waits for each P.
# - **Always rescale**: the correction warpgroup must load, scale and store O in TMEM on every
#   block; TMEM bandwidth becomes the busiest unit. Conditional rescaling (tau = 8) removes that.
# - **Split P** and **exp2 emulation** each shorten the softmax on the critical path.
# - **2-CTA** halves each SM's share of K/V shared-memory traffic and TMA traffic.
#
# ### Exercise 4.2: always rescale
# Which unit is the busiest when conditional rescaling is off? Write its name; the check reads
# the simulator's utilisation.

# %%
busiest_when_always_rescaling = None  # <- a unit name: tensor, mufu, fma, alu, smem, tmem, tma, issue

# %%
# SOLUTION (try the exercise first).
if busiest_when_always_rescaling is None:
    busiest_when_always_rescaling = "tmem"

# %%
u = ablated["always rescale (no threshold)"].utilization
kit.check(busiest_when_always_rescaling == max(u, key=u.get), "look at the utilisation of the 'always rescale' run")
print({k: f"{v:.0%}" for k, v in sorted(u.items(), key=lambda kv: -kv[1])})

# %%
kit.gantt(ablated["one Q tile (no ping-pong)"], iterations=4,
          title="FA4 with one Q tile: the tensor core waits for each softmax")

# %% [markdown]
# ## 4. Read the real kernel's SASS
#
# `fa4kernel/sm100/fwd.py` implements the schedule simulated above in CuTe DSL: 16 warps (two
# softmax warpgroups, a correction warpgroup, one MMA warp, one load warp, one epilogue warp), S
# and O in TMEM, two Q tiles of 128 rows per CTA, 128-key blocks. `compile_sm100_sass()` compiles
# it for `sm_100a` against fake tensors, on the CPU, and returns the SASS (the GPU's machine code,
# as printed by `nvdisasm`). So we can check that the binary contains the instruction mix the
# schedule promises. We cannot say anything about its speed: **the kernel has never run**, on any
# GPU. Nobody has timed it or compared its output with a reference.
#
# The SASS names of the instructions that matter:
#
# | SASS | PTX / meaning |
# |---|---|
# | `UTCHMMA` | `tcgen05.mma`: one UMMA instruction, 128 rows x N x 16 (bf16), issued by one thread |
# | `UTCBAR` | `tcgen05.commit`: an mbarrier fires when the MMAs issued before it have finished |
# | `LDTM` / `STTM` | `tcgen05.ld` / `tcgen05.st`: TMEM <-> registers |
# | `UTMALDG` / `UTMASTG` | TMA tensor load / store (Q, K, V in; O out) |
# | `MUFU.EX2` | `ex2.approx`: exp2 on the MUFU (16 per clock per SM) |
# | `FFMA2` / `FADD2` | packed f32x2 FMA / add: two fp32 lanes per instruction (new on Blackwell) |
# | `FMNMX3` / `FMNMX` | 3-input / 2-input float max |
# | `LDL` / `STL` | local memory loads / stores: register spills |
#
# We compile hd128 non-causal at three exp2-emulation fractions (about 2 s each). Without
# `nvidia-cutlass-dsl` (the `kernels` extra) the cells below say so and skip.

# %%
compile_sm100_sass = kit.sm100_compiler()  # None (reason printed) without the CuTe DSL
EMULATION = (0.0, 0.125, 0.25)
OPS = ("UTCHMMA", "UTCBAR", "LDTM", "STTM", "UTMALDG", "UTMASTG", "MUFU.EX2",
       "FFMA2", "FADD2", "FMNMX3", "FMNMX", "LEA", "LDL", "STL")
SASS, COUNTS = {}, {}
if compile_sm100_sass is not None:
    for f in EMULATION:
        t0 = time.perf_counter()
        SASS[f] = compile_sm100_sass(head_dim=128, causal=False, exp_emulation=f)
        COUNTS[f] = {op: kit.sass_count(SASS[f], op) for op in OPS}
        print(f"hd128 non-causal, exp_emulation={f:<5}: compiled in {time.perf_counter() - t0:.1f} s, "
              f"{len(SASS[f].splitlines())} lines of SASS")
    print(f"\n{'instruction':12s}" + "".join(f"{'emu ' + str(f):>11s}" for f in EMULATION))
    for op in OPS:
        print(f"{op:12s}" + "".join(f"{COUNTS[f][op]:11d}" for f in EMULATION))
else:
    print("No SASS to read here; the prose below quotes the counts (CI compiles them).")

# %% [markdown]
# These are **static** counts: each instruction is counted once for each place it appears in the
# binary, however many times it executes. No `LDL`/`STL`: the register split (192 per softmax
# thread, 80 correction, 48 for the MMA/load/epilogue warps) holds without spills.
#
# ### 4a. How many `tcgen05.mma` does one KV block need?
#
# **Predict.** A bf16 UMMA instruction reduces over K = 16. `S_s = Q_s K^T` reduces over the head
# dimension: hdim/16 instructions per Q tile. `O_s += P_s V` reduces over the block's keys:
# tile_n/16 per Q tile. Two Q tiles.

# %%
HDIM, TILE_N, Q_TILES, UMMA_K = 128, 128, 2, 16
qk_steps = HDIM // UMMA_K    # S_s = Q_s K^T
pv_steps = TILE_N // UMMA_K  # O_s += P_s V
mma_per_block = Q_TILES * (qk_steps + pv_steps)
print(f"predicted: {Q_TILES} Q tiles x ({qk_steps} QK + {pv_steps} PV) = {mma_per_block} tcgen05.mma per KV block")

# %% [markdown]
# **Measure.** The SASS has twice that (64 `UTCHMMA` in the table). Below, in code order, `Q`
# is an MMA reading A from shared memory (QK), `P` one reading A = P from TMEM (PV), and `c` a
# commit (`Q8` = eight `Q` in a row).

# %%
if SASS:
    seq = kit.mma_sequence(SASS[0.0])
    print("UTCHMMA in the SASS:", len(seq), f"= {len(seq) // mma_per_block} x the prediction")
    runs = [f"{k}{len(list(g))}" for k, g in itertools.groupby(kit.mma_sequence(SASS[0.0], commits=True))]
    print("with commits, run-length:", " ".join(runs))
    qk, pv = "Q" * qk_steps, "P" * pv_steps
    prologue, body, tail = qk + qk, pv + qk + pv + qk, pv + pv
    kit.check(seq == prologue + body + tail, "expected first block QK0 QK1, loop body PV0 QK0 PV1 QK1, tail PV0 PV1")
    print(f"first block: {len(prologue)} (QK0, QK1)  |  loop body: {len(body)} (PV0, QK0, PV1, QK1)  |  "
          f"tail: {len(tail)} (PV0, PV1)")
    for n in (1, 2, 256):
        run = len(prologue) + (n - 1) * len(body) + len(tail)
        print(f"  {n:3d} KV blocks execute {run:5d} tcgen05.mma = {run / n:.0f} per block")
else:
    print("skipped: nvidia-cutlass-dsl is not importable (the compiled kernel shows 64 UTCHMMA)")

# %% [markdown]
# **Explain.** The MMA warp software-pipelines the blocks: PV of block j+1 is issued beside QK of
# block j (the blocks run last to first). The loop is compiled once (not unrolled), and the code
# before and after it holds the parts that have no partner:
#
# - **first block**: QK0, QK1 only (16), since no P exists yet;
# - **loop body**: PV0(j+1), QK0(j), PV1(j+1), QK1(j) (32), executed n-1 times;
# - **tail**: the last PV0, PV1 (16).
#
# So the binary holds 16 + 32 + 16 = 64, while a run over n blocks executes 16 + 32(n-1) + 16 =
# 32n: exactly the predicted 32 per block. A static SASS count is per code path, not per
# iteration. (Look closely at the PVs: a branch splits each into 6 + 2 instructions: that is the
# wait for "P full" before PV's last two k-steps, the split P of section 3. The 12 commits are the
# "S ready" signals after each QK, the "O ready" signals after the last PVs, and the releases of K,
# V and Q buffers back to the load warp.)
#
# ### 4b. What does exp2 emulation change in the binary?
#
# **Predict.** `fa4sim.exp2_emulation` charges an emulated pair of elements 6 packed FMA-pipe
# instructions (1 `add.rm`, 2 `sub`, 3 `fma`, all f32x2) and each element 2 ALU instructions
# (a clamp `max` and the exponent shift+add). The softmax code exists once in the binary, and one
# thread owns one row, so a static count change = the change per row and KV block.

# %%
from fa4sim import exp2_emulation as emu

n_emu = {f: int(emu.emulated_columns(TILE_N, f).sum()) for f in EMULATION}  # per 128-column row
per_pair = {"FFMA2": 3, "FADD2": 1 + 2}  # 3 fma; add.rm + 2 sub
assert sum(per_pair.values()) == emu.FMA_OPS_PER_ELEMENT  # 6 lane-ops per element = 6 packed instructions per pair


def predicted_delta(n):
    """Static SASS change when n more elements of a row are emulated."""
    return {"MUFU.EX2": -n, "FFMA2": per_pair["FFMA2"] * n // 2, "FADD2": per_pair["FADD2"] * n // 2,
            "FMNMX": n, "LEA": n}


step = n_emu[0.125] - n_emu[0.0]
print(f"exp_emulation 0 -> 0.125 emulates {step} elements per row; predicted change:", predicted_delta(step))

# %%
if COUNTS:
    for a, b in zip(EMULATION, EMULATION[1:]):
        measured = {op: COUNTS[b][op] - COUNTS[a][op] for op in predicted_delta(0)}
        pred = predicted_delta(n_emu[b] - n_emu[a])
        print(f"{a} -> {b}: measured {measured}")
        kit.check(measured == pred, f"predicted {pred}")
    print("FADD2.RM (the round-down add, one per pair):",
          {f: kit.sass_count(SASS[f], "FADD2.RM") for f in EMULATION})
else:
    print("skipped: nvidia-cutlass-dsl is not importable (the compiled kernel shows -16 MUFU.EX2, "
          "+24 FFMA2, +24 FADD2 per step)")

# %% [markdown]
# **Explain.** Each step of 0.125 emulates 16 more elements of every row (8 pairs): 16 `MUFU.EX2`
# go, and 8 x 3 = 24 `FFMA2` plus 8 x 3 = 24 `FADD2` come (48 packed FMA-pipe instructions = 6
# per pair), with 16 `FMNMX` clamps and 16 `LEA` (shift+add into the exponent) on the ALU. That is
# exactly the cost the simulator charges (`emu.FMA_OPS_PER_ELEMENT`, `emu.ALU_OPS_PER_ELEMENT`),
# so its exp2-emulation model describes the instructions our kernel really contains. Whether
# those instructions then run as fast as the model says on a B200 is the part nobody here has
# measured.
#
# Two details: `MUFU.EX2` is 129 at emulation 0, 128 per row plus one for the rescale factor
# `exp2((m_old - m_new) * scale)`. And the kernel emulates the last `round(f * 32)` columns of
# every 16 in the middle two 32-column fragments (FA4's pattern), while `fa4sim` spreads them
# evenly; the columns differ, the count is the same.
#
# ### Exercise 4.3: count before you compile
# How many `MUFU.EX2` instructions disappear from the kernel when `exp_emulation` goes from 0 to
# 0.25? The check compiles nothing new: it reads the SASS compiled above.

# %%
mufu_removed_at_025 = None  # <- your answer

# %%
# SOLUTION (try the exercise first).
if mufu_removed_at_025 is None:
    mufu_removed_at_025 = 4 * round(0.25 * 32)  # 2 fragments x 2 groups of 16, res = 8 each

# %%
if COUNTS:
    actual = COUNTS[0.0]["MUFU.EX2"] - COUNTS[0.25]["MUFU.EX2"]
    kit.check(mufu_removed_at_025 == actual, "count the emulated columns of one row: the softmax code exists once")
    print(f"MUFU.EX2: {COUNTS[0.0]['MUFU.EX2']} -> {COUNTS[0.25]['MUFU.EX2']} in the compiled kernel")
else:
    kit.check(mufu_removed_at_025 == n_emu[0.25], "count the emulated columns of one row")
    print("(checked against fa4sim's emulation pattern only: no compiled kernel here)")

# %% [markdown]
# ## 5. Against measurements: everyone's, and yours on a B200
#
# No B200 has run here. What others published has: `lab/campaigns/published-b200/published_b200.json`
# holds every B200 figure found for flash-attn-4 (the FA4 paper, pull requests, issues), each
# with its source, and `fa4sim validate` predicts them as typed. Their measurements, not ours.

# %%
from fa4sim import validate

published = validate.compare(validate.load(str(kit.repo_root() / "lab/campaigns/published-b200/published_b200.json")))
for row in published["points"][:6] + published["points"][6:12]:  # the paper's hd128 forward
    print(f"{row['id']:36s} published {row['measured_tflops']:5.0f}  predicted {row['predicted_tflops']:5.0f}  "
          f"({row['error']:+.1%})")
s = published["summary"]["all"]
print(f"all {s['points']} predicted figures: median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%}")

# %% [markdown]
# **On a B200** (`kit.blackwell()`: a GPU of compute capability 10.x), the next cell times
# flash-attn-4 itself at two points, after checking its output against an fp32 reference, and
# puts the prediction beside it. A short burst runs above the clock the 1000 W cap settles at;
# the settled check, forward and backward, is one command:
# `python3 lab/tools/sustained_sm100.py --quick --out b200.json && fa4sim validate b200.json`.

# %%
if kit.blackwell():
    import torch
    from flash_attn.cute.interface import flash_attn_func

    for s_len, causal in ((8192, False), (8192, True)):
        prob = Problem(batch=32768 // s_len, heads=16, seqlen_q=s_len, seqlen_k=s_len, hdim=128, causal=causal)
        q, k, v = (torch.randn(prob.batch, s_len, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))

        def run():
            out = flash_attn_func(q, k, v, causal=causal)
            return out[0] if isinstance(out, tuple) else out

        got = run()[:1, :, :1].float()  # one (batch, head) slice against fp32
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(x[:1, :, :1].float().transpose(1, 2) for x in (q, k, v)), is_causal=causal).transpose(1, 2)
        rel = float((got - ref).norm() / ref.norm())
        kit.check(torch.isfinite(got).all().item() and rel < 1e-2, f"flash-attn-4's output is off by {rel:.2e}")
        ms = kit.time_cuda(run, reps=20)
        print(f"hd128 {s_len} {'causal' if causal else 'non-causal'}: measured {prob.flops / ms / 1e9:.0f} TFLOP/s "
              f"(a short burst), predicted {simulate('b200', 'fa4', prob).tflops:.0f}")
else:
    print("No B200 here: the published figures above are the comparison.")

# %% [markdown]
# The clock is predicted too: the power model puts the main job at the 1000 W cap (its clock is
# printed below), which no public B200 measurement gives. How much the prediction rests on
# such parameters is `fa4sim run --uncertainty`: each parameter over its range (the b200
# profile states one for each assumed value), and the band that puts on TFLOP/s:

# %%
from fa4sim import uncertainty

band = uncertainty.band("b200", "fa4", PROBLEM, nominal=r)
print(f"main job: {r.tflops:.0f} TFLOP/s at {r.clock_ghz:.2f} GHz, band {band.tflops_low:.0f}..{band.tflops_high:.0f}; "
      f"dominated by {', '.join(n for n, _ in band.dominant[:3])}")

# %% [markdown]
# Do not tune a parameter until the prediction matches a published number: that would be
# fitting, and the simulator would stop predicting. A parameter is *measured* (our Hopper
# microbenchmarks do this for SM90; on a B200, `lab/tools/calibrate/` would).
#
# ## What to remember
#
# - FA4 = TMEM for S and O, one thread issuing all MMAs, two Q tiles in ping-pong, a correction
#   warpgroup with conditional rescaling, split P and exp2 emulation.
# - In the model, two Q tiles are worth ~2x, conditional rescaling ~13 %, 2-CTA, split P and
#   emulation 8-10 % each.
# - Our SM100 kernel compiles, and its SASS holds what the schedule predicts: 32 `tcgen05.mma`
#   per KV block (64 in the binary: first block + loop body + tail), and per 16 emulated
#   elements of a row -16 `MUFU.EX2`, +24 `FFMA2`, +24 `FADD2`.
# - It has never run: its speed and its correctness on a B200 are unknown. The simulator's B200
#   predictions are checked against every published figure, each with its band, and on a B200
#   against your own run (`lab/tools/sustained_sm100.py`).
#
# Next: lesson 05, the exp2 emulation in detail.
