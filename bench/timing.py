"""The benchmark timers, kept importable as ``bench.timing``; they live in `gemkernels.bench_timing`
so that the installed ``gem bench`` has them too."""

from gemkernels.bench_timing import Timing, compare, cpu_call, cuda_call, default_timer, fmt_seconds, measure, rotating

__all__ = ["Timing", "compare", "cpu_call", "cuda_call", "default_timer", "fmt_seconds", "measure", "rotating"]
