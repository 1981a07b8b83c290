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
# # Lesson 07: the Hopper forward kernel, advanced (research exercises, about an hour)
#
# Lesson 03 predicts and measures the Hopper forward kernel knob by knob. This lesson goes where
# the model comes from: each section is one question about the kernel, answered with a
# recorded measurement from `lab/campaigns/` and set against fa4sim. Each links the page of
# `lab/findings/` that holds the whole answer, its evidence and what is still open.
#
# 1. **Inside the KV loop:** a burst of multiplies beside a GEMM, where the wait for the previous
#    PV GEMM goes, where the conditional rescale's branch goes, two warpgroups each beside its own
#    GEMM.
# 2. **Tile turnover:** what a tile costs beyond its KV blocks: idle warpgroups, the Q release
#    and the O store, what ping-pong costs a short tile.
# 3. **The launch:** the first wave from a cold L2, and the jitter a table fixed before the
#    launch pays.
# 4. **How it is measured:** the clock, exact cycles, and what stamps disturb.
#
# Everything runs on a CPU from recorded measurements; a cell with nothing recorded says so.
# Do lesson 03 first.

# %%
import statistics

import lessonkit as kit
from fa4sim import Problem, hardware, simulate

LIVE = kit.live()  # unused: this lesson reads recorded measurements only
one_sm = hardware.load("h100").with_values(num_sms=1)  # one persistent CTA, exact cycles


def per_tile(blocks, **knobs):
    """Cycles one more tile of `blocks` KV blocks (hd128) costs one persistent CTA in the model:
    the difference of a walk over 9 tiles and one over 1, divided by 8."""
    c = {n: simulate(one_sm, "fa3", Problem(1, 1, 128 * n, 128 * blocks, 128, False), {"persistent": True, **knobs}).cycles
         for n in (1, 9)}
    return (c[9] - c[1]) / 8


# %% [markdown]
# ## 1. Inside the KV loop
#
# ### Exercise 7.1: a burst of multiplies beside a GEMM
#
# At hd256 each warp rescales its O accumulator, 128 FMULs per thread, while the other
# warpgroup's wgmma runs on the tensor core. On Hopper both use the register file. Does a burst
# of 128 independent FMULs from another warpgroup slow a running wgmma by more than 5 %?
# `lab/tools/calibrate/bench_bursts.py` measured exactly that (one CTA, H100 and H200). Answer
# True or False. ([issue rate beside the MMA](../lab/findings/issue-rate-beside-mma.md))

# %%
slows_it = None  # <- your answer: True or False

# %%
# SOLUTION (try the exercise first).
if slows_it is None:
    slows_it = False  # 128-long bursts cost the tensor core almost nothing; 512-long ones do

# %%
# the in-place FMUL bursts (lab/tools/calibrate/bench_bursts.py, kind "bursts"): the run of four codes
# (FMUL, FFMA, integer, the softmax mix), then the run that adds FMNMX and F2FP, one kernel per code
def codes(doc):
    """The codes a bench_bursts.py run timed (each has its '<code>_alone_F<n>' entry)."""
    return {k.split("_alone_")[0] for k in doc["benchmarks"]["bursts"] if "_alone_" in k}


PER_CODE = {"fmul", "ffma", "fmnmx", "f2fp", "mix", "int"}
bursts = (kit.recorded(kind="bursts", where=lambda d: codes(d) == {"fmul", "ffma", "int", "mix"})
          + kit.recorded(kind="bursts", where=lambda d: PER_CODE <= codes(d)))
for path, doc in bursts:
    b = doc["benchmarks"]["bursts"]
    for key in ("fmul_F2_b1_gap0", "fmul_F2_b4_gap1000"):
        r = b[key]
        print(f"{doc['meta']['device']}: {r['blocks'] * 128:4d}-FMUL bursts, 2 warps per scheduler: "
              f"wgmma x{r['wgmma_slowdown']:.3f}, the bursts issue at {r['stream_rate_per_smsp']:.3f} per clock "
              f"per scheduler (alone: {b['fmul_alone_F2']['stream_rate_per_smsp']:.3f})")
    kit.check(slows_it == (b["fmul_F2_b1_gap0"]["wgmma_slowdown"] > 1.05), "read the 128-FMUL row above")
if not bursts:
    print("No recorded bench_bursts results (lab/campaigns/issue-rate/): nothing to compare against.")

