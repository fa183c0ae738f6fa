"""pytest-benchmark regression runs of the selection entry points, compared across commits.

    pytest bench/ --benchmark-only --benchmark-autosave          # save this commit's timings (.benchmarks/)
    pytest bench/ --benchmark-only --benchmark-compare            # compare against the last saved run

These live in bench/, not tests/, so the CI test run (testpaths = ["tests"]) never times
anything. Each asserts the shape of what it timed, so a broken selection fails rather than
timing fast. The GPU case runs at full size and is skipped without CUDA.
"""

from __future__ import annotations

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


def test_numpy_one_session(benchmark):
    case = cases.NUMPY_ONE
    x = cases.numpy_sessions(case)[0]
    benchmark.extra_info.update(case.describe())
    sel = benchmark(gk.select, x, tau=case.tau, k=case.k, backend="numpy")
    check_selection(sel.indices, case.n, case.k)
    assert sel.residuals.shape == (case.n,)
    assert 0.0 < sel.coverage < 1.0


def test_torch_cpu_batch(benchmark):
    pytest.importorskip("torch")
    case = cases.TORCH_BATCH
    xs = cases.torch_sessions(case)
    benchmark.extra_info.update(case.describe())
    sels = benchmark(gk.select_batch, xs, tau=case.tau, k=case.k, backend="torch")
    assert len(sels) == case.sessions
    for sel in sels:
        check_selection(sel.indices, case.n, case.k)
        assert tuple(sel.residuals.shape) == (case.n,)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("path", ["gram", "fused", "stepwise"])
def test_triton_batch(benchmark, monkeypatch, path, dtype):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("triton")
    from gemkernels.backends import triton_backend

    monkeypatch.setattr(triton_backend, "OPTIONS", triton_backend.TritonOptions(path=path))
    case = cases.GPU_BATCH
    batch = cases.ragged_batch(case, "cuda", getattr(torch, dtype))
    benchmark.extra_info.update(case.describe() | {"path": path, "dtype": dtype})

    def run():
        out = gk.select_ragged(batch, tau=case.tau, k=case.k, backend="triton")
        torch.cuda.synchronize()
        return out

    out = benchmark(run)
    assert tuple(out.indices.shape) == (case.sessions, case.k)
    assert bool((out.counts == case.k).all())
    indices = out.indices.cpu()
    assert bool(((indices >= 0) & (indices < case.n)).all())
    assert all(len(set(row.tolist())) == case.k for row in indices[:: max(1, case.sessions // 16)])
