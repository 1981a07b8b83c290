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
# # Lesson 00: a tour of the SM (about 15 minutes)
#
# A GPU streaming multiprocessor (SM) is, for our purposes, **a set of units that work at the
# same time**: a tensor core for matrix multiplies, a MUFU ("multi-function unit") that computes
# `exp2`, an FMA pipe and an ALU pipe for ordinary arithmetic, shared memory, the TMA engine that
# copies tiles from global memory, and (on Blackwell) tensor memory, TMEM. A fast attention
# kernel is one that keeps the *expensive* unit, the tensor core, busy while the others work
# beside it.
#
# `fa4sim` replays a kernel's schedule, op by op, on such a model of one SM. In this lesson you
#
# 1. look at the units and their rates (the hardware profile),
# 2. run the simulator on FlashAttention-4's forward pass on a B200,
# 3. read its utilisation table and its Gantt chart.
#
# Everything here runs on a CPU. Set-up: `pip install -e ".[lessons]"` in the repository root.

# %%
import subprocess
import sys

import lessonkit as kit
from fa4sim import Problem, hardware, simulate

LIVE = kit.live()  # True only with a CUDA GPU; this lesson is simulation only either way
print("LIVE (GPU present):", LIVE)

# %% [markdown]
# ## 1. The units and their rates
#
# A hardware profile is data: every number has a unit, a source and a confidence
# (H = vendor document or several agreeing measurements, M = one measurement, L = a guess).
# Here are the per-SM rates that matter most, for Hopper (H100) and Blackwell (B200).

# %%
KEY = ["clock_ghz", "num_sms", "tensor_flops_per_clk", "mufu_ex2_per_clk", "fma_lanes_per_clk",
       "alu_lanes_per_clk", "smem_bytes_per_clk", "tmem_columns", "tma_bytes_per_clk"]
h100, b200 = hardware.load("h100-datasheet"), hardware.load("b200")
print(f"{'parameter':22s} {'h100-ds':>10s} {'b200':>10s}   unit                 [conf b200]")
for name in KEY:
    unit = hardware.PARAMS[name][0]
    print(f"{name:22s} {h100.values[name]!s:>10s} {b200.values[name]!s:>10s}   {unit:20s} [{b200.confidence[name]}]")
print(f"\npeak dense BF16: h100 {h100.peak_tflops:.0f} TFLOP/s, b200 {b200.peak_tflops:.0f} TFLOP/s")

# %% [markdown]
# Look at the ratios: the tensor core doubled from Hopper to Blackwell (4096 -> 8192 FLOP per
# clock per SM), but the MUFU (16 `exp2` per clock) and shared memory (128 B per clock) did not.
# That asymmetry is what FlashAttention-4 is designed around; lesson 02 works it out per tile.
#
# ## 2. Run the simulator
#
# The command line and the Python API do the same thing. The command line first (this is the
# repository's "main job": FA4 forward, head dim 128, 32k tokens, 16 heads, on a B200). In a
# terminal you would type `fa4sim run --hw b200 --schedule fa4 --hdim 128 --seqlen 32768
# --batch 1 --heads 16`; here we call the same entry point through the notebook's Python:

# %%
cmd = [sys.executable, "-m", "fa4sim.cli", "run", "--hw", "b200", "--schedule", "fa4", "--hdim", "128",
       "--seqlen", "32768", "--batch", "1", "--heads", "16"]
print(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)

# %% [markdown]
# And from Python, which gives you a `Result` object to poke at:

# %%
problem = Problem(batch=1, heads=16, seqlen_q=32768, seqlen_k=32768, hdim=128)
r = simulate("b200", "fa4", problem)
print(f"{r.tflops:.0f} TFLOP/s, {r.time_us:.0f} us, {r.tflops / r.hw.peak_tflops:.0%} of peak")
print("steady-state cycles per KV block (one CTA):", round(r.interval, 1))
print("bottleneck:", r.bottleneck)

