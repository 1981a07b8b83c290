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
# # Lesson 08: the power wall (about 25 minutes)
#
# Every lesson so far turns cycles into time with one clock. A real H100 does not hold its
# 1.98 GHz maximum under attention: the board may draw at most 700 W, and a busy tensor core
# draws more than that at full clock. The GPU lowers its clock (and voltage) until the power fits.
# So the clock is an output of the kernel, not an input, and every watt a kernel spends outside
# the tensor core is a watt the tensor core's clock does not get.
#
# fa4sim predicts that clock from the work each unit does (`fa4sim/power.py`, the power model of
# `docs/model.md`, "Clock and power"). A `Result` carries `clock_ghz`, `power_w`,
# `power_by_part` (watts per unit), `clock_source` and `power_limited`; `--set clock_ghz=X` (or
# `{"clock_ghz": X}`) forces a clock instead.

# %%
import lessonkit as kit
from fa4sim import Problem, hardware, simulate

LIVE = kit.live()
PARTS = ("static", "tensor", "mufu", "fma", "alu", "smem", "l2", "hbm")


def hopper(hdim):
    """16k tokens (batch 4 x seqlen 4096), heads x hdim = 2048, non-causal."""
    return Problem(batch=4, heads=2048 // hdim, seqlen_q=4096, seqlen_k=4096, hdim=hdim)


def show(label, r):
    parts = "  ".join(f"{p} {r.power_by_part.get(p, 0):3.0f}" for p in PARTS)
    print(f"{label:26s} {r.tflops:5.0f} TFLOP/s  {r.clock_ghz:.3f} GHz  {r.power_w:4.0f} W  "
          f"({r.clock_source}{', capped' if r.power_limited else ''})\n{'':26s} W: {parts}")


# %% [markdown]
# ## 1. Why a clock model
#
# **Predict first.** FlashAttention-4's Hopper forward at hd64 and at hd256, same tokens and
# same heads x hdim. Which one runs at the lower clock? Hint: at hd256 each score element comes
# with 4x the MMA work of hd64, and the same exp2 and softmax work.

# %%
h100 = {hd: simulate("h100", problem=hopper(hd), impl="flash-attn-4") for hd in (64, 256)}
for hd, r in h100.items():
    show(f"H100 flash-attn-4 hd{hd}", r)
    full = simulate("h100", problem=hopper(hd), impl="flash-attn-4", overrides={"clock_ghz": 1.98})
    print(f"{'':26s} at a forced 1.98 GHz: {full.tflops:.0f} TFLOP/s, drawing {full.power_w:.0f} W")

# %% [markdown]
# Both hit the 700 W cap. hd256 runs at the lower clock (~1.46 GHz against ~1.67): its tensor
# core is busier per clock, and the tensor core is most of the dynamic power (~370 W of ~580).
# At 1.98 GHz the same kernels would draw ~980 W and ~1270 W. The static part (~120 W) is paid
# whatever the kernel does.
#
# **Cards differ.** Two H200s under the same capped GEMM hold 1.57 and 1.62 GHz: one draws ~40 W
# more than the other at the same clock (leakage, voltage bin, cooling). The profile carries the
# median card of those measured (`card_power_w`); a card that draws 40 W more is slower under
# the cap. Predict by how much before you run the cell.

# %%
for hd in (64, 256):
    hot = simulate("h100", problem=hopper(hd), impl="flash-attn-4",
                   overrides={"card_power_w": hardware.load("h100").card_power_w + 40})
    print(f"hd{hd:<3d} a card drawing 40 W more: {hot.clock_ghz:.3f} GHz (the median card: "
          f"{h100[hd].clock_ghz:.3f}), {hot.tflops / h100[hd].tflops - 1:+.1%} in TFLOP/s")

# %% [markdown]
# ## 2. Measured
#
# The sustained benchmark runs each point back to back for seconds, so the GPU reaches its
# steady clock. It records TFLOP/s, NVML's clock and power over the timed windows, and, for a
# clock-probe build of fa4kernel, the clock counted inside the kernel (`clock64` against
# `globaltimer`, summed over every launch of a window: the cap's controller moves the clock by
# several percent from one window to the next, and one launch's sample reads about 4 % low). Look
# at the file's shape first:

# %%
# the newest settled run on an H100 (lab/tools/sustained_sm90.py, kind "sustained") with the two
# points below and the clock probe's in-kernel clock
(path, doc), = kit.recorded(kind="sustained", gpu="h100", where=lambda d: {"hd64-4k-b4-h32", "hd256-4k-b4-h8"}
                            <= {p["name"] for p in d["points"] if "clock_ghz_in_kernel" in p})[:1]
print(path.name, "|", *kit.describe(doc), "| kind:", doc["meta"]["kind"])
point = doc["points"][0]
print("a point:", {k: v for k, v in point.items() if k not in ("results", "fa4kernel_config", "order")})
print("its candidates:", list(point["results"]))
print("one candidate's numbers:", sorted(k for k, v in point["results"]["flash-attn-4"].items()
                                          if isinstance(v, float)))

# %%
measured = {p["name"]: p for p in doc["points"]}
for hd, name in ((64, "hd64-4k-b4-h32"), (256, "hd256-4k-b4-h8")):
    p, r = measured[name], h100[hd]
    fa = p["results"]["flash-attn-4"]
    print(f"hd{hd:<3d} predicted {r.clock_ghz:.3f} GHz | in-kernel {p['clock_ghz_in_kernel']:.3f} GHz "
          f"(prediction {r.clock_ghz / p['clock_ghz_in_kernel'] - 1:+.1%}) | NVML, flash-attn-4: "
          f"{fa['sm_mhz'] / 1000:.3f} GHz {fa['power_w']:.0f} W, {fa['tflops']:.0f} TFLOP/s "
          f"(predicted {r.tflops:.0f})")

# %% [markdown]
# The order is right, and so is the level: within a few percent of the clock counted inside the
# kernel. Two terms of the power model make that so. Attention's tensor core works in bursts
# between softmax phases, and a tensor core that idles between bursts still draws about a quarter
# of its busy power (more idle at hd64, whose softmax is twice as long per FLOP); and the softmax
# is one mixed stream of MUFU, FMA and ALU instructions, which draws more than the same work in
# single-pipe streams. Section 3 shows the unit loads that measure both. Switch them off and see
# the clock the model would predict:

# %%
for hd in (64, 256):
    plain = simulate("h100", problem=hopper(hd), impl="flash-attn-4",
                     overrides={"tensor_idle_power_fraction": 0.0, "mixed_code_energy_fraction": 0.0})
    t = h100[hd].activity.totals
    print(f"hd{hd:<3d} without the idle and mixed-code terms: {plain.clock_ghz:.3f} GHz "
          f"(with them {h100[hd].clock_ghz:.3f}); the tensor core's weighted idle cycles per busy one: "
          f"{t['tensor_idle'] / t['tensor']:.2f}")

# %% [markdown]
# On a Hopper GPU (`LIVE` is True) you can measure the two points yourself:
#
#     python lab/tools/sustained_sm90.py --points hd64-4k-b4-h32,hd256-4k-b4-h8 --out sustained.json
#
# or any problem of your own (repeat `--problem`), and then compare with the prediction:
#
#     python lab/tools/sustained_sm90.py --problem b=2,h=16,sq=5000,d=192,causal --out mine.json
#     fa4sim validate mine.json

# %%
print("LIVE:", LIVE, "(the command above takes a few minutes; run it in a terminal)")

# %% [markdown]
# ## 3. Where the watts go
#
# The power model's energies come from unit loads: one unit (or a mix) kept busy on every SM for
# seconds, with the clock, the board's power and the work per clock recorded. Three of them: the
# tensor core alone (wgmma N=256 back to back), and the same beside one or two softmax-like
# warpgroups (MUFU, FMA and ALU work).

# %%
def load_names(doc):
    return {load["name"] for load in doc["loads"]}


# the unit loads on an H100 (lab/tools/calibrate/bench_power.py, kind "power")
UNIT_LOADS = {"sleep", "tensor256", "tensor256+mix1", "tensor256+mix2", "mix"}
(ppath, pdoc), = kit.recorded(kind="power", gpu="h100", where=lambda d: UNIT_LOADS <= load_names(d))[:1]
print(ppath.name, "|", *kit.describe(pdoc))
loads = {l["name"]: l for l in pdoc["loads"]}
for name in ("sleep", "tensor256", "tensor256+mix1", "tensor256+mix2", "mix"):
    l = loads[name]
    a = l["activity_per_clk"]
    print(f"{name:16s} {l['clock_ghz']:.3f} GHz {l['power_w']:4.0f} W | per clock: tensor "
          f"{a['tensor_flops']:8.0f} FLOP, mufu {a['mufu_ops']:5.0f}, fma {a['fma_lane_ops']:5.0f}, "
          f"alu {a['alu_lane_ops']:5.0f}")

# %% [markdown]
# The tensor core alone already hits the cap at ~1.6 GHz. Adding the softmax mix does the same
# tensor work per clock and costs clock: ~1.53 GHz. The mix alone stays at 1.98 GHz (it draws
# only ~340 W), but beside the GEMM its watts come out of the tensor core's clock.
#
# A second file runs the tensor core at a duty cycle: bursts of 1, 8 or 64 trips (1024 cycles
# each) with the tensor core idle between them, at 90 %, 75 % and 50 % of the time busy. Per
# FLOP the loads with more idle time draw more: the idle tensor core keeps drawing part of its
# busy power through its gaps. The model's `tensor_idle_power_fraction` (that part) and
# `tensor_idle_gap_cycles` (how long a gap must be before it gates) come from these loads.
# Compare the 50 % loads with the 90 % ones at equal clock.

# %%
# the first H100 run with the 90 % duty loads (a second, the same card two minutes later, agrees
# within about 2 % in power)
(bpath, bdoc) = kit.recorded(kind="power", gpu="h100", where=lambda d: "tensor256_d90_b1" in load_names(d))[-1]
print(bpath.name, "|", *kit.describe(bdoc))
for l in bdoc["loads"]:
    if l["name"].startswith("tensor256_d"):
        a = l["activity_per_clk"]
        print(f"{l['name']:24s} {l['clock_ghz']:.3f} GHz {l['power_w']:4.0f} W | tensor "
              f"{a['tensor_flops'] / pdoc['gpu']['num_sms']:5.0f} FLOP/clk/SM")

# %% [markdown]
# A third file puts memory traffic beside the tensor core, as attention's K/V loads do: the
# tensor core with one softmax-like warpgroup, and in the same CTA one more warp that keeps a ring
# of TMA loads from HBM going, as fast as it goes or one 8 KB box per 500, 1000 or 2000 cycles.
# The more HBM traffic, the lower the clock. But an HBM byte costs less here than alone at
# 1.98 GHz: in proportion to the clock. The model prices it so (`energy_hbm_pj_per_byte` x
# f/fmax); priced as at the maximum clock, the full-rate load would be predicted about 10 % slower
# than it runs.

# %%
from fa4sim import power

# the first H100 run of the TMA ring beside the tensor core (a second followed on the same card)
(rpath, rdoc) = kit.recorded(kind="power", gpu="h100", where=lambda d: "tensor256+mix1+hbm_g500" in load_names(d))[-1]
print(rpath.name, "|", *kit.describe(rdoc))
h100_hw = hardware.load("h100")
for l in rdoc["loads"]:
    if not l["name"].startswith("tensor256+mix1"):
        continue
    rates = {u: l["activity_per_clk"].get(k, 0.0) for k, u in power.CALIBRATION_KEYS.items()}
    rates["mixed"] = 1.0
    f, pred = l["clock_ghz"], power.predict_clock(h100_hw, rates)
    hbm_w = power.power_w(h100_hw, rates, f)[1]["hbm"]
    print(f"{l['name']:26s} HBM {rates['hbm'] * f / 1e3:4.2f} TB/s  {f:.3f} GHz  {l['power_w']:4.0f} W | model: "
          f"HBM {hbm_w:3.0f} W ({hbm_w * h100_hw.clock_ghz / f:3.0f} W at the maximum clock's price), "
          f"clock {pred.clock_ghz:.3f} GHz")
    kit.check(abs(pred.clock_ghz / f - 1) < 0.03, f"{l['name']}: predicted {pred.clock_ghz:.3f} GHz, measured {f:.3f}")

# %% [markdown]
# ## 4. FA4's asymmetry as a power argument
#
# On B200 the tensor core's rate per SM doubled, the MUFU's did not. Lesson 02 reads this as a
# time argument: exp2 becomes the bottleneck, so FA4 emulates part of it on the FMA pipes and
# skips most O rescales. The cap adds a second one: every non-tensor operation spends watts, and
# under a 1000 W cap those watts lower the clock of everything. Two what-ifs on the FA4 main job
# (B200, hd128, 32k tokens, 16 heads):

# %%
B200 = Problem(batch=1, heads=16, seqlen_q=32768, seqlen_k=32768, hdim=128)
b200 = {
    "FA4 default": simulate("b200", "fa4", B200),
    "exp_emulation 0": simulate("b200", "fa4", B200, {"exp_emulation": 0.0}),
    "rescale_threshold 0": simulate("b200", "fa4", B200, {"rescale_threshold": 0.0}),
}
for label, r in b200.items():
    show(label, r)
print(f"default: exp_emulation {b200['FA4 default'].knobs['exp_emulation']}, "
      f"rescale_threshold {b200['FA4 default'].knobs['rescale_threshold']}")

# %% [markdown]
# Separate time from clock: run all three at the default's clock.

# %%
f0 = b200["FA4 default"].clock_ghz
same_clock = {label: simulate("b200", "fa4", B200, {**o, "clock_ghz": f0}) for label, o in (
    ("FA4 default", {}), ("exp_emulation 0", {"exp_emulation": 0.0}),
    ("rescale_threshold 0", {"rescale_threshold": 0.0}))}
for label, r in same_clock.items():
    print(f"{label:20s} at {f0:.3f} GHz: {r.tflops:5.0f} TFLOP/s, {r.power_w:5.0f} W; "
          f"with its own clock {b200[label].clock_ghz:.3f} GHz: {b200[label].tflops:5.0f} TFLOP/s")

# %% [markdown]
# What the numbers show:
#
# - **Emulation off** (all exp2 on the MUFU): at the same clock it is ~8 % slower (the MUFU
#   limits) and draws ~70 W less, so the cap lets it run ~4 % faster (1.59 GHz). The net loss
#   is ~4.5 %: emulation still pays, but the cap takes back nearly half of its gain in clock. Of
#   those ~70 W, the emulation's own FMA and ALU work is ~25 W; the rest is the tensor core and
#   its shared-memory operands doing more work per clock.
# - **Rescale every block** (`rescale_threshold` 0): at the same clock the throughput does not
#   change (the correction warpgroup hides the rescales), but the extra O reads and writes draw
#   ~32 W more, almost all of it shared-memory and TMEM traffic (the model counts them together).
#   Under the cap that costs ~1.6 % of clock and the same
#   in TFLOP/s. In time alone, conditional rescaling buys nothing here; in power it does.
#
# ## 5. Exercises
#
# ### Exercise 8.1
# MUFU energy on the H100 profile is ~10.3 pJ per op. At what `energy_mufu_pj_per_op` would the
# hd64 clock of section 1 drop by 2 %? Predict from `power_by_part` first (how many watts must the
# MUFU add?), then try values with `overrides={"energy_mufu_pj_per_op": e}`.

# %%
mufu_pj = None  # <- your answer, pJ per op

# %%
# SOLUTION (try the exercise first).
if mufu_pj is None:
    lo, hi = hardware.load("h100").energy_mufu_pj_per_op, 100.0
    for _ in range(30):  # bisection on the clock drop
        mid = (lo + hi) / 2
        r = simulate("h100", problem=hopper(64), impl="flash-attn-4", overrides={"energy_mufu_pj_per_op": mid})
        lo, hi = (mid, hi) if r.clock_ghz > 0.98 * h100[64].clock_ghz else (lo, mid)
    mufu_pj = round(lo, 1)

# %%
drop = 1 - simulate("h100", problem=hopper(64), impl="flash-attn-4",
                    overrides={"energy_mufu_pj_per_op": mufu_pj}).clock_ghz / h100[64].clock_ghz
print(f"{mufu_pj} pJ/op: clock drops {drop:.2%}")
kit.check(0.015 <= drop <= 0.025, f"the clock drops {drop:.2%}, not about 2 %")

# %% [markdown]
# About twice the fitted MUFU energy: the MUFU is a small part of hd64's budget, so a clock
# error at hd64 would not be a MUFU energy error.
#
# ### A ceiling below the maximum
#
# Lift the cap and the clock still stops short of 1.98 GHz: while the tensor core works, an
# H100 counts at most ~1.86 GHz in the kernel (`clock64` over `globaltimer`) even where NVML
# reports 1.98 and no reason to hold it (unit loads below the cap). The profile calls it
# `clock_tensor_ghz`, and a `Result` says when it set the clock
# (`clock_ceiling`).

# %%
hw = hardware.load("h100")
free = simulate("h100", problem=hopper(256), impl="flash-attn-4", overrides={"power_cap_w": 2000})
print(f"cap 2000 W: {free.clock_ghz:.3f} GHz (clock_tensor_ghz {hw.clock_tensor_ghz}, "
      f"ceiling: {free.clock_ceiling}), {free.power_w:.0f} W")

# %% [markdown]
# ### Exercise 8.2
# What `power_cap_w` would let hd256 of section 1 reach that ceiling? (Force the clock to it and
# read the power; the cap's controller holds a load at `cap_held_fraction` of the limit.)

# %%
cap_w = None  # <- your answer, watts

# %%
# SOLUTION (try the exercise first).
if cap_w is None:
    cap_w = simulate("h100", problem=hopper(256), impl="flash-attn-4",
                     overrides={"clock_ghz": hw.clock_tensor_ghz}).power_w / hw.cap_held_fraction

# %%
def clock_at_cap(w):
    return simulate("h100", problem=hopper(256), impl="flash-attn-4", overrides={"power_cap_w": w}).clock_ghz


top = hw.clock_tensor_ghz
print(f"cap {cap_w:.0f} W: {clock_at_cap(cap_w + 1):.3f} GHz; cap {cap_w - 20:.0f} W: {clock_at_cap(cap_w - 20):.3f} GHz")
kit.check(clock_at_cap(cap_w + 1) >= top and clock_at_cap(cap_w - 20) < top,
          f"{cap_w} W is not the smallest cap that reaches {top} GHz")

# %% [markdown]
# ## What to remember
#
# - Under sustained attention the power cap, not the maximum clock, sets the clock: ~1.35-1.75 GHz
#   on an H100, lower where the tensor core is busier. Below the cap a working tensor core still
#   holds the SM at ~1.86 GHz (1.81 on an H200), not 1.98.
# - The model gets the order and the level right within a few %, once it counts what bursts and
#   mixed code cost beyond their parts: a tensor core that idles between bursts, and a softmax
#   that mixes MUFU, FMA and ALU instructions, each draw more than single-unit loads suggest.
# - Softmax work beside a GEMM costs clock even when it costs no time; on B200 that makes the
#   non-tensor work FA4 removes (or moves) a power question as well as a time question.
