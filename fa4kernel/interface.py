"""The entry points: attention() picks the kernel by the GPU's architecture, compile_sass()
compiles either kernel on a machine without a GPU; the SM90 kernel's host side (compile cache,
tile schedule, launch) and its diagnostic launches (attention_traced, attention_probed).

Plain Python at import: torch and the CuTe DSL are imported when a function needs them.
"""

from __future__ import annotations

import math
import os
import time
from typing import Optional

from .diagnostics import NONE, Diagnostics, probe_build, trace_build
from .inputs import capability, device_props, validate_device, validate_tensors
from .interop import to_cute, torch_stream, tvm_ffi_enabled
from .sass import sass_for
from .sm90.bwd_config import BWD_KNOB_NAMES, BwdConfig, bwd_config_from_knobs, check_bwd_knob_names
from .sm90.config import SUPPORTED_HEAD_DIMS, KernelConfig, make_config

# The architectures with a kernel: compute capability -> (compile target, kernel)
ARCHS = {(9, 0): ("sm_90a", "the SM90 (Hopper) forward"), (10, 0): ("sm_100a", "the SM100 (Blackwell) forward")}
_SUPPORTED = "sm_90 (H100, H200) or sm_100 (B200)"

_CACHE: dict = {}  # build key (_build_key) -> compiled callable
COMPILE_TIMES: dict = {}  # build key -> seconds spent in the first (JIT) compile


def _build_key(cfg: KernelConfig, diag: Diagnostics = NONE):
    """The compile-cache key of a build: the KernelConfig alone for the normal kernel (so
    COMPILE_TIMES[cfg] is its compile time), (cfg, diagnostics) for a diagnostic build."""
    return cfg if diag == NONE else (cfg, diag)


def _cutlass_dtype(name: str):
    import cutlass

    return cutlass.BFloat16 if name == "bfloat16" else cutlass.Float16


def _fake_args(cfg: KernelConfig):
    """Fake tensors with dynamic batch / seqlen / heads (q's and k/v's) / strides (16-byte aligned rows)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    dt = _cutlass_dtype(cfg.dtype)
    div = 128 // dt.width  # strides are multiples of 8 elements = 16 bytes

    def fake(shape_syms):
        stride = tuple(cute.sym_int64(divisibility=div) for _ in range(3)) + (1,)
        return make_fake_tensor(dt, shape_syms, stride=stride, assumed_align=16)

    b, sq, sk, h, hkv = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
    q = fake((b, sq, h, cfg.head_dim))
    k = fake((b, sk, hkv, cfg.head_dim))  # GQA / MQA: heads_kv divides heads
    v = fake((b, sk, hkv, cfg.head_dim))
    o = fake((b, sq, h, cfg.head_dim))
    lse = None
    if cfg.has_lse:
        lse = make_fake_tensor(cutlass.Float32, (b, h, sq),
                               stride=(cute.sym_int64(), cute.sym_int64(), 1), assumed_align=4)
    return q, k, v, o, lse


def _fake_decode_args(cfg: KernelConfig):
    """The decode build's fake tensors (FlashFwdSm90Decode): packed q, the cache, out (q's dtype,
    or fp32 partials with split_kv: their batch is num_splits x b), lse, the per-row key counts."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    dt = _cutlass_dtype(cfg.dtype)
    b, b_out, rows, sk, hkv = (cute.sym_int() for _ in range(5))

    def fake(dtype, shape_syms, div):
        stride = tuple(cute.sym_int64(divisibility=div) for _ in range(len(shape_syms) - 1)) + (1,)
        return make_fake_tensor(dtype, shape_syms, stride=stride, assumed_align=16 if div > 1 else 4)

    div = 128 // dt.width  # 16-byte aligned rows (TMA)
    q = fake(dt, (b, rows, hkv, cfg.head_dim), div)
    k = fake(dt, (b, sk, hkv, cfg.head_dim), div)
    v = fake(dt, (b, sk, hkv, cfg.head_dim), div)
    if cfg.split_kv:
        o = fake(cutlass.Float32, (b_out, rows, hkv, cfg.head_dim), 4)
    else:
        o = fake(dt, (b_out, rows, hkv, cfg.head_dim), div)
    lse = fake(cutlass.Float32, (b_out, hkv, rows), 1)
    seqused = make_fake_tensor(cutlass.Int32, (b,), stride=(1,), assumed_align=4)
    return q, k, v, o, lse, seqused


def _compile_decode(cfg: KernelConfig, options=None):
    import cutlass.cute as cute
    from cutlass import Float32, Int32

    from .sm90.fwd import make_kernel

    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=options == "--enable-tvm-ffi")
    q, k, v, o, lse, seqused = _fake_decode_args(cfg)
    return cute.compile(make_kernel(cfg), q, k, v, o, lse, seqused, Int32(1), Int32(1), Float32(1.0), stream,
                        options=options)


