"""A real training run: a small GPT trained from one seed with each attention backend in turn
(fa4kernel's torch op, torch SDPA, flash-attn-4), same data, same order, same init; losses, step
times, tokens/s and the attention's share of a step, per backend, in one JSON (kind "training").

The model (nanoGPT's): byte tokens (vocab 256), learned positions, --layers pre-LayerNorm blocks
of causal attention (--width / --head-dim heads; --kv-heads < heads: grouped K/V heads, GQA) and
a 4x GELU MLP, no biases, the output head tied to the token embedding. fp32 weights, bf16 autocast
(the matmuls and attention run in bf16, the loss in fp32), AdamW (betas 0.9 / 0.95, weight decay
0.1 on matrices, fused on CUDA), gradients clipped at 1.0, the learning rate warmed up linearly for
--lr-warmup steps, then cosine down to a tenth.

The corpus: the source of Python's standard library (every .py under sysconfig's stdlib folder,
tests and site-packages left out, in sorted path order, bytes as they are): real text that every
machine with Python has, with no download, about 12 MB (so 300 steps of 16 x 1024 tokens see each
byte less than once). Byte-level tokens need no tokenizer. The tokens are the same in every run
and for every backend of one machine (meta.corpus has its sha256; another Python version has
other bytes). The last 5% is held out: each run ends with the loss on --eval-batches of it. The
batches' offsets come from a generator seeded by --seed, drawn before training, and the weights
are initialised on the CPU from --seed, so every backend sees the same init and the same batches.

Backends (--attn, one run each): fa4kernel (fa4kernel.attention_op, the custom op torch.compile
traces without a graph break); sdpa (F.scaled_dot_product_attention, is_causal=True, the backend
torch picks, recorded: flash, cudnn, efficient or math); flash-attn-4 (flash_attn.cute.interface
.flash_attn_func, run outside the compiled graph through torch.compiler.disable: it is no custom
op; a backend that cannot be imported is recorded with its error). --compile (default on CUDA)
wraps the model in torch.compile; torch._dynamo.explain on one forward counts graphs and breaks;
a compile that fails at the first step falls back to eager, recorded.

Per step: the loss (fp32), the step time between two CUDA events (forward, backward, clip,
optimizer), tokens/s; medians over the steps after --warmup (compiles happen in the first steps).
The attention share is an estimate: one layer's attention forward + backward at the run's shape,
timed alone back to back (eager, same backend, random inputs), times --layers, over the median
step time; it leaves out the overlap and launch gaps a real step has.

--deterministic: fa4kernel's (and flash-attn-4's) deterministic backward, and
torch.use_deterministic_algorithms with inductor's deterministic mode, for every run.
--repeat-deterministic (default on CUDA): after the runs, the first backend of --attn runs twice
more in that mode and the file says whether the two loss sequences are bit-identical (else the
first step where they differ).

Time (estimate): a step at the defaults (6 layers x 384, 1024 tokens x batch 16: about 1.3 TFLOP
of matmuls and attention) takes about 5-15 ms on an H200, so 300 steps take 2-5 s; compiles
dominate (inductor about 30-60 s cold, less from its cache; the CuTe kernels a few seconds each),
so 3 backends and the repeat take about 3-5 minutes. --budget-s stops one run cleanly (default 120 s,
compiles included; the steps that ran are kept), --total-s (480 s) starts no run and stops any past that
many seconds since start; the file is rewritten after every run.

Usage (device, from the repository root):
    source .gpu/setup-device.sh && python3 lab/tools/train_gpt_sm90.py --out $OUT/train_h200.json \\
        --figure $OUT/train_h200.png
    python3 lab/tools/train_gpt_sm90.py --attn fa4kernel,sdpa --kv-heads 2 --seq 4096 --batch 4 --out ...
    python lab/tools/train_gpt_sm90.py --plot FILE.json --figure FILE.png      # CPU: the figure again
    python lab/tools/train_gpt_sm90.py --device cpu --attn sdpa --steps 3 --layers 1 --width 64 \\
        --seq 64 --batch 2                                                   # CPU smoke run (sdpa only)
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import sysconfig
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

BACKENDS = ("fa4kernel", "sdpa", "flash-attn-4")
# the GPU's sleep (torch.cuda._sleep cycles, ~0.2 s at 1.98 GHz) before calls timed on the GPU
# alone: longer than the host takes to queue them (20 attention forward + backward calls of up to
# ~5 ms of host time each), so no call waits for the host
SLEEP_CYCLES = 400_000_000
GPU_ONLY = ("fa4kernel", "flash-attn-4")
FA4KERNEL_HEAD_DIMS = (64, 96, 128, 192, 256)
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
VOCAB = 256
HELD_OUT = 0.05


def corpus_bytes() -> tuple[bytes, dict]:
    """The stdlib's .py sources concatenated (sorted paths, raw bytes) and what they are."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(root).parts[:-1]))
    data = b"".join(p.read_bytes() for p in files)
    return data, {"source": f"Python {platform.python_version()} standard library .py files", "files": len(files),
                  "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def attention_fn(backend: str, deterministic: bool):
    """q (batch, seqlen, heads, hd), k and v (batch, seqlen, kv_heads, hd) -> out like q, causal."""
    import torch
    import torch.nn.functional as F

    if backend == "fa4kernel":
        import fa4kernel

        return lambda q, k, v: fa4kernel.attention_op(q, k, v, causal=True, deterministic=deterministic)
    if backend == "sdpa":
        def sdpa(q, k, v):
            gqa = {"enable_gqa": True} if k.shape[2] != q.shape[2] else {}
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True, **gqa)
            return out.transpose(1, 2)

        return sdpa
    from flash_attn.cute.interface import flash_attn_func

    @torch.compiler.disable
    def fa4(q, k, v):
        out = flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
        return out[0] if isinstance(out, tuple) else out

    return fa4