# What the model takes from it: the rescale's issue rate beside a GEMM (dense_issue_under_mma);
# with the softmax mix's rate instead (issue_under_mma), the hd256 loop gets longer.
hd256 = Problem(batch=2, heads=8, seqlen_q=8192, seqlen_k=8192, hdim=256)
mix_rate = hardware.load("h100").issue_under_mma
for label, over in (("measured burst rate", {}), ("the mix's rate", {"dense_issue_under_mma": mix_rate})):
    r = simulate("h100", "fa3", hd256, over)
    print(f"O rescale at {label}: hd256 loop {r.interval:.0f} cycles per KV block "
          f"(tile {r.knobs['tile_m']} x {r.knobs['tile_n']}, O rescaled {'before' if r.knobs['rescale_before_pv'] else 'after'} the PV GEMM)")

# %% [markdown]
# The run with one kernel per code adds the row max's FMNMX and P's F2FP pack (the ALU pipe, half
# the FP32 rate). Is "about half its own rate" a shared cap on issue (then FMNMX, alone below the
# cap, would barely slow) or a slowdown of everything?

# %%
for path, doc in kit.recorded(kind="bursts", where=lambda d: PER_CODE <= codes(d)):
    b = doc["benchmarks"]["bursts"]
    print(doc["meta"]["device"])
    for code in ("fmul", "ffma", "fmnmx", "f2fp", "mix", "int"):
        alone, beside = b[f"{code}_alone_F2"]["stream_rate_per_smsp"], b[f"{code}_F2_b1_gap0"]["stream_rate_per_smsp"]
        print(f"  {code:6s} alone {alone:.3f}, beside a wgmma {beside:.3f} per clock per scheduler: x{beside / alone:.2f}")

# %% [markdown]
# Beside a running wgmma every kind of code issues at about half its own rate, bursts of
# multiplies as much as the softmax, the ALU-bound FMNMX too: a slowdown, not a cap. Short bursts
# leave the tensor core alone; long ones starve the warp that feeds it. Measured, one CTA of
# fa4kernel runs its hd256 loop in 2086 cycles per block (H100); the model says about 2170, about
# 4 % long (its rescale issues among the S GEMM's first HGMMAs, at the inline rate, so the burst
# rate in the cell above does not enter). The real kernel issues its loop beside its GEMMs faster
# than any code we could benchmark does.
#
# ### Exercise 7.2: where the wait for the previous PV GEMM goes
#
# With intra-warpgroup overlap, the source lets block j's whole softmax run while `PV(j-1)` is on
# the tensor core. In the compiled SASS, ptxas hoists the wait for `PV(j-1)` to just after the
# row max: most of the exp2s come after it. A build with a never-taken branch keeps the exp2s
# ahead of the wait, as the source has them (their SASS shows it). One CTA, exact cycles per KV
# block, H100. Is the loop faster or slower with the exp2s forced before the PV wait? Answer
# `"faster"` or `"slower"`. ([where the PV wait goes](../lab/findings/pv-wait-placement.md))

# %%
forced_exp2s = None  # <- "faster" or "slower"

# %%
# SOLUTION (try the exercise first).
if forced_exp2s is None:
    forced_exp2s = "slower"  # a warpgroup's exp2s beside its own in-flight wgmma cost more

# %%
def variants(doc, hdim=128, causal=False):
    """The build variants a ctas_sm90.py file (kind "loop_intervals") timed at that head dim."""
    return {p["variant"] for p in doc["points"] if p["hdim"] == hdim and bool(p["causal"]) == causal}


# the builds pinned with the exp2s before the PV wait (lab/campaigns/kernel-sm90-forward/)
pins = kit.recorded(kind="loop_intervals", where=lambda d: "default+exp_before_pv_wait" in variants(d))
PROBE = Problem(1, 1, 128, 16384, 128, False)  # one CTA, one Q tile, 128 KV blocks
if pins:
    path, doc = pins[0]
    cyc = {p["variant"]: p["cycles_per_kv_block"] for p in doc["points"]}
    print(f"measured ({kit.describe(doc)[0]}, {path.name}), cycles per KV block:")
    print(f"{'build':22s} {'as compiled':>12s} {'exp2s before the wait':>22s}   model: after_max  after_softmax  compiled")
    for build, knobs in (("default", {}), ("p_in_registers=False", {"p_in_registers": False}),
                         ("pingpong=False", {"pingpong": False})):
        model = [simulate(one_sm, "fa3", PROBE, {"persistent": True, "pv_wait": w, **knobs}).interval
                 for w in ("after_max", "after_softmax", "compiled")]
        print(f"{build:22s} {cyc[build]:12.0f} {cyc[build + '+exp_before_pv_wait']:22.0f}   "
              + "".join(f"{m:15.0f}" for m in model))
    got = "slower" if cyc["default+exp_before_pv_wait"] > cyc["default"] else "faster"
    kit.check(forced_exp2s == got, f"measured, the forced order is {got}")
