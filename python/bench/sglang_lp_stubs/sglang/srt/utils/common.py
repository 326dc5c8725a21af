"""epx's stub for `sglang.srt.utils.common` (python/bench/sglang_lp_stubs).

The real module is the server's utility collection and imports much of the
runtime. SGLang 0.5.23's JIT arch code (sglang.kernels.jit.utils.arch) reads
two things from it: is_cuda(), whether torch is a CUDA build, and
get_cuda_version(), the CUDA version as a tuple, used only when nvcc cannot
be run. Both are answered here from torch."""
import torch


def is_cuda():
    return torch.version.cuda is not None and torch.version.hip is None


def get_cuda_version():
    v = torch.version.cuda or "0.0"
    return tuple(int(x) for x in v.split(".")[:2])
