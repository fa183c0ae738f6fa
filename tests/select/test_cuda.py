"""Selection on a CUDA device (skipped without one): the auto backend, bf16, batches, every Triton path and dtype at
the default tiles, and CuPy arrays. Shared helpers: tests/select_helpers.py."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from select_helpers import HAS_CUDA, check_selection, make_x  # noqa: E402

import gemkernels as gk  # noqa: E402
from gemkernels.select.backends import auto_backend  # noqa: E402


def cuda_x(rng, n, d, dtype="float32"):
    return torch.from_numpy(make_x(rng, n, d, "clustered")).to("cuda", getattr(torch, dtype))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cuda_auto_uses_triton(dtype):
    x = cuda_x(np.random.default_rng(50), 1000, 384, dtype)
    assert auto_backend(x) == "triton"
    sel = gk.select(x, protected=[3, 900], k=32)
    assert sel.indices.is_cuda and sel.residuals.is_cuda and sel.indices.dtype == torch.int64
    explicit = gk.select(x, protected=[3, 900], k=32, backend="triton")
    assert sel.indices.tolist() == explicit.indices.tolist() and abs(sel.coverage - explicit.coverage) <= 1e-6
    check_selection(sel, x, [3, 900], None, k=32)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_cuda_bf16_on_triton():
    x = cuda_x(np.random.default_rng(51), 500, 256, "bfloat16")
    sel = gk.select(x, protected=[0], tau=0.95, k=24, backend="triton")
    assert sel.indices.is_cuda
    check_selection(sel, x, [0], None, 0.95, 24)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_cuda_batch_against_reference(backend):
    rng = np.random.default_rng(52)
    ns = [1, 1000, 17, 255, 1, 3000]
    xs = [cuda_x(rng, n, 384) for n in ns]
    ps = [[0], [5, 999], [], [1, 2, 3], [], list(range(0, 3000, 500))]
    ks = np.array([4, 32, 0, 16, 16, 64])
    sels = gk.select_batch(xs, protected=ps, tau=0.97, k=ks, backend=backend)
    for x, p, k, sel in zip(xs, ps, ks.tolist(), sels):
        assert sel.indices.is_cuda
        check_selection(sel, x, p, None, 0.97, k)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_numpy_input_on_triton_gives_numpy():
    x = make_x(np.random.default_rng(53), 300, 100, "embedding").astype(np.float32)
    sel = gk.select(x, k=12, backend="triton")
    assert isinstance(sel.indices, np.ndarray) and isinstance(sel.residuals, np.ndarray)
    check_selection(sel, x, None, None, k=12)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("path,resident", [("gram", True), ("gram", False), ("fused", True), ("fused", False),
                                           ("stepwise", False)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cuda_every_triton_path_and_dtype_at_default_tiles(path, resident, dtype, monkeypatch, triton_options):
    """Three batches: the longest session 1000 rows (gram keeps its greedy in registers, fused cannot), 200 rows
    (both can) and 64 rows (gram computes G on chip), each with the register-resident greedy allowed and not."""
    from gemkernels.select.backends import triton_backend

    triton_options(triton_backend.TritonOptions(path=path, resident=resident))
    rng = np.random.default_rng(54)
    for ns in ([1, 256, 17, 1000, 129], [1, 200, 17, 64, 129], [1, 64, 17, 33, 40]):
        xs = [cuda_x(rng, n, 1000, dtype) for n in ns]
        ps = [[0], [3, ns[1] - 1], [], [10, 20, ns[3] - 1], [ns[4] - 1]]
        sels = gk.select_batch(xs, protected=ps, tau=0.9, k=16, backend="triton")
        for x, p, sel in zip(xs, ps, sels):
            assert sel.indices.is_cuda
            check_selection(sel, x, p, None, 0.9, 16)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or importlib.util.find_spec("cupy") is None, reason="needs CUDA and CuPy")
def test_cupy_in_cupy_out():
    import cupy

    x = make_x(np.random.default_rng(55), 300, 96, "embedding").astype(np.float32)
    sel = gk.select(cupy.asarray(x), protected=[1, 2], k=10)
    assert isinstance(sel.indices, cupy.ndarray) and isinstance(sel.residuals, cupy.ndarray)
    check_selection(sel, x, [1, 2], None, k=10)