else:
    print("No recorded pinned builds (lab/campaigns/kernel-sm90-forward/): nothing to compare against.")

# %% [markdown]
# Slower, by about 200 cycles per block with ping-pong, less without it: running a warpgroup's
# exp2s beside its own in-flight wgmma costs something the model does not have. The model's
# knob `pv_wait` places the wait: `after_max` (the default, the order the model is validated
# with), `after_softmax` (the source order) or `compiled` (each build's measured position, from
# its SASS). The model charges the two orders alike, so the compiled order stays the default for
# a reason it cannot give: a microbenchmark of a warpgroup's exp2s beside its own RS wgmma
# would isolate it.
#
# ### Exercise 7.3: where conditional rescaling's branch goes
#
# FA4's conditional rescaling (lesson 01) multiplies O only when some row's max moved by more
# than tau, so on most KV blocks a warp votes, branches and skips its 64 FMULs. The model charges
# instructions, not branches: it predicts a small gain for tau = 8 with the rescale after the PV
# wait. The recorded ablations (`lab/tools/ctas_sm90.py --only-ablations`, one CTA, hd128,
# exact cycles per KV block) time each build with its rescale code compiled out, with the rescale
# after the PV wait. How many more cycles per KV block does tau's test-and-branch cost than the
# 64 FMULs it skips? ([emulation cost and the rescale branch](../lab/findings/emulation-cost.md))

# %%
branch_minus_fmuls = None  # <- cycles per KV block

# %%
rows = {}
ABLATED = {"default", "default ablate=rescale", "rescale_threshold=8", "rescale_threshold=8 ablate=rescale"}
for path, doc in kit.recorded(kind="loop_intervals", where=lambda d: ABLATED <= variants(d))[:1]:
    rows = {p["variant"]: p["cycles_per_kv_block"] for p in doc["points"]}
    print(f"recorded in {path.name} ({kit.describe(doc)[0]}), cycles per KV block:")
    for v in ("default", "default ablate=rescale", "rescale_threshold=8", "rescale_threshold=8 ablate=rescale"):
        print(f"  {v:36s} {rows[v]:6.0f}")
if not rows:
    print("No ablations recorded here: Exercise 7.3 is skipped.")

# %%
# SOLUTION (try the exercise first).
if branch_minus_fmuls is None and rows:
    branch = rows["rescale_threshold=8"] - rows["rescale_threshold=8 ablate=rescale"]  # test, vote, branch
    fmuls = rows["default"] - rows["default ablate=rescale"]                           # the 64 FMULs
    branch_minus_fmuls = branch - fmuls

# %%
if rows:
    want = ((rows["rescale_threshold=8"] - rows["rescale_threshold=8 ablate=rescale"])
            - (rows["default"] - rows["default ablate=rescale"]))
    kit.check(abs(branch_minus_fmuls - want) < 2, f"the branch costs {want:+.0f} cycles per block against the FMULs")

# %% [markdown]
# About the same: skipping the multiply saves nothing, because the branch costs as much. What
# helps is not the branch but where it sits: the same conditional rescale placed before the PV
# GEMM (knob `rescale_before_pv`, between issuing S(j) and PV(j-1), where the loop already waits)
# costs nothing, and fa4kernel places it there whenever tau is set (tau 8 is its default, except
# hd256 without a mask). The model's tau gain in both places over always rescaling ("default" in
# these recordings, which predate that default), against the measurements:

# %%
base = simulate(one_sm, "fa3", PROBE, {"persistent": True, "rescale_threshold": None}).interval  # always rescale
for before in (False, True):
    t = simulate(one_sm, "fa3", PROBE, {"persistent": True, "rescale_threshold": 8.0, "rescale_before_pv": before}).interval
    print(f"model: tau 8 with the rescale {'before the PV GEMM' if before else 'after the PV wait '}: "
          f"{base / t - 1:+.1%} throughput per KV block")
for path, doc in kit.recorded(kind="loop_intervals",
                              where=lambda d: "rescale_threshold=8+rescale_before_pv=True" in variants(d))[:1]:
    after = {p["variant"]: p["cycles_per_kv_block"] for p in doc["points"]}
    if rows and "rescale_threshold=8+rescale_before_pv=True" in after:
        print(f"measured ({kit.describe(doc)[0]}): after the PV wait {rows['default'] / rows['rescale_threshold=8'] - 1:+.1%}, "
              f"before the PV GEMM {rows['default'] / after['rescale_threshold=8+rescale_before_pv=True'] - 1:+.1%}")

