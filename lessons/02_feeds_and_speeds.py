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
# # Lesson 02: feeds and speeds (about 20 minutes)
#
# Before simulating anything, a kernel designer asks: for one tile of work, how many cycles does
# each unit need, if nothing ever waited? The unit with the largest count bounds the kernel
# from below. For attention, one tile is a `128 x 128` block of scores (128 query rows against
# 128 keys), and it needs
#
# - **MMA**: `S = Q K^T` and `O += P V`, each `128 x 128 x hdim` multiply-adds,
# - **exp2**: `128 x 128` exponentials on the MUFU (16 per clock per SM),
# - **shared memory**: the MMA operands that are read from shared memory.
#
# You will compute these by hand, compare with `fa4sim.feeds.tile_costs`, and see the
# asymmetry FA4 is built on: from Hopper to Blackwell the tensor core doubled, and exp2 and
# shared memory did not.

# %%
import matplotlib.pyplot as plt
import numpy as np

import lessonkit as kit
from fa4sim import hardware
from fa4sim.feeds import operand_bytes, tile_costs

LIVE = kit.live()  # this lesson reads recorded microbenchmarks; it runs nothing on the GPU
h100, b200 = hardware.load("h100-datasheet"), hardware.load("b200")

# %% [markdown]
# ## 1. By hand
#
# ### Exercise 2.1: MMA cycles per tile
#
# A `128 x 128` tile at head dim 128 does two GEMMs of `128 x 128 x 128`, i.e.
# `2 x 2 x 128^3` FLOPs (a multiply-add is 2 FLOPs). Using `tensor_flops_per_clk` (4096 on
# H100, 8192 on B200), how many tensor-core cycles per tile on each? And how many MUFU cycles
# for the tile's `exp2`s?

# %%
mma_cycles_h100 = None  # <- your answer
mma_cycles_b200 = None  # <- your answer
exp_cycles = None       # <- your answer (the same on both)

# %%
# SOLUTION (try the exercise first).
if mma_cycles_h100 is None:
    mma_cycles_h100 = 2 * 2 * 128**3 / h100.tensor_flops_per_clk
if mma_cycles_b200 is None:
    mma_cycles_b200 = 2 * 2 * 128**3 / b200.tensor_flops_per_clk
if exp_cycles is None:
    exp_cycles = 128 * 128 / b200.mufu_ex2_per_clk

# %%
c_h, c_b = tile_costs(h100, hdim=128), tile_costs(b200, hdim=128)
kit.check(mma_cycles_h100 == c_h["mma"], f"H100 MMA: the simulator says {c_h['mma']:.0f}")
kit.check(mma_cycles_b200 == c_b["mma"], f"B200 MMA: the simulator says {c_b['mma']:.0f}")
kit.check(exp_cycles == c_b["exp_mufu"] == c_h["exp_mufu"], "exp2: 16384 exponentials at 16 per clock")

# %% [markdown]
# ### Exercise 2.2: shared-memory cycles on B200
#
# On Blackwell, `S = Q K^T` reads Q and K from shared memory (SS), and `O += P V` reads P from
# TMEM and V from shared memory (TS). At 128 B per clock, how many cycles of shared-memory
# bandwidth does one tile take? (`operand_bytes` gives the bytes of Q, K and V tiles.)

# %%
print(operand_bytes(hdim=128, tile_m=128, tile_n=128))
smem_cycles_b200 = None  # <- your answer

# %%
# SOLUTION (try the exercise first).
if smem_cycles_b200 is None:
    b = operand_bytes(128, 128, 128)
    smem_cycles_b200 = (b["q"] + b["k"] + b["v"]) / b200.smem_bytes_per_clk

# %%
kit.check(smem_cycles_b200 == c_b["smem"], f"the simulator says {c_b['smem']:.0f} cycles")

# %% [markdown]
# On Hopper the same tile costs more shared-memory cycles (1280 vs 768): two consumer
# warpgroups each issue `m64` wgmmas, so each reads the whole K and V tile: the B operand is
# read twice. Blackwell's 128-row UMMA reads it once, and a CTA pair (2-CTA mode) halves it again.

# %% [markdown]
# ## 2. The table and the chart

# %%
rows = []
for name, hw in (("H100", h100), ("B200", b200), ("B200 2-CTA", b200)):
    c = tile_costs(hw, hdim=128, two_cta=(name == "B200 2-CTA"))
    rows.append((name, c))
    print(f"{name:11s} MMA {c['mma']:6.0f}   exp2 (MUFU) {c['exp_mufu']:6.0f}   smem {c['smem']:6.0f}   "
          f"exp/MMA {c['exp_mufu'] / c['mma']:4.0%}   smem/MMA {c['smem'] / c['mma']:4.0%}")

fig, ax = plt.subplots(figsize=(8, 3.5))
x = np.arange(3)
for i, (name, c) in enumerate(rows):
    ax.bar(x + (i - 1) * 0.27, [c["mma"], c["exp_mufu"], c["smem"]], width=0.27, label=name)
ax.set_xticks(x, ["tensor core (MMA)", "MUFU (exp2)", "shared memory"])
ax.set_ylabel("cycles per 128x128 tile (hd128)")
ax.set_title("Feeds and speeds: one tile, no overlap, no latency")
ax.legend()
fig.tight_layout()

