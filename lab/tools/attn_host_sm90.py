"""Host time against GPU time of one attention call (forward, forward + backward) at a training
shape, per backend, and the kernels each call launches: what part of an attention's cost in a
training step is the host's launch path and what part the GPU's.

    python3 lab/tools/attn_host_sm90.py --out FILE.json [--batch 16 --seq 1024 --heads 6 --kv-heads 6
        --head-dim 64 --attn fa4kernel,sdpa,flash-attn-4 --calls 50]

For each backend (train_gpt_sm90.attention_fn: the same calls the training run makes, causal):
- host_us: the host's time to queue one call while the GPU sleeps (torch.cuda._sleep first, so the
  queue never fills and no call waits on the GPU);
- gpu_us: the GPU's time per call over the same queued calls (CUDA events after the sleep): the
  calls run back to back, so no host time is in it;
- kernels: every kernel one call launches and its GPU time (torch.profiler), in launch order.
A call whose host_us exceeds its gpu_us is host-bound wherever nothing else fills the GPU.
For fa4kernel also the host time of its parts ("parts"): the forward without autograd, the torch
ops fa4lab.attention_fwd and fa4lab.attention_bwd called directly (as a torch.compile graph calls
them: AOTAutograd traces the op's autograd formula, so no autograd Function runs per call), the
backward without the op, and the same forward + backward through fa4kernel.attention's own
autograd Function instead of the op's.
Needs a CUDA GPU (sm_90).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lab.tools.hopper import require_hopper  # noqa: E402
from lab.tools.train_gpt_sm90 import BACKENDS, SLEEP_CYCLES, attention_fn  # noqa: E402


def inputs(args, grad: bool):
    import torch

    g = torch.Generator(device="cuda").manual_seed(1)
    shape = lambda h: (args.batch, args.seq, h, args.head_dim)  # noqa: E731
    q, k, v = (torch.randn(shape(h), device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(grad)
               for h in (args.heads, args.kv_heads, args.kv_heads))
    return q, k, v, torch.randn(shape(args.heads), device="cuda", dtype=torch.bfloat16, generator=g)


def measure(call, calls: int) -> dict:
    """host_us and gpu_us per call of call() (see the module docstring)."""
    import torch

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    host = time.perf_counter() - t0
    end.record()
    end.synchronize()
    return {"host_us": host / calls * 1e6, "gpu_us": start.elapsed_time(end) / calls * 1e3}


def kernels(call) -> list:
    """[(kernel name, GPU us)] of one call, in launch order."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [(e.name[:120], round(e.device_time, 2)) for e in sorted(evs, key=lambda e: e.time_range.start)]


def run(args, backend: str) -> dict:
    import torch

    attn = attention_fn(backend, False)
    q, k, v, dout = inputs(args, True)
    fwd = lambda: attn(q.detach(), k.detach(), v.detach())  # noqa: E731
    both = lambda: torch.autograd.grad(attn(q, k, v), (q, k, v), dout)  # noqa: E731
    rec = {"backend": backend}
    for name, call in (("fwd", fwd), ("fwd_bwd", both)):
        rec[name] = measure(call, args.calls)
        rec[name]["kernels"] = kernels(call)
    if backend == "fa4kernel":
        rec["parts"] = {name: measure(call, args.calls)["host_us"] for name, call in fa4kernel_parts(q, k, v, dout).items()}
    return rec


def fa4kernel_parts(q, k, v, dout) -> dict:
    """fa4kernel's calls, each alone (the module docstring's "parts")."""
    import torch

    import fa4kernel
    import fa4kernel.ops  # noqa: F401  (registers torch.ops.fa4lab)
    from fa4kernel.autograd import attention_backward

    qd, kd, vd = q.detach(), k.detach(), v.detach()
    out, lse = fa4kernel.attention(qd, kd, vd, causal=True, return_lse=True)
    return {
        "attention (forward, no autograd)": lambda: fa4kernel.attention(qd, kd, vd, causal=True, return_lse=True),
        "op attention_fwd": lambda: torch.ops.fa4lab.attention_fwd(qd, kd, vd, True, None, False),
        "attention_backward": lambda: attention_backward(dout, qd, kd, vd, out, lse, True, None, False),
        "op attention_bwd": lambda: torch.ops.fa4lab.attention_bwd(dout, qd, kd, vd, out, lse, True, None, False),
        "forward + backward through fa4kernel.attention's autograd Function":
            lambda: torch.autograd.grad(fa4kernel.attention(q, k, v, causal=True), (q, k, v), dout),
    }


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", required=True, help="results JSON")
    ap.add_argument("--attn", default=",".join(BACKENDS), help=f"backends, from {','.join(BACKENDS)}")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=6)
    ap.add_argument("--head-dim", type=int, default=64, choices=(64, 96, 128, 192, 256))
    ap.add_argument("--calls", type=int, default=50, help="calls queued per measurement (1-200; the GPU's "
                    "sleep covers about 40 calls of 5 ms of host time each)")
    a = ap.parse_args(argv)
    bad = [b for b in a.attn.split(",") if b not in BACKENDS]
    if bad:
        ap.error(f"--attn {bad[0]}: allowed {', '.join(BACKENDS)}")
    for name in ("batch", "seq", "heads", "kv_heads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(a, name)}: must be >= 1")
    if a.heads % a.kv_heads:
        ap.error(f"--kv-heads {a.kv_heads}: must divide --heads {a.heads}")
    if not 1 <= a.calls <= 200:
        ap.error(f"--calls {a.calls}: allowed 1-200")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    require_hopper("attn_host_sm90.py")
    import datetime as dt
    import platform

    import torch

    from lab.tools.bench_fwd_sm90 import _version, nvidia_smi
    from lab.tools.provenance import stamp

    res = {"meta": stamp({
        "device": torch.cuda.get_device_name(0), "driver": nvidia_smi("driver_version").get("driver_version"),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                     "cutlass_dsl": _version("nvidia-cutlass-dsl"), "flash_attn_4": _version("flash-attn-4"),
                     "python": platform.python_version()},
        "config": {k: v for k, v in vars(args).items() if k != "out"}}, "attn_host"), "runs": []}
    for backend in args.attn.split(","):
        try:
            rec = run(args, backend)
        except Exception as e:  # a peer that does not run here: recorded, the others go on
            rec = {"backend": backend, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        res["runs"].append(rec)
        for name in ("fwd", "fwd_bwd"):
            if name in rec:
                r = rec[name]
                print(f"{backend:13s} {name:8s} host {r['host_us']:7.1f} us  gpu {r['gpu_us']:7.1f} us  "
                      f"{len(r['kernels'])} kernels: " + ", ".join(f"{n[:40]} {t}" for n, t in r["kernels"]))
        for name, us in rec.get("parts", {}).items():
            print(f"{backend:13s} host {us:7.1f} us  {name}")
        if "error" in rec:
            print(f"{backend}: {rec['error']}")
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