def build_model(args, attn):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    heads, kv, hd = args.width // args.head_dim, args.kv_heads, args.head_dim

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(args.width, bias=False), nn.LayerNorm(args.width, bias=False)
            self.qkv = nn.Linear(args.width, (heads + 2 * kv) * hd, bias=False)
            self.proj = nn.Linear(args.width, args.width, bias=False)
            self.fc = nn.Linear(args.width, 4 * args.width, bias=False)
            self.out = nn.Linear(4 * args.width, args.width, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split([heads * hd, kv * hd, kv * hd], dim=-1)
            y = attn(q.view(b, s, heads, hd), k.view(b, s, kv, hd), v.view(b, s, kv, hd))
            x = x + self.proj(y.reshape(b, s, heads * hd))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(VOCAB, args.width), nn.Embedding(args.seq, args.width)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.ln = nn.LayerNorm(args.width, bias=False)
            self.head = nn.Linear(args.width, VOCAB, bias=False)
            self.head.weight = self.tok.weight
            for name, p in self.named_parameters():  # nanoGPT's init; residual projections scaled down
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * args.layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            x = self.tok(idx) + self.pos.weight[: idx.shape[1]]
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln(x))
            return F.cross_entropy(logits.float().view(-1, VOCAB), targets.reshape(-1))

    torch.manual_seed(args.seed)
    return GPT()  # on the CPU: the same init whatever the device


@contextlib.contextmanager
def determinism(on: bool):
    """torch.use_deterministic_algorithms and inductor's deterministic mode for the block."""
    import torch

    if not on:
        yield
        return
    import torch._inductor.config as inductor

    before = torch.are_deterministic_algorithms_enabled(), getattr(inductor, "deterministic", None)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if before[1] is not None:
        inductor.deterministic = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=True)
        if before[1] is not None:
            inductor.deterministic = before[1]


class Timer:
    """Step times: CUDA events on a GPU (read after the run), the host clock on the CPU."""

    def __init__(self, device):
        import torch

        self.cuda, self.marks = device.type == "cuda", []
        self.event = (lambda: torch.cuda.Event(enable_timing=True)) if self.cuda else None

    def mark(self):
        if self.cuda:
            e = self.event()
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> list[float]:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks[::2], self.marks[1::2])]
        return [(b - a) * 1e3 for a, b in zip(self.marks[::2], self.marks[1::2])]


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:500]}"


def sdpa_choice(args, device) -> str:
    """Which SDPA backend torch picks at the run's shape (bf16, with grad): flash, cudnn, ..."""
    import torch
    from torch.nn.attention import SDPBackend

    heads = args.width // args.head_dim
    q = torch.randn(args.batch, heads, args.seq, args.head_dim, device=device, dtype=torch.bfloat16,
                    requires_grad=True)
    k = torch.randn(args.batch, args.kv_heads, args.seq, args.head_dim, device=device, dtype=torch.bfloat16,
                    requires_grad=True)
    choice = torch._fused_sdp_choice(q, k, k, is_causal=True, enable_gqa=args.kv_heads != heads)
    return {"FLASH_ATTENTION": "flash", "CUDNN_ATTENTION": "cudnn", "EFFICIENT_ATTENTION": "efficient",
            "MATH": "math"}.get(SDPBackend(choice).name, SDPBackend(choice).name.lower())


