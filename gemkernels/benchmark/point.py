"""One benchmark point: every backend timed on the same seeded inputs, and what its time means.

A `Point` is (mode, dtype, S, n, d, b). `measure_point` plans memory first (a point that would not
fit is skipped with a note), builds ``copies`` batches to rotate through, checks each backend's
first answer (exactly `Point.steps` steps per session in the fixed-b mode; agreement with torch), then
times the backends in interleaved rounds and returns one record per backend. A backend that fails
is recorded with its error; nothing here raises for a single point's trouble.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from gemkernels.benchmark.machine import Ceilings, free_bytes, l2_bytes
from gemkernels.benchmark.timing import Timing, compare, rotating
from gemkernels.select.api import select_ragged
from gemkernels.select.arrays import NUMPY, TORCH, convert_like, to_numpy
from gemkernels.select.ragged import RaggedBatch
from gemkernels.select.result import RaggedSelection

#: Benchmark dtype names and their torch names.
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}
#: fixed: tau = 1.0 and k = b, so random rows take exactly min(b, n, d) steps; tau: tau = 0.9, at most b steps.
MODES = {"fixed": 1.0, "tau": 0.9}
#: Contender names: a backend, or a triton path forced through `triton_backend.using`.
CONTENDERS = ("numpy", "numba", "torch", "triton-gram", "triton-fused", "triton-stepwise")
#: Contenders that take numpy inputs (numpy has no bfloat16).
NUMPY_CONTENDERS = ("numpy", "numba")
#: Suffix of a triton contender that keeps the greedy state in global memory even where it fits in registers.
GLOBAL_STATE = "-global"
#: Contenders run only when named: the register-resident greedy's A/B counterparts.
VARIANTS = ("triton-gram" + GLOBAL_STATE, "triton-fused" + GLOBAL_STATE)
#: Rotate GPU inputs until they span this many L2 caches (at most MAX_COPIES copies of the batch).
ROTATE_L2_FACTOR, MAX_COPIES = 4, 32
#: Share of free memory a point may plan to use.
MEMORY_HEADROOM = 0.9


@dataclass(frozen=True)
class Point:
    """S sessions of n blocks in d dimensions, dtype by benchmark name, selecting at most b per session."""

    mode: str
    dtype: str
    sessions: int
    n: int
    d: int
    b: int

    @property
    def tau(self) -> float:
        return MODES[self.mode]

    @property
    def steps(self) -> int:
        """Steps each session takes in the fixed-b mode: random rows have rank min(n, d)."""
        return min(self.b, self.n, self.d)

    @property
    def x_bytes(self) -> int:
        """Bytes of X as stored: what a selection must read at least once."""
        return self.sessions * self.n * self.d * ITEMSIZE[self.dtype]

    def describe(self) -> dict[str, Any]:
        return asdict(self) | {"tau": self.tau, "k": self.b}

    def __str__(self) -> str:
        return f"{self.mode} {self.dtype} S={self.sessions} n={self.n} d={self.d} b={self.b}"


@dataclass(frozen=True)
class Settings:
    """How to time: device ("cpu"/"cuda"), repeat cap, warm-up calls (>= 2), seconds of timed rounds per
    point, input copies to rotate through (None: enough to exceed L2 on a GPU, 1 on the CPU), seed."""

    device: str
    repeats: int
    warmup: int = 2
    point_seconds: float = 1.0
    copies: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.warmup < 2 or self.repeats < 1 or self.point_seconds <= 0 or (self.copies or 1) < 1:
            raise ValueError(f"need warmup >= 2, repeats >= 1, point_seconds > 0, copies >= 1; got {self}")

    @property
    def timer_name(self) -> str:
        return "cuda-events" if self.device == "cuda" else "perf_counter"


def split_contender(name: str) -> tuple[str, str | None]:
    """``"triton-gram"`` -> ``("triton", "gram")``; ``"torch"`` -> ``("torch", None)``."""
    backend, _, path = name.partition("-")
    return backend, path or None


def library(contender: str) -> str:
    """The array library a contender's inputs are given in."""
    return NUMPY if contender in NUMPY_CONTENDERS else TORCH


def triton_path(path: str | None) -> contextlib.AbstractContextManager:
    """Force the triton backend's path (``"gram"``, ``"gram-global"``, ...) for the duration (no-op for None)."""
    if path is None:
        return contextlib.nullcontext()
    from gemkernels.select.backends.triton_backend import TritonOptions, using

    return using(TritonOptions(path=path.removesuffix(GLOBAL_STATE), resident=not path.endswith(GLOBAL_STATE)))


def run_selection(batch: RaggedBatch, contender: str, tau: float, k: int) -> RaggedSelection:
    """`select_ragged` on one contender (backend, and triton path if named), on a fresh `RaggedBatch` of the same
    arrays: what a batch derives once (its protected rows) is paid on every call, as in serving."""
    backend, path = split_contender(contender)
    with triton_path(path):
        return select_ragged(replace(batch), tau=tau, k=k, backend=backend)


