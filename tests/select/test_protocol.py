"""The backend registry and the `Backend` protocol: what each backend declares, how one is found, Triton options
per thread or task, and the warm-up every backend answers the same way."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import gemkernels as gk
from gemkernels.select import backends
from gemkernels.select.api import warm_up
from gemkernels.select.backends import BACKENDS, REGISTRY, Backend, get_backend, unavailable_reason


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_that_runs_follows_the_protocol(name):
    """What each backend declares: where it computes for host rows, and what a server compiles ahead (numba one
    small selection; triton one per power-of-two row count, only where kernels compile, on a GPU)."""
    reason = unavailable_reason(name)
    if reason is not None:
        with pytest.raises(gk.BackendUnavailableError, match=REGISTRY[name].extra or name):
            get_backend(name)
        return
    module = get_backend(name)
    assert isinstance(module, Backend)
    x = np.eye(3, 5, dtype=np.float32) + 0.1
    shapes = module.warm_up_shapes(5, 2, 64, 4, "float32")
    assert all(isinstance(shape, backends.WarmUp) and shape.rows == max(shape.lengths) for shape in shapes)
    if name == "triton":
        assert module.device(x) == module.kernel_device()
        assert bool(shapes) == module.compiles_ahead()
    else:
        assert module.device(x) is None
        assert shapes == ([(8, 2, (8,), "float32"), (8, 2, (8, 4), "float32")] if name == "numba" else [])


def test_a_missing_package_is_named_with_its_extra(monkeypatch):
    real = backends.importlib.util.find_spec
    monkeypatch.setattr(backends.importlib.util, "find_spec", lambda m, *a: None if m == "numba" else real(m, *a))
    assert unavailable_reason("numba") == "the numba backend needs numba: pip install 'gemkernels[numba]'"
    with pytest.raises(gk.BackendUnavailableError, match=r"gemkernels\[numba\]"):
        gk.select(np.eye(4, dtype=np.float32), backend="numba")


def test_a_package_that_is_installed_but_does_not_import_leaves_its_backend_out(tmp_path, monkeypatch):
    """A numba built for another numpy raises ImportError on import: the registry must list numba as unavailable
    with that reason (not raise from `available_backends`), and auto must keep working."""
    import sys

    (tmp_path / "numba").mkdir()
    (tmp_path / "numba" / "__init__.py").write_text('raise ImportError("Numba needs NumPy 2.2 or less")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in [m for m in sys.modules if m == "numba" or m.startswith("numba.")
                   or m == "gemkernels.select.backends.numba_backend" or m.startswith("gemkernels.kernels.greedy_cpu")]:
        monkeypatch.delitem(sys.modules, module)
    assert "numba" not in gk.available_backends() and "numpy" in gk.available_backends()
    assert "Numba needs NumPy 2.2 or less" in unavailable_reason("numba")
    with pytest.raises(gk.BackendUnavailableError, match="does not import"):
        gk.select(np.eye(4, dtype=np.float32), backend="numba")
    assert len(gk.select(np.eye(4, dtype=np.float32) + 0.1, k=2).indices) == 2


def test_there_is_no_cupy_backend_and_the_name_says_where_cupy_runs():
    assert "cupy" not in BACKENDS and "cupy" not in gk.available_backends()
    with pytest.raises(ValueError, match="unknown backend 'cupy'.*CuPy arrays run zero-copy on triton"):
        gk.select(np.eye(4, dtype=np.float32), backend="cupy")


def test_backends_that_compile_nothing_warm_up_nothing():
    assert warm_up("numpy", 16) == [] and warm_up("auto", 16) == []
    if unavailable_reason("torch") is None:
        assert warm_up("torch", 16) == []


def test_triton_options_hold_for_one_thread_or_task_only():
    """`using` in one thread leaves another thread's selections on the defaults (a module global swapped by a
    benchmark used to reach every thread of a server)."""
    triton_backend = pytest.importorskip("gemkernels.select.backends.triton_backend")
    forced = triton_backend.TritonOptions(path="fused", resident=False)
    seen: dict[str, object] = {}
    inside, release = threading.Event(), threading.Event()

    def forcing() -> None:
        with triton_backend.using(forced):
            seen["forcing"] = triton_backend.current_options()
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=forcing)
    thread.start()
    inside.wait(10)
    seen["other"] = triton_backend.current_options()
    release.set()
    thread.join()
    assert seen == {"forcing": forced, "other": triton_backend.TritonOptions()}
    with triton_backend.using(forced):
        assert triton_backend.current_options() == forced
    assert triton_backend.current_options() == triton_backend.TritonOptions()


@pytest.mark.parametrize("name", ["numpy", "torch", "numba"])
def test_a_row_too_small_to_normalise_in_float32_is_refused_not_answered_wrong(name):
    """A float32 row of norm 1e-20 (squared norm 1e-40 < 1 / FLT_MAX): its scale 1 / ||x|| squared overflows, and
    the numpy backend silently returned one block at coverage 0.165 where float64 keeps six at 0.66; every
    backend now refuses it by name, as it refuses a zero row."""
    if unavailable_reason(name):
        pytest.skip(unavailable_reason(name))
    x = np.random.default_rng(3).standard_normal((10, 8)).astype(np.float32)
    x[3] = 1e-20
    data = x
    if name == "torch":
        torch = pytest.importorskip("torch")
        data = torch.from_numpy(x)
    with pytest.raises(ValueError, match=r"^row 3 of the embeddings is too large or too small to normalise"):
        gk.select(data, protected=[3], k=6, tau=1.0, backend=name)
    assert len(gk.select(x.astype(np.float64), protected=[3], k=6, tau=1.0, backend="numpy").indices) == 6