def time_attention(attn, args, device, iters: int = 20) -> float:
    """ms of one layer's attention forward + backward at the run's shape, back to back (eager)."""
    import torch

    heads, g = args.width // args.head_dim, torch.Generator(device=device).manual_seed(args.seed)
    shape = lambda h: (args.batch, args.seq, h, args.head_dim)  # noqa: E731
    q, k, v = (torch.randn(shape(h), device=device, dtype=torch.bfloat16, generator=g).requires_grad_()
               for h in (heads, args.kv_heads, args.kv_heads))
    dout = torch.randn(shape(heads), device=device, dtype=torch.bfloat16, generator=g)
    timer = Timer(device)
    for i in range(3 + iters):
        if i == 3:  # the GPU sleeps while the host queues the timed calls: GPU time, not launch time
            torch.cuda._sleep(SLEEP_CYCLES)
            timer.mark()
        torch.autograd.grad(attn(q, k, v), (q, k, v), dout)
    timer.mark()
    return timer.intervals_ms()[0] / iters


def explain(model, x, y) -> dict:
    """torch._dynamo.explain on one forward: graphs, graph breaks, the first reasons."""
    import torch

    e = torch._dynamo.explain(model)(x, y)
    torch._dynamo.reset()
    return {"graphs": e.graph_count, "graph_breaks": e.graph_break_count,
            "break_reasons": [str(r.reason).split("\n")[0][:200] for r in e.break_reasons[:5]]}


