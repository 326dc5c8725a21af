"""epx's stub for the `sglang` package (python/bench/sglang_lp_stubs): only the
modules of SGLang 0.5.23's LP dispatch path are staged beside it, and the real
package __init__ imports the frontend and the whole runtime, which those
modules never use."""
