"""The benchmark shapes, shared by `bench.select_floor` and `bench/test_select_bench.py`, and their seeded inputs.

Random Gaussian rows are in general position, so with tau=1.0 (or tau=0.9 and few rows
covered) the greedy never stops early: every session takes exactly k steps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Case:
    """S sessions of n rows in d dimensions, selected with (tau, k)."""

    name: str
    sessions: int
    n: int
    d: int
    tau: float
    k: int

    def describe(self) -> dict:
        return asdict(self)


#: One numpy session: 16 steps over a 2 MiB X (DESIGN.md §1 on the CPU fallback).
NUMPY_ONE = Case("numpy-one-session", sessions=1, n=512, d=1024, tau=1.0, k=16)
#: Many small sessions on the torch backend (CPU): batched call against a per-session loop.
TORCH_BATCH = Case("torch-cpu-batch", sessions=64, n=64, d=384, tau=0.9, k=16)
#: A serving-sized batch for the GPU paths (X is 1 GiB in fp32).
GPU_BATCH = Case("gpu-batch", sessions=1024, n=256, d=1024, tau=1.0, k=16)
#: The issue's headline GPU target: many sessions (X is 2 GiB in bf16).
GPU_HEADLINE = Case("gpu-headline", sessions=4096, n=256, d=1024, tau=1.0, k=16)
#: The issue's long-history GPU target: few sessions of many blocks (X is 1.5 GiB in fp32).
GPU_LONG = Case("gpu-long-history", sessions=256, n=4096, d=384, tau=1.0, k=16)


def numpy_sessions(case: Case, seed: int = 0, dtype=np.float32) -> list[np.ndarray]:
    """``case.sessions`` arrays of shape (n, d)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((case.n, case.d)).astype(dtype) for _ in range(case.sessions)]


def torch_sessions(case: Case, seed: int = 0, dtype=None) -> list:
    """The same sessions as `numpy_sessions`, as CPU torch tensors."""
    import torch

    return [torch.from_numpy(x).to(dtype or torch.float32) for x in numpy_sessions(case, seed)]


def ragged_batch(case: Case, device, dtype, seed: int = 0):
    """A packed `RaggedBatch` of equal sessions (torch values) made directly on ``device`` (no host copy of a
    1 GiB X); ``dtype`` is a torch dtype."""
    from gemkernels.benchmark.point import make_batch, make_values
    from gemkernels.select.arrays import to_torch

    values = make_values(case.sessions * case.n, case.d, str(dtype).removeprefix("torch."), str(device), seed)
    return make_batch(to_torch(values), case.n)
