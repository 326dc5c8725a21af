"""epx's stub for `sglang.kernels.ops` (python/bench/sglang_lp_stubs): the real
__init__ imports every operator group; only ops.lplb is staged."""
