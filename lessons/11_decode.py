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
# # Lesson 11: decode is a memory problem (about 20 minutes)
#
# Every lesson so far ran prefill: thousands of queries against thousands of keys, where the
# tensor core and the exp2s decide the time. Serving a model is mostly **decode**: one new token
# per sequence (a few with speculative decoding) against a KV cache of everything said so far.
# Each step reads the whole cache and does almost no math with it, so its time is bytes over
# bandwidth, plus what it takes to keep every SM reading.
#
# fa4sim models decode as each implementation schedules it (`docs/model.md`, "Decode"):
# grouped K/V heads (`heads_kv`), pack-GQA (the q heads of a K/V head as rows of one tile),
# split-KV (a long cache in `num_splits` chunks over more CTAs, then a combine launch).

# %%
import lessonkit as kit
from fa4kernel import kvcache
from fa4sim import Problem, hardware, simulate

LIVE = kit.live()


def layer(batch, cache, new=1):
    """One attention layer of a Llama-70B-like model: 64 q heads over 8 K/V heads, hd128."""
    return Problem(batch=batch, heads=64, seqlen_q=new, seqlen_k=cache, hdim=128, causal=new > 1, heads_kv=8)


def kvcache_model(hw, p):
    """fa4kernel's decode as fa4kernel.attention_with_kvcache runs it: its plan (kvcache.decode_plan:
    pack-GQA, the split count its heuristic picks on the profile's SMs) in the model."""
    plan = kvcache.decode_plan(p.batch, p.seqlen_q, p.seqlen_k, p.heads, p.heads_kv, p.hdim, "bfloat16",
                               p.causal, None, hardware.load(hw).num_sms)
    return simulate(hw, problem=p, impl="fa4kernel",
                    overrides={"pack_gqa": True, "num_splits": plan["num_splits"]})


def kv_bytes(p):
    """K and V of the cache, bf16: what one decode step must read from HBM at least once."""
    return p.batch * p.seqlen_k * p.heads_kv * (p.hdim + p.hdim_v) * 2


# %% [markdown]
# ## 1. Bytes alone
#
# **Predict first.** A batch of 8 sequences with 32k tokens cached each. How many bytes does one
# decode step read, and how long does that take at the HBM bandwidth of an H100 and of a B200?

# %%
p = layer(8, 32768)
for hw in ("h100", "b200"):
    bw = hardware.load(hw).hbm_bandwidth_tbps
    print(f"{hw}: {kv_bytes(p) / 1e9:.2f} GB of K and V at {bw} TB/s -> at least "
          f"{kv_bytes(p) / (bw * 1e12) * 1e6:.0f} us per layer and step")

# %% [markdown]
# ~1.07 GB: about 356 us on an H100 and 149 us on a B200, whatever the kernel does (the
# profiles' bandwidths are what a copy achieves, below the datasheets' 3.35 and 8 TB/s).

# %% [markdown]
# ## 2. The model, kernel by kernel
#
# FlashAttention-3 (its split heuristic and pack-GQA), flash-attn-4 (pack-GQA, no split-KV on
# SM90), fa4kernel's plain forward (`attention`: neither; one CTA per q head and 128-row Q tile,
# 127 of whose rows are padding) and fa4kernel's decode entry point (`attention_with_kvcache`:
# pack-GQA and its own split heuristic, `kvcache_model` above).

# %%
runs = [(hw, impl, simulate(hw, problem=p, impl=impl)) for hw, impl in
        (("h100", "flash-attn-3"), ("h100", "flash-attn-4"), ("h100", "fa4kernel"), ("b200", "flash-attn-4"))]
runs.insert(3, ("h100", "fa4kernel kvcache", kvcache_model("h100", p)))
for hw, impl, r in runs:
    print(f"{hw} {impl:17s} {r.time_us:6.0f} us, K/V read at {r.kv_read_gbps:5.0f} GB/s "
          f"(splits {r.knobs.get('num_splits')}, pack-GQA {r.knobs.get('pack_gqa')})\n   {r.bottleneck[:110]}")

