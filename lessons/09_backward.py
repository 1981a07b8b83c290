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
# # Lesson 09: the backward pass (about 30 minutes)
#
# Training needs dQ, dK and dV. FlashAttention never stores P: the backward recomputes it from
# S and the row statistics (LSE) the forward saved. A CTA owns one **KV tile** (its keys) and
# walks the Q blocks that see it. Per Q block it runs five GEMMs:
#
# | GEMM | what | accumulates |
# |---|---|---|
# | S^T = K Q^T | the scores again, then P = exp2(S scale - LSE) | |
# | dP^T = V dO^T | then dS = P (dP - dPsum), dPsum = rowsum(dO * O) | |
# | dV += P^T dO | | over the tile's Q blocks, in the CTA |
# | dK += dS^T Q | | over the tile's Q blocks, in the CTA |
# | dQ = dS K | this KV tile's share of dQ | **across CTAs**: added into an fp32 buffer in global memory |
#
# Five GEMMs against the forward's two: TFLOP/s count 2.5 forward passes. dK and dV stay in the
# CTA until its tile ends; dQ of a Q block gets a share from every KV tile, so every CTA adds
# into it. Two short launches surround the main kernel: a preprocess (dPsum, LSE in log2 units,
# the fp32 dQ buffer zeroed) and a postprocess (dQ fp32 to bf16).
#
# fa4sim simulates flash-attn-4's backward with `simulate(..., pass_="bwd")` (the command line:
# `fa4sim run --pass bwd`), on B200 (FA4's SM100 backward) and on Hopper (the FA3-style SM90
# backward); `docs/model.md`, "The backward pass", describes both.

# %%
import contextlib
import io
import statistics

import lessonkit as kit
from fa4sim import Problem, feeds, hardware, power, simulate
from fa4sim.schedules import fa3_sm90_bwd

LIVE = kit.live()
B200 = Problem(batch=4, heads=16, seqlen_q=8192, seqlen_k=8192, hdim=128)  # flash-attn-4's published shape
b200 = hardware.load("b200")


def show(label, r, bound=None):
    """One backward result: TFLOP/s, clock, the loop's cycles per Q block (vs a roofline bound),
    the busiest units and what the tensor core waits for."""
    top = sorted(((u, v) for u, v in r.utilization.items() if ":" not in u), key=lambda uv: -uv[1])[:3]
    waits = ", ".join(f"{op} {w:.0%}" for op, w in sorted(r.tensor_waits.items(), key=lambda kv: -kv[1]))
    print(f"{label:24s} {r.tflops:5.0f} TFLOP/s at {r.clock_ghz:.2f} GHz | loop {r.interval:5.0f} cycles per Q block"
          + (f" (roofline {bound:.0f})" if bound else "")
          + f" | {', '.join(f'{u} {v:.0%}' for u, v in top)} | tensor waits for: {waits or '-'}")


# %% [markdown]
# ## 1. Feeds and speeds per tile (B200)
#
# Lesson 02's forward tile on B200 (128 x 128, hd128): tensor core 1024 cycles, exp2 1024,
# shared memory 768. The backward tile (one KV tile of 128 keys x one Q block of 128 rows) does
# five MMAs instead of two and the same exp2 (the backward emulates none).
#
# **Predict first.** Which unit sets the bound for one CTA: the tensor core, the MUFU or shared
# memory? flash-attn-4 runs hd128 as a **CTA pair** (a cluster of two SMs whose MMAs span both):
# how much faster than one CTA do you expect the pair to be?

# %%
guess = {"wall_one_cta": None,  # <- "tensor", "mufu" or "smem"
         "pair_gain": None}     # <- a fraction, e.g. 0.2 for 20 % faster

# %%
ROOF = {}
for two_cta in (False, True):
    label = "CTA pair" if two_cta else "one CTA"
    g = feeds.bwd_gemms(b200, two_cta=two_cta)
    c = feeds.bwd_tile_costs(b200, two_cta=two_cta)
    parts = feeds.bwd_smem_parts(b200, two_cta=two_cta)
    ROOF[two_cta] = max(c["mma"], c["smem"], c["exp_mufu"])
    print(f"{label}: tensor {c['mma']:.0f}, exp2 {c['exp_mufu']:.0f}, shared memory {c['smem']:.0f} cycles per SM")
    print("   tensor by MMA:       ", {k: round(v.tensor_cycles) for k, v in g.items()})
    print("   operand fetch by MMA:", {k: round(v.smem_cycles) for k, v in g.items()})
    print("   shared memory parts: ", {k: round(v) for k, v in parts.items()})

# %% [markdown]
# These are the FA4 paper's roofline numbers (MMA 2560, shared memory 3328, exp2 1024 at
# M = N = d = 128). Each MMA costs the tensor core 512 cycles. Shared memory pays for more than
# the operands:
#
# - **Operand fetch.** S and dP read both operands from shared memory (512 each); dV and dK take
#   P and dS from TMEM and read only dO and Q (256 each); dQ reads dS and K (512).
# - **dS** is stored once (bf16) as dQ's operand; **dQ** is written to fp32 staging and read back
#   by the TMA bulk reduce-add that adds it into global memory (512 + 512).
#
# On one CTA shared memory (3328) is the wall, 30 % above the tensor core. A CTA pair runs S, dP,
# dV and dK as 256-row MMAs over both SMs' keys: each SM stages half of the B operand, and each
# holds half of dQ's columns. It pays a dS exchange (each SM's dQ needs the peer's dS), and its
# shared memory falls to the MMA time (the paper puts it about 5 % above). exp2 is far from the
# bound: the backward's wall is not the forward's.
#
# ## 2. Simulate it
#
# flash-attn-4's choice at hd128 is the CTA pair, not deterministic. Four runs: the pair, one
# CTA, and each in deterministic mode (below).

# %%
RUNS = {"CTA pair": {}, "one CTA": {"two_cta": False},
        "CTA pair, deterministic": {"deterministic": True},
        "one CTA, deterministic": {"two_cta": False, "deterministic": True}}
bwd = {label: simulate("b200", problem=B200, overrides=o, pass_="bwd") for label, o in RUNS.items()}
for label, r in bwd.items():
    show(label, r, ROOF[r.knobs["two_cta"]])
r = bwd["CTA pair"]
print(f"\nlaunches (CTA pair): preprocess {r.pre_us:.0f} us, main kernel {r.main_us:.0f} us, "
      f"postprocess {r.post_us:.0f} us")
gain = bwd["CTA pair"].tflops / bwd["one CTA"].tflops - 1
print(f"your guesses: {guess}; the simulator: one CTA's shared memory {ROOF[False]:.0f} cycles is the largest "
      f"of the three, the pair is {gain:+.0%} faster")