# %% [markdown]
# Before the PV GEMM the model gives tau 8 too little (about +2 % against +7 %): with P's
# conversion in the exp2 phase, as compiled, its loop with the rescale skipped stays long
# ([where the PV wait goes](../lab/findings/pv-wait-placement.md)). After the PV wait it
# predicts a gain the kernel does not have (about +3 %): the model has no cost for a branch, only
# for instructions, and what the branch does to ptxas's schedule of the softmax is not in its
# units. The measurement picks the faster kernel; the model alone would pick the other
# order.
#
# ### Exercise 7.4: two warpgroups, each beside its own GEMM
#
# The unit benchmark behind the model's rates beside a GEMM has a second kernel, "intra": each
# warpgroup issues 8 wgmma (512 tensor cycles), runs `nb` blocks of a softmax-like mix (180
# instructions per warp each), then waits for its wgmma: FA3's intra-warpgroup overlap with
# nothing of attention in it. With two such warpgroups the tensor core has 1024 cycles of work per
# trip and the mixes share the schedulers. At nb = 3, how many of the GEMMs' 1024 cycles does a
# trip hide behind the mixes (the mix alone plus 1024, minus the trip with both)? Replay it with
# the model's own rules (`fa4sim.validate.contention`, A from registers), then compare with the
# measurement. ([issue rate beside the MMA](../lab/findings/issue-rate-beside-mma.md), "The hd64
# loop")

# %%
from fa4sim.validate import contention  # noqa: E402

MIX = {"FMNMX": 35, "FFMA": 32, "MUFU.EX2": 32, "FADD": 32, "FMUL": 33, "F2FP": 16}  # one block, per thread


def intra_trip(warpgroups, blocks, with_mma):
    """The model's cycles per trip of the intra kernel (A from registers), H100 profile."""
    s = contention.schedule(hardware.load("h100"), warpgroups, blocks, with_mma, MIX if blocks else {}, 8, 64.0, rs=True)
    return contention.cycles_per_trip(s)


hidden_in_model = None  # <- cycles of the GEMMs hidden per trip, in the model (use intra_trip)

# %%
# SOLUTION (try the exercise first).
if hidden_in_model is None:
    hidden_in_model = intra_trip(2, 3, False) + intra_trip(2, 0, True) - intra_trip(2, 3, True)

# %%
kit.check(abs(hidden_in_model - (intra_trip(2, 3, False) + intra_trip(2, 0, True) - intra_trip(2, 3, True))) < 1,
          "replay the mix alone, the GEMMs alone and both, with two warpgroups")
print(f"model: two warpgroups hide {hidden_in_model:.0f} of the GEMMs' 1024 cycles per trip at nb = 3")
# bench_contention.py's full run on an H100 (its roles kernels and the intra kernel)
for path, doc in kit.recorded(kind="contention", gpu="h100", where=lambda d: "roles_rs" in d["benchmarks"]["contention"]):
    m = doc["benchmarks"]["contention"]["intra_rs"]
    for wg, gemm in (("WG1", 512), ("WG2", 1024)):
        hid = m[wg]["mma0_nb3"]["cycles_per_trip"] + m[wg]["mma1_nb0"]["cycles_per_trip"] - m[wg]["mma1_nb3"]["cycles_per_trip"]
        print(f"measured ({kit.describe(doc)[0]}), {wg[-1]} warpgroup(s): the trip hides {hid:.0f} of the GEMMs' "
              f"{gemm} cycles")
# the intra kernel's run on an H100 with each trip stamped
traced = kit.recorded(kind="contention", gpu="h100",
                      where=lambda d: d["benchmarks"]["contention"]["intra_rs"]["WG2"]["mma1_nb3"]["trace"])
for path, doc in traced:
    tr = doc["benchmarks"]["contention"]["intra_rs"]["WG2"]["mma1_nb3"]["trace"]
    trip = tr[5]  # one trip, warp 0 of each warpgroup: [start, HGMMAs issued, mix done, wait returned]
    for w, name in ((0, "warpgroup 0"), (4, "warpgroup 1")):
        s0, issued, mixed, done = trip[w]
        print(f"  traced trip, {name}: starts at {s0}, its 8 HGMMAs take {issued - s0} cycles to issue, "
              f"its mix {mixed - issued}, its wait {done - mixed}")
if not traced:
    print("No traced intra run recorded (lab/campaigns/issue-rate/): the per-trip view is skipped.")

