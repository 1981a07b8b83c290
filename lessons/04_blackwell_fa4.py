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
# There is no SM100 kernel in this repository yet and no Blackwell GPU in our lab, so this lesson
# is simulation only; section 4 shows what will be compared once both exist.

# %%
import matplotlib.pyplot as plt

import lessonkit as kit
from fa4sim import InputError, Problem, simulate
from fa4sim.schedules import fa4_sm100

LIVE = kit.live()  # unused: our kernels are SM90 only, and there is no SM100 kernel yet
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
    "one Q tile (no ping-pong)": {"q_tiles": 1},
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
# ## 4. What will be compared (no SM100 measurement exists yet)
#
# When our SM100 kernel exists and a B200 is available, its benchmark will be recorded in
# `benchmarks/results/` like the SM90 one, and this section will put it beside the predictions.
# Until then we show the predictions alone, and the one published number we have: the FA4
# paper's own kernel on a B200 (**their** measurement, not ours).

# %%
recorded_sm100 = kit.recorded("sm100_fwd_*.json")
if recorded_sm100:
    for path, doc in recorded_sm100:
        print("recorded:", path.name, kit.describe(doc))
else:
    print("No SM100 measurement is recorded (no SM100 kernel yet, no B200 here): predictions only.")

PUBLISHED = 1613  # FA4 paper (arXiv 2603.05451): BF16, hd128, 32k, non-causal, their kernel on B200
print(f"\n{'problem':34s} {'predicted':>10s} {'measured (ours)':>16s}")
for d in (64, 128):
    for s in (4096, 32768):
        for causal in (False, True):
            prob = Problem(batch=max(1, 32768 // s), heads=2048 // d, seqlen_q=s, seqlen_k=s, hdim=d, causal=causal)
            pred = simulate("b200", "fa4", prob).tflops
            print(f"hd{d:<3d} seqlen {s:5d} {'causal    ' if causal else 'non-causal'}      {pred:10.0f} {'not yet':>16s}")
print(f"\nmain job (hd128, 32k, 16 heads): predicted {r.tflops:.0f}; published by the FA4 authors: {PUBLISHED}")

# %% [markdown]
# The prediction assumes the rated 1.86 GHz; the reference notes a sustained clock of about
# 1.6-1.75 GHz under FA4's load. Predicted time scales with the clock:

# %%
for ghz in (1.6, 1.75, 1.86):
    print(f"at {ghz:.2f} GHz: {simulate('b200', 'fa4', PROBLEM, {'clock_ghz': ghz}).tflops:5.0f} TFLOP/s")

# %% [markdown]
# Do not tune the clock until the prediction matches the published number: that would be fitting,
# and the simulator would stop predicting. The clock is a parameter to *measure* (our Hopper
# microbenchmarks do this for SM90; nobody here can do it for a B200 yet).
#
# ## What to remember
#
# - FA4 = TMEM for S and O, one thread issuing all MMAs, two Q tiles in ping-pong, a correction
#   warpgroup with conditional rescaling, split P and exp2 emulation.
# - In the model, two Q tiles are worth ~2x, conditional rescaling ~13 %, 2-CTA, split P and
#   emulation 8-10 % each.
# - No SM100 measurement of ours exists yet; the lesson says so instead of inventing one.
#
# Next: lesson 05, the exp2 emulation in detail.
