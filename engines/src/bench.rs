//! Engine benchmarks: prefill and decode tokens/s per preset, and the second-turn speedup reuse buys.