def train(args, backend: str, data, offsets, deterministic: bool, deadline: float) -> dict:
    """One run: fresh model from --seed, --steps steps over `offsets`; its record."""
    import torch

    device = torch.device(args.device)
    rec = {"backend": backend, "deterministic": deterministic, "status": "error"}
    t0 = time.perf_counter()
    if args.compile:
        torch._dynamo.reset()  # a fresh model compiles afresh (and far from the recompile limit)
    with determinism(deterministic):
        attn = attention_fn(backend, deterministic)
        raw = build_model(args, attn).to(device)
        decay = [p for p in raw.parameters() if p.dim() >= 2]
        rest = [p for p in raw.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")
        train_data = data[: int(len(data) * (1 - HELD_OUT))]
        span = torch.arange(args.seq + 1, device=device)
        offsets = offsets.to(device)  # once: a copy per step would wait for the GPU

        def batch(src, offs):  # (inputs, targets): --batch rows of --seq bytes and the bytes after them
            rows = src[offs[:, None] + span].long()
            return rows[:, :-1], rows[:, 1:]

        if backend == "sdpa":
            try:
                rec["sdpa_backend"] = sdpa_choice(args, device)
            except Exception as e:  # noqa: BLE001 (a private torch function: its name may move)
                rec["sdpa_backend"] = f"unknown ({one_line(e)})"
        model, autocast = raw, torch.autocast(device.type, dtype=torch.bfloat16)
        rec["compile"] = {"requested": args.compile}
        if args.compile:
            try:
                with autocast:
                    rec["compile"].update(explain(raw, *batch(train_data, offsets[0])))
            except Exception as e:  # noqa: BLE001
                rec["compile"]["explain_error"] = one_line(e)
            model = torch.compile(raw)
        losses = torch.zeros(args.steps, device=device)
        timer, steps_run = Timer(device), 0
        def one_step(step, model):  # the model that ran: raw again if compiling failed at the first step
            x, y = batch(train_data, offsets[step])
            warm = min(1.0, (step + 1) / args.lr_warmup) if args.lr_warmup else 1.0
            for group in opt.param_groups:
                group["lr"] = args.lr * warm * (0.55 + 0.45 * math.cos(math.pi * step / args.steps))
            timer.mark()
            try:
                with autocast:
                    loss = model(x, y)
                loss.backward()
            except Exception as e:
                if step or model is raw:
                    raise
                rec["compile"].update(ok=False, error=one_line(e))
                print(f"  [{backend}] torch.compile failed, eager instead: {rec['compile']['error']}", flush=True)
                model = raw
                opt.zero_grad(set_to_none=True)
                with autocast:
                    loss = model(x, y)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            timer.mark()
            losses[step] = loss.detach()
            return model

        for step in range(args.steps):
            try:
                model = one_step(step, model)
            except Exception as e:  # noqa: BLE001 (the steps that ran are kept)
                if not steps_run:
                    raise
                rec["error"] = f"step {step}: {one_line(e)}"
                break
            steps_run = step + 1
            if step == 0 and model is not raw:
                rec["compile"]["ok"] = True
            if step % args.log_every == 0 or step == args.steps - 1:
                print(f"  [{backend}] step {step:4d} loss {losses[step].item():.4f} "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
            now = time.perf_counter()
            if step < args.steps - 1 and (now - t0 > args.budget_s or now > deadline):
                rec["stopped_by"] = "--budget-s" if now - t0 > args.budget_s else "--total-s"
                break
        step_ms = timer.intervals_ms()
        rec["losses"] = losses[:steps_run].tolist()
        rec["steps_run"], rec["step_ms"] = steps_run, [round(t, 4) for t in step_ms]
        tokens = args.batch * args.seq
        rec["tokens_per_s"] = [round(tokens / t * 1e3) for t in step_ms]
        timed = step_ms[args.warmup:]
        rec["step_ms_median"] = statistics.median(timed) if timed else None
        rec["tokens_per_s_median"] = tokens / rec["step_ms_median"] * 1e3 if timed else None
        if "error" not in rec:  # the held-out loss (the same batches for every run), the attention's share
            held_out, g = data[int(len(data) * (1 - HELD_OUT)):], torch.Generator().manual_seed(args.seed + 2)
            with torch.no_grad(), autocast:
                evals = [raw(*batch(held_out, torch.randint(len(held_out) - args.seq - 1, (args.batch,),
                                                            generator=g).to(device)))
                         for _ in range(args.eval_batches)]
            rec["held_out_loss"] = torch.stack(evals).mean().item() if evals else None
            if device.type == "cuda" and timed:
                ms = time_attention(attn, args, device)
                rec["attention"] = {"fwd_bwd_ms_one_layer": ms,
                                    "share_estimate": ms * args.layers / rec["step_ms_median"]}
    rec["status"], rec["wall_s"] = "error" if "error" in rec else "ok", time.perf_counter() - t0
    return rec


def summary(rec: dict) -> str:
    if rec["status"] != "ok":
        return f"{rec['backend']}: {rec['status']}: {rec.get('error', '')}"
    s = f"{rec['backend']}: {rec['steps_run']} steps, loss {rec['losses'][-1]:.4f}"
    if rec.get("tokens_per_s_median"):
        s += f", {rec['step_ms_median']:.2f} ms/step, {rec['tokens_per_s_median'] / 1e6:.2f} M tok/s"
    if rec.get("attention"):
        s += f", attention ~{rec['attention']['share_estimate']:.0%}"
    return s + f" ({rec['wall_s']:.0f} s)"


def meta(args, corpus: dict) -> dict:
    import torch
    from lab.tools.bench_fwd_sm90 import _version, nvidia_smi
    from lab.tools.provenance import stamp

    cuda = args.device == "cuda"
    return stamp({
        "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        "driver": nvidia_smi("driver_version").get("driver_version") if cuda else None,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                     "cutlass_dsl": _version("nvidia-cutlass-dsl"), "flash_attn_4": _version("flash-attn-4"),
                     "python": platform.python_version()},
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "figure", "plot")},
        "corpus": corpus, "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }, "training")


def write(path, res):
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".tmp", "w") as fh:
            json.dump(res, fh, indent=1)
        os.replace(path + ".tmp", path)