# %% [markdown]
# FlashAttention-3 sits on the memory floor (HBM-bound). flash-attn-4 on the H100 packs the heads
# but does not split: 64 work units for 132 SMs. fa4kernel's plain forward reads every K/V head
# once per q head of its group (8 x the bytes, most of them from L2) and computes a 128-row tile
# for one row: 2.7 x slower; its decode entry point packs the heads and splits, and sits on the
# floor with FlashAttention-3. On the B200, flash-attn-4's SM100 forward is 1.5 x above its
# memory floor.

# %% [markdown]
# ## 3. What split-KV buys
#
# **Predict first.** Batch 1, 128k tokens cached: how many CTAs does an unsplit launch have with
# pack-GQA (one per K/V head), and what happens to the time as the cache is split in 2, 4, ... 32?

# %%
one = layer(1, 131072)
for ns in (1, 2, 4, 8, 16, 32):
    r = simulate("h100", problem=one, impl="flash-attn-3", overrides={"num_splits": ns})
    print(f"num_splits {ns:2d}: {r.time_us:6.1f} us (combine {r.combine_us:4.1f} us), "
          f"{r.kv_read_gbps:5.0f} GB/s")
auto = simulate("h100", problem=one, impl="flash-attn-3")
print(f"FlashAttention-3's own choice: {auto.knobs['num_splits']} splits, {auto.time_us:.1f} us")

# %% [markdown]
# Unsplit, 8 CTAs (one per K/V head) read the cache while 124 SMs idle: the launch is
# occupancy-bound. Each doubling of the splits halves the time until the SMs together saturate
# HBM, at 8 splits here; past that only the combine grows. FlashAttention-3's heuristic picks 15.

# %% [markdown]
# ## 4. pack-GQA, and FA4's exp2 tricks
#
# Without pack-GQA each q head reads its K/V head on its own: eight times the cache traffic. And
# FA4 emulates part of the exp2s on the FMA pipe to relieve the MUFU. **Predict first:** does
# that matter for a step that waits on memory?

# %%
for pack in (True, False):
    r = simulate("h100", problem=p, impl="flash-attn-3", overrides={"pack_gqa": pack})
    print(f"pack_gqa {str(pack):5s}: {r.time_us:6.0f} us")
for emu in (0.0, 0.25):
    r = simulate("b200", problem=p, impl="flash-attn-4", overrides={"exp_emulation": emu})
    print(f"B200 flash-attn-4, exp_emulation {emu}: {r.time_us:6.1f} us")

# %% [markdown]
# pack-GQA is worth 3.3 x. For a kernel on the memory floor (FlashAttention-3 on the H100) the
# exp2s change nothing: with `exp_emulation` forced to 0.25 or 0.5 the model gives the same 361 us.
# flash-attn-4 on the B200 is not on its floor in the model: a packed tile holds 8 real rows of
# 128 and still computes the exp2s of all of them, so the MUFU sits on the critical path and the
# emulated share (0.125 by default) moves the step by 9 % between 0 and 0.25. The trick matters
# only where the tile is mostly padding; a tile sized to the rows would not need it. No B200 run
# has checked this.

# %% [markdown]
# ## 5. A paged cache
#
# Serving engines keep the cache in pages of a few tokens (vLLM 16, SGLang up to 256), found
# through a page table, so that sequences grow without copying. TMA reads a rectangle of a tensor;
# a KV block spread over pages is no rectangle. FlashAttention-3 then loads K and V with
# cp.async from its producer warpgroup, each key row's address from the table, and narrows its
# tile (docs/model.md, "Paged KV"). **Predict first:** what do pages of 16 tokens cost a decode
# step, and what do they cost a prefill over the same kind of cache?

# %%
from dataclasses import replace

for page in (0, 16, 256):
    r = simulate("h100", problem=replace(p, page_size=page), impl="flash-attn-3")
    print(f"decode, pages of {page:3d}: {r.time_us:6.1f} us  ({r.knobs['kv_load']}, {r.knobs['tile_n']}-key blocks)")
prefill = Problem(batch=1, heads=64, seqlen_q=4096, seqlen_k=4096, hdim=128, causal=True, heads_kv=8)
for page in (0, 16, 256):
    r = simulate("h100", problem=replace(prefill, page_size=page), impl="flash-attn-3")
    print(f"prefill 4k, pages of {page:3d}: {r.time_us:6.1f} us  ({r.knobs['kv_load']})")
