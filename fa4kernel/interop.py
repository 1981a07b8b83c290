"""What the kernels' launch code shares with the host: torch tensors into the CuTe DSL (DLPack,
or TVM-FFI's direct calls), torch's stream, and compiles against fake tensors.

The launch paths (interface.py's SM90 forward, sm90/bwd.py and its pre- and postprocess,
sm100/fwd.py) import from here, so no kernel module imports interface.py. Importing this module
imports neither torch nor the CuTe DSL: each function imports what it needs when called.

Two ways to call a compiled kernel with torch tensors:
  TVM-FFI (apache-tvm-ffi installed): compiled with --enable-tvm-ffi against fake tensors
          (compile_fake(..., tvm_ffi=True)), called with the torch tensors themselves on torch's
          current stream (a few microseconds of host overhead);
  DLPack  (the fallback): each argument converted per call (to_cute), the stream passed
          explicitly (torch_stream).
FA4KERNEL_NO_TVM_FFI=1 takes the DLPack path even where TVM-FFI is installed (tvm_ffi_enabled).
"""
from __future__ import annotations

import os


def to_cute(t, leading_dim: int, align: int = 16):
    """A torch tensor as a cute.Tensor through DLPack (detached), its layout dynamic but for
    the contiguous mode `leading_dim`; `align`: the byte alignment the kernel may assume."""
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t.detach(), assumed_align=align).mark_layout_dynamic(leading_dim=leading_dim)


def tvm_ffi_available() -> bool:
    """Whether apache-tvm-ffi imports (the fast call path)."""
    try:
        import tvm_ffi  # noqa: F401

        return True
    except Exception:
        return False


def tvm_ffi_enabled() -> bool:
    """Whether launches take the TVM-FFI path: available and not turned off by
    FA4KERNEL_NO_TVM_FFI=1. (The launch modules ask once and keep the answer.)"""
    return tvm_ffi_available() and os.environ.get("FA4KERNEL_NO_TVM_FFI") != "1"


def torch_stream(device):
    """torch's current CUDA stream on `device` as the driver's CUstream (the DLPack path's
    stream argument)."""
    import cuda.bindings.driver as cuda
    import torch

    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


def compile_fake(kernel, args, options=None, tvm_ffi: bool = False):
    """cute.compile of `kernel` on fake `args` and a fake stream (no GPU needed); tvm_ffi adds
    --enable-tvm-ffi to the options and takes the environment's stream."""
    import cutlass.cute as cute

    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True) if tvm_ffi \
        else cute.runtime.make_fake_stream()
    opts = options
    if tvm_ffi:
        opts = "--enable-tvm-ffi" if options is None else f"{options} --enable-tvm-ffi"
    if opts is None:
        return cute.compile(kernel, *args, stream)
    return cute.compile(kernel, *args, stream, options=opts)