def _fake_varlen_args(cfg: KernelConfig):
    """The varlen build's fake tensors (FlashFwdSm90Varlen): q, k, v, out as one packed batch row,
    lse (1, heads, total_q) or None, cu_seqlens_q and _k, the CTA count, the tile counter; with
    pack_gqa (FlashFwdSm90VarlenPacked) the group too."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32
    from cutlass.cute.runtime import make_fake_tensor

    q, k, v, o, lse = _fake_args(cfg)
    if cfg.pack_gqa and lse is not None:
        # packed q is (1, total_q x group, 1, d) while lse keeps (1, heads, total_q): its own sizes
        # (sharing q's would make the launch check lse.shape[1] == 1)
        lse = make_fake_tensor(cutlass.Float32, (cute.sym_int(), cute.sym_int(), cute.sym_int()),
                               stride=(cute.sym_int64(), cute.sym_int64(), 1), assumed_align=4)
    n = cute.sym_int()
    cu = [make_fake_tensor(cutlass.Int32, (n,), stride=(1,), assumed_align=4) for _ in range(2)]
    counter = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), stride=(1,), assumed_align=4)
    group = (Int32(1),) if cfg.pack_gqa else ()
    return (q, k, v, o, lse, cu[0], cu[1], Int32(1), counter, *group)


def _compile_varlen(cfg: KernelConfig, options=None):
    import cutlass.cute as cute
    from cutlass import Float32, Int32

    from .sm90.fwd import make_kernel

    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=options == "--enable-tvm-ffi")
    return cute.compile(make_kernel(cfg), *_fake_varlen_args(cfg), Float32(1.0), stream, options=options)


def run_varlen(cfg: KernelConfig, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, tiles: int, softmax_scale,
               group: int = 1):
    """Launch the varlen build (FlashFwdSm90Varlen) on torch tensors: q, k, v, out (1, total, heads,
    d), lse (1, heads, total_q) or None, cu_seqlens int32 on q's device, at most `tiles` Q tiles
    (varlen.tile_bound); with cfg.pack_gqa (FlashFwdSm90VarlenPacked) q and out (1, total_q x group,
    1, d) and the group. Compiled once per config (TVM-FFI when installed, else DLPack per call)."""
    global _USE_TVM_FFI
    from cutlass import Float32, Int32

    from .varlen import grid_ctas

    scale_log2 = _scale_log2(q, softmax_scale)
    num_ctas = grid_ctas(cfg.persistent, tiles, _max_ctas(q.device))
    counter = _tile_counter(q.device)
    fn = _CACHE.get(cfg)
    if fn is None:
        t0 = time.perf_counter()
        fn = _compile_varlen(cfg, "--enable-tvm-ffi" if _USE_TVM_FFI else None)
        COMPILE_TIMES[cfg] = time.perf_counter() - t0
        _CACHE[cfg] = fn
    packed = (group,) if cfg.pack_gqa else ()
    if _USE_TVM_FFI:
        fn(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, num_ctas, counter, *packed, scale_log2)
        return
    args = [to_cute(t, 3) for t in (q, k, v, out)]
    fn(*args, to_cute(lse, 2, align=4) if lse is not None else None, to_cute(cu_seqlens_q, 0, align=4),
       to_cute(cu_seqlens_k, 0, align=4), Int32(num_ctas), to_cute(counter, 0, align=4),
       *(Int32(g) for g in packed), Float32(scale_log2), torch_stream(q.device))


_TILE_COUNTERS: dict = {}  # (device, stream) -> the varlen build's tile counter, int32 (1,)


def _tile_counter(device):
    """The persistent varlen build's tile counter for the current stream: zeroed once here, left
    zero by every launch (its last fetch resets it), so launches in one stream share it; one
    per stream, as launches in two streams may run at once."""
    import torch

    key = (device, torch.cuda.current_stream(device).cuda_stream)
    c = _TILE_COUNTERS.get(key)
    if c is None:
        c = _TILE_COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return c


def _scale_log2(q, softmax_scale) -> float:
    """softmax_scale (None: 1 / sqrt(head_dim)) in log2 units, as the kernels take it; decides the
    launch path (TVM-FFI or DLPack) on first use."""
    global _USE_TVM_FFI
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    if _USE_TVM_FFI is None:
        _USE_TVM_FFI = tvm_ffi_enabled()
    return float(softmax_scale * math.log2(math.e))


def run_decode(cfg: KernelConfig, q, k, v, out, lse, seqused_k, group: int, num_splits: int, softmax_scale):
    """Launch the decode build (FlashFwdSm90Decode) on torch tensors: q packed (b, rows, heads_kv,
    d), out / lse as the build writes them, seqused_k (b,) int32 on q's device. Compiled once per
    config (TVM-FFI when installed, else DLPack per call)."""
    global _USE_TVM_FFI
    from cutlass import Float32, Int32

    scale_log2 = _scale_log2(q, softmax_scale)
    fn = _CACHE.get(cfg)
    if fn is None:
        t0 = time.perf_counter()
        fn = _compile_decode(cfg, "--enable-tvm-ffi" if _USE_TVM_FFI else None)
        COMPILE_TIMES[cfg] = time.perf_counter() - t0
        _CACHE[cfg] = fn
    if _USE_TVM_FFI:
        fn(q, k, v, out, lse, seqused_k, group, num_splits, scale_log2)
        return
    args = [to_cute(t, 3) for t in (q, k, v)] + [to_cute(out, 3, align=16 if out.element_size() == 2 else 4)]
    fn(*args, to_cute(lse, 2, align=4), to_cute(seqused_k, 0, align=4), Int32(group), Int32(num_splits),
       Float32(scale_log2), torch_stream(q.device))


def _compile_combine(dtype: str, head_dim: int, options=None):
    """The split-KV combine (sm90/combine.py) against fake tensors with dynamic shapes and strides."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32
    from cutlass.cute.runtime import make_fake_tensor

    from .sm90.combine import CombineSm90

    def fake(dt, rank, d=None):
        shape = tuple(cute.sym_int() for _ in range(rank - 1)) + ((d,) if d else (cute.sym_int(),))
        stride = tuple(cute.sym_int64() for _ in range(rank - 1)) + (1,)
        return make_fake_tensor(dt, shape, stride=stride, assumed_align=4 if dt.width == 32 else 2)

    f32 = cutlass.Float32
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=options == "--enable-tvm-ffi")
    return cute.compile(CombineSm90(dtype, head_dim), fake(f32, 4, head_dim), fake(f32, 3),
                        fake(_cutlass_dtype(dtype), 4, head_dim), fake(f32, 3), Int32(1), Int32(1), stream,
                        options=options)