# %% [markdown]
# The model hides about half of the 1024 cycles; the two warpgroups on the H100 hide about a
# sixth, less than one warpgroup hides of its own 512. Part of that is the mix itself: two warps
# of it per scheduler keep the MUFU working only 92 % of the time (its dependences leave gaps),
# which the model charges (`mix_mufu_utilization`, measured on the mix alone). The rest the trace
# shows: the warpgroup that issues second waits in its HGMMAs for room in the tensor core's queue
# (7 deep) behind the other's GEMM, then runs its mix, so for part of every trip one mix runs
# alone on each scheduler, at about three quarters of what two warps get through together. The
# model keeps no order of warps within a scheduler and settles the two warpgroups half a GEMM
# apart, side by side. fa4kernel's hd64 loop lives in this regime (512 tensor cycles per
# warpgroup and block beside about 2.3 mix blocks of instructions, 2-3 warpgroups). There the
# model needs one more rule: while the tensor core idles, k warps of softmax on a scheduler fill
# only 1 - (1 - p)^k of its slots, p one warp's rate alone (lesson 03). With it the model's loop
# is within about 2 % of the kernel's with three warpgroups; with two it is still 6-8 % short.
#
# ## 2. Tile turnover
#
# A persistent CTA walks many tiles, and each costs more than its KV blocks: the next tile's Q
# must load, O must be stored, a short last tile has idle warpgroups. At 1k tokens, with 8 KV
# blocks per tile, that is a large share of the time
# ([tile turnover](../lab/findings/tile-turnover.md)).
#
# ### Exercise 7.5: a tile with idle warpgroups
#
# At hd64 a tile holds 192 query rows (3 consumer warpgroups of 64 rows). With 1024 tokens the
# 6th tile of every head has only 64 rows: fa4kernel lets the two warpgroups without rows skip
# their GEMMs and softmax. What does that tile cost, as a fraction of a full tile? A third (the
# work is a third)? Or more? Write down a number, then let the model answer (fa3 with
# `skip_idle_wgs`, one SM walking 16 such tiles of 32 KV blocks) and compare with the measurement
# (lab/tools/idle_wg_sm90.py, if recorded).

# %%
my_guess = None  # <- a fraction of a full tile, e.g. 0.5

# %%
# SOLUTION (try the exercise first).
if my_guess is None:
    my_guess = 0.6  # a lone warpgroup's own chain (S, softmax, PV) sets the pace

# %%
def walk(rows):
    return simulate(one_sm, "fa3", Problem(batch=1, heads=16, seqlen_q=rows, seqlen_k=4096, hdim=64),
                    {"tile_m": 192, "tile_n": 128, "skip_idle_wgs": True, "persistent": True}).cycles


model_share = walk(64) / walk(192)
print(f"model: a tile with 1 of 3 warpgroups live costs {model_share:.2f} of a full tile")
for path, doc in kit.recorded(kind="idle_wgs")[:1]:
    case = next(c for c in doc["cases"] if c["head_dim"] == 64 and c["tile_m"] == 192)
    print(f"measured ({path.name}, {doc['meta']['device']}): {case['ratio_to_full']['1']:.2f}")
kit.check(abs(my_guess - model_share) < 0.1,
          f"the model says {model_share:.2f}: more than a third, the idle warpgroups' partner is missing")

# %% [markdown]
# Not a third: a lone warpgroup has no ping-pong partner whose GEMMs could hide its softmax, so
# its own chain (S, softmax, PV) sets the pace. That is why fa4kernel's host tile schedule costs
# such tiles at the measured 0.6 (fa4kernel/tile_schedule.py), and why hd64 at 1k tokens gains
# 6 % from idling them, not the 10-13 % their share of the work would suggest.
#
# ### Exercise 7.6: the tile boundary
#
# At 1k tokens a persistent CTA runs about 16 tiles of 8 KV blocks each, and every tile boundary
# costs: the next tile's Q must be loaded, and the warp that stores O (warpgroup 0's first) can
# wait right after issuing the store (about 1400 cycles in the kernel's own stamps). fa4kernel
# has two knobs for this: `early_q_release` (hand Q back right after the tile's last QK GEMM, not
# after its whole last block) and `defer_o_store_wait` (wait for the store only before the next
# tile's O goes to shared memory). Which one saves more cycles per tile, alone? Answer `"q"` or
# `"store"`, then let the model answer (one SM walking such tiles, hd128) and compare with the
# measurements below.

# %%
my_answer = None  # <- "q" or "store"

# %%
# SOLUTION (try the exercise first).
if my_answer is None:
    my_answer = "store"  # warpgroup 0 sits out ~1400 cycles; the Q load hides partly behind the epilogue

# %%
base = per_tile(8, early_q_release=False, defer_o_store_wait=False)
saved = {"q": base - per_tile(8, early_q_release=True, defer_o_store_wait=False),
         "store": base - per_tile(8, early_q_release=False, defer_o_store_wait=True)}