# --------------------------------------------------------------------------- inputs and memory


def make_values(rows: int, d: int, dtype: str, device: str, seed: int) -> Any:
    """Seeded Gaussian X ``(rows, d)`` in ``dtype`` (a torch dtype name): numpy on the CPU (a torch tensor
    for bfloat16, which numpy lacks), a torch tensor elsewhere. One seed gives one fp32 draw in every dtype."""
    if device == "cpu":
        x = np.random.default_rng(seed).standard_normal((rows, d), dtype=np.float32)
        if dtype == "bfloat16":
            import torch

            return torch.from_numpy(x).to(torch.bfloat16)
        return x.astype(np.dtype(dtype), copy=False)
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, d, generator=generator, device=device, dtype=torch.float32)
    return x.to(getattr(torch, dtype))


def make_batch(values: Any, n: int) -> RaggedBatch:
    """Equal sessions of ``n`` rows, nothing protected, everything eligible."""
    rows = int(values.shape[0])
    return RaggedBatch(values=values, offsets=np.arange(rows // n + 1, dtype=np.int64) * n,
                       protected=np.zeros(rows, dtype=bool), eligible=np.ones(rows, dtype=bool))


def memory_need(point: Point, contenders: list[str], copies: int, device: str) -> dict[str, int]:
    """Conservative peak bytes per memory ("cpu" host, "cuda" device) for ``copies`` inputs plus the
    largest backend's workspace: torch pads and normalises in fp32 (about 3 fp32 copies of X), triton
    takes one fp32 temporary (plus the n^2 Gram matrices for gram, launched in groups that fit its budget, none
    when G is computed on chip), numpy and numba widen fp16 to fp32."""
    x32 = point.sessions * point.n * point.d * 4
    gram = 4 * point.sessions * point.n ** 2
    if any(c.startswith("triton-gram") for c in contenders):
        from gemkernels.kernels.greedy_resident import resident_fits
        from gemkernels.select.backends.triton_backend import GRAM_MAX_BYTES

        gram = min(gram, GRAM_MAX_BYTES + 4 * point.n ** 2)
        if "triton-gram-global" not in contenders and resident_fits(point.n, min(point.b, point.n), "chip"):
            gram = 0  # the resident greedy computes G on chip
    work = {"torch": 3 * x32, "triton-gram": x32 + gram, "triton-fused": x32, "triton-stepwise": x32}
    work |= {c: work[c.removesuffix(GLOBAL_STATE)] + 4 * point.sessions * point.n * point.b for c in VARIANTS}
    need = {device: copies * point.x_bytes + max([x32 if point.dtype != "fp32" else 0] +
                                                  [work[c] for c in contenders if c in work])}
    if any(c in NUMPY_CONTENDERS for c in contenders):
        host = (copies * point.x_bytes if device != "cpu" else 0) + (x32 if point.dtype == "fp16" else 0)
        need["cpu"] = need.get("cpu", 0) + host
    return need


def plan_copies(point: Point, contenders: list[str], settings: Settings) -> tuple[int, str | None]:
    """Input copies to rotate through, reduced to fit; or 0 and why the point does not fit in memory."""
    if settings.copies is not None:
        copies = settings.copies
    else:
        l2 = l2_bytes(settings.device)
        copies = min(MAX_COPIES, max(1, math.ceil(ROTATE_L2_FACTOR * l2 / point.x_bytes))) if l2 else 1
    free = {where: free_bytes(where) for where in memory_need(point, contenders, 1, settings.device)}
    for c in range(copies, 0, -1):
        need = memory_need(point, contenders, c, settings.device)
        if all(need[where] <= MEMORY_HEADROOM * free[where] for where in need):
            return c, None
    need = memory_need(point, contenders, 1, settings.device)
    where = max(need, key=lambda w: need[w] / max(free[w], 1))
    return 0, (f"does not fit in memory: needs about {need[where] / 2 ** 30:.3g} GiB on {where}, "
               f"{free[where] / 2 ** 30:.3g} GiB free")


# --------------------------------------------------------------------------- measuring


def metrics(point: Point, seconds: float, steps_total: int, ceilings: Ceilings) -> dict[str, float]:
    """Throughput and roofline numbers for one median time.

    Work is 2·n·d·b_s FLOP per session (b_s: that session's steps); the bytes that must move are X read
    once. Fractions are of the ceilings measured in this run; the read-once time uses the copy bandwidth
    (read + write bytes per second), as does "b passes over X".
    """
    flops = 2 * point.n * point.d * steps_total
    bandwidth, peak = ceilings.copy_bytes_per_s, ceilings.matmul_flop_per_s[point.dtype]
    read_once = point.x_bytes / bandwidth
    b_passes = read_once * steps_total / point.sessions
    roofline = max(read_once, flops / peak)
    return {
        "sessions_per_s": point.sessions / seconds,
        "blocks_per_s": point.sessions * point.n / seconds,
        "work_flop": flops,
        "x_bytes": point.x_bytes,
        "gflop_per_s": flops / seconds / 1e9,
        "gb_per_s": point.x_bytes / seconds / 1e9,
        "bandwidth_fraction": point.x_bytes / seconds / bandwidth,
        "flops_fraction": flops / seconds / peak,
        "read_x_once_s": read_once,
        "b_passes_s": b_passes,
        "roofline_s": roofline,
        "roofline_fraction": roofline / seconds,
        "time_over_read_once": seconds / read_once,
        "time_over_b_passes": seconds / b_passes,
        "speedup_vs_torch": None,
    }


def check_steps(point: Point, out: RaggedSelection) -> dict[str, Any]:
    """Steps per session; raises if the fixed-b mode did not take exactly ``point.steps`` steps everywhere."""
    counts = to_numpy(out.counts).astype(np.int64)
    if point.mode == "fixed" and not (counts == point.steps).all():
        raise RuntimeError(f"fixed-b mode expects {point.steps} steps per session, got "
                           f"{sorted(set(counts.tolist()))[:5]}")
    return {"steps_total": int(counts.sum()), "steps_mean": float(counts.mean()),
            "steps_min": int(counts.min()), "steps_max": int(counts.max())}


def agreement(indices: np.ndarray, reference: np.ndarray) -> float | None:
    """Fraction of sessions whose padded index rows equal the reference's (None if the widths differ)."""
    if indices.shape != reference.shape:
        return None
    return float((indices == reference).all(axis=1).mean())


def record(point: Point, contender: str, settings: Settings, status: str, note: str | None = None,
           copies: int = 0, timing: Timing | None = None, checks: dict | None = None,
           measures: dict | None = None) -> dict[str, Any]:
    """One JSON-ready record (the run adds ``ceilings`` and ``env``)."""
    backend, path = split_contender(contender)
    config = point.describe() | {"backend": contender, "library_backend": backend, "path": path,
                                 "device": settings.device, "copies": copies, "repeats_max": settings.repeats,
                                 "warmup": settings.warmup, "point_seconds": settings.point_seconds,
                                 "seed": settings.seed, "timer": settings.timer_name}
    timing_dict = None if timing is None else {"median_s": timing.median, "q1_s": timing.q1, "q3_s": timing.q3,
                                               "repeats": timing.repeats}
    return {"kind": "point", "status": status, "note": note, "config": config, "timing": timing_dict,
            "checks": checks, "metrics": measures}


def measure_point(point: Point, contenders: list[str], settings: Settings, ceilings: Ceilings,
                  timer: Callable[[Callable[[], object]], float]) -> list[dict[str, Any]]:
    """Records (ok, error or skipped) for every contender at ``point``; see the module docstring."""
    copies, why = plan_copies(point, contenders, settings)
    if why is not None:
        return [record(point, c, settings, "skipped", why) for c in contenders]
    try:
        values = [make_values(point.sessions * point.n, point.d, DTYPES[point.dtype], settings.device,
                              settings.seed + i) for i in range(copies)]
        libraries = {library(c) for c in contenders}
        batches = {lib: [make_batch(convert_like(v, lib, settings.device if lib == TORCH else None), point.n)
                         for v in values] for lib in libraries}
    except (MemoryError, RuntimeError) as err:  # torch's OutOfMemoryError is a RuntimeError
        return [record(point, c, settings, "skipped", f"could not build the inputs: {err}", copies)
                for c in contenders]
    fns, estimates, checks, failed, answers = {}, {}, {}, {}, {}
    for c in contenders:
        try:
            call = lambda batch, c=c: run_selection(batch, c, point.tau, point.b)  # noqa: E731
            out = call(batches[library(c)][0])
            checks[c] = check_steps(point, out)
            answers[c] = to_numpy(out.indices).astype(np.int64)
            fns[c] = rotating(call, batches[library(c)])
            estimates[c] = max(timer(fns[c]) for _ in range(settings.warmup - 1))
        except Exception as err:  # one backend's failure is a result, not the end of the sweep
            failed[c] = f"{type(err).__name__}: {err}"
            fns.pop(c, None)
    timings: dict[str, Timing] = {}
    if fns:
        floor = min(5, settings.repeats)
        repeats = int(np.clip(settings.point_seconds / sum(estimates.values()), floor, settings.repeats))
        try:
            timings = compare(fns, repeats, warmup=0, timer=timer)
        except Exception as err:
            failed |= {c: f"while timing: {type(err).__name__}: {err}" for c in fns}
    records = []
    for c in contenders:
        if c not in timings:
            records.append(record(point, c, settings, "error", failed.get(c), copies))
            continue
        if "torch" in answers and c != "torch":
            checks[c]["same_indices_as_torch"] = agreement(answers[c], answers["torch"])
        measures = metrics(point, timings[c].median, checks[c]["steps_total"], ceilings)
        if "torch" in timings:
            measures["speedup_vs_torch"] = timings["torch"].median / timings[c].median
        records.append(record(point, c, settings, "ok", None, copies, timings[c], checks[c], measures))
    return records