def compile_combine_sass(dtype: str = "bfloat16", head_dim: int = 128) -> str:
    """The split-KV combine's SASS for sm_90a, compiled on this machine (no GPU needed)."""
    return sass_for(lambda options: _compile_combine(dtype, head_dim, options), "sm_90a",
                    cache=("sm90_combine", (dtype, head_dim)))


def run_combine(out_accum, lse_accum, out, lse, group: int, num_splits: int):
    """Launch the split-KV combine (sm90/combine.py): out_accum (num_splits * b, rows, heads_kv, d)
    and lse_accum (num_splits * b, heads_kv, rows) fp32 -> out (b, seqlen_q, heads, d) in its
    dtype and lse (b, heads, seqlen_q) fp32."""
    global _USE_TVM_FFI
    from cutlass import Int32

    if _USE_TVM_FFI is None:
        _USE_TVM_FFI = tvm_ffi_enabled()
    dtype = "bfloat16" if out.dtype == __import__("torch").bfloat16 else "float16"
    key = ("combine", dtype, out.shape[-1])
    fn = _CACHE.get(key)
    if fn is None:
        t0 = time.perf_counter()
        fn = _compile_combine(dtype, out.shape[-1], "--enable-tvm-ffi" if _USE_TVM_FFI else None)
        COMPILE_TIMES[key] = time.perf_counter() - t0
        _CACHE[key] = fn
    if _USE_TVM_FFI:
        fn(out_accum, lse_accum, out, lse, group, num_splits)
        return
    fn(to_cute(out_accum, 3, align=4), to_cute(lse_accum, 2, align=4), to_cute(out, 3, align=2),
       to_cute(lse, 2, align=4), Int32(group), Int32(num_splits), torch_stream(out.device))


def _scheduled(cfg: KernelConfig) -> bool:
    """Persistent and causal launches take the host's tile table (tile_schedule.py); a
    non-persistent non-causal launch runs one CTA per tile in index order."""
    return cfg.persistent or cfg.causal


def _fake_sched(cfg: KernelConfig):
    """The host's tile schedule as the kernel takes it: (CTAs, width) int32, row-major."""
    if not _scheduled(cfg):
        return None
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    return make_fake_tensor(cutlass.Int32, (cute.sym_int(), cute.sym_int()),
                            stride=(cute.sym_int64(), 1), assumed_align=4)


def _fake_trace():
    import cutlass
    from cutlass.cute.runtime import make_fake_tensor

    from .trace_layout import TRACE_WORDS

    return make_fake_tensor(cutlass.Int64, (TRACE_WORDS,), stride=(1,), assumed_align=16)


