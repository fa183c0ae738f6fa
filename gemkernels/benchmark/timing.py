"""Benchmark timers for ``gem bench`` and ``bench/``: CPU wall clock (``time.perf_counter``) and CUDA
events; median and IQR of many repeats.

`compare` times several functions in interleaved rounds (A B C, B C A, C A B, ...), so slow
drift and bursts of noise on a shared machine hit every contender alike and the *ratios* of
the medians stay meaningful even when the absolute times wander.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


@dataclass(frozen=True)
class Timing:
    """Seconds per call over ``len(samples)`` repeats."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(np.median(self.samples))

    @property
    def q1(self) -> float:
        return float(np.percentile(self.samples, 25))

    @property
    def q3(self) -> float:
        return float(np.percentile(self.samples, 75))

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def repeats(self) -> int:
        return len(self.samples)

    def __str__(self) -> str:
        return f"{fmt_seconds(self.median)} (IQR {fmt_seconds(self.q1)}-{fmt_seconds(self.q3)}, {self.repeats} runs)"


def fmt_seconds(seconds: float) -> str:
    """1.23 s / 4.56 ms / 7.89 us."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def cpu_call(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cuda_call(fn: Callable[[], object]) -> float:
    """Seconds of one call measured by CUDA events on the current stream (queued work drained first)."""
    import torch

    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def default_timer() -> Callable[[Callable[[], object]], float]:
    """CUDA events when a GPU is present, else the CPU wall clock."""
    try:
        import torch

        if torch.cuda.is_available():
            return cuda_call
    except ImportError:
        pass
    return cpu_call


def compare(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 3,
            timer: Callable[[Callable[[], object]], float] = cpu_call) -> dict[str, Timing]:
    """Time every function ``repeats`` times after ``warmup`` untimed calls each, in rotating interleaved order."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(timer(fns[name]))
    return {name: Timing(tuple(s)) for name, s in samples.items()}


def measure(fn: Callable[[], object], repeats: int, warmup: int = 3,
            timer: Callable[[Callable[[], object]], float] = cpu_call) -> Timing:
    """Time one function: `compare` with a single contender."""
    return compare({"fn": fn}, repeats, warmup, timer)["fn"]


def rotating(fn: Callable[[T], Any], inputs: Sequence[T]) -> Callable[[], Any]:
    """A zero-argument call of ``fn`` on the next of ``inputs`` each time, cycling, so that repeated runs
    read different buffers (on a GPU: not the copy the previous run left in L2)."""
    if not inputs:
        raise ValueError("rotating needs at least one input")
    order = itertools.cycle(inputs)
    return lambda: fn(next(order))
