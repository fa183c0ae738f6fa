"""pytest-benchmark regression runs of the selection entry points, compared across commits.

    pytest bench/ --benchmark-only --benchmark-autosave          # save this commit's timings (.benchmarks/)
    pytest bench/ --benchmark-only --benchmark-compare            # compare against the last saved run

These live in bench/, not tests/, so the CI test run (testpaths = ["tests"]) never times
anything. Each asserts the shape of what it timed, so a broken selection fails rather than
timing fast. CPU cases are small; the CUDA cases (torch and every triton path, at the serving
batch and the issue's two target shapes) run at full size and are skipped without CUDA.
The throughput sweep with roofline ratios is ``python -m bench`` (`gemkernels.benchmark`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gemkernels as gk
from bench import cases


def check_selection(indices, n: int, k: int) -> None:
    """Exactly k distinct in-range int64 row indices."""
    idx = np.asarray(indices.cpu() if hasattr(indices, "cpu") else indices)
    assert idx.dtype == np.int64
    assert idx.shape == (k,)
    assert len(set(idx.tolist())) == k
    assert ((idx >= 0) & (idx < n)).all()


CPU_BACKENDS = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(
    "numba" not in gk.available_backends(), reason="the numba backend needs numba"))]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_cpu_one_session(benchmark, backend):
    case = cases.NUMPY_ONE
    x = cases.numpy_sessions(case)[0]
    benchmark.extra_info.update(case.describe())
    gk.select(x, tau=case.tau, k=case.k, backend=backend)  # numba compiles (or loads its cache) before timing
    sel = benchmark(gk.select, x, tau=case.tau, k=case.k, backend=backend)
    check_selection(sel.indices, case.n, case.k)
    assert sel.residuals.shape == (case.n,)
    assert 0.0 < sel.coverage < 1.0


def bench_cpu_batch(benchmark, xs, backend: str) -> None:
    """Time `gk.select_batch` over the small CPU batch and check every session's answer."""
    case = cases.TORCH_BATCH
    benchmark.extra_info.update(case.describe())
    sels = benchmark(gk.select_batch, xs, tau=case.tau, k=case.k, backend=backend)
    assert len(sels) == case.sessions
    for sel in sels:
        check_selection(sel.indices, case.n, case.k)
        assert tuple(sel.residuals.shape) == (case.n,)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_cpu_batch(benchmark, backend):
    bench_cpu_batch(benchmark, cases.numpy_sessions(cases.TORCH_BATCH), backend)


def test_torch_cpu_batch(benchmark):
    pytest.importorskip("torch")
    bench_cpu_batch(benchmark, cases.torch_sessions(cases.TORCH_BATCH), "torch")


GPU_CASES = [pytest.param(c, id=c.name) for c in (cases.GPU_BATCH, cases.GPU_HEADLINE, cases.GPU_LONG)]


def cuda_torch():
    """torch, when it sees a CUDA device; skips the test otherwise."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch


def bench_ragged(benchmark, case, dtype: str, backend: str):
    """Time `gk.select_ragged` on a full-size CUDA batch (synchronised) and check every session's answer."""
    torch = cuda_torch()
    batch = cases.ragged_batch(case, "cuda", getattr(torch, dtype))
    benchmark.extra_info.update(case.describe() | {"dtype": dtype, "backend": backend})

    def run():
        out = gk.select_ragged(dataclasses.replace(batch), tau=case.tau, k=case.k, backend=backend)  # a fresh batch
        torch.cuda.synchronize()
        return out

    out = benchmark(run)
    assert tuple(out.indices.shape) == (case.sessions, case.k)
    assert bool((out.counts == case.k).all())
    indices = out.indices.cpu()
    assert bool(((indices >= 0) & (indices < case.n)).all())
    assert all(len(set(row.tolist())) == case.k for row in indices[:: max(1, case.sessions // 16)])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", GPU_CASES)
def test_torch_gpu_batch(benchmark, case, dtype):
    bench_ragged(benchmark, case, dtype, "torch")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("path", ["gram", "fused", "stepwise"])
@pytest.mark.parametrize("case", GPU_CASES)
def test_triton_batch(benchmark, monkeypatch, case, path, dtype):
    cuda_torch()
    pytest.importorskip("triton")
    from gemkernels.select.backends import triton_backend

    benchmark.extra_info["path"] = path
    with triton_backend.using(triton_backend.TritonOptions(path=path)):
        bench_ragged(benchmark, case, dtype, "triton")