def compile_sass(cfg=None, arch: str = "sm_90a", *, dtype: str = "bfloat16", head_dim: int = 128,
                 causal: bool = False, return_lse: bool = False, diagnostics: Diagnostics = NONE,
                 dump_dir: Optional[str] = None, **knobs) -> str:
    """Compile one kernel for `arch` on this machine, no GPU needed, and return its SASS (the
    text nvdisasm prints). Needs nvidia-cutlass-dsl (ptxas and nvdisasm come with it).

    arch "sm_90a": the SM90 forward (Hopper); arch "sm_100a": the SM100 forward (Blackwell).
    Either pass a configuration (sm90.KernelConfig from make_config, or sm100.Sm100Config from
    sm100.make_sm100_config), or the problem and knobs as attention() takes them (validated
    first, one-line ValueError; knobs left out take the kernel's defaults: fa4kernel/README.md
    lists the SM90 knobs, fa4kernel/sm100/README.md the SM100 ones). The tensors are fake, with
    dynamic batch, sequence lengths and heads: the SASS is the one every launch of that build runs.
    diagnostics: an SM90 diagnostic build (diagnostics.trace_build(), probe_build(...)).
    dump_dir: keep the compiler's files (cubin, PTX) there instead of a temporary directory.
    The SASS is kept in an on-disk cache keyed by the configuration, fa4kernel's sources and the
    toolchain (fa4kernel/compile_cache.py: FA4LAB_CACHE=off turns it off, `python -m
    fa4kernel.compile_cache --clear` empties it); with dump_dir the compile always runs.

        sass = fa4kernel.compile_sass(head_dim=64, causal=True)             # SM90 defaults
        sass = fa4kernel.compile_sass(arch="sm_100a", exp_emulation=0.25)    # SM100, hd128
        from fa4kernel.sass import kv_loop; print(len(kv_loop(sass)))        # its KV loop
    """
    if arch == "sm_90a":
        if cfg is None:
            cfg = make_config(dtype, head_dim, causal, return_lse, knobs)
        elif not isinstance(cfg, KernelConfig):
            raise ValueError(f"cfg={type(cfg).__name__} is not the SM90 kernel's; allowed with arch='sm_90a': "
                             f"None or a KernelConfig (fa4kernel.make_config)")
        if not isinstance(diagnostics, Diagnostics):
            raise ValueError(f"diagnostics={diagnostics!r}; allowed: a fa4kernel.diagnostics.Diagnostics")
        return _compile_sm90_sass(cfg, diagnostics, dump_dir)
    if arch == "sm_100a":
        from .sm100.config import Sm100Config, make_sm100_config

        if diagnostics != NONE:
            raise ValueError("diagnostics: the SM100 kernel has no diagnostic builds; allowed: the default")
        if cfg is None:
            cfg = make_sm100_config(head_dim, causal, dtype=dtype, return_lse=return_lse, **knobs)
        elif not isinstance(cfg, Sm100Config):
            raise ValueError(f"cfg={type(cfg).__name__} is not the SM100 kernel's; allowed with arch='sm_100a': "
                             f"None or an Sm100Config (fa4kernel.sm100.make_sm100_config)")
        from .compile_cache import cached
        from .sm100.fwd import compile_sm100_config

        # the on-disk SASS cache (compile_cache.py); with dump_dir the compile runs (its files are wanted)
        return cached("sm100_fwd", arch, cfg, lambda: compile_sm100_config(cfg, dump_dir), refresh=dump_dir is not None)
    raise ValueError(f"arch={arch!r} not supported; allowed: 'sm_90a' (SM90 forward) or 'sm_100a' (SM100 forward)")


def compile_bwd_sass(cfg: Optional[BwdConfig] = None, *, dtype: str = "bfloat16", head_dim: int = 128,
                     causal: bool = False, deterministic: bool = False, dump_dir: Optional[str] = None,
                     clock_probe: bool = False, **bwd_knobs) -> str:
    """Compile the SM90 backward (sm90/bwd.py) for sm_90a on this machine, no GPU needed, and
    return its SASS. Pass a BwdConfig (sm90.bwd_config.make_bwd_config) or the arguments and
    backward knobs (dq_reduce, dq_smem, dq_sum, stats, mma_order, preprocess, tile_m; checked first:
    one-line ValueError). Fake tensors with dynamic batch, lengths and heads, as compile_sass.
    clock_probe: the clock-probe build (FlashBwdSm90Probe) instead of the normal one."""
    if cfg is None:
        cfg = bwd_config_from_knobs(dtype, head_dim, causal, deterministic, bwd_knobs)
    elif not isinstance(cfg, BwdConfig):
        raise ValueError(f"cfg={type(cfg).__name__}; allowed: None or a BwdConfig (fa4kernel.make_bwd_config)")

    def build(options):
        from .sm90.bwd import compile_bwd

        compile_bwd(cfg, options, clock_probe=bool(clock_probe))

    kind = "sm90_bwd_probe" if clock_probe else "sm90_bwd"
    return sass_for(build, "sm_90a", dump_dir, cache=(kind, cfg))