both = base - per_tile(8, early_q_release=True, defer_o_store_wait=True)
print(f"model, cycles per tile of 8 blocks: {base:.0f}; saved by early_q_release {saved['q']:.0f}, "
      f"by defer_o_store_wait {saved['store']:.0f}, by both {both:.0f}")
kit.check(my_answer == max(saved, key=saved.get), f"the model says {max(saved, key=saved.get)!r}")

# %% [markdown]
# Now the recorded H100 A/B tests (each pair of builds timed side by side;
# [tile turnover](../lab/findings/tile-turnover.md)): deferring the store's wait **alone changes nothing**; releasing Q early gains +1.7 % at hd128
# 1k causal (+3.1 % at hd64); and *then* deferring the store's wait gains another +1.9 %. The
# model ranks them the other way round and says the early release adds nothing once the wait is
# deferred. Explain the difference: in the kernel, which of the two waits on the other? (A hint:
# in the traces, timeline_hd128_1k_late_q.json.gz, the next tile's first S GEMM issues about
# 1900 cycles after the Q load is issued.) The model's ranking is wrong here, and the lesson keeps
# it as a wrong prediction.
#
# ### Exercise 7.7: what ping-pong costs a short tile
#
# One persistent CTA walking tiles of only 2 KV blocks (hd128) is where the tile boundary shows
# most. Measured exactly (clock-probe build, `lab/tools/ctas_sm90.py --only-tiles --tile-knobs`),
# ping-pong makes such a tile about 320 cycles *longer*. First the model against that measurement:

# %%
on, off = per_tile(2, pingpong=True), per_tile(2, pingpong=False)
print(f"model: 2-block tile {on:5.0f} cycles with ping-pong, {off:5.0f} without ({on - off:+4.0f})")
# the newest tile-cost run with knob variants (lab/tools/ctas_sm90.py --only-tiles)
for path, doc in kit.recorded(kind="tile_costs", where=lambda d: any(t.get("knobs") for t in d["tile_costs"]))[:1]:
    meas = {tuple(sorted((t.get("knobs") or {}).items())): t["cycles_per_tile"] for t in doc["tile_costs"]
            if t["hdim"] == 128 and t["kv_blocks"] == 2}
    m_on, m_off = meas.get(()), meas.get((("pingpong", False),))
    if m_on and m_off:
        print(f"measured ({kit.describe(doc)[0]}, {path.name}): {m_on:5.0f} with ping-pong, {m_off:5.0f} without "
              f"({m_on - m_off:+4.0f})")

# %% [markdown]
# The model's 2-block tiles come out a few percent short, and it gives ping-pong about half of
# its per-tile cost. The kernel's own
# stamps of that walk (`timeline_sm90.py --max-ctas 1`, a trace build) show why. Warpgroup 0's
# first warp issues the tile's O store (about 230 cycles), so the two warpgroups do not reach the
# next tile together. Which warpgroup issues the first S GEMM of a tile in the kernel? Answer
# `"wg0"` or `"wg1"`, then read the stamps.
#
# A trace build is not the plain kernel: its clock64 stamps cost issue slots. Six stamps per
# warpgroup and KV block slow the hd128 loop by 20 % (2953 against 2462 cycles per block), a
# full trace build by about 45 %. Read a trace for the order of events and for tile boundaries,
# never for cycles inside the loop ([the clock, and how we measure](../lab/findings/clock-and-measurement.md)).

# %%
first_at_tile_start = None  # <- "wg0" or "wg1"

# %%
# SOLUTION (try the exercise first).
if first_at_tile_start is None:
    first_at_tile_start = "wg1"  # warpgroup 0 is still issuing the previous tile's O store

# %%
# the stamped walk: one CTA over every tile of hd128, 256 tokens (2 KV blocks per tile), default knobs
walks = kit.recorded(kind="timeline", where=lambda d: (d["meta"]["problem"]["hdim"], d["meta"]["problem"]["seqlen_k"])
                     == (128, 256) and not d["meta"]["knobs_given"])
if walks:
    path, walk_doc = walks[0]
    firsts = []
    for t in sorted({e["tile"] for e in walk_doc["events"]}):
        qk0 = sorted((e for e in walk_doc["events"] if e["tile"] == t and e["op"].startswith("QK") and e["iter"] == 0),
                     key=lambda e: e["start"])
        firsts.append(qk0[0]["role"])
        print(f"tile {t}: " + ", ".join(f"{e['role']} issues S at {e['start'] - qk0[0]['start']:+d}" for e in qk0))
    kit.check(first_at_tile_start == max(set(firsts), key=firsts.count),
              f"in {path.name}, {max(set(firsts), key=firsts.count)} goes first")
else:
    print("No stamped walk is recorded here: nothing to read.")