for page in (0, 16, 128):
    r = simulate("b200", problem=replace(p, page_size=page), impl="flash-attn-4")
    print(f"B200 flash-attn-4 decode, pages of {page:3d}: {r.time_us:6.1f} us  ({r.knobs['kv_load']}, "
          f"S ping-pong {'on' if r.knobs['s_stages'] > 1 else 'off'})")

# %% [markdown]
# At decode nothing moves: the step waits on HBM, and the producer's extra instructions and
# page-table loads hide under it (the narrower tile even fits the cache a little better). In the
# prefill the same instructions come out of the issue slots the softmax needs: pages of 16 cost
# about 1 %, pages of 256 (whole blocks of 128 keys) nothing, since TMA reads them again.
# flash-attn-4 on a B200 is another story: this decode runs one CTA per K/V head (no split), so its
# loop's latency is the time, and with pages that are not its 128-key tile it also gives up the S
# ping-pong that hides the exp2s behind the next QK (its interface allows that only for pages of
# the tile): 41 % slower in the model, where pages of 128 cost nothing. No run has measured a
# paged cache yet: these are predictions from the kernels' sources.

# %% [markdown]
# ## 6. Exercise: a bigger batch from bytes alone
#
# Batch 32, 8k tokens cached. Predict the time of one step on an H100 from bytes alone (section
# 1), then compare with FlashAttention-3 in the model. Within 15 %?

# %%
my_us = None  # your prediction, microseconds

# %%
# SOLUTION (try without it first)
if my_us is None:
    q = layer(32, 8192)
    my_us = kv_bytes(q) / (hardware.load("h100").hbm_bandwidth_tbps * 1e12) * 1e6

# %%
model = simulate("h100", problem=layer(32, 8192), impl="flash-attn-3")
kit.check(abs(model.time_us / my_us - 1) < 0.15,
          f"bytes alone give {my_us:.0f} us, the model {model.time_us:.0f} us: recount the bytes "
          "(batch x cache x K/V heads x (hdim + hdim_v) x 2 bytes)")
print(f"bytes alone {my_us:.0f} us, the model {model.time_us:.0f} us ({model.bottleneck[:60]})")

# %% [markdown]
# ## 7. Measured
#
# With a Hopper GPU this cell times one decode step (torch SDPA with grouped heads, and
# fa4kernel.attention_with_kvcache: pack-GQA and split-KV) and prints the K/V read rate beside the
# model's. Without one it prints a recorded decode run from `lab/campaigns/`
# (`lab/tools/bench_decode_sm90.py`: five rows, each candidate's K/V read rate).

# %%
shape = layer(8, 32768)
if LIVE:
    import torch

    import fa4kernel

    q = torch.randn(8, 1, 64, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(8, 32768, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
    for name, fn in (("torch SDPA", sdpa), ("fa4kernel kvcache", lambda: fa4kernel.attention_with_kvcache(q, k, v))):
        ms = kit.time_cuda(fn)
        print(f"{name:20s} {ms * 1e3:6.0f} us, {kv_bytes(shape) / (ms * 1e-3) / 1e9:5.0f} GB/s")
else:
    found = kit.recorded(kind="decode")
    if found:
        path, doc = found[0]
        print(f"recorded: {path.name} ({kit.describe(doc)[0]}); K/V read, GB/s")
        for row in doc["rows"]:
            rates = {n: r["kv_gbps"] for n, r in row["results"].items() if r.get("ok") and "kv_gbps" in r}
            print(f"  {row['point']:30s} " + ", ".join(f"{n} {g:.0f}" for n, g in rates.items()
                                                      if "[" not in n or n.endswith("[auto]")))
    else:
        print("no decode run is recorded yet: the comparison needs a Hopper GPU (run this cell there)")
for impl, r in (("flash-attn-3", simulate("h200", problem=shape, impl="flash-attn-3")),
                ("fa4kernel kvcache", kvcache_model("h200", shape))):
    print(f"model, H200, {impl:17s} {r.time_us:6.0f} us, {r.kv_read_gbps:5.0f} GB/s")
