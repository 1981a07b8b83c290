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
# # Lesson 06: what if? Change one number, predict, explain (about 30 minutes)
#
# A simulator earns its keep on questions no GPU on your desk can answer. The method, every time:
#
# 1. **Change one number.**
# 2. **Predict** on paper (feeds and speeds, lesson 02) what should happen and why.
# 3. **Simulate**, and read the utilisation and the bottleneck, not just TFLOP/s.
# 4. **Explain** the difference between 2 and 3. That is where you learn something.
#
# Four what-ifs on the FA4 main job (B200, hd128, 32k tokens, 16 heads).

# %%
import subprocess
import sys

import lessonkit as kit
from fa4sim import DeadlockError, InputError, Problem, simulate
from fa4sim.schedules import fa4_sm100

LIVE = kit.live()  # unused: everything here is a what-if about hardware we do not have
PROBLEM = Problem(batch=1, heads=16, seqlen_q=32768, seqlen_k=32768, hdim=128)
base = simulate("b200", "fa4", PROBLEM)


def show(label, r):
    top = sorted(r.utilization.items(), key=lambda kv: -kv[1])[:3]
    print(f"{label:36s} {r.tflops:6.0f} TFLOP/s ({r.tflops / base.tflops - 1:+6.1%})  "
          + "  ".join(f"{u} {v:.0%}" for u, v in top))


show("B200 FA4 default", base)

# %% [markdown]
# ## 1. A faster MUFU: the B300
#
# Blackwell Ultra (B300, SM103) doubles the MUFU's exp2 rate to 32 per clock. The `b300` profile
# is the B200's SM with that MUFU, its own clock (2032 MHz) and board limit (1100 W), each from a
# public source (`fa4sim params --hw b300`). flash-attn-4 turns the exp2 emulation off there: its
# implementation file says so for compute capability 10.3, so `simulate("b300")` runs FA4 as it
# ships on that chip. On paper: exp2 per tile drops from 1024 to 512 cycles, half the MMA time,
# like on Hopper. So the tensor core should become the bottleneck.
#
# The command line equivalent is `fa4sim run --hw b300 --hdim 128 --seqlen 32768 --batch 1 --heads 16`;
# `--set exp_emulation=0.1875` keeps the B200's split (the what-if).

# %%
b300 = simulate("b300", "fa4", PROBLEM)
b300_emu = simulate("b300", "fa4", PROBLEM, {"exp_emulation": base.knobs["exp_emulation"]})
show("B300, FA4 as it ships (no emulation)", b300)
show(f"B300, B200's emulation {base.knobs['exp_emulation']:.2%}", b300_emu)
print("bottleneck:", b300.bottleneck)
print(f"clock: B200 {base.clock_ghz:.3f} GHz, B300 {b300.clock_ghz:.3f} GHz (its cap is {b300.hw.power_cap_w:.0f} W)")

# %% [markdown]
# ### Exercise 6.1
# On the B300, with no emulation, which unit is the busiest now?

# %%
busiest_fast_mufu = None  # <- a unit name

# %%
# SOLUTION (try the exercise first).
if busiest_fast_mufu is None:
    busiest_fast_mufu = "tensor"

# %%
kit.check(busiest_fast_mufu == max(b300.utilization, key=b300.utilization.get), "read b300.utilization")

# %% [markdown]
# **Explain:** the prediction holds: the tensor core is now the limiter. Part of the B300's gain
# over the B200 is the MUFU (the tensor core no longer waits for exp2), part its higher clock
# and larger power budget: compare `b300` with `simulate("b200", "fa4", PROBLEM,
# {"mufu_ex2_per_clk": 32, "exp_emulation": 0})` to separate them. Note that the model still
# gains a little from emulation on the fast MUFU (it shortens each softmax's latency), while FA4
# turns it off on B300; register pressure and instruction latency, which the model lacks, are the
# likely reason. `fa4sim run --hw b300 --uncertainty` says how much of this rests on what is not
# measured.
#
# ## 2. More (or fewer) K/V stages
#
# K and V share one ring of shared-memory slots. More slots let the TMA run further ahead;
# fewer make the MMA wait for loads. FA4 uses 6 slots in 2-CTA mode (each holds half a block).