# %% [markdown]
# - **Neither reaches its roofline.** The loop per Q block is about a fifth (one CTA) and a
#   third (pair) longer than the bound, and no unit is saturated: the tensor core waits, mostly
#   for `RDQ`, the dQ reduce warps reading dQ out of TMEM. dQ shares TMEM with another
#   accumulator (over dP on one CTA, over the tail of S on a pair), so the next MMA into those
#   columns waits until dQ is out.
# - **The pair** gains about 13 %, less than half of what the roofline promises (3328 to 2560
#   cycles, 30 %): it removes the shared-memory wall, and what is left is latency.
# - **The three launches**: the pre- and postprocess are memory-bound and short beside the
#   main kernel.
#
# The four runs use the shape of flash-attn-4's published B200 timings; `docs/accuracy.md`
# compares them (within about 5 %). No B200 of ours has run this backward.
#
# The timeline of one CTA of the pair: the tensor row runs `S(j)`, `dK(j-1)`, `dP(j)`,
# `dQ(j-1)`, `dV(j)`: the previous Q block's dK and dQ fill the gaps while the compute warps work
# on this block's P and dS. The compute role loads S from TMEM (`LDS`), runs `EXP` on the MUFU,
# then `DS`; the reduce role reads dQ out of TMEM (`RDQ`) and stores it in stages (`STQ`), each
# followed by a bulk reduce-add on the TMA row (brown); `XCHG` is the dS exchange with the peer,
# `relay` the warp that tells the MMA warp the peer's half has arrived.

# %%
kit.gantt(bwd["CTA pair"], iterations=4,
          title=f"FA4 backward on B200, CTA pair, hd128: {bwd['CTA pair'].tflops:.0f} TFLOP/s (one CTA, first 4 Q blocks)")

# %% [markdown]
# **Deterministic mode.** Floating-point addition is not associative, so dQ's adds from
# different KV tiles, landing in whatever order the CTAs run, make results differ from run to
# run in the last bits. flash-attn-4's deterministic mode gives every Q block a semaphore in global memory: a CTA
# spins until the semaphore holds its turn (its KV tile's index), adds its dQ, waits until the
# adds have landed, and increments it. Each of these is an L2 round trip on the dQ path, so
# `RDQ` grows as the largest wait. In the table it costs the pair about a tenth of its TFLOP/s
# and one CTA about a fifth. Look at the clock, too: the deterministic runs draw less power, so
# the cap lets them run faster (lesson 08), which gives back part of the loss. The FA4 paper
# reports that the deterministic mode reaches up to 75 % of the fast path's speed.
#
# ## 3. Hopper: the same backward without TMEM
#
# flash-attn-4's SM90 backward (the FA3 design; fa4sim's `fa3_sm90_bwd` schedule): a producer
# warpgroup (warp 0 loads; warp 1 issues dQ's bulk reduce-adds) and two MMA warpgroups, which
# issue their own wgmmas and do the exp2 and dS work between them. The recorded H100 point
# hd128 at 16k tokens:

# %%
H100 = Problem(batch=1, heads=16, seqlen_q=16384, seqlen_k=16384, hdim=128)
h = simulate("h100", problem=H100, impl="flash-attn-4", pass_="bwd")
m, n = h.knobs["tile_m"], h.knobs["tile_n"]
print(f"tile: Q block {m} rows x KV tile {n} keys; {h.tflops:.0f} TFLOP/s at {h.clock_ghz:.2f} GHz")
g = fa3_sm90_bwd.gemms(h.hw, H100, h.knobs)  # per warpgroup: (tensor, shared memory, latency, k-steps)
print("per warpgroup, tensor cycles:      ", {k: round(v[0]) for k, v in g.items()})
print("per warpgroup, operand fetch cycles:", {k: round(v[1]) for k, v in g.items()})
tensor_sm = 2 * sum(v[0] for v in g.values())
smem_sm = 2 * sum(v[1] for v in g.values())
print(f"both warpgroups: tensor {tensor_sm:.0f}, operand fetch {smem_sm:.0f}; the loop {h.interval:.0f} cycles per Q block")
scale = 128 / m  # per 128 x 128 (keys x queries), to compare with the B200 tile
print(f"per 128 x 128: H100 loop {h.interval * scale:.0f} cycles (tensor {tensor_sm * scale:.0f}, operand fetch "
      f"{smem_sm * scale:.0f}); B200 pair {bwd['CTA pair'].interval:.0f} (tensor 2560, operand fetch 1536)")
show("H100 flash-attn-4", h)

# %% [markdown]
# The H100's tensor core needs twice the B200's cycles for the same MMA, and the kernel is
# shared-memory-bound: the operand fetch alone is about as long as the MMAs. What changes
# without TMEM:
#
# - **Accumulators live in registers.** dK and dV (128 keys x 128 columns, fp32, each) stay in
#   the MMA warpgroups' registers for the whole KV tile, beside S and dP of the current Q block.
#   Registers are scarce, and the Q block is smaller: 80 rows at hd128 (64 when causal) instead
#   of 128.
# - **wgmma is 64 rows per instruction, issued per warpgroup.** A warpgroup computing 128 rows
#   issues two wgmmas, each reading its whole B operand from shared memory, and with the keys
#   on M both warpgroups read all of K (or V) as A. A B200 MMA of 128 (or, on a pair, 256) rows
#   reads each operand once. Hence operand traffic about equal to the tensor time here, about
#   0.6 of it on the B200 pair.
# - **P and dS in registers** serve as the A operand of dV and dK (RS wgmma): Hopper's counterpart
#   of TMEM's TS MMA. dS still goes to shared memory for dQ.
# - **dQ** accumulates in the MMA warpgroups' registers; they store it to fp32 shared memory and
#   producer warp 1 adds it into global memory with one TMA bulk reduce-add. On the B200 the MMA
#   writes dQ to TMEM and four dedicated warps move it out.
# - **No CTA pair**: nothing halves the operand traffic.
#
# ## 4. Measured: our SM90 backward, flash-attn-4 and cuDNN
#
# `fa4kernel.attention` on tensors that require grad returns an output whose `backward()` runs
# our SM90 backward (`fa4kernel/README.md`, "Backward"). It has section 3's structure (a CTA per
# 128-key tile, a producer warpgroup and two MMA warpgroups, the same five wgmmas) with 64-row Q
# blocks. Four knobs (`attention(..., bwd_knobs={...})`) set how it spends the stretch between Q
# blocks and how it preprocesses; with all four at the left column's value (the baseline build)
# it runs at about half of flash-attn-4's speed. The defaults are the right column:
#
# | knob | the baseline | the default |
# |---|---|---|
# | `dq_reduce` | `"red"`: after the Q block's GEMMs, every consumer thread adds its part of dQ into global memory with `RED` atomics | `"bulk"`: dQ goes to an fp32 shared-memory buffer; one thread of producer warp 1 adds it with one bulk reduce-add per warpgroup |
# | `stats` | `"thread"`: every consumer thread loads LSE and D from global memory at the top of each Q block | `"tma"`: producer warp 0 bulk-copies them with Q and dO; the consumers read shared memory |
# | `mma_order` | `"dv_dk_dq"`: dV, dK and dQ issued after the dS barrier, one wait for all three, then dQ leaves while the tensor core idles | `"dv_dq_dk"`: dV before the barrier (it runs under it), then dQ, then dK; dQ's store to shared memory runs while dK does (flash-attn-4's order) |
# | `preprocess` | `"torch"`: D = rowsum(dO * O) and LSE in log2 units by torch ops (fp32 copies of dO and O) | `"kernel"`: one small kernel that reads dO and O once |
#
# **Predict first.** The first three shorten the stretch between the last GEMM of one Q block and
# the first of the next, where the tensor core waits; the fourth runs before the main kernel.
# Which step buys the most on 16k-token sequences (batch 1), and which on 1k-token ones (batch
# 16: the same tokens, a sixteenth of the FLOPs)?