def plot(res: dict, path: str, attention_gpu_us: dict | None = None) -> None:
    """Loss curves of every run overlaid; median tokens/s and step time per backend, and with
    attention_gpu_us ({backend: GPU us of one layer's attention forward + backward at the run's
    shape, attn_host_sm90.py}) the attention's share of a step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in res["runs"] if r.get("losses")]
    repeat = [r for r in (res.get("repeat_deterministic") or {}).get("runs", []) if r.get("losses")]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    for r in runs:
        ax.plot(r["losses"], lw=1.2, label=r["backend"])
    for i, r in enumerate(repeat):
        ax.plot(r["losses"], lw=0.8, ls="--", label=f"{r['backend']} deterministic #{i + 1}")
    ax.axhline(math.log(VOCAB), color="gray", lw=0.6, ls=":", label="uniform (ln 256)")
    ax.set(xlabel="step", ylabel="training loss (nats per byte)", title="loss per step, same seed and batches")
    ax.legend(fontsize=8)
    rep = res.get("repeat_deterministic")
    if rep and rep.get("bit_identical") is not None:
        ax.text(0.98, 0.95, f"deterministic repeat of {rep['backend']}: " + (
            "bit-identical" if rep["bit_identical"] else f"differs from step {rep['first_diff_step']}"),
            transform=ax.transAxes, ha="right", va="top", fontsize=8)
    timed = [r for r in runs if r.get("tokens_per_s_median")]
    bars = bx.bar([r["backend"] for r in timed], [r["tokens_per_s_median"] / 1e6 for r in timed], color="C0")
    layers = res["meta"]["config"]["layers"]
    for b, r in zip(bars, timed):
        us = (attention_gpu_us or {}).get(r["backend"])
        text = f"{r['tokens_per_s_median'] / 1e6:.2f} M/s"
        if r.get("step_ms_median"):
            text += f"\n{r['step_ms_median']:.1f} ms/step"
        if us and r.get("step_ms_median"):
            text += f"\nattention {us * layers / 1e3 / r['step_ms_median']:.0%}"
        bx.annotate(text, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    bx.set_ylim(0, 1.3 * max((r["tokens_per_s_median"] / 1e6 for r in timed), default=1))
    bx.set(ylabel="M tokens/s (median step)", title="throughput" + (
        " (attention: its GPU time per step)" if attention_gpu_us else ""))
    m, c = res["meta"], res["meta"]["config"]
    fig.suptitle(f"{m['device']}: {c['layers']} layers x {c['width']}, hd{c['head_dim']}, kv heads {c['kv_heads']}, "
                 f"{c['seq']} tokens x batch {c['batch']}, " + ("torch.compile" if c["compile"] else "eager"),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        sys.stderr.write(f"{self.prog}: {message}\n")
        sys.exit(2)


def parse_args(argv=None):
    ap = Parser(prog="train_gpt_sm90.py", description=__doc__.split("\n\n")[0],
                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attn", default=",".join(BACKENDS),
                    help=f"backends, comma-separated, one run each: {', '.join(BACKENDS)}")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: sdpa only (tests, smoke runs)")
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--seq", type=int, default=1024, help="context (tokens per sequence): a multiple of 8, 8-4096")
    ap.add_argument("--layers", type=int, default=6, help="transformer blocks")
    ap.add_argument("--width", type=int, default=384, help="model width: heads = width / head dim")
    ap.add_argument("--head-dim", type=int, default=64, help="fa4kernel takes 64, 96, 128, 192, 256")
    ap.add_argument("--kv-heads", type=int, default=None, help="K/V heads (dividing the heads; default: all, no GQA)")
    ap.add_argument("--seed", type=int, default=1234, help="init, batch order and held-out batches")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    ap.add_argument("--lr-warmup", type=int, default=30, help="steps of linear warm-up of the learning rate")
    ap.add_argument("--warmup", type=int, default=10, help="first steps left out of the timing medians")
    ap.add_argument("--eval-batches", type=int, default=8, help="held-out batches scored after each run")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile the model (default: on CUDA, off on the CPU)")
    ap.add_argument("--deterministic", action="store_true", help="every run in deterministic mode")
    ap.add_argument("--repeat-deterministic", action=argparse.BooleanOptionalAction, default=None,
                    help="run the first backend twice more, deterministic, and compare losses bit for bit "
                         "(default: on CUDA)")
    ap.add_argument("--budget-s", type=float, default=120.0,
                    help="stop one run after this many seconds (compiles included)")
    ap.add_argument("--total-s", type=float, default=480.0, help="start no run, and stop any, past this many seconds")
    ap.add_argument("--log-every", type=int, default=50, help="print the loss every this many steps")
    ap.add_argument("--out", default=None, help="the JSON to write (rewritten after every run; default: none)")
    ap.add_argument("--figure", default=None, help="a PNG of the loss curves and tokens/s (matplotlib)")
    ap.add_argument("--plot", default=None, metavar="FILE.json", help="only draw --figure from a result file (CPU)")
    args = ap.parse_args(argv)
    if args.plot:
        if not args.figure:
            ap.error("--plot needs --figure FILE.png")
        return args
    args.attn = [a.strip() for a in args.attn.split(",") if a.strip()]
    for a in args.attn:
        if a not in BACKENDS:
            ap.error(f"--attn {a!r}: unknown backend; one of {', '.join(BACKENDS)}")
    if not args.attn:
        ap.error("--attn: no backend given")
    for name in ("steps", "batch", "layers", "width", "head_dim", "log_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: at least 1")
    if args.seq % 8 or not 8 <= args.seq <= 4096:
        ap.error(f"--seq {args.seq}: a multiple of 8 from 8 to 4096")
    if args.width % args.head_dim:
        ap.error(f"--width {args.width}: a multiple of --head-dim {args.head_dim}")
    heads = args.width // args.head_dim
    args.kv_heads = args.kv_heads or heads
    if heads % args.kv_heads:
        ap.error(f"--kv-heads {args.kv_heads}: must divide the {heads} heads")
    if "fa4kernel" in args.attn and args.head_dim not in FA4KERNEL_HEAD_DIMS:
        ap.error(f"--head-dim {args.head_dim}: fa4kernel takes {', '.join(map(str, FA4KERNEL_HEAD_DIMS))}")
    if args.device == "cpu":
        gpu = [a for a in args.attn if a in GPU_ONLY]
        if gpu:
            ap.error(f"--attn {','.join(gpu)}: needs a CUDA GPU (sm_90); on the CPU only sdpa runs")
    for flag, cuda_default in (("compile", True), ("repeat_deterministic", True)):
        if getattr(args, flag) is None:
            setattr(args, flag, cuda_default and args.device == "cuda")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot:
        with open(args.plot) as fh:
            plot(json.load(fh), args.figure)
        print(f"wrote {args.figure}")
        return 0
    start = time.perf_counter()
    if args.deterministic or args.repeat_deterministic:  # cuBLAS's deterministic workspace, before CUDA starts
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if args.device == "cuda":
        from lab.tools.hopper import require_hopper

        require_hopper("train_gpt_sm90.py", "--device cpu --attn sdpa runs on the CPU")
    import torch

    if args.device == "cpu":
        torch.set_num_threads(1)  # the CPU path's models are tiny: more threads only wait on each other
    raw, corpus = corpus_bytes()
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    span = int(len(data) * (1 - HELD_OUT)) - args.seq - 1
    offsets = torch.randint(span, (args.steps, args.batch), generator=torch.Generator().manual_seed(args.seed + 1))
    if args.device == "cuda":
        data = data.cuda()
    res = {"meta": meta(args, corpus), "runs": []}
    print(f"corpus: {corpus['files']} files, {corpus['bytes'] / 1e6:.1f} MB; {args.layers} layers x {args.width}, "
          f"{args.seq} tokens x batch {args.batch}, {args.steps} steps, compile {args.compile}", flush=True)

    def run(backend, deterministic):
        if time.perf_counter() - start > args.total_s:
            return {"backend": backend, "deterministic": deterministic, "status": "skipped: --total-s"}
        try:
            rec = train(args, backend, data, offsets, deterministic, start + args.total_s)
        except Exception as e:  # noqa: BLE001 (recorded; the next backend runs)
            rec = {"backend": backend, "deterministic": deterministic,
                   "status": "unavailable" if isinstance(e, ImportError) else "error", "error": one_line(e)}
        if args.device == "cuda":
            torch.cuda.empty_cache()
        print(summary(rec), flush=True)
        return rec

    for backend in args.attn:
        res["runs"].append(run(backend, args.deterministic))
        write(args.out, res)
    if args.repeat_deterministic:
        pair = [run(args.attn[0], True) for _ in range(2)]
        a, b = ([repr(x) for x in r.get("losses") or []] for r in pair)  # repr: NaN equals NaN
        rep = {"backend": args.attn[0], "runs": pair, "bit_identical": None, "first_diff_step": None}
        if a and b:
            n = min(len(a), len(b))
            rep["compared_steps"], rep["bit_identical"] = n, a[:n] == b[:n]
            rep["first_diff_step"] = next((i for i in range(n) if a[i] != b[i]), None)
        res["repeat_deterministic"] = rep
        print(f"deterministic repeat of {args.attn[0]}: bit-identical {rep['bit_identical']}"
              + (f" (first difference at step {rep['first_diff_step']})" if rep["first_diff_step"] is not None else ""))
        write(args.out, res)
    if args.figure:
        try:
            plot(res, args.figure)
        except Exception as e:  # noqa: BLE001 (e.g. no matplotlib here: draw it later with --plot)
            print(f"figure not drawn ({type(e).__name__}: {e}); later: --plot {args.out} --figure {args.figure}")
    print(f"done in {time.perf_counter() - start:.0f} s" + (f"; wrote {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
