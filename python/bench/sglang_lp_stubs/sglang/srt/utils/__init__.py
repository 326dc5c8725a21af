"""epx's stub for `sglang.srt.utils` (python/bench/sglang_lp_stubs): the real
package re-exports the server's utilities (and their dependencies); the LP
path's JIT code imports sglang.srt.utils.common only, stubbed beside this."""