# %%
guess_step = {"16k": None,  # <- "dq_reduce", "stats", "mma_order" or "preprocess"
              "1k": None}

# %% [markdown]
# With a Hopper GPU the next cell times the default and the baseline at hd128, 4 x 4096
# tokens, and flash-attn-4's backward where it is installed; otherwise it says why it skips.

# %%
FIRST = {"dq_reduce": "red", "stats": "thread", "mma_order": "dv_dk_dq", "preprocess": "torch"}
live = {}
if not LIVE:
    print("No CUDA GPU here (or FA4LAB_LIVE=0): skipping the live measurement; the recorded ones follow.")
else:
    import torch

    device = torch.cuda.get_device_name(0)
    if torch.cuda.get_device_capability(0)[0] != 9:
        print(f"{device} is not a Hopper GPU; our backward is an SM90 kernel: skipping the live measurement.")
    else:
        impls = {}
        try:
            import fa4kernel

            impls["fa4kernel (defaults)"] = lambda q, k, v: fa4kernel.attention(q, k, v)
            impls["fa4kernel, baseline"] = lambda q, k, v: fa4kernel.attention(q, k, v, bwd_knobs=FIRST)
        except Exception as e:  # the kernel package or the CuTe DSL is missing
            print("cannot import fa4kernel, skipping it:", repr(e)[:300])
        try:
            from flash_attn.cute.interface import flash_attn_func

            def fa4_fwd(q, k, v):
                out = flash_attn_func(q, k, v)
                return out[0] if isinstance(out, tuple) else out  # (out, lse) in some versions

            impls["flash-attn-4"] = fa4_fwd
        except Exception as e:
            print("flash-attn-4 is not installed here:", repr(e)[:200])
        p = Problem(batch=4, heads=16, seqlen_q=4096, seqlen_k=4096, hdim=128)
        q, k, v = (torch.randn(p.batch, p.seqlen_q, p.heads, p.hdim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        dout = torch.randn_like(q)
        for label, fwd in impls.items():
            try:
                out = fwd(q, k, v)
                ms = kit.time_cuda(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
                live[label] = 2.5 * p.flops / (ms * 1e-3) / 1e12
            except Exception as e:
                print(f"{label}: failed: {repr(e)[:300]}")
        print(f"live on {device}, hd128 4x4096, backward only (a median of 10 calls):",
              {k: f"{v:.0f} TFLOP/s" for k, v in live.items()})

# %% [markdown]
# The recorded measurements: `lab/tools/bench_bwd_sm90.py` times the backward alone (after one
# forward outside the timed region) of every implementation round-robin in one run, each one's
# gradients checked against an fp32 reference first. Compare within a run: the power cap moves
# absolute numbers between runs.
#
# **The ladder.** The recorded H100 ladder times each step beside the others (its `fa4kernel`
# column, without knobs, is the baseline build). The cell prints the baseline's TFLOP/s, then
# what each step adds on top of the one before. The ladder times the preprocess kernel only on top
# of a third order, `dv_early` (dV issued as soon as P is in registers), so its column is that pair.

# %%
STEPS = {  # step: (before, after), columns timed side by side
    "dq_reduce": ("fa4kernel", "fa4kernel[dq_reduce=bulk]"),
    "stats": ("fa4kernel[dq_reduce=bulk]", "fa4kernel[dq_reduce=bulk,stats=tma]"),
    "mma_order": ("fa4kernel[dq_reduce=bulk,stats=tma]", "fa4kernel[dq_reduce=bulk,stats=tma,mma_order=dv_dq_dk]"),
    "preprocess": ("fa4kernel[dq_reduce=bulk,stats=tma,mma_order=dv_early]",
                   "fa4kernel[dq_reduce=bulk,stats=tma,mma_order=dv_early,preprocess=kernel]")}
ladder = next((pd for pd in kit.recorded(kind="sm90_bwd")
               if all(c in pd[1]["points"][0]["results"] for pair in STEPS.values() for c in pair)), None)
if ladder is None:
    print("No recorded run with every step (lab/campaigns/kernel-sm90-backward/): the ladder is skipped.")
else:
    path, doc = ladder
    print(f"{path.name} ({', '.join(kit.describe(doc))}): baseline in TFLOP/s, then each step's gain")
    print(f"{'point':19s}{'base':>7s}" + "".join(f"{s:>12s}" for s in STEPS) + f"{'FA4':>7s}{'cuDNN':>7s}")
    gains = {s: {"1k": [], "16k": []} for s in STEPS}
    for p in doc["points"]:
        t = {c: r.get("tflops") for c, r in p["results"].items()}
        size = "1k" if p["seqlen"] <= 1024 else "16k"
        for s, (a, b) in STEPS.items():
            gains[s][size].append(t[b] / t[a])
        print(f"hd{p['hdim']:<3d} {p['seqlen']:5d} {'causal' if p['causal'] else '':7s}{t['fa4kernel']:7.0f}"
              + "".join(f"{t[b] / t[a] - 1:+12.0%}" for a, b in STEPS.values())
              + f"{t['flash-attn-4']:7.0f}{t['sdpa-cudnn']:7.0f}")
    best = {}
    for size in ("16k", "1k"):
        g = {s: statistics.geometric_mean(v[size]) for s, v in gains.items()}
        best[size] = max(g, key=g.get)
        print(f"{'geomean ' + size:26s}" + "".join(f"{g[s] - 1:+12.0%}" for s in STEPS))
    print(f"baseline / flash-attn-4 (geomean over the ladder): {doc['summary']['geomean_fa4kernel_over_flash-attn-4']:.2f}")
    print(f"the largest step: {best}; your guess: {guess_step}")

# %% [markdown]
# - **Long sequences**: the bulk reduce-add is the largest step; the baseline's thousands of
#   atomics per CTA and Q block sit between one block's GEMMs and the next. LSE and D by TMA and
#   the dV-dQ-dK order each add about another eighth: both take work off that stretch.
# - **Short sequences**: the three steps inside the main kernel give little, and the preprocess
#   kernel gives about half again. The preprocess reads dO and O, work that grows with the tokens,
#   while the main kernel's work grows with tokens times sequence length: at 1k it weighs sixteen
#   times more beside the main kernel than at 16k.
#
# **Where it stands.** The whole grid (head dims 64, 128, 256; 1k, 4k, 16k; causal or not), with
# the defaults, flash-attn-4 and cuDNN. The cell prints one summary line for every recorded grid
# run, older builds of ours among them (the baseline; builds without hd256), then the newest run
# per GPU in full. Where a run times hd256's default, the CTA pair, as a variant row beside the
# build without it, "ours" takes the pair's row. These grid runs time each point alone after 1 s
# back to back, which leaves the clock not quite settled; the settled runs below time ours and
# flash-attn-4 only.

# %%
GRID, short = {}, {}  # GPU -> the newest grid run: ours, ours deterministic, FA4, cuDNN (and the pair)
PAIR = "fa4kernel[dq_smem=qdo,dq_sum=pair]"  # hd256's default: the CTA pair
BEFORE = "fa4kernel[tile_m=64,postprocess=torch,dq_zero=torch]"  # the build without the launch fixes (below)
for path, doc in sorted(kit.recorded(kind="sm90_bwd"), key=lambda pd: kit.describe(pd[1])[0]):
    cols = doc["points"][0]["results"]
    if any(c.startswith("fa4kernel[") and c not in ("fa4kernel[deterministic]", PAIR, BEFORE) for c in cols):
        continue  # a run of knob variants
    s = doc["summary"]
    print(f"{path.name:40s} {kit.describe(doc)[0]:22s} kernel {doc['meta'].get('kernel', '?')[:7]}: ours / FA4 "
          f"{s['geomean_fa4kernel_over_flash-attn-4']:.2f}, ours / cuDNN {s['geomean_fa4kernel_over_sdpa-cudnn']:.2f}")
    dev = kit.describe(doc)[0]
    if dev not in GRID or kit.describe(doc)[1] > kit.describe(GRID[dev][1])[1]:
        GRID[dev], short[dev] = (path, doc), (kit.profile_for(dev) or dev).upper()
if not GRID:
    print("No recorded backward grid (lab/campaigns/kernel-sm90-backward/): the comparison is skipped.")
else:
    print("\nTFLOP/s, the newest run per GPU:")
    print(f"{'point':19s}" + "".join(f"| {short[d]:5s} ours  FA4 cuDNN ours/FA4  det " for d in GRID))
    rows = {}
    for dev, (path, doc) in GRID.items():
        for p in doc["points"]:
            if p.get("heads_kv", p["heads"]) != p["heads"]:
                continue  # a grouped-heads problem beside the grid
            t = {c: r.get("tflops") for c, r in p["results"].items()}
            if t.get(PAIR):
                t["fa4kernel"] = t[PAIR]  # the default at hd256
            if t.get("fa4kernel"):
                rows.setdefault((p["hdim"], p["seqlen"], p["causal"]), {})[dev] = t
    for (hd, sl, causal), by_dev in rows.items():
        print(f"hd{hd:<3d} {sl:5d} {'causal' if causal else '':7s}" + "".join(
            f"| {'':5s}{t['fa4kernel']:5.0f}{t['flash-attn-4']:5.0f}{t['sdpa-cudnn']:6.0f}"
            f"{t['fa4kernel'] / t['flash-attn-4']:9.2f}"
            + (f"{t['fa4kernel[deterministic]']:5.0f} " if t.get("fa4kernel[deterministic]") else f"{'-':>5s} ")
            for t in (by_dev.get(d) for d in GRID) if t))
    for dev, (path, doc) in GRID.items():
        mine = [t[dev] for t in rows.values() if dev in t]
        fa4 = [t["fa4kernel"] / t["flash-attn-4"] for t in mine]
        cudnn = [t["fa4kernel"] / t["sdpa-cudnn"] for t in mine]
        det = [t["fa4kernel[deterministic]"] / t["fa4kernel"] for t in mine if t.get("fa4kernel[deterministic]")]
        print(f"{short[dev]}: ours / FA4 geomean {statistics.geometric_mean(fa4):.2f}, lowest {min(fa4):.2f}; "
              f"ours / cuDNN geomean {statistics.geometric_mean(cudnn):.2f}, lowest {min(cudnn):.2f}; "
              f"deterministic keeps {min(det):.0%} to {max(det):.0%}")

# %% [markdown]
# At hd64 and hd128 ours is ahead of cuDNN at every point (by 8 to 25 %) and within about a
# twelfth of flash-attn-4 (the last column: how it got there is below). hd256 is where the backward is hardest on
# Hopper: each CTA holds only 64 keys (dK and dV of 64 x 256 fill the registers), so every Q block
# sends 64 KiB of dQ partial sums to the L2, whose reduce-add rate is a quarter of its load rate,
# and a 64 KiB fp32 staging buffer leaves room for one Q / dO stage only. Two changes of ours
# answer it: dQ is staged in the bytes of the Q / dO stage it was computed from (they are dead by
# then), which gives two stages, and the two CTAs of a cluster sum their partials through
# distributed shared memory before one of them adds the sum: half the reduce-add bytes, the idea
# of FA4's 2-CTA backward on Blackwell (dQ reduced once per CTA pair). With both, ours leads
# flash-attn-4 at hd256 and meets cuDNN without a mask; with a causal mask cuDNN keeps a lead.
#
# **The remaining gap.** First, is the model right about flash-attn-4? `fa4sim validate` replays
# a recorded backward (`fa4sim/validate/backward.py`): every flash-attn-4 point through
# `simulate(..., pass_="bwd")`, at the model's own clock. Then, in the model, how much of
# flash-attn-4's time the two launches around its main kernel take, and what a 64-row Q block
# would cost its schedule.

# %%
def settled(doc):
    """A settled run (each candidate 2.5 s back to back, then timed in windows, as
    lab/tools/sustained_sm90.py times): its timings carry their windows."""
    return "windows" in doc["points"][0]["results"]["fa4kernel"]


SETTLED = {kit.describe(doc)[0]: (path, doc) for path, doc in kit.recorded(kind="sm90_bwd", where=settled)}
for dev, (path, doc) in GRID.items():
    from fa4sim.validate import backward

    path, doc = SETTLED.get(dev, (path, doc))  # the settled run where there is one: the clock the model predicts
    with contextlib.redirect_stderr(io.StringIO()):  # its progress lines
        fa4_rows = [row for row in backward.compare(doc, kernels=("flash-attn-4",))["points"]
                    if row["kernel"] == "flash-attn-4"]
    print(f"{short[dev]}: the model of flash-attn-4's backward, |error| median / max: " + ", ".join(
        f"hd{hd} {statistics.median(e):.0%} / {max(e):.0%}"
        for hd in (64, 128, 256) if (e := [abs(r["error"]) for r in fa4_rows if r["hdim"] == hd])))
for hd, heads in ((64, 32), (128, 16)):
    for batch, sl in ((16, 1024), (1, 16384)):
        P = Problem(batch=batch, heads=heads, seqlen_q=sl, seqlen_k=sl, hdim=hd)
        own = simulate("h100", problem=P, impl="flash-attn-4", pass_="bwd")
        rows64 = simulate("h100", problem=P, impl="flash-attn-4", overrides={"tile_m": 64}, pass_="bwd")
        launches = (own.pre_us + own.post_us) / (own.pre_us + own.main_us + own.post_us)
        print(f"hd{hd} {sl:5d}: flash-attn-4 simulated {own.tflops:3.0f} TFLOP/s, pre- and postprocess "
              f"{launches:4.0%} of its time; with 64-row Q blocks (its own {own.knobs['tile_m']}) "
              f"{rows64.tflops / own.tflops - 1:+.0%}")

# %% [markdown]
# Against the settled runs (each kernel back to back until the power cap has settled its clock)
# the model is within about a twelfth of flash-attn-4 at every head dim on both GPUs, close
# enough to read it: at 1k the launches around the main kernel are about a fifth of
# flash-attn-4's time (a fiftieth at 16k), and the 64-row Q block costs its schedule under a
# tenth, most at hd64 16k. At hd64 flash-attn-4 runs 128-row Q blocks. Ours can too
# (`tile_m=128`); a recorded H100 run times it, and two other knobs, beside the default of an
# older build:

# %%
knobs_run = next((pd for pd in kit.recorded(kind="sm90_bwd")
                  if "fa4kernel[tile_m=128]" in pd[1]["points"][0]["results"]), None)
if knobs_run is None:
    print("No recorded run of the tile_m=128 variant (lab/campaigns/kernel-sm90-backward/): skipped.")
else:
    path, doc = knobs_run
    variants = [c for c in doc["points"][0]["results"] if c.startswith("fa4kernel[")]
    print(f"{path.name} ({', '.join(kit.describe(doc))}), TFLOP/s; the variants' knobs on top of the default")
    names = {c: c[len("fa4kernel["):-1].replace("mma_order=", "") for c in variants}
    print(f"{'point':19s}{'default':>8s}" + "".join(f"{names[c]:>{len(names[c]) + 2}s}" for c in variants) + f"{'FA4':>6s}")
    for p in doc["points"]:
        t = {c: r.get("tflops") for c, r in p["results"].items()}
        print(f"hd{p['hdim']:<3d} {p['seqlen']:5d} {'causal' if p['causal'] else '':7s}{t['fa4kernel']:8.0f}"
              + "".join(f"{t[c]:{len(names[c]) + 2}.0f}" if t.get(c) else f"{'-':>{len(names[c]) + 2}s}"
                        for c in variants)
              + f"{t['flash-attn-4']:6.0f}")

# %% [markdown]
# In that build none of them gains more than a percent or two anywhere, and most lose: the
# 128-row tile is slower with the default order. Two mechanisms explain it, and the current
# defaults avoid both; the newest grid above times the current build (and the build without
# these two changes, as a variant row):
#
# - **ptxas serializes a 128-row build short of registers.** When LSE and D of all 32 query
#   columns a thread touches are read from smem into 64 registers before the exp2 and dS loops,
#   ptxas says "wgmma.mma_async instructions are serialized due to insufficient register
#   resources" and gives every wgmma its own arrive and wait (32 per loop trip instead of one
#   batch per GEMM, 5). Reading each column's value where it is used (column by column) frees
#   those registers, the wgmmas stay asynchronous, and the 128-row tile gains 1 to 11 % over 64
#   rows; it is hd64's default. A CPU test counts the arrives in every default build's loop, so
#   a serialized build fails the tests.
# - **The postprocess must run at the memory's bandwidth.** `lab/tools/bwd_launches_sm90.py`
#   times every launch of one backward call with torch.profiler: at 1k a torch `copy_` that puts
#   dQ's rows back in order takes 157 us, flash-attn-4's postprocess kernel 67 us (the bytes at
#   the memory's bandwidth). A postprocess kernel whose warps store 16 bytes into each of 32
#   rows is slow too; ours lets the threads of a warp take consecutive pieces of one row and
#   takes 68 us, and the preprocess zeroes the dQ accumulator (one launch fewer).
#
# Together the two are worth 11 to 25 % at hd64 and hd128 at 1k, 0 to 18 % at 4k and 2 to 14 %
# at 16k (at hd256, where only the postprocess differs: 7 to 14 % at 1k), and the model of our
# kernel, which assumes a postprocess at bandwidth and 128-row blocks where they hold, agrees
# with it within a few percent at hd64. What they leave is hd256 with a causal mask, where,
# with the CTAs launched head by head, cuDNN leads by 2 to 4 % at 1k and 4k (timed sustained).
#
# **The launch order.** With a causal mask a CTA walks only the Q blocks below its KV tile's
# diagonal: at 4k and hd256 the first KV tile of a head walks 64 of them, the last one 1. The CTAs
# launch head by head (`grid_order="heads_outer"`), so the last head's longest CTAs start about
# 64 CTAs before the end, and the launch waits for them while the other SMs idle. Predict: how much
# faster is the launch if the last few heads (two waves of CTAs) go KV tile by KV tile across
# them, longest first (`"tail_lpt"`)? fa4sim replays the launch in either order:

# %%
H100 = hardware.load("h100")
for causal in (True, False):
    p = Problem(batch=4, heads=8, seqlen_q=4096, seqlen_k=4096, hdim=256, causal=causal)
    t = {go: simulate(H100, None, p, {"grid_order": go}, impl="fa4kernel", pass_="bwd").main_us
         for go in ("heads_outer", "tail_lpt")}
    print(f"hd256 4k {'causal' if causal else 'full  '}: main kernel {t['heads_outer']:.0f} us heads_outer, "
          f"{t['tail_lpt']:.0f} us tail_lpt ({t['heads_outer'] / t['tail_lpt'] - 1:+.1%})")

# %% [markdown]
# `tail_lpt` is the kernel's causal default. Measured sustained, with the `heads_outer` build
# timed as a row beside the default:

# %%
tail_run = next((pd for pd in kit.recorded(kind="sm90_bwd")
                 if {"fa4kernel[grid_order=heads_outer]", "sdpa-cudnn"} <= set(pd[1]["points"][0]["results"])), None)
if tail_run is None:
    print("No recorded run of the two launch orders (lab/campaigns/kernel-sm90-backward/): skipped.")
else:
    path, doc = tail_run
    print(f"{path.name} ({', '.join(kit.describe(doc))}), TFLOP/s, causal points")
    for p in doc["points"]:
        if not p["causal"]:
            continue
        t = {c: r.get("tflops") for c, r in p["results"].items()}
        tail, heads = t["fa4kernel"], t["fa4kernel[grid_order=heads_outer]"]
        print(f"hd{p['hdim']:<3d} {p['seqlen']:5d}: tail_lpt {tail:4.0f}, heads_outer {heads:4.0f} "
              f"({tail / heads - 1:+.1%}), cuDNN {t['sdpa-cudnn']:4.0f}")

# %% [markdown]
# The gain is where the tail is a large part of the launch (1k and 4k, hd128 and hd256); at 16k
# the points move no more than they move between runs of one build (here hd64 16k by 4 %). With
# it ours is at or above cuDNN at every point of the grid. Without a mask
# every CTA walks as many blocks and the order changes nothing, so the default stays
# `heads_outer` there.
#
# Our compiled code shows what the knobs change. `fa4kernel.compile_bwd_sass` compiles the
# backward for `sm_90a` on the CPU (a few seconds each; without `nvidia-cutlass-dsl`, the
# `kernels` extra, the cell says so and skips). `REDG` is a reduction into global memory,
# `UBLKRED` a bulk reduce-add, `UBLKCP` a bulk copy (LSE and D), `LDG` a load from global
# memory, `HGMMA` a wgmma; static counts (each place in the binary once), hd128.

# %%
SASS = {}
try:
    import fa4kernel

    for label, knobs in (("default", {}), ("red", {"dq_reduce": "red"}), ("baseline", FIRST)):
        SASS[label] = fa4kernel.compile_bwd_sass(head_dim=128, **knobs)
except Exception as e:  # no CuTe DSL, no nvdisasm
    print(f"cannot compile the backward here ({str(e).splitlines()[0][:200]}): skipping the SASS counts.")
for label, sass in SASS.items():
    print(f"{label:13s}: " + ", ".join(f"{op} {kit.sass_count(sass, op)}"
                                       for op in ("REDG", "UBLKRED", "UBLKCP", "LDG", "HGMMA")))

# %% [markdown]
# **Deterministic, ours.** Our deterministic mode is not flash-attn-4's semaphores: each CTA adds
# its dQ into its own slice of a buffer with one slice per KV tile (a CTA pair: one per pair), and the host sums the
# slices in a fixed order. It costs memory (at 16k, 128 slices of dQ in fp32; so it is timed up
# to 4k) and bandwidth: the `det` column, and the share of the default's speed it keeps, printed
# with each GPU's summary above.
#
# **Where the model stands, and where it is wrong.** Two unit facts weigh most in the model's
# flash-attn-4 backward. At hd256 its loop is bound by the L2: each Q block loads Q and dO
# and reduce-adds 64 KB of dQ. `bench_bwd_units.py` runs bulk loads beside bulk reduce-adds from
# every SM, about as many bytes of each: together they take 0.91 (H100) and 0.885 (H200) of the sum
# of their times alone (`l2_mixed_time_fraction`). Predict flash-attn-4 at hd256 with the times
# simply added (1.0) and with the measured overlap, then read the recorded measurement:

# %%
PROBE_RUNS = {}  # GPU -> the settled run with our clock probe
for path, doc in sorted(kit.recorded(kind="sm90_bwd", where=settled), key=lambda pd: kit.describe(pd[1])[1]):
    if any("flash-attn-4" in pt.get("results", {}) for pt in doc.get("points", [])):  # beside the peer
        PROBE_RUNS[kit.describe(doc)[0]] = (path, doc)
if not PROBE_RUNS:
    print("No recorded settled run with the clock probe (lab/campaigns/kernel-sm90-backward/).")
for dev, (path, doc) in PROBE_RUNS.items():
    hw = kit.profile_for(dev)
    for pt in doc["points"]:
        if pt["hdim"] != 256 or pt["causal"] or not hw:
            continue
        P = Problem(batch=pt["batch"], heads=pt["heads"], seqlen_q=pt["seqlen"], seqlen_k=pt["seqlen"], hdim=256)
        added = simulate(hw, problem=P, overrides={"l2_mixed_time_fraction": 1.0}, impl="flash-attn-4", pass_="bwd")
        shared = simulate(hw, problem=P, impl="flash-attn-4", pass_="bwd")
        print(f"{hw.upper()} flash-attn-4 hd256 {pt['seqlen']:5d}: times added {added.tflops:3.0f}, overlap as measured "
              f"{shared.tflops:3.0f}, measured {pt['results']['flash-attn-4']['tflops']:3.0f} TFLOP/s")

# %% [markdown]
# The overlap takes a tenth off the L2's time, and the L2-bound hd256 loop follows it. One
# measured mix stands for every moment of the loop; when flash-attn-4's loads and adds meet in the
# L2, and how much, is not measured. The other fact is the clock, and how it is measured matters.
# Timed in short batches, each after an idle GPU-side sleep, the backward appears to run at
# 1.70-1.80 GHz, below the cap. Launched back to back for seconds (`bwd_power_sm90.py`), its main
# kernel holds the 700 W cap at 1.45-1.67 GHz: the clock a training step settles at
# ([the backward's power](../lab/findings/power-backward.md)). At the clock measured, what power does the model give the main kernel, and what clock does it predict?

# %%
# bwd_power_sm90.py --long: the main kernel alone, launched back to back
POWER = sorted(kit.recorded(kind="bwd_power", where=lambda d: d["meta"]["mode"] == "long"), key=lambda pd: kit.describe(pd[1])[1])
if not POWER:
    print("No recorded settled run of the main kernel (lab/campaigns/backward-power/): skipped.")
for path, doc in POWER[-1:]:
    prof = kit.profile_for(kit.describe(doc)[0])
    print(f"{path.name} ({', '.join(kit.describe(doc))}): the main kernel alone, launched back to back")
    for pt in doc["points"]:
        if pt.get("pass_") != "bwd" or pt.get("data") != "randn" or "window" not in pt:
            continue
        f = pt["clock_ghz_in_kernel"]
        P = Problem(batch=pt["batch"], heads=pt["heads"], seqlen_q=pt["seqlen"], seqlen_k=pt["seqlen"], hdim=pt["hdim"])
        at = simulate(prof, problem=P, overrides={**pt["knobs"], "clock_ghz": f}, impl="fa4kernel", pass_="bwd")
        hw_p = hardware.load(prof)
        model_w = power.power_w(hw_p, at.main_activity, f)[0]
        own = power.predict_clock(hw_p, at.main_activity).clock_ghz
        knobs = " ".join(f"{k}={v}" for k, v in pt["knobs"].items())
        print(f"hd{pt['hdim']:<3d} {pt['seqlen']:5d} {knobs:18s}: {pt['window']['power_w_energy_slope']:4.0f} W at "
              f"{f:.2f} GHz in the kernel; the model {model_w:4.0f} W there, and predicts {own:.2f} GHz")

# %% [markdown]
# ### Grouped K/V heads: a CTA per K/V head, or one per q head?
#
# With GQA several q heads read one K/V head, so that head's dK and dV are sums over its group.
# Our backward schedules the sum two ways (`bwd_knobs={"gqa_dkv": ...}`, `docs/model.md`,
# "Backward"): `"loop"` runs one CTA per KV tile of each K/V head, which walks the Q blocks of
# every q head of its group and keeps dK and dV in registers; `"reduce"` runs one CTA per KV tile
# of each q head, as without grouping, and adds its dK and dV into fp32 accumulators at its end
# (flash-attn-4's scheme). **Predict first**: MQA (16 q heads on one K/V head), hd64, 2k tokens,
# causal, batch 8, on an H200's 132 SMs. How many CTAs does each launch have (KV tiles of 128
# keys), and which runs faster?

# %%
guess_gqa = {"loop_ctas": None,  # <- an integer
             "reduce_ctas": None,
             "faster": None}  # <- "loop" or "reduce"

# %%
# SOLUTION (fills in only what you left as None)
tiles = 2048 // 128
for key, val in {"loop_ctas": 8 * 1 * tiles, "reduce_ctas": 8 * 16 * tiles, "faster": "reduce"}.items():
    if guess_gqa[key] is None:
        guess_gqa[key] = val

# %%
MQA = Problem(batch=8, heads=16, heads_kv=1, seqlen_q=2048, seqlen_k=2048, hdim=64, causal=True)
sim_gqa = {}
for mode in ("loop", "reduce"):
    sim_gqa[mode] = simulate("h200", problem=MQA, overrides={"gqa_dkv": mode}, impl="fa4kernel", pass_="bwd")
    show(f"H200 fa4kernel gqa_dkv={mode}", sim_gqa[mode])
assert guess_gqa["loop_ctas"] == 8 * tiles, "loop: one CTA per (KV tile, K/V head, batch)"
assert guess_gqa["reduce_ctas"] == 8 * 16 * tiles, "reduce: one CTA per (KV tile, q head, batch)"
faster = max(sim_gqa, key=lambda m: sim_gqa[m].tflops)
assert guess_gqa["faster"] == faster, f"the model has {faster} faster: the loop's 128 CTAs are each 16 q heads long"

# %% [markdown]
# The loop's 128 CTAs leave 4 of the 132 SMs idle and each walks 16 q heads' Q blocks; with a
# causal mask the first KV tiles see many more Q blocks than the last, so the launch lasts as
# long as its longest CTA. The reduce launch has 16 times the CTAs, each as short as without
# grouping, and pays for it in fp32 adds: tile_n x (hdim + hdim) x 4 bytes per CTA into L2. The
# recorded run, where there is one, puts both builds beside flash-attn-4:

# %%
def recorded_tflops(where, missing):
    """(point, TFLOP/s by kernel) of the newest recorded backward run (kind sm90_bwd) that `where`
    accepts, after a line naming it; `missing` is printed where none is recorded."""
    runs = kit.recorded(kind="sm90_bwd", where=where)
    if not runs:
        print(missing)
        return
    path, doc = runs[0]
    print(f"{path.name} ({', '.join(kit.describe(doc))}), TFLOP/s:")
    for pt in doc["points"]:
        yield pt, {k: v.get("tflops") for k, v in pt["results"].items() if isinstance(v, dict)}


for pt, res in recorded_tflops(lambda d: any("fa4kernel[gqa_dkv=reduce]" in pt["results"] for pt in d["points"]),
                               "No recorded run of the reduce build (lab/campaigns/kernel-sm90-backward/): skipped."):
    cells = ", ".join(f"{k} {res[k]:.0f}" for k in ("fa4kernel", "fa4kernel[gqa_dkv=reduce]", "flash-attn-4")
                      if res.get(k))
    print(f"  hd{pt['hdim']} {pt['heads']}/{pt['heads_kv']} heads, {pt['seqlen']} tokens x {pt['batch']}"
          f"{' causal' if pt['causal'] else ''}: {cells}")

# %% [markdown]
# Where the loop's CTAs fill the SMs (GQA 64/8 or 32/8 on 4k-8k tokens: thousands of CTAs),
# a causal mask still decides: a loop CTA walks its group's q heads over one to all of its Q
# blocks, a long and uneven walk, while the reduce CTAs are as short as without grouping. So
# fa4kernel's default takes `"reduce"` where the loop's CTAs are fewer than the SMs, and with a
# causal mask and at least half as many queries as keys (`sm90/bwd_config.py`, `gqa_dkv_for`;
# the 0.5 is where fa4sim puts the two even). Without a mask the two are even: the fp32 adds
# cost about what the shorter CTAs save. On a batch of chunks (a few queries against many keys
# each) `"reduce"` loses: each CTA has few Q blocks, and its adds are most of its work.
#
# %% [markdown]
# ### Head dim 192: the L2 wall
#
# Every CTA adds its fp32 dQ for each Q block it visits (64 rows x hdim x 4 bytes) into one
# accumulator in L2, and loads that block's Q and dO. At hd192 our CTA holds 64 keys (both
# warpgroups on the same keys, dK, dV and dQ split by the head dim), flash-attn-4's 96 (dK and
# dV computed transposed, the head dim on the wgmma's M). **Predict first**: at 3 x 12 heads x
# 7001 tokens, how many GB of dQ reduce-adds does each launch send into L2, and what is the
# shortest time the L2 can take them at its reduce-add rate (`l2_reduce_bandwidth_tbps` of the
# H100 profile, 3.29 TB/s)?

# %%
guess_l2 = {"ours_gb": None,  # <- GB of dQ reduce-adds with 64 keys per CTA
            "fa4_gb": None,   # <- with 96
            "ours_min_us": None}  # <- us, the reduce-adds alone at the L2's rate

# %%
# SOLUTION (fills in only what you left as None)
h100 = hardware.load("h100")


def reduce_gb(keys_per_cta, b=3, h=12, s=7001, d=192, tile_m=64):
    visits = b * h * -(-s // keys_per_cta) * -(-s // tile_m)  # (KV tile, Q block) pairs
    return visits * tile_m * d * 4 / 1e9


for key, val in {"ours_gb": reduce_gb(64), "fa4_gb": reduce_gb(96),
                 "ours_min_us": reduce_gb(64) * 1e3 / h100.l2_reduce_bandwidth_tbps}.items():
    if guess_l2[key] is None:
        guess_l2[key] = val

# %%
HD192 = Problem(batch=3, heads=12, seqlen_q=7001, seqlen_k=7001, hdim=192)
TILE96 = {"tile_n": 96, "sdp_swapab": False, "dkv_swapab": True, "atom_sdp": 1, "atom_dkv": 2,
          "pds_stages": 1, "do_stages": 1, "p_with_ds": False}  # flash-attn-4's hd192 layout
sim_192 = {"fa4kernel": simulate("h100", problem=HD192, impl="fa4kernel", pass_="bwd"),
           "flash-attn-4": simulate("h100", problem=HD192, impl="flash-attn-4", pass_="bwd"),
           "fa4kernel, 96 keys (what-if)": simulate("h100", problem=HD192, impl="fa4kernel", pass_="bwd",
                                                    overrides=TILE96)}
for label, r in sim_192.items():
    show(f"H100 {label}", r)
    print(f"{'':24s} main kernel {r.main_us:6.0f} us, of which the L2 needs at least {r.kernel.l2_us:6.0f} us")
assert abs(guess_l2["ours_gb"] / guess_l2["fa4_gb"] - 1.5) < 0.02, "64 keys visit 1.5 x the (KV tile, Q block) pairs of 96"
assert guess_l2["ours_min_us"] > 0.75 * sim_192["fa4kernel"].main_us, "the adds alone are most of our main kernel"
assert sim_192["fa4kernel, 96 keys (what-if)"].tflops > 1.15 * sim_192["fa4kernel"].tflops

# %% [markdown]
# The reduce-adds alone take most of our main kernel: with 64 keys per CTA the launch moves 1.5
# times flash-attn-4's bytes per key through the L2, and the L2, not the tensor core, sets the
# pace. The same kernel with a 96-key tile (a what-if: fa4kernel does not build it) gets most of
# the way to flash-attn-4. The recorded runs at hd192, where there are some:

# %%
at_192 = lambda d: any(pt["hdim"] == 192 and "flash-attn-4" in pt["results"] for pt in d["points"])  # noqa: E731
for pt, res in recorded_tflops(at_192, "No recorded backward run at hd192 (lab/campaigns/kernel-sm90-backward/): "
                                       "skipped."):
    if pt["hdim"] == 192 and res.get("fa4kernel") and res.get("flash-attn-4"):
        print(f"  hd192 {pt['seqlen']} tokens x {pt['batch']}{' causal' if pt['causal'] else ''}: fa4kernel "
              f"{res['fa4kernel']:.0f}, flash-attn-4 {res['flash-attn-4']:.0f} "
              f"({res['fa4kernel'] / res['flash-attn-4']:.2f}x)")

# %% [markdown]
# With its defaults the main kernel's power comes out within about 5 % and its clock within about
# 3 % at 4k and 16k (H100). That rests on the measured memory paths (`bench_mem_power.py`,
# `fit_mem_power.py`): a byte that a TMA bulk reduce-add adds into L2 costs about 2.5 times a
# loaded byte, a RED.ADD from registers more still, and the CTA pair's bytes over the SM-to-SM
# network cost energy too; priced as loads, with the network free, the main kernel's power comes
# out too low. What is off:
# the `red` build (RED.ADD from registers) draws more than its bytes priced alone, and on the
# H200 the CTA pair at hd256 draws 8 % more than the model gives it. The data matters too: with
# q = k = 0 the same kernel draws 90 W less at a higher clock. The energies are for random bits,
# and a tensor core that multiplies zeros flips fewer of them.
#
# ## 5. Exercises
#
# ### Exercise 9.1: twice the shared-memory bandwidth
# Set `smem_bytes_per_clk` to twice the B200's (128 bytes per clock). First from the roofline:
# by what fraction at most can the one-CTA backward speed up? Then simulate both configurations
# at a fixed clock (the CTA pair's, `clock_ghz`) and give the gains.

# %%
f0 = bwd["CTA pair"].clock_ghz
WIDE = {"smem_bytes_per_clk": 2 * b200.smem_bytes_per_clk}


def gain_at(o):
    """TFLOP/s gain from WIDE for the knobs o, both at the clock f0."""
    return (simulate("b200", problem=B200, overrides={**o, **WIDE, "clock_ghz": f0}, pass_="bwd").tflops
            / simulate("b200", problem=B200, overrides={**o, "clock_ghz": f0}, pass_="bwd").tflops - 1)


bound_gain_one_cta = None  # <- the roofline's upper bound, a fraction
gain_one_cta = None        # <- gain_at(...) for one CTA
gain_pair = None           # <- gain_at(...) for the CTA pair

# %%
# SOLUTION (try the exercise first).
if bound_gain_one_cta is None:
    bound_gain_one_cta = 3328 / 2560 - 1  # shared memory halves to 1664: the tensor core's 2560 is the bound
if gain_one_cta is None:
    gain_one_cta = gain_at({"two_cta": False})
if gain_pair is None:
    gain_pair = gain_at({})

# %%
wide = feeds.bwd_tile_costs(b200.with_values(**WIDE))
sim_one, sim_pair = gain_at({"two_cta": False}), gain_at({})
print(f"one CTA, twice the bandwidth: tensor {wide['mma']:.0f}, shared memory {wide['smem']:.0f} cycles; bound "
      f"{bound_gain_one_cta:+.0%}; simulated at {f0:.2f} GHz: one CTA {sim_one:+.1%}, pair {sim_pair:+.1%}")
kit.check(abs(bound_gain_one_cta - (ROOF[False] / max(wide["mma"], wide["smem"], wide["exp_mufu"]) - 1)) < 0.01,
          "the one-CTA loop cannot get shorter than the largest unit's cycles with the wider shared memory")
kit.check(abs(gain_one_cta - sim_one) < 0.02 and abs(gain_pair - sim_pair) < 0.02,
          f"the simulator gives one CTA {sim_one:+.1%}, the pair {sim_pair:+.1%}")
one_own = simulate("b200", problem=B200, overrides={"two_cta": False, **WIDE}, pass_="bwd")
print(f"one CTA with its own clock: {one_own.tflops / bwd['one CTA'].tflops - 1:+.1%} at {one_own.clock_ghz:.2f} GHz")

# %% [markdown]
# One CTA gains about a sixth, more than half of the roofline's 30 %: its wall falls, and the
# latency of the dQ path stays. The pair, already at the MMA bound in shared memory, gains a
# few percent. Under the power cap one CTA gains about half as much: a busier tensor core
# draws more power, and the clock drops (lesson 08).
#
# ### Exercise 9.2: a CTA pair with deterministic mode
# Which loses the larger fraction of its TFLOP/s to deterministic mode, at each one's own clock:
# `"one CTA"` or `"CTA pair"`? And what does the tensor core wait for most in deterministic mode
# (an op name from section 2's table)?

# %%
loses_more = None    # <- "one CTA" or "CTA pair"
waits_most_for = None  # <- an op name

# %%
# SOLUTION (try the exercise first).
if loses_more is None:
    loses_more = "one CTA"
if waits_most_for is None:
    waits_most_for = "RDQ"

# %%
kept = {cfg: bwd[f"{cfg}, deterministic"].tflops / bwd[cfg].tflops for cfg in ("one CTA", "CTA pair")}
print({cfg: f"deterministic keeps {k:.0%}" for cfg, k in kept.items()})
kit.check(loses_more == min(kept, key=kept.get), f"deterministic keeps {kept}")
w = bwd[f"{loses_more}, deterministic"].tensor_waits
kit.check(waits_most_for == max(w, key=w.get), f"the tensor core's waits: {w}")

# %% [markdown]
# The semaphore's L2 round trips lengthen the dQ path of every Q block, and the tensor core
# waits for dQ's TMEM. On one CTA dQ lies over dP and the MMA warp issues the next dP right
# after dQ, so it waits for the whole dQ path. On a pair dQ lies over the tail of S, with the dV
# MMA between dQ and the next S, and each SM moves only half of dQ. A pair keeps about nine
# tenths of its speed, one CTA about four fifths.
#
# ### Exercise 9.3: how many atomics?
# Our backward at hd128 with `dq_reduce="red"`: 64-row Q blocks, dQ split over the two consumer
# warpgroups along the head dim (64 columns each), 128 threads per warpgroup, one
# `RED.ADD.F32x2` per two fp32 values. How many RED instructions does each consumer thread
# issue per Q block?

# %%
reds_per_thread = None  # <- your answer

# %%
# SOLUTION (try the exercise first).
if reds_per_thread is None:
    reds_per_thread = 64 * (128 // 2) // 128 // 2  # 64 rows x 64 columns per warpgroup, 2 floats per RED

# %%
from fa4kernel import make_bwd_config  # noqa: E402  (plain Python: no CuTe DSL, no torch)

cfg = make_bwd_config("bfloat16", 128, False, dq_reduce="red")
expected = cfg.tile_m * (cfg.head_dim // cfg.dq_wgs) // 128 // 2
kit.check(reds_per_thread == expected, f"dQ is {cfg.tile_m} x {cfg.head_dim} fp32 over {cfg.dq_wgs} warpgroups")
if SASS:
    kit.check(reds_per_thread == kit.sass_count(SASS["red"], "REDG"), "count the REDG in the SASS above")
print(f"{reds_per_thread} per thread, {reds_per_thread * 256} per CTA per Q block; with dq_reduce='bulk' (the "
      f"default): {cfg.dq_wgs} bulk reduce-adds, issued by one producer thread")

# %% [markdown]
# ## What to remember
#
# - The backward does 2.5x the forward's MMA work and the same exp2; on B200 its wall is shared
#   memory, and the CTA pair exists to bring that down to the tensor core's time.
# - dQ is the hard part: it is reduced across CTAs, through fp32 shared memory and TMA bulk
#   reduce-adds. On B200 the tensor core waits mostly for dQ's read-out from TMEM; deterministic
#   mode puts L2 round trips on that path.
# - Without TMEM the accumulators take registers (smaller Q blocks) and 64-row wgmmas re-read
#   their operands: flash-attn-4's Hopper backward is shared-memory-bound.
# - Our SM90 backward has flash-attn-4's structure. What puts it level with cuDNN, at about
#   twice the speed of its baseline build: on long sequences, keeping the stretch between Q blocks short
#   (bulk reduce-adds for dQ, LSE and D by TMA, dQ's store under the dK GEMM); on short ones, a
#   preprocess that reads dO and O once. The gap left to flash-attn-4 is at short sequences and
#   hd64, and what it is made of is not measured.
# - With grouped K/V heads the launch decides: one CTA per K/V head sums dK and dV for free but
#   leaves SMs idle when the heads are few (MQA); one CTA per q head fills them and pays fp32
#   adds into L2.
