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
# # Lesson 03: the Hopper forward kernel, predicted and measured (about 30 minutes)
#
# On Hopper (H100/H200, SM90) FlashAttention-3's forward kernel, which FA4's code base keeps for
# SM90, is built from three ideas:
#
# - **Warp specialisation.** A *producer* warpgroup only issues TMA copies of Q, K and V into
#   shared memory (and gives its registers away with `setmaxnreg`); two or three *consumer*
#   warpgroups each own 64 query rows per wgmma and do the math.
# - **Ping-pong** between consumer warpgroups: named barriers make warpgroup 0 issue its GEMMs,
#   then warpgroup 1 issue its GEMMs, so one warpgroup's softmax runs while the other's GEMMs
#   occupy the tensor core.
# - **Intra-warpgroup overlap:** inside one warpgroup, issue `S(j) = Q K(j)^T`, then
#   `O += P(j-1) V(j-1)`, and do the softmax of `S(j)` while `PV(j-1)` still runs. (That is the
#   source order. In the compiled code the wait for `PV(j-1)` comes earlier, right after the row
#   max; the simulator's knob `pv_wait` says where it sits, and lesson 07 measures what it costs.)
#
# Plus a choice of where P lives for `P V`: in registers (RS wgmma, the default at hd128) or
# staged through shared memory (SS). The simulator's `fa3` schedule has each of these as a knob.
# In this lesson you predict what each knob is worth, compare two real kernels built from the
# same ideas, and check the predictions against measurements.

# %%
import os
import subprocess
import sys

import matplotlib.pyplot as plt

import lessonkit as kit
from fa4sim import Problem, hardware, simulate
from fa4sim.schedules import SCHEDULES

LIVE = kit.live()  # True with a CUDA GPU: the measurement cells run fa4kernel live
print("LIVE (GPU present):", LIVE)
FA3_KNOBS = {k.name for k in SCHEDULES["fa3"].KNOBS}
# this lesson's fa4kernel rescales O at every KV block, as FA3 does, and so did the recorded runs
# below; conditional rescaling (its default, tau = 8) is lessons 01 and 07's subject
ALWAYS = {"rescale_threshold": None}

# %% [markdown]
# ## 1. One schedule, two implementations
#
# The `fa3` schedule is the pipeline: which warps issue which ops, in which order, waiting on
# what. An **implementation** is the set of choices a real kernel makes inside that pipeline (its
# tile shapes, whether its CTAs are persistent, in which order it hands out tiles) plus the
# constants measured on it. fa4sim knows two on Hopper, each a data file in
# `fa4sim/implementations/`:
#
# - `fa4kernel`: our own SM90 kernel (`fa4kernel.attention`), the default on Hopper;
# - `flash-attn-4`: flash-attn-4's SM90 forward.
#
# `fa4sim params --impl NAME` lists the knobs as that implementation sets them (a `*` marks its
# own choice) and the constants measured on it. Here are the lines where the two differ at hd128:

# %%
def params(impl, hdim=128, causal=False):
    cmd = [sys.executable, "-m", "fa4sim.cli", "params", "--hw", "h100", "--impl", impl,
           "--hdim", str(hdim)] + (["--causal"] if causal else [])
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()


def values(lines):
    """name -> value of each knob or constant line (`  name  =*value ...`)."""
    out = {}
    for line in lines:
        name, eq, rest = line.partition("=")
        if line.startswith("  ") and eq and rest.split() and " " not in name.strip():
            out[name.strip()] = rest.lstrip("*").split()[0]
    return out


ours, theirs = values(params("fa4kernel")), values(params("flash-attn-4"))
print(f"{'':24s} {'fa4kernel':>14s} {'flash-attn-4':>14s}")
for name in ours:
    if ours[name] != theirs.get(name):
        print(f"{name:24s} {ours[name]:>14s} {theirs.get(name, '-'):>14s}")