# %% [markdown]
# ## 3. Read the utilisation table
#
# `r.utilization` says what fraction of the loop's steady state each unit was busy. A unit at
# ~100 % is *the* bottleneck; if no unit is near 100 %, the kernel is **latency-bound**: units
# wait on each other, and `r.tensor_waits` names what the tensor core waited for.

# %%
for unit, busy in sorted(r.utilization.items(), key=lambda kv: -kv[1]):
    print(f"  {unit:7s} {busy:6.1%} {'#' * int(round(busy * 40))}")
print("\ntensor core idle, by cause:", {k: f"{v:.1%}" for k, v in r.tensor_waits.items()})

# %% [markdown]
# ## 4. Read the Gantt chart
#
# Each row is a **unit** (top block: when it was busy, and with which op) or a **warp role**
# (bottom block: what that warp was doing). Colours are op kinds: blue MMA, orange exp2, red
# the rest of softmax, purple correction, green loads. Labels read `OP.iteration`.
#
# In FA4 the MMA warp issues `PV0(j-1), QK0(j), PV1(j-1), QK1(j)`: while the tensor core works
# for Q tile 1, the softmax warpgroup of Q tile 0 runs its `exp2` on the MUFU, and vice versa.
# The gaps in the tensor row are the cycles it waited for softmax.

# %%
kit.gantt(r, iterations=6)

# %% [markdown]
# ### Exercise 0.1: which unit limits this kernel?
#
# From the utilisation table above (not from `r.bottleneck`!), write the name of the busiest
# unit and its busy fraction rounded to two decimals. Try first; then run the solution cell.

# %%
busiest_unit = None      # <- your answer, e.g. "smem"
busiest_fraction = None  # <- your answer, e.g. 0.42

# %%
# SOLUTION (try the exercise first). Fills in only what you left as None.
if busiest_unit is None:
    busiest_unit = "tensor"
if busiest_fraction is None:
    busiest_fraction = 0.84

# %%
top = max(r.utilization, key=r.utilization.get)
kit.check(busiest_unit == top, f"the busiest unit is not {busiest_unit!r}; sort r.utilization")
kit.check(abs(busiest_fraction - r.utilization[top]) < 0.01,
          f"{busiest_fraction} is not {top}'s busy fraction to 2 decimals")

# %% [markdown]
# ### Exercise 0.2: from cycles per block to TFLOP/s
#
# One CTA of this kernel works on 2 x 128 = 256 query rows (two Q tiles; in 2-CTA mode a CTA
# *pair* shares 512 rows, but each SM still does 256 rows' worth) against one 128-key block per
# loop iteration, at head dim 128. Each (row, key) pair costs 4 x hdim FLOPs (two GEMMs, multiply
# and add). Using `r.interval` (cycles per KV block in the steady state), the clock and the number
# of SMs, compute the steady-state TFLOP/s of the whole chip. It should be a bit **above**
# `r.tflops`, because the kernel also pays a prologue, an epilogue and a last partial wave.

# %%
steady_tflops = None  # <- your formula, using r.interval, r.hw.clock_ghz, r.hw.num_sms

# %%
# SOLUTION (try the exercise first).
if steady_tflops is None:
    flops_per_block = 4 * 256 * 128 * 128
    steady_tflops = flops_per_block / r.interval * r.hw.clock_ghz * 1e9 * r.hw.num_sms / 1e12

# %%
print(f"steady state: {steady_tflops:.0f} TFLOP/s; whole kernel: {r.tflops:.0f} TFLOP/s")
kit.check(r.tflops <= steady_tflops <= 1.1 * r.tflops,
          "count 256 rows x 128 keys x 4 x 128 FLOPs per block; cycles -> seconds with clock_ghz * 1e9")

# %% [markdown]
# ## What to remember
#
# - An SM is a set of units running concurrently; a kernel's speed is set by the busiest unit,
#   or by how long units wait for each other (latency-bound).
# - `fa4sim run` (or `simulate()`) gives TFLOP/s, the utilisation of each unit and the reason.
# - The Gantt chart shows *why*: which op each unit was doing and where the tensor core waited.
#
# Next: lesson 01 builds attention and the online softmax from scratch in numpy.