# %% [markdown]
# Then the tensor core runs warpgroup 1's whole first S GEMM before warpgroup 0's, and warpgroup
# 1 finishes its first softmax first. But ping-pong makes warpgroup 0 issue first in the next
# block, so warpgroup 1 waits. The model starts a tile's first S GEMMs without the hand-off and
# has no O-store issue on warpgroup 0. Put there (a what-if tried on the model), the store's
# issue reproduces ping-pong's per-tile cost (+276 cycles against +321) but not the tiles'
# lengths: another cost of about 300 cycles per tile is missing, so the model does not
# carry it. A mechanism can be right while the model around it still balances on a missing piece.
#
# ## 3. The launch
#
# ### Exercise 7.8: the first wave
#
# At 1k tokens, hd256, causal, the kernel launches 1024 CTAs (one per Q tile) onto 132 SMs. When
# the launch starts nothing is in L2: every SM first loads its Q tile and its first K/V block,
# all at once, from HBM. The H200's HBM is about 40 % faster than the H100's; the SMs are the
# same. Does the first CTA on every SM lose **more**, **fewer** or the **same** cycles on the
# H200? Answer `"more"`, `"fewer"` or `"same"`, then let the model answer (its cold start: the
# first wave's bytes at the HBM bandwidth) and compare with the CTA log, which records every
# CTA's SM, start and end (lab/tools/cta_log_sm90.py).
# ([the launch and tile order](../lab/findings/launch-and-tile-order.md))

# %%
my_answer = None  # <- "more", "fewer" or "same"

# %%
# SOLUTION (try the exercise first).
if my_answer is None:
    my_answer = "fewer"  # the same bytes through a faster memory; the clock is about the same

# %%
first_wave = Problem(16, 8, 1024, 1024, 256, True)
cold = {}
for prof in ("h100", "h200"):
    r = simulate(prof, "fa3", first_wave, {"persistent": False})
    cold[prof] = r.kernel.cold_start_us * hardware.load(prof).clock_ghz * 1e3  # in cycles
    print(f"{prof}: cold start {r.kernel.cold_start_us:.2f} us = {cold[prof]:.0f} cycles")
model_says = "fewer" if cold["h200"] < cold["h100"] else "more"
kit.check(my_answer == model_says, f"the model says {model_says!r}")


def first_wave_extra(point):
    """Median cycles the first CTA on each SM takes beyond the median of later CTAs of its length."""
    rows = point["ctas"]  # [cta, sm, start_ns, end_ns, cycles, m_block, n_kv, tiles_in_cta]
    first = {}
    for r in sorted(rows, key=lambda r: r[2]):
        first.setdefault(r[1], r[0])
    later = {}
    for r in rows:
        if first[r[1]] != r[0]:
            later.setdefault(r[6], []).append(r[4])
    return statistics.median(r[4] - statistics.median(later[r[6]]) for r in rows
                             if first[r[1]] == r[0] and r[6] in later)


logs = kit.recorded(kind="cta_log")
for path, doc in logs:
    for p in doc["points"]:
        if (p["head_dim"], p["seqlen"], p["causal"], p["persistent"]) == (256, 1024, True, False):
            print(f"measured, {doc['meta']['device']} ({path.name}): the first CTA on an SM takes "
                  f"{first_wave_extra(p):.0f} cycles longer than the same tile later")
if not logs:
    print("No recorded CTA log (lab/campaigns/launch-jitter/): nothing to compare against.")

# %% [markdown]
# The model gets the direction and the size (about 10 200 cycles on the H100 and 7 300 on the
# H200, against 10 800-11 800 and 6 200-6 700 in the CTA logs) from bytes and a measured
# bandwidth alone. Ten thousand cycles per SM (about 6 us) are about 4 % of
# this 150 us launch, and nothing at 16k tokens: one more reason short sequences are hard.
#
# ### Exercise 7.9: a table fixed before the launch
#
# A persistent fa4kernel launch runs one CTA per SM, and the host decides before the launch which
# CTA runs which tiles (fa4kernel/tile_schedule.py), balancing by its own estimate. The CTA log
# of a persistent launch has a tile log: every CTA stamps the start of each of its tiles
# (lab/tools/cta_log_sm90.py). Give every tile the mean cycles of its kind (same KV blocks, same
# rows) and add them up along the table: that is each CTA's load if no tile varied. Does the
# slowest CTA really end at the slowest such load, or later, and by how many percent? hd256, 1k
# tokens, causal, 7-8 tiles per CTA. ([tile jitter](../lab/findings/tile-jitter.md))

# %%
later_by_percent = None  # <- your guess: 0 if the slowest CTA ends at the slowest load