def _compile_sm90_sass(cfg: KernelConfig, diag: Diagnostics, dump_dir: Optional[str]) -> str:
    import cutlass.cute as cute
    from cutlass import Float32

    from .sm90.fwd import make_kernel

    if cfg.decode or cfg.varlen:
        if diag != NONE:
            raise ValueError("diagnostics: the decode and varlen builds have none; allowed: the default")
        build = _compile_decode if cfg.decode else _compile_varlen
        return sass_for(lambda options: build(cfg, options), "sm_90a", dump_dir, cache=("sm90_fwd", (cfg, diag)))

    def build(options):
        q, k, v, o, lse = _fake_args(cfg)
        stream = cute.runtime.make_fake_stream()
        extra = (_fake_trace(),) if diag.buffered else ()
        cute.compile(make_kernel(cfg, diag), q, k, v, o, lse, _fake_sched(cfg), Float32(1.0), *extra, stream,
                     options=options)

    return sass_for(build, "sm_90a", dump_dir, cache=("sm90_fwd", (cfg, diag)))


# Short causal launches take smaller tiles: the diagonal wastes more of a big tile. Measured
# (H200, 16k tokens, one run of lab/tools/tile_choice_sm90.py): hd64 tile_m 128 instead of 192:
# 1k causal 334 vs 299 TFLOP/s, 2k 395 vs 420 (so <= 1k only; non-causal 1k 413 vs 438). Again
# once idle warpgroups skip their work (H100): 1k causal 327 vs 312, 2k 397 vs 427. (hd256 took
# tile_n 64 here too; it is now its default.) The runs: lab/campaigns/kernel-sm90-forward/ (tile
# choice); lab/findings/kernel-tiles-sm90.md.
SHORT_CAUSAL_MAX_SEQLEN_Q = 1024
SHORT_CAUSAL_TILES = {64: {"tile_m": 128, "tile_n": 128}}


# Long launches without a mask at hd256 take 80 keys per KV block (FlashAttention-3's and
# flash-attn-4's tile), once P converts one cvt per pair at that shape (convert.py). Measured
# side by side on an H200, settled (lab/campaigns/kernel-sm90-peers/, 20 problems): no mask,
# seqlen_k 2k-16k +0.7..+4.3 % over 64 keys, 1k -1.7 %; causal 64 keys stay (80 loses up to 3 %
# at 2k-8k: a 128-row tile's diagonal crosses more, partly masked, 80-key blocks).
LONG_MIN_SEQLEN_K = 2048
LONG_TILES = {256: {"tile_n": 80}}


def tile_rule(d: int, causal: bool, sq: int, sk: int) -> dict:
    """The tile shape a launch takes where it departs from its head dim's default (a dict of
    tile_m / tile_n, or {}): SHORT_CAUSAL_TILES for short causal launches, LONG_TILES for long
    launches without a mask."""
    if causal and sq <= SHORT_CAUSAL_MAX_SEQLEN_Q:
        return SHORT_CAUSAL_TILES.get(d, {})
    if not causal and sk >= LONG_MIN_SEQLEN_K:
        return LONG_TILES.get(d, {})
    return {}


def resolve_config(q, k, v, causal: bool = False, return_lse: bool = False, **knobs) -> KernelConfig:
    """The KernelConfig attention() runs for these tensors and knobs (knob defaults resolved,
    including the tile shapes of short causal and long unmasked launches, tile_rule)."""
    b, sq, sk, h, d, dtype = validate_tensors(q, k, v, causal, None, return_lse, head_dims=SUPPORTED_HEAD_DIMS,
                                              gqa=True)
    if knobs.get("tile_m") is None and knobs.get("tile_n") is None:
        knobs = {**tile_rule(d, causal, sq, sk), **knobs}
    return make_config(dtype, d, causal, return_lse, knobs)


def _backward_knobs(dq_reduce, bwd_knobs) -> dict:
    """attention()'s backward knobs as one dict; names checked (one-line ValueError), values when
    the backward is built (make_bwd_config)."""
    if bwd_knobs is None:
        bwd_knobs = {}
    if not isinstance(bwd_knobs, dict):
        raise ValueError(f"bwd_knobs={type(bwd_knobs).__name__}; allowed: None or a dict of backward knobs")
    check_bwd_knob_names(bwd_knobs, tuple(n for n in BWD_KNOB_NAMES if n != "deterministic"), "bwd_knobs:")
    if dq_reduce is not None:
        if "dq_reduce" in bwd_knobs and bwd_knobs["dq_reduce"] != dq_reduce:
            raise ValueError(f"dq_reduce={dq_reduce!r} and bwd_knobs dq_reduce={bwd_knobs['dq_reduce']!r}; "
                             "allowed: one of them, or the same value")
        bwd_knobs = {**bwd_knobs, "dq_reduce": dq_reduce}
    return bwd_knobs