# %% [markdown]
# Both run the same loop; they differ at the **tile boundary**: fa4kernel runs one *persistent*
# CTA per SM that walks a table of tiles the host fixed before the launch, and its warpgroups
# whose rows lie past the sequence's end skip their work; flash-attn-4 launches one CTA per tile
# and lets the hardware hand them out. The same problem, simulated as each:

# %%
def both(problem, profile="h100"):
    return {impl: simulate(profile, "fa3", problem, ALWAYS if impl == "fa4kernel" else None, impl=impl)
            for impl in ("fa4kernel", "flash-attn-4")}


for d, seq, causal in ((128, 8192, False), (128, 1024, True)):
    prob = Problem(batch=16384 // seq, heads=2048 // d, seqlen_q=seq, seqlen_k=seq, hdim=d, causal=causal)
    r = both(prob)
    print(f"hd{d} {seq // 1024}k {'causal' if causal else 'non-causal':10s}: "
          + ", ".join(f"{impl} {x.tflops:4.0f} TFLOP/s" for impl, x in r.items()))

# %% [markdown]
# ## 2. The knobs, predicted
#
# The benchmark `lab/tools/bench_fwd_sm90.py` measures fa4kernel with each knob changed on one
# problem: hd128, seqlen 8192, batch 2, 16 heads (16k tokens), non-causal. We simulate exactly
# the same.
#
# There are two kinds of Hopper profile: `h100-datasheet` holds datasheet and literature values (the rated
# 1.83 GHz clock, some latencies that are guesses), `h100` and `h200` replace
# them with our own microbenchmarks (`lab/tools/calibrate/`). Here is what the microbenchmarks
# changed:

# %%
PROFILES = [p for p in ("h100-datasheet", "h100", "h200") if p in hardware.available()]
datasheet = hardware.load("h100-datasheet")
for prof in PROFILES[1:]:
    hw = hardware.load(prof)
    changed = [n for n in hardware.PARAMS if hw.values[n] != datasheet.values[n]]
    print(f"{prof}: " + ", ".join(f"{n} {datasheet.values[n]} -> {hw.values[n]}" for n in changed[:9]) + ", ...")

# %%
PROBLEM = Problem(batch=2, heads=16, seqlen_q=8192, seqlen_k=8192, hdim=128)
VARIANTS = {label: {**ALWAYS, **knobs} for label, knobs in {
    "default": {},
    "pingpong=False": {"pingpong": False},
    "intra_wg_overlap=False": {"intra_wg_overlap": False},
    "p_in_registers=False": {"p_in_registers": False},
    "kv_stages=3": {"kv_stages": 3},
}.items()}
predicted = {prof: {label: simulate(prof, "fa3", PROBLEM, knobs) for label, knobs in VARIANTS.items()}
             for prof in PROFILES}
print(f"{'TFLOP/s':24s}" + "".join(f"{p:>15s}" for p in PROFILES))
for label in VARIANTS:
    print(f"{label:24s}" + "".join(f"{predicted[p][label].tflops:15.0f}" for p in PROFILES))
r = predicted["h100-datasheet"]["default"]
print(f"\nh100 (datasheet), default: loop {r.interval:.0f} cycles per KV block, "
      + ", ".join(f"{u} {v:.0%}" for u, v in sorted(r.utilization.items(), key=lambda kv: -kv[1])[:4]))

# %% [markdown]
# The measured profiles predict less across the board: they add what our microbenchmarks measure
# (section 3 explains it). Keep that in mind: the **datasheet predictions are upper bounds**.
#
# ### Exercise 3.1: which knob hurts most?
#
# Use lesson 02's unit arithmetic (per 128 x 128 tile at hd128 on the H100: MMA 2048 cycles,
# exp2 1024, shared memory 1280). With P staged through shared memory, the `P V` wgmma also reads
# P there (32 KB, 256 more cycles): does shared memory then come near the tensor core's 2048? Does
# one warpgroup's softmax (1024 cycles of exp2) fit beside the other's GEMMs (2 x 512)? If every
# loop stays at the tensor core's bound, look outside the loop: what does a third K/V stage take
# from shared memory, and what needs that space at the end of a tile? Write the label from
# `VARIANTS`; the check compares with the simulator's ranking on the datasheet `h100-datasheet`
# profile.

# %%
worst_variant = None  # <- a label from VARIANTS

# %%
# SOLUTION (try the exercise first).
if worst_variant is None:
    worst_variant = "kv_stages=3"

# %%
ds = predicted["h100-datasheet"]  # the datasheet profile
sim_worst = min(ds, key=lambda k: ds[k].tflops)
kit.check(worst_variant == sim_worst, f"the simulator (h100 profile) ranks {sim_worst!r} lowest")
for label in ("p_in_registers=False", "pingpong=False", "kv_stages=3"):
    r = ds[label]
    print(f"{label:22s}: loop {r.interval:.0f} cycles per block, tensor core {r.utilization['tensor']:.0%}, "
          f"shared memory {r.utilization['smem']:.0%} busy, {r.tflops / ds['default'].tflops - 1:+.1%}")

# %% [markdown]
# On the datasheet profile every variant's loop sits at the tensor core's bound, 2048 cycles per
# KV block. Shared memory stays below it with P staged through it (1536 of 2048 cycles). One
# warpgroup's softmax fits beside the other's GEMMs with or without the ping-pong hand-off: P's
# conversion to bf16 issues among the exp2s (as ptxas compiles it), and the O rescale is the
# warpgroup's last work before its next GEMMs. What costs is outside the loop: with three K/V
# stages the O tile no longer fits a buffer of its own, so it goes out through Q's buffer and each
# tile's next Q load waits for that store. The kernel agrees on the small ones (hd128 8k,
# `bench_fwd_sm90.py --only-knobs`): ping-pong off -0.7 % (H100) and -0.2 % (H200), three stages
# -2.0 % and -2.4 %. The timelines below look alike: at hd128 the hand-off is not what keeps the
# tensor core busy.

# %%
kit.gantt(predicted["h100-datasheet"]["default"], iterations=5, title="fa3 on h100, hd128: ping-pong ON")
kit.gantt(predicted["h100-datasheet"]["pingpong=False"], iterations=5, title="fa3 on h100, hd128: ping-pong OFF")

# %% [markdown]
# At other head dims the knobs matter more. At hd64 (3 consumer warpgroups, the MMA is cheap
# against exp2) ping-pong carries the datasheet model; at hd256 (a large O accumulator, a long PV
# GEMM) intra-warpgroup overlap does. Compare both profiles (fa4kernel's own choices: at hd256 it
# runs without ping-pong already):

# %%
for prof in ("h100-datasheet", "h100"):
    for d in (64, 128, 256):
        prob = Problem(batch=16384 // 8192, heads=2048 // d, seqlen_q=8192, seqlen_k=8192, hdim=d)
        base = simulate(prof, "fa3", prob, ALWAYS).tflops
        line = [f"default {base:4.0f}"]
        for label in ("pingpong=False", "intra_wg_overlap=False"):
            line.append(f"{label} {simulate(prof, 'fa3', prob, VARIANTS[label]).tflops / base - 1:+6.1%}")
        print(f"{prof:14s} hd{d:3d}: " + "   ".join(line))
hd64 = Problem(batch=2, heads=32, seqlen_q=8192, seqlen_k=8192, hdim=64)
kit.gantt(simulate("h100-datasheet", "fa3", hd64, {**ALWAYS, "pingpong": False}), iterations=5,
          title="fa3 on h100 (datasheet), hd64, ping-pong OFF: the three warpgroups' GEMMs collide, then all wait for softmax")

# %% [markdown]
# ## 3. Why the measured profile predicts less
#
# Three measured mechanisms separate the profiles (lab/tools/calibrate/, H100 and H200):
#
# - the **clock**: the datasheet profile runs at the rated 1.83 GHz; the measured profile
#   predicts the clock the 700 W power cap allows under this kernel's load (about 1.52 GHz here;
#   lesson 08), which is what a sustained run holds;
# - **contention**: while a wgmma runs, the warps beside it issue at about half their own rate
#   and the MUFU at 75 % (on Hopper the accumulator lives in the register file the softmax also
#   uses; `issue_under_mma`, `dense_issue_under_mma`, `warp_issue_under_mma`, `mufu_under_mma`);
# - a **warp's own issue rate** on a softmax-like instruction mix is 0.47 instructions per clock
#   (`warp_issue_ipc`): one warp per scheduler cannot hide its own dependencies, and k warps on a
#   scheduler fill only 1 - (1 - 0.47)^k of its slots (0.72 for two), not k times as many.
#
# With contention the softmax no longer hides behind the other warpgroup's GEMMs for free, so
# intra-warpgroup overlap matters again, and so does every instruction added to the softmax
# (lesson 05's exp2 emulation).
#
# ### Exercise 3.2: which mechanism costs the most?
# At hd128, 8k, which of the three costs the most TFLOP/s on `h100`: `"clock"`,
# `"contention"` or `"warp_ipc"`? Predict, then let the check undo each one in turn (setting it
# back to its datasheet value) and compare.

# %%
biggest = None  # <- your answer: "clock", "contention" or "warp_ipc"

# %%
# SOLUTION (try the exercise first).
if biggest is None:
    biggest = "clock"

# %%
UNDO = {"clock": {"clock_ghz": 1.83},
        "contention": {"issue_under_mma": 1, "dense_issue_under_mma": 1, "warp_issue_under_mma": 1,
                       "mufu_under_mma": 1},
        "warp_ipc": {"warp_issue_ipc": 1}}
base = simulate("h100", "fa3", PROBLEM, ALWAYS).tflops
undone = {name: simulate("h100", "fa3", PROBLEM, {**ALWAYS, **undo}) for name, undo in UNDO.items()}
gains = {name: r.tflops / base - 1 for name, r in undone.items()}
print({name: f"{g:+.1%} at {undone[name].clock_ghz:.2f} GHz" for name, g in gains.items()})
kit.check(biggest == max(gains, key=gains.get), "undo each mechanism and see which gains the most")

# %% [markdown]
# The clock costs the most. Undoing contention gains cycles but loses part of them again to the
# clock: with the softmax out of the tensor core's way, the tensor core is busier, draws more
# power, and the cap lowers the clock.
#
# So what a schedule trick is worth in the model depends on how the units behave beside each
# other: measure that before trusting the prediction, which is what the calibration
# microbenchmarks (lab/tools/calibrate/) are for.
#
# ## 4. Measured: our SM90 kernel with the same knobs
#
# With a GPU (`LIVE`), the next cell runs `fa4kernel.attention` for each variant (the first call
# of each variant compiles it, which takes a while). Without one, it reads the newest recorded
# benchmark (`lab/tools/bench_fwd_sm90.py`, kind "points" in `lab/results.json`,
# campaign `lab/campaigns/kernel-sm90-forward/`).

# %%
measured, source, device = {}, None, None
if LIVE:
    import torch

    device = torch.cuda.get_device_name(0)
    source = f"live on {device}"
    if torch.cuda.get_device_capability(0)[0] != 9:
        print(f"{device} is not a Hopper GPU; fa4kernel is an SM90 kernel: no live measurement.")
    else:
        try:
            import fa4kernel
        except Exception as e:  # the kernel package or the CuTe DSL is missing
            fa4kernel = None
            print("cannot import fa4kernel:", repr(e)[:300])
        if fa4kernel is not None:
            p = PROBLEM
            q, k, v = (torch.randn(p.batch, p.seqlen_q, p.heads, p.hdim, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            for label, knobs in VARIANTS.items():
                try:
                    ms = kit.time_cuda(lambda: fa4kernel.attention(q, k, v, **knobs))
                    measured[label] = p.flops / (ms * 1e-3) / 1e12
                except Exception as e:
                    print(f"{label}: the kernel failed: {repr(e)[:300]}")
else:
    runs = kit.recorded(kind="points", campaign="kernel-sm90-forward")
    if runs:
        path, doc = runs[0]
        device, date = kit.describe(doc)
        source = f"recorded in {path.name} ({device}, {date})"
        for label, point in kit.sm90_points(doc).items():
            if label in VARIANTS:
                measured[label] = point["results"]["fa4kernel"]["tflops"]
    else:
        print("No measurement is recorded yet (no bench_fwd_sm90.py run in lab/campaigns/kernel-sm90-forward/), and no GPU here: "
              "the comparison below is skipped. Predictions only.")
if measured:
    print(source, {k: round(v) for k, v in measured.items()})

# %% [markdown]
# ## 5. Predicted vs measured
#
# We predict with the profile of the device that was measured, both the datasheet one and the
# measured one when it exists (`h200` for an H200). Read the ratio column, not only the
# absolute numbers: the absolute gap says how far the profile is from the chip; the
# *differences between variants* say whether the model understands the schedule. A live timing
# here is a median of 10 calls: differences of 2-3 % between variants can be run-to-run noise
# (the recorded benchmark takes more repetitions).

# %%
if measured:
    profs = [p for p in (kit.profile_for(device or "", measured=False), kit.profile_for(device or "")) if p]
    profs = list(dict.fromkeys(profs)) or ["h100-datasheet"]
    print(f"measured: {source}; predicted: fa3 on {' and '.join(profs)}\n")
    print(f"{'variant':24s} {'measured':>9s} {'vs default':>11s}" + "".join(f" {p:>14s} {'meas/pred':>9s}" for p in profs))
    base = measured.get("default")
    for label, knobs in VARIANTS.items():
        m = measured.get(label)
        line = f"{label:24s} " + (f"{m:9.0f} " + (f"{m / base - 1:+11.1%}" if base else f"{'-':>11s}") if m else f"{'(none)':>9s} {'':>11s}")
        for prof in profs:
            pred = simulate(prof, "fa3", PROBLEM, knobs).tflops
            line += f" {pred:14.0f} " + (f"{m / pred:9.2f}" if m else f"{'':>9s}")
        print(line)
else:
    print("No measurement: nothing to compare. (Never fill this table with guesses.)")

# %% [markdown]
# In the recorded benchmark every knob costs the real kernel 1-3 %. The measured profile
# predicts each within about a percent (ping-pong off: nothing, against -0.9 % measured); the
# datasheet profile has ping-pong off at -6 % and the overlap and P via shared memory at almost
# nothing. Both profiles' absolute predictions lie above the measurement, the datasheet one by
# about a quarter.
#
# ### Exercise 3.3: where the two implementations part
#
# The recorded benchmark also times flash-attn-4 on a grid of problems (hd 64/128/256, seqlen
# 1k/4k/16k, causal and not), point by point beside fa4kernel. The two kernels share their loop and
# differ at the tile boundary (section 1). At which sequence length should fa4kernel lead
# flash-attn-4 the most: 1024, 4096 or 16384 tokens? Answer, then let the check ask the
# simulator (fa4kernel's predicted lead, each implementation simulated as itself, at hd128) and
# read the measured leads below.

# %%
longest_lead_at = None  # <- 1024, 4096 or 16384

# %%
# SOLUTION (try the exercise first).
if longest_lead_at is None:
    longest_lead_at = 1024  # the shorter the sequence, the more tiles per SM and the more the boundary costs

# %%
lead = {}
for seq in (1024, 4096, 16384):
    r = both(Problem(batch=16384 // seq, heads=16, seqlen_q=seq, seqlen_k=seq, hdim=128, causal=True))
    lead[seq] = r["fa4kernel"].tflops / r["flash-attn-4"].tflops
print("model, hd128 causal, fa4kernel / flash-attn-4:", {s: round(x, 2) for s, x in lead.items()})
kit.check(longest_lead_at == max(lead, key=lead.get), f"the model says {max(lead, key=lead.get)}")

runs = kit.recorded(kind="points", campaign="kernel-sm90-forward")
if runs:
    path, doc = runs[0]
    rec_device, rec_date = kit.describe(doc)
    prof = kit.profile_for(rec_device) or "h100"
    print(f"\n{path.name} ({rec_device}, {rec_date}); predicted on {prof}")
    print(f"{'problem':22s} {'fa4kernel / flash-attn-4: measured':>36s} {'predicted':>10s}")
    for p in doc.get("points", []):
        res = p.get("results", {})
        if p.get("label") != "main" or "flash-attn-4" not in res or "fa4kernel" not in res:
            continue
        prob = Problem(p["batch"], p["heads"], p["seqlen"], p["seqlen"], p["hdim"], bool(p["causal"]))
        r = both(prob, prof)
        print(f"hd{p['hdim']:<3d} {p['seqlen']:5d} {'causal' if p['causal'] else '':10s} "
              f"{res['fa4kernel']['tflops'] / res['flash-attn-4']['tflops']:36.2f} "
              f"{r['fa4kernel'].tflops / r['flash-attn-4'].tflops:10.2f}")
else:
    print("No recorded benchmark (lab/campaigns/kernel-sm90-forward/): predictions only.")

# %% [markdown]
# At 1k tokens a tile has only 8 KV blocks, and what a tile costs beyond them is a large share of
# it. flash-attn-4 launches one CTA per tile and pays a CTA's start-up for every tile; fa4kernel's
# persistent CTAs pay it once per SM, and its idle warpgroups skip their work (at hd64 causal it
# also picks a 128-row tile). That pays most at hd64 and hd128 causal, and the model sees it,
# though it overestimates the lead at 1k non-causal. At 16k
# the two are within a few percent, and at hd128 non-causal flash-attn-4 measures *faster*,
# which the model does not predict: its loop issues faster beside its GEMMs than ours
# ([loop bookkeeping](../lab/findings/loop-bookkeeping.md)). Lesson 07 takes the tile boundary
# apart.
#
# The same recorded grid, predicted against measured for both kernels:

# %%
pairs = []
if runs:
    for p in doc.get("points", []):
        res = p.get("results", {})
        if p.get("label") != "main":
            continue
        prob = Problem(p["batch"], p["heads"], p["seqlen"], p["seqlen"], p["hdim"], bool(p["causal"]))
        for impl in ("fa4kernel", "flash-attn-4"):
            if "tflops" in res.get(impl, {}):
                knobs = ALWAYS if impl == "fa4kernel" else None
                pairs.append((impl, bool(p["causal"]), simulate(prof, "fa3", prob, knobs, impl=impl).tflops,
                              res[impl]["tflops"]))
if pairs:
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    for impl, colour in (("fa4kernel", "C0"), ("flash-attn-4", "C1")):
        for causal, marker in ((False, "o"), (True, "x")):
            pts = [(a, b) for i, c, a, b in pairs if i == impl and c == causal]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, color=colour,
                           label=f"{impl}, {'causal' if causal else 'non-causal'}")
    top = max(max(a, b) for _, _, a, b in pairs) * 1.05
    ax.plot([0, top], [0, top], "k--", linewidth=0.8, label="measured = predicted")
    ax.set(xlabel=f"predicted TFLOP/s (fa3 schedule on {prof})", ylabel="measured TFLOP/s",
           title=f"{rec_device}, {rec_date[:10]}: hd 64/128/256, 1k-16k tokens", xlim=(0, top), ylim=(0, top))
    ax.legend(fontsize=8)
    ratios = sorted(b / a for _, _, a, b in pairs)
    print(f"{path.name}: {len(pairs)} points; measured/predicted from {ratios[0]:.2f} to {ratios[-1]:.2f}")
    print(f"the same from the command line: fa4sim validate {os.path.relpath(path, kit.repo_root())} --plot validate.png")
else:
    print("No recorded grid measurement (lab/campaigns/kernel-sm90-forward/) to compare against.")

# %% [markdown]
# ### Exercise 3.4: what clock would explain the gap?
#
# The model's time scales with `clock_ghz` (the compute part of it does). If the kernel ran at a
# sustained clock `f` instead of the rated 1.83 GHz, the datasheet profile's predicted TFLOP/s
# would scale by `f / 1.83`. Write a function that, given a predicted and a measured TFLOP/s,
# returns the clock that would make them agree. The check runs the simulator at that clock.

# %%
def implied_clock(pred_tflops, meas_tflops, rated_ghz=1.83):
    return None  # <- your formula


# %%
# SOLUTION (try the exercise first).
if implied_clock(1.0, 1.0) is None:
    def implied_clock(pred_tflops, meas_tflops, rated_ghz=1.83):
        return rated_ghz * meas_tflops / pred_tflops

# %%
pred = predicted["h100-datasheet"]["default"].tflops
example_meas = measured.get("default", 0.8 * pred)  # a real measurement if there is one
f = implied_clock(pred, example_meas)
at_f = simulate("h100-datasheet", "fa3", PROBLEM, {**ALWAYS, "clock_ghz": f}).tflops
what = f"measured ({source})" if "default" in measured else "a hypothetical 80 % of the prediction (no measurement)"
print(f"{what}: {example_meas:.0f} TFLOP/s -> implied clock {f:.2f} GHz -> simulated {at_f:.0f} TFLOP/s")
kit.check(abs(at_f / example_meas - 1) < 0.02, "scale the rated clock by measured / predicted")
for prof in PROFILES[1:]:
    hw = hardware.load(prof)
    print(f"clock measured by the microbenchmarks ({prof}): {hw.clock_ghz} GHz  [{hw.sources['clock_ghz'][:70]}...]")

# %% [markdown]
# If the implied clock is below the clock measured inside the attention kernel, the gap is not the
# clock: the kernel has stalls the datasheet model does not know about (section 3 named them).
# The in-kernel clock itself moves with the power cap from run to run, so the benchmark records
# it at every point with a clock-probe build of our kernel, and `fa4sim validate` predicts each
# point at its own measured clock ([the clock, and how we measure](../lab/findings/clock-and-measurement.md)).
#
# ## What to remember
#
# - Warp specialisation, ping-pong and intra-warpgroup overlap all serve one purpose: keep the
#   tensor core busy while softmax runs.
# - On H100 at hd128 exp2 is only half the MMA time, yet the softmax does not hide for free: the
#   softmax warps slow down beside a running wgmma (measured), so overlap tricks and the
#   instruction count of the softmax show up in the time.
# - A schedule is the pipeline; an implementation is a kernel's choices in it
#   (`simulate(..., impl="flash-attn-4")`, `fa4sim params --impl`). Two kernels with one loop
#   part at the tile boundary, where short sequences spend their time.
# - Datasheet predictions are upper bounds; the measured profiles are our best model. Compare
#   *differences* between variants with the measurements, and state the device and the build of
#   every measurement.
#
# Next: lesson 04, the same questions on Blackwell, where exp2 costs as much as the MMA. The
# research questions behind this lesson's numbers (what a tile costs beyond its blocks, where the
# PV wait and the rescale's branch go, the launch's first wave and tile jitter) are lesson 07.
