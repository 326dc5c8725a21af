"""epx's stub for `sglang.kernels` (python/bench/sglang_lp_stubs): the real
__init__ imports every kernel group; the LP path imports sglang.kernels.jit,
.registry, .spec and .ops.lplb directly, which are staged."""