def attention(q, k, v, causal: bool = False, softmax_scale: Optional[float] = None,
              return_lse: bool = False, *, deterministic: bool = False, dq_reduce: Optional[str] = None,
              bwd_knobs: Optional[dict] = None, cu_seqlens_q=None, cu_seqlens_k=None,
              max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None, **knobs):
    """softmax(q k^T * scale [+ causal mask]) v for q, k, v (batch, seqlen, heads, head_dim);
    k and v may have fewer heads (GQA / MQA on SM90: heads_kv divides heads).

    Runs the kernel of the GPU q is on: sm_90 (H100, H200) the SM90 forward, sm_100 (B200) the
    SM100 forward (sm100/README.md; compiled and checked on the CPU only, it has not run on a GPU).
    Returns out (same shape/dtype as q), and lse (batch, heads, seqlen_q) fp32 (natural log) if
    return_lse. Causal with seqlen_q != seqlen_k is bottom-right aligned (flash_attn's convention).
    softmax_scale: None = 1 / sqrt(head_dim). Knobs: the kernel's (fa4kernel/README.md for SM90,
    KNOB_NAMES; sm100/README.md for SM100). Bad input raises a one-line ValueError.

    With grad mode on and q, k or v requiring grad (SM90), out has a grad_fn: the SM90 backward
    (sm90/bwd.py) fills their .grad; deterministic=True makes its dQ reduction run in a fixed
    order (fa4kernel/README.md, "Backward"). bwd_knobs: a dict of the backward's knobs
    (sm90/bwd_config.py: dq_reduce, dq_smem, dq_sum, stats, mma_order, preprocess, tile_m; left out: their
    defaults), e.g. bwd_knobs={"tile_m": 128} at head_dim 64; dq_reduce= is the same as
    bwd_knobs={"dq_reduce": ...}. **knobs apply to the forward only. Arguments the backward does
    not support raise here.

    Varlen (packed sequences of unequal lengths, SM90; fa4kernel/varlen.py, docs/varlen.md): q
    (total_q, heads, d), k / v (total_k, heads_kv, d), cu_seqlens_q / _k int32 (sequences + 1,)
    offsets, max_seqlen_q / _k the longest sequence's (None: read from cu_seqlens, one sync);
    lse (heads, total_q); with MQA the forward packs the q heads into the rows (pack_gqa None,
    the default; False: not; varlen.pack_plan).
    """
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic={deterministic!r}; allowed: True or False")
    bwd_knobs = _backward_knobs(dq_reduce, bwd_knobs)
    cap = capability(q)
    if cap is not None and cap not in ARCHS:
        raise ValueError(f"q is on an sm_{cap[0]}{cap[1]} GPU; fa4kernel has kernels for {_SUPPORTED}")
    if cu_seqlens_q is not None or cu_seqlens_k is not None or max_seqlen_q is not None \
            or max_seqlen_k is not None:
        if cap == (10, 0):
            raise ValueError("cu_seqlens on sm_100: the SM100 forward has no varlen build; allowed: sm_90 "
                             "(H100, H200)")
        from .varlen import attention_varlen

        return attention_varlen(run_varlen, tile_rule, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, causal, softmax_scale, return_lse, deterministic, bwd_knobs, knobs)
    if cap == (10, 0):
        from .autograd import needs_grad
        from .sm100.fwd import attention_sm100

        if needs_grad(q, k, v):
            raise ValueError("q, k or v requires grad on sm_100, which has no backward in fa4kernel; allowed: "
                             "sm_90 (H100, H200), or the forward under torch.no_grad()")
        return attention_sm100(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
                               **knobs)
    # sm_90, or not on a CUDA device: the SM90 kernel's checks, then the device's (one-line errors)
    b, sq, sk, h, d, dtype = validate_tensors(q, k, v, causal, softmax_scale, return_lse,
                                              head_dims=SUPPORTED_HEAD_DIMS, gqa=True)
    from .autograd import needs_grad

    grad = needs_grad(q, k, v)
    if grad:
        from .autograd import check_backward_supported

        check_backward_supported(q, k, v, causal, deterministic, **bwd_knobs)
    cfg = resolve_config(q, k, v, causal, return_lse or grad, **knobs)  # raises before any compile
    validate_device(q, k, v)
    if grad:
        from .autograd import attention_with_grad

        out, lse = attention_with_grad(_run, q, k, v, cfg, softmax_scale, deterministic, **bwd_knobs)
        return (out, lse) if return_lse else out

    import torch

    out = torch.empty((b, sq, h, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device) if return_lse else None
    _run(cfg, q, k, v, out, lse, softmax_scale)
    return (out, lse) if return_lse else out


def attention_trainable(q, k, v, causal: bool = False, softmax_scale: Optional[float] = None,
                        deterministic: bool = False, **bwd_knobs):
    """attention(q, k, v, causal) with a grad_fn whose backward is built with any backward knob
    (sm90/bwd_config.py), e.g. stats="thread", mma_order="dv_dk_dq"; the forward takes its
    default knobs. Same as attention(..., bwd_knobs=dict(...)); kept for the benchmark's
    variants (lab/tools/bench_bwd_sm90.py)."""
    from .autograd import attention_with_grad, check_backward_supported
    from .sm90.bwd_config import BWD_HEAD_DIMS

    validate_tensors(q, k, v, causal, softmax_scale, False, head_dims=BWD_HEAD_DIMS, gqa=True)
    check_backward_supported(q, k, v, causal, deterministic, **bwd_knobs)
    cfg = resolve_config(q, k, v, causal, True)
    validate_device(q, k, v)
    out, _ = attention_with_grad(_run, q, k, v, cfg, softmax_scale, deterministic, **bwd_knobs)
    return out


def attention_traced(q, k, v, causal: bool = False, softmax_scale: Optional[float] = None,
                     trace_cta: int = 0, light: bool = False, **knobs):
    """The SM90 trace build (diagnostics.trace_build): returns (out, stamps), stamps an int64
    CUDA tensor of trace_layout.TRACE_WORDS words with clock64 stamps of CTA `trace_cta`
    (layout: trace_layout.py; decode with fa4kernel.trace.decode). Knobs as attention()."""
    import torch

    from .trace_layout import TRACE_WORDS

    b, sq, sk, h, d, dtype = validate_tensors(q, k, v, causal, softmax_scale, False,
                                              head_dims=SUPPORTED_HEAD_DIMS, gqa=True)
    cfg = resolve_config(q, k, v, causal, False, **knobs)
    validate_device(q, k, v)
    out = torch.empty((b, sq, h, d), dtype=q.dtype, device=q.device)
    stamps = torch.zeros((TRACE_WORDS,), dtype=torch.int64, device=q.device)
    stamps[0] = int(trace_cta)
    _run(cfg, q, k, v, out, None, softmax_scale, trace=stamps, diag=trace_build(light))
    return out, stamps


def attention_probed(q, k, v, causal: bool = False, softmax_scale: Optional[float] = None,
                     skip_softmax: bool = False, trace_cta: int = 0, stamps=None, ablate: str = "",
                     cta_log: bool = False, **knobs):
    """An SM90 clock-probe build (diagnostics.probe_build): the normal kernel plus the in-kernel
    clock of one CTA. Returns (out, stamps); stamps[1:5] = clock64 and globaltimer (ns) at that
    CTA's start and end, so cycles / ns is the SM clock of this very launch
    (fa4kernel.trace.header_clock). skip_softmax=True times the wgmma + pipeline skeleton without
    the softmax; its `out` is not attention; so is any `ablate` build (diagnostics.ABLATIONS,
    comma-separated). cta_log=True: every CTA also logs its SM id and start / end stamps
    (trace_layout.CTA_LOG_*; decode with fa4kernel.trace.cta_log). stamps: a reusable int64 CUDA
    buffer of TRACE_WORDS (else a new one per call). Knobs as attention()."""
    import torch

    from .trace_layout import TRACE_WORDS

    b, sq, sk, h, d, dtype = validate_tensors(q, k, v, causal, softmax_scale, False,
                                              head_dims=SUPPORTED_HEAD_DIMS, gqa=True)
    cfg = resolve_config(q, k, v, causal, False, **knobs)
    diag = probe_build(skip_softmax, ablate, cta_log)
    validate_device(q, k, v)
    out = torch.empty((b, sq, h, d), dtype=q.dtype, device=q.device)
    if stamps is None:
        stamps = torch.zeros((TRACE_WORDS,), dtype=torch.int64, device=q.device)
        stamps[0] = int(trace_cta)
    _run(cfg, q, k, v, out, None, softmax_scale, trace=stamps, diag=diag)
    return out, stamps


_USE_TVM_FFI = None
# Grid cap: one persistent CTA per SM. FA4KERNEL_PERSISTENT=0 (or setting this to False)
# launches one CTA per tile instead; read at every call, no recompile needed.
PERSISTENT = os.environ.get("FA4KERNEL_PERSISTENT", "1") != "0"
# Diagnostics: cap the persistent grid below the SM count (1 = one CTA walks every tile in turn,
# which isolates the per-tile cost of the persistent loop); None = one CTA per SM.
MAX_CTAS = None


def _sm_count(device) -> int:
    return device_props(device).multi_processor_count


def _max_ctas(device) -> int:
    if not PERSISTENT:
        return 2**31 - 1
    if MAX_CTAS is not None:
        return int(MAX_CTAS)
    return _sm_count(device)


_SCHEDULES: dict = {}  # (shape, tiles, grid, section, device) -> int32 CUDA tensor
# tile order: K/V bytes per section of (batch, head) pairs; None = L2 size / 8
# (tile_schedule.SECTION_FRACTION_OF_L2). A diagnostic override (lab/tools/causal_sm90.py).
L2_SECTION_BYTES = None


def _section_bytes(device) -> int:
    if L2_SECTION_BYTES is not None:
        return int(L2_SECTION_BYTES)
    from .tile_schedule import SECTION_FRACTION_OF_L2

    return int(device_props(device).L2_cache_size) // SECTION_FRACTION_OF_L2


def _schedule(cfg: KernelConfig, q, k):
    """The tile schedule for this launch (tile_schedule.py), cached per shape and grid."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    num_tiles = b * h * -(-sq // cfg.tile_m)
    grid = min(num_tiles, _max_ctas(q.device)) if cfg.persistent else num_tiles
    section = _section_bytes(q.device)
    key = (b, sq, sk, h, d, cfg.tile_m, cfg.tile_n, cfg.causal, grid, section, q.device)
    table = _SCHEDULES.get(key)
    if table is None:
        import torch

        from .tile_schedule import as_table, make_schedule

        if torch.cuda.is_current_stream_capturing():  # the upload below is a blocking copy
            raise ValueError(f"CUDA graph capture of a shape not run before (q {tuple(q.shape)}, k {tuple(k.shape)}); "
                             "allowed: run it once before capture (its tile schedule is uploaded then)")

        rows = make_schedule(b, h, sq, sk, d, cfg.tile_m, cfg.tile_n, grid, section, cfg.causal,
                             _sm_count(q.device))
        table = torch.tensor(as_table(rows), dtype=torch.int32, device=q.device)
        if len(_SCHEDULES) >= 256:  # many shapes (e.g. varying lengths): drop the oldest
            _SCHEDULES.pop(next(iter(_SCHEDULES)))
        _SCHEDULES[key] = table
    return table


def _run(cfg: KernelConfig, q, k, v, out, lse, softmax_scale, trace=None, diag: Diagnostics = NONE):
    """Launch the SM90 kernel into caller-provided out (b, s_q, h, d) and lse (b, h, s_q) or
    None; a diagnostic build (diag) also into trace, its stamps buffer.

    Fast path (apache-tvm-ffi installed, as on the device): the kernel is compiled once per
    configuration against fake tensors with dynamic shapes/strides and called with torch tensors
    directly on torch's current stream (a few microseconds of host overhead). Fallback: DLPack
    conversion of each argument per call.
    """
    global _USE_TVM_FFI
    import cutlass.cute as cute
    from cutlass import Float32

    scale_log2 = _scale_log2(q, softmax_scale)
    key = _build_key(cfg, diag)
    fn = _CACHE.get(key)
    buffered = diag.buffered
    if buffered and trace is None:
        raise ValueError("a trace / diagnostic build needs its stamps buffer (attention_traced, attention_probed)")
    if _USE_TVM_FFI:
        if fn is None:
            from .sm90.fwd import make_kernel

            t0 = time.perf_counter()
            fq, fk, fv, fo, flse = _fake_args(cfg)
            extra = (_fake_trace(),) if buffered else ()
            stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
            try:
                fn = cute.compile(make_kernel(cfg, diag), fq, fk, fv, fo, flse, _fake_sched(cfg), Float32(1.0),
                                  *extra, stream, options="--enable-tvm-ffi")
            except Exception as e:  # keep working through DLPack if the FFI path breaks
                import warnings

                warnings.warn(f"fa4kernel: TVM-FFI compile failed ({e!r:.200}); using DLPack path")
                _USE_TVM_FFI = False
                return _run(cfg, q, k, v, out, lse, softmax_scale, trace, diag)
            COMPILE_TIMES[key] = time.perf_counter() - t0
            _CACHE[key] = fn
        sched = _schedule(cfg, q, k) if _scheduled(cfg) else None
        if buffered:
            fn(q, k, v, out, lse, sched, scale_log2, trace)
        else:
            fn(q, k, v, out, lse, sched, scale_log2)
        return

    args = [to_cute(t, 3) for t in (q, k, v, out)]
    lse_c = to_cute(lse, 2, align=4) if lse is not None else None
    stream = torch_stream(q.device)
    extra = (to_cute(trace, 0, align=16),) if buffered else ()
    sched = to_cute(_schedule(cfg, q, k), 1, align=4) if _scheduled(cfg) else None
    if fn is None:
        from .sm90.fwd import make_kernel

        t0 = time.perf_counter()
        fn = cute.compile(make_kernel(cfg, diag), *args, lse_c, sched, Float32(scale_log2), *extra, stream)
        COMPILE_TIMES[key] = time.perf_counter() - t0
        _CACHE[key] = fn
    fn(*args, lse_c, sched, Float32(scale_log2), *extra, stream)