# %%
for stages in (2, 3, 4, 5, 6, 7):
    try:
        show(f"kv_stages={stages}", simulate("b200", "fa4", PROBLEM, {"kv_stages": stages}))
    except InputError as e:
        print(f"kv_stages={stages:<27d} does not fit: {e}")

# %% [markdown]
# Throughput rises to 4 stages and then flattens: beyond that the loads are already far enough
# ahead, and extra slots only cost shared memory. Seven do not fit beside Q and the O staging
# buffers.
#
# ### Exercise 6.2: the smem budget
# In 2-CTA mode each CTA holds 2 Q tiles (128 x 128 bf16 each), 2 O staging tiles of the same
# size, 1 KB of barriers, and `kv_stages` slots of half a 128 x 128 bf16 block. With 232448
# bytes of shared memory per CTA, what is the largest `kv_stages` that fits?

# %%
max_stages = None  # <- your answer

# %%
# SOLUTION (try the exercise first).
if max_stages is None:
    fixed = 2 * 128 * 128 * 2 + 2 * 128 * 128 * 2 + 1024
    max_stages = (232448 - fixed) // (128 * 128 * 2 // 2)

# %%
def fits(knobs):
    try:
        simulate("b200", "fa4", PROBLEM, knobs)
        return True
    except InputError:
        return False


kit.check(fits({"kv_stages": max_stages}) and not fits({"kv_stages": max_stages + 1}),
          f"{max_stages} is not the limit")

# %% [markdown]
# And one stage? Then K and V share a single slot. `simulate` refuses it up front, with the
# reason; to watch the reason happen, build the schedule anyway and hand it to the engine, which
# finds that it cannot make progress and says which ops wait for which:

# %%
try:
    simulate("b200", "fa4", PROBLEM, {"kv_stages": 1})
except InputError as e:
    print("rejected:", e)

from fa4sim.engine import simulate as run_engine
from fa4sim.model import setup

# a valid configuration first (setup checks it), then one slot, past the check
profile, _, module, impl, knobs = setup("b200", "fa4", PROBLEM, {}, None)
try:
    run_engine(module.build(profile, PROBLEM, {**knobs, "kv_stages": 1}, 8, 0, impl), [8])
except DeadlockError as e:
    print(str(e)[:400])

# %% [markdown]
# **Explain:** `K(j+1)` can only be loaded into the slot after `PV1(j)` has read `V(j)` from it;
# but the MMA warp issues `QK0(j+1)`, which needs `K(j+1)`, *before* `PV1(j)` (the ping-pong
# order `PV0(j-1), QK0(j), PV1(j-1), QK1(j)`). A cycle of waits: a deadlock. The ping-pong order
# needs at least two slots.
#
# ## 3. 2-CTA off
#
# In 2-CTA mode (`cta_group::2`) a pair of SMs runs M=256 MMAs, each SM staging half of every
# K/V block. What should turning it off cost? Each SM then reads whole K and V blocks: more
# shared-memory and TMA traffic per tile (lesson 02: 768 instead of 512 smem cycles per tile).

# %%
one_cta = simulate("b200", "fa4", PROBLEM, {"two_cta": False})
show("2-CTA (default)", base)
show("1-CTA", one_cta)
for u in ("smem", "tma", "tensor"):
    print(f"  {u:6s} 2-CTA {base.utilization[u]:4.0%}   1-CTA {one_cta.utilization[u]:4.0%}")
print("kv_stages chosen:", base.knobs["kv_stages"], "(2-CTA, half blocks) vs", one_cta.knobs["kv_stages"], "(1-CTA)")

# %% [markdown]
# **Explain:** shared memory is not saturated even at 1-CTA (~57 %), so the loss (~10 %) is not
# a bandwidth limit. The tensor core's idle causes tell the story: it now waits for K loads
# (`LK`) as well as for softmax. Each SM's TMA moves twice the bytes per block and, with whole
# blocks, only 3 slots fit (2-CTA with 3 slots loses just ~2 %, so the stage count is part of it,
# the slower per-SM loads the rest).

# %%
print("tensor idle causes, 2-CTA:", {k: f"{v:.0%}" for k, v in base.tensor_waits.items()})
print("tensor idle causes, 1-CTA:", {k: f"{v:.0%}" for k, v in one_cta.tensor_waits.items()})

# %% [markdown]
# ## 4. A third Q tile
#
# Two Q tiles let the tensor core work on one while the other does softmax. Would three hide
# more? Try it:

# %%
try:
    simulate("b200", "fa4", PROBLEM, {"q_tiles": 3})
except InputError as e:
    print("InputError:", e)
cli = subprocess.run([sys.executable, "-m", "fa4sim.cli", "run", "--hw", "b200", "--set", "q_tiles=3"],
                     capture_output=True, text=True)  # the same as `fa4sim run --hw b200 --set q_tiles=3`
print(f"CLI exit code {cli.returncode}: {cli.stderr.strip()}")

# %% [markdown]
# **Why:** each Q tile needs its own S (`tile_n` columns) and O (`hdim` columns) in TMEM, and
# lesson 04 showed two tiles already use all 512 columns. To fit three, shrink something: the KV
# block (`tile_n`), or, on a different problem, the head dimension.
#
# ### Exercise 6.3
# At hd128 with three Q tiles, what is the largest `tile_n` that fits in 512 TMEM columns? In
# 2-CTA mode the MMA's N must be a multiple of 16.

# %%
tile_n_3 = None  # <- your answer

# %%
# SOLUTION (try the exercise first).
if tile_n_3 is None:
    tile_n_3 = (512 // 3 - 128) // 16 * 16

# %%
k3 = {"q_tiles": 3, "tile_n": tile_n_3}
kit.check(fits(k3) and not fits({"q_tiles": 3, "tile_n": tile_n_3 + 16}), f"tile_n={tile_n_3} is not the largest that fits")
three = simulate("b200", "fa4", PROBLEM, k3)
print("TMEM columns:", fa4_sm100.tmem_columns(PROBLEM, three.knobs), "of", three.hw.tmem_columns)
show(f"3 Q tiles, tile_n={tile_n_3}", three)
print("bottleneck:", three.bottleneck)

# %% [markdown]
# **Explain:** it fits, and it is slower (~-24 %): with 32-key blocks each MMA is small, and for
# every 32 keys the Q tiles' operands stream from shared memory again, so shared memory becomes
# the busiest unit (~86 %). At hd128 the third tile is not worth it.
#
# At **hd64** the budget is looser (O needs only 64 columns) and lesson 02 said hd64 is exp-bound
# on Blackwell (exp2 takes twice the MMA time), so more tiles to overlap should help:

# %%
hd64 = Problem(batch=1, heads=32, seqlen_q=32768, seqlen_k=32768, hdim=64)
two64 = simulate("b200", "fa4", hd64)
three64 = simulate("b200", "fa4", hd64, {"q_tiles": 3, "tile_n": 96})
for label, r in (("hd64, 2 Q tiles, tile_n 128", two64), ("hd64, 3 Q tiles, tile_n 96", three64)):
    cols = fa4_sm100.tmem_columns(hd64, r.knobs)
    top = max(r.utilization, key=r.utilization.get)
    print(f"{label:30s} {cols} TMEM columns  {r.tflops:5.0f} TFLOP/s  busiest: {top} {r.utilization[top]:.0%}")

# %% [markdown]
# The model predicts about +27 % for hd64 with a third Q tile: the MUFU goes from ~67 % to ~87 %
# busy. A prediction worth testing once the SM100 kernel runs on a B200.
#
# ## Your turn
#
# Pick any parameter from `fa4sim params --hw b200` (e.g. `tmem_bytes_per_clk`, a guess, marked
# L) and halve or double it. Predict first, then simulate. The cell below is a template.

# %%
what_if = {"tmem_bytes_per_clk": 100}  # <- change one number
r = simulate("b200", "fa4", PROBLEM, what_if)
show(str(what_if), r)
print("bottleneck:", r.bottleneck)

# %% [markdown]
# ## What to remember
#
# - Change one number, predict, simulate, explain; read utilisation and the bottleneck, not only
#   TFLOP/s.
# - Capacity limits (TMEM columns, shared memory, too few K/V slots) are hard errors; a schedule
#   that cannot make progress is reported as a deadlock naming the ops.
# - Doubling the MUFU makes FA4 tensor-bound; stages matter up to 4; 2-CTA is worth ~10 %
#   through faster loads and more slots; a third Q tile does not fit at hd128 but may pay at
#   hd64.
#
# Next: lesson 07 returns to Hopper, to the research questions behind lesson 03's numbers.