# %%
from fa4sim.validate.launches import replay_persistent

measured_later = {}
for path, doc in kit.recorded(kind="cta_log", where=lambda d: any("tile_logs" in p for p in d["points"])):
    for p in doc["points"]:
        if "tile_logs" in p and (p["head_dim"], p["seqlen"], p["causal"]) == (256, 1024, True):
            load, end = replay_persistent(p)  # cycles: slowest replayed load, measured slowest CTA
            device = doc["meta"]["device"]
            measured_later[device] = 100 * (end / load - 1)
            print(f"measured, {device} ({kit.describe(doc)[1][:10]}): slowest load {load:.0f} cycles, "
                  f"slowest CTA {end:.0f} ({measured_later[device]:+.1f} %)")
if not measured_later:
    print("No recorded tile log (lab/campaigns/launch-jitter/): nothing to compare against.")

# %%
# SOLUTION (try the exercise first).
if later_by_percent is None:
    later_by_percent = 1.0  # every tile varies a little (about one Q load's time), independently

# %%
if measured_later:
    got = max(measured_later.values())
    kit.check(abs(later_by_percent - got) < 1.0, f"measured {got:+.1f} %: later, not at the slowest load")

# %% [markdown]
# Later, by about 1 %. No tile of a kind takes exactly its mean: the spread is a few hundred to a
# thousand cycles per tile (about the time the tile's Q takes to load, whatever the tile's
# length), nearly independent from tile to tile. Along a row of 8 tiles it adds up like a random
# walk, and the launch waits for the slowest of 132 such walks. A causal launch of one CTA per
# tile does not pay this: the hardware hands the next tile to whichever SM frees up first
# (replayed the same way, it ends within 0.9 % of the measurement; `fa4sim validate` on these
# files prints every launch). fa4sim models it from the measured spread (profile parameter
# `tile_jitter_q_loads`, from lab/tools/calibrate/tile_jitter.py): the expected slowest CTA,
# E[max] over CTAs of load + jitter, only for tables fixed before the launch.

# %%
for prof in ("h100", "h200"):
    r = simulate(prof, "fa3", first_wave, {"persistent": True})
    print(f"model, {prof}: the slowest CTA ends {r.kernel.jitter_cycles:.0f} cycles after the slowest load "
          f"({100 * r.kernel.jitter_cycles / (r.kernel.cycles - r.kernel.jitter_cycles):+.1f} %)")

# %% [markdown]
# ## 4. How it is measured
#
# Every number above comes from one of three kinds of measurement
# ([the clock, and how we measure](../lab/findings/clock-and-measurement.md),
# [unit calibration](../lab/findings/unit-calibration.md)):
#
# - **TFLOP/s of whole launches** (`lab/tools/bench_fwd_sm90.py`), each point with the clock
#   read inside the kernel by a clock-probe build (a few clock64 and globaltimer reads at one
#   CTA's start and end): the power cap moves the clock from point to point, and `fa4sim
#   validate` predicts each point at its own clock.
# - **Exact cycles of one CTA** (`lab/tools/ctas_sm90.py`): cycles per KV block as the
#   difference of two K lengths, so prologue and epilogue cancel; no clock needed.
# - **Stamps** (trace builds, the tile log, the CTA log): the order of events and the tile
#   boundaries, at a cost to the loop they stamp.
#
# The clock each point of the newest recorded benchmark of each device ran at:

# %%
devices = set()
for path, doc in kit.recorded(kind="points", campaign="kernel-sm90-forward"):
    if kit.describe(doc)[0] in devices:
        continue  # the newest benchmark of each device only
    devices.add(kit.describe(doc)[0])
    clocks = sorted(c for c in kit.find_keys(doc, "clock_ghz_in_kernel").values())
    if clocks:
        print(f"{path.name} ({kit.describe(doc)[0]}): {len(clocks)} points, in-kernel clock "
              f"{clocks[0]:.2f}-{clocks[-1]:.2f} GHz (median {statistics.median(clocks):.2f})")

# %% [markdown]
# ## What to remember
#
# - Beside a running wgmma every other instruction issues at about half its rate; short bursts
#   leave the tensor core alone. Where a wait or a branch sits in the compiled loop moves it by
#   percents, and the model prices instructions, not their order.
# - Beyond its blocks a tile pays for its Q load, its O store and its warpgroups' hand-offs; at
#   1k tokens that is where fa4kernel gains on flash-attn-4, and where the model still misses
#   a few hundred cycles per tile.
# - A launch pays a cold first wave and, with a table fixed before it, the jitter of its tiles.
# - A measurement disturbs what it measures: stamps slow the loop they stamp. State the build,
#   the device and the build with every number, and where it is recorded.