# %% [markdown]
# **Read it:** on H100 exp2 needs half the MMA time, so a schedule that overlaps softmax with the
# GEMMs (FA3's ping-pong) hides it completely. On B200 exp2 needs **as long as** the MMA: even a
# perfect overlap leaves no slack, and any exp2 time not hidden shows up as tensor-core idle time.
# FA4's answers: two Q tiles in ping-pong so MUFU and tensor core always have work, **conditional
# rescaling** (lesson 01) to take correction work off the critical path, and **exp2 emulation**:
# move some exponentials to the FMA pipe (128 lanes per clock), which has room to spare.
#
# The FMA and ALU columns below are only the emulation's extra work; those pipes also do the rest
# of softmax (scaling, row sums, conversions), which is why FA4 stops at 10-25 % (lesson 05).

# %%
for frac in (0.0, 0.125, 0.25, 0.5):
    c = tile_costs(b200, hdim=128, exp_emulation=frac)
    print(f"B200, {frac:5.1%} emulated: MUFU {c['exp_mufu']:5.0f}  FMA {c['exp_fma']:4.0f}  ALU {c['exp_alu']:4.0f}"
          f"  -> max(exp units) {max(c['exp_mufu'], c['exp_fma']):5.0f} vs MMA {c['mma']:.0f}")

# %% [markdown]
# ### Exercise 2.3: head dimension
#
# MMA work grows with the head dimension, exp2 work does not (one exp per score). At which head
# dimension does B200's exp2 time equal its MMA time? Write it, then the check compares
# `tile_costs` at your value.

# %%
hdim_balance = None  # <- your answer

# %%
# SOLUTION (try the exercise first).
if hdim_balance is None:
    hdim_balance = 128  # 4 * 128 * 128 * d / 8192 = 128 * 128 / 16  =>  d = 128

# %%
c = tile_costs(b200, hdim=hdim_balance)
kit.check(c["mma"] == c["exp_mufu"], f"at hdim {hdim_balance}: MMA {c['mma']:.0f} vs exp2 {c['exp_mufu']:.0f}")
for d in (64, 128, 256):
    c = tile_costs(b200, hdim=d)
    print(f"B200 hd{d:3d}: MMA {c['mma']:5.0f}, exp2 {c['exp_mufu']:5.0f} -> exp/MMA {c['exp_mufu'] / c['mma']:.0%}")

# %% [markdown]
# Small head dims (64) are exp-bound on Blackwell even with perfect overlap; large ones (256) have
# slack. A faster MUFU (B300-like) changes the whole picture (lesson 06).

# %% [markdown]
# ## 3. Are the rates right? Recorded microbenchmarks
#
# The rates above come from vendor documents and papers. Our own Hopper microbenchmarks
# (`lab/tools/calibrate/run_all.py`) record what the chip actually does (campaign
# `lab/campaigns/unit-calibration/`, kind "calibration" in `lab/results.json`). When they exist,
# this cell puts each measured per-clock rate beside the datasheet value and recomputes the H100
# tile costs with it.

# %%
WANTED = {  # the rate, where the calibration file keeps it, the datasheet profile's parameter
    "exp2 (MUFU.EX2) per clk": ("pipes.ex2.lanes_per_clk", "mufu_ex2_per_clk"),
    "FFMA lanes per clk": ("pipes.ffma.lanes_per_clk", "fma_lanes_per_clk"),
    "FMNMX (ALU) lanes per clk": ("pipes.fmnmx.lanes_per_clk", "alu_lanes_per_clk"),
    "shared memory B per clk": ("smem.bytes_per_clk", "smem_bytes_per_clk"),
    "wgmma FLOP per clk (best)": ("flops_per_clk", "tensor_flops_per_clk"),
}
# run_all.py's full runs: the pipes, shared memory, sync, TMA and wgmma benchmarks
calib = kit.recorded(kind="calibration", campaign="unit-calibration", where=lambda d: "pipes" in d["benchmarks"])
if not calib:
    print("No calibration measurement is recorded yet (lab/campaigns/unit-calibration/): "
          "nothing to compare; the rates above are datasheet values.")
for path, doc in calib:
    device, date = kit.describe(doc)
    rates = kit.find_keys(doc, "per_clk")
    print(f"{path.name}: {device}, {date}")
    found = {}
    for name, (suffix, param) in WANTED.items():
        hits = [v for k, v in rates.items() if k.endswith(suffix)]
        if hits:
            found[param] = max(hits)
            print(f"   {name:28s} measured {found[param]:8.1f}   datasheet {h100.values[param]}")
        else:
            print(f"   {name:28s} not in this file")
    if {"tensor_flops_per_clk", "mufu_ex2_per_clk"} <= set(found):
        mma = 2 * 2 * 128**3 / found["tensor_flops_per_clk"]
        exp = 128 * 128 / found["mufu_ex2_per_clk"]
        print(f"   -> per 128x128 tile at hd128 with the measured rates: MMA {mma:.0f} cycles, exp2 {exp:.0f} cycles")

# %% [markdown]
# Per clock, Hopper delivers its datasheet rates almost exactly. What the microbenchmarks do
# change is the **clock** (about 1.61 GHz under a full wgmma load instead of the rated 1.83 GHz)
# and several latencies: cycles per tile stay, seconds per tile grow. Lesson 03 uses the measured
# profiles (`h100`, `h200`) built from these files.
#
# ## What to remember
#
# - Per 128x128 tile at hd128: MMA 2048 cycles on H100 and 1024 on B200; exp2 1024 on both;
#   shared memory 1280 (H100) and 768 (B200, 1-CTA).
# - Blackwell doubled the tensor core but not the MUFU or shared memory: exp2 went from 50 % to
#   100 % of MMA time. Everything in FA4's design follows from that ratio.
#
# Next: lesson 03 simulates, and measures, the Hopper kernel.
