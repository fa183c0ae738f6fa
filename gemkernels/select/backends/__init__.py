"""Selection backends: the `Backend` protocol every backend module follows, the registry of what can run here,
and the ``backend="auto"`` rule (DESIGN.md §1.1).

One module per backend (``numpy_backend``, ``numba_backend``, ``torch_backend``, ``triton_backend``); each is
imported only when first used, after the packages it needs were found, so a core install (numpy alone) lists
every backend and names the install that would bring the rest.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from gemkernels.select.arrays import CUPY, NUMPY, is_cuda, library_of
from gemkernels.select.ragged import RaggedBatch


class BackendUnavailableError(RuntimeError):
    """A backend was named explicitly but cannot run on this machine; the message says what is missing."""


class PackedSelection(NamedTuple):
    """What a backend returns, in its own library: indices (S, W) -1 padded, counts (S,), coverage (S,),
    residuals (N,); and, from a backend that `CHECKS_ROWS`, bad_rows (N,): non-zero for each row it could not
    normalise (the caller reads it once and raises)."""

    indices: Any
    counts: Any
    coverage: Any
    residuals: Any
    bad_rows: Any = None


@runtime_checkable
class Backend(Protocol):
    """What a backend module provides. It accepts rows in any float dtype of its ``LIBRARY`` (the caller converts
    them there, on ``device(values)``); ``select_packed`` runs a validated batch whose ``capacity`` is
    K_t = max(k, |P|) per session and returns packed results in ``LIBRARY``. Optional: ``select_one(x, sq_norms,
    protected, eligible, tau, capacity, eps) -> (order, coverage, residuals)``, one numpy session without the batch
    layout, ``unavailable_reason() -> str | None`` for a condition beyond its packages (a GPU), and ``CHECKS_ROWS =
    True``: the backend takes the rows' norms itself (``sq_norms`` None; a GPU backend then makes one pass over the
    rows fewer and does not wait for the device before it returns) and flags the rows that are zero or not finite
    in ``PackedSelection.bad_rows``."""

    LIBRARY: str

    def device(self, values: Any) -> Any:
        """Where to compute for ``values``: a device of ``LIBRARY``, or None for where they already are."""

    def select_packed(self, batch: RaggedBatch, values: Any, sq_norms: Any, tau: np.ndarray, capacity: np.ndarray,
                      eps: float) -> PackedSelection:
        """Every session of ``batch``, from its rows in ``LIBRARY`` and their squared norms (None for a backend that
        `CHECKS_ROWS`)."""

    def warm_up_shapes(self, dim: int, k: int | None, max_rows: int | None, max_batch: int,
                       dtype: str) -> list[WarmUp]:
        """The batches of ``dim``-dimensional rows of ``dtype`` (a dtype name) whose kernels a server should compile
        before its first request, for selections of k steps (None: as many as rows) over batches of up to
        ``max_batch`` sessions of up to ``max_rows`` rows (None: the backend's own limit); empty when nothing
        compiles ahead."""


def computes_in_place(values: Any) -> None:
    """`Backend.device` of the backends that compute where the rows already are."""
    return None


class WarmUp(NamedTuple):
    """One batch a warm-up selects: sessions of ``lengths`` rows (the first, the longest, has ``rows``) of ``dtype``,
    ``steps`` steps each (`Backend.warm_up_shapes`)."""

    rows: int
    steps: int
    lengths: tuple[int, ...]
    dtype: str


def compiles_nothing(dim: int, k: int | None, max_rows: int | None, max_batch: int, dtype: str) -> list[WarmUp]:
    """`Backend.warm_up_shapes` of the backends that compile nothing ahead."""
    return []


#: The dependency threshold never falls below this many machine epsilons of the dtype residuals are computed in
#: (DESIGN.md §1): that close to 0 a residual is rounding, and a direction taken from it would be noise.
EPS_FLOOR_ULPS = 8


def dependency_threshold(eps: float, dtype: Any) -> float:
    """The eps a backend computing residuals in ``dtype`` (numpy's float32 or float64) applies: ``eps``, but never
    below `EPS_FLOOR_ULPS` machine epsilons of that dtype."""
    return max(eps, EPS_FLOOR_ULPS * machine_epsilon(dtype))


@functools.cache
def machine_epsilon(dtype: Any) -> float:
    """np.finfo(dtype).eps as a float, looked up once a dtype (a selection asks for it on every call)."""
    return float(np.finfo(dtype).eps)


#: A downdated residual is recomputed from its row below this many sqrt(machine epsilon) of its last exact value
#: (1.1% in float32): xGEQP3's test after LAWN 176, scaled so that a pivot's residual, and the coverage that its
#: direction adds, keep about five digits (DESIGN.md §1.1).
NEAR_DEPENDENCE_SCALE = 32


def near_dependence(dtype: Any) -> float:
    """`NEAR_DEPENDENCE_SCALE` sqrt(machine epsilon) of ``dtype``: the fraction of its last exact value below which a
    downdated residual has lost too many digits and is computed again from its row."""
    return NEAR_DEPENDENCE_SCALE * math.sqrt(machine_epsilon(dtype))


@dataclass(frozen=True)
class BackendSpec:
    """A registry entry: the module, the packages it needs, and the extra that installs them."""

    module: str
    needs: tuple[str, ...] = ()
    extra: str = ""


REGISTRY = {
    "numpy": BackendSpec("numpy_backend"),
    "numba": BackendSpec("numba_backend", ("numba",), "numba"),
    "torch": BackendSpec("torch_backend", ("torch",), "torch"),
    "triton": BackendSpec("triton_backend", ("torch", "triton"), "triton"),
}
#: The backends by name, in the order `available_backends` lists them.
BACKENDS = tuple(REGISTRY)


def unavailable_reason(name: str) -> str | None:
    """None when backend ``name`` can run here, else a sentence saying what is missing: an unknown name, a package
    that is not installed or fails to import (a numba built for another numpy, say), or the backend's own
    condition (a GPU)."""
    spec = REGISTRY.get(name)
    if spec is None:
        return (f"unknown backend {name!r}; choose one of {', '.join(('auto', *BACKENDS))} "
                "(CuPy arrays run zero-copy on triton)")
    for package in spec.needs:
        if importlib.util.find_spec(package) is None:
            return f"the {name} backend needs {package}: pip install 'gemkernels[{spec.extra}]'"
        try:
            importlib.import_module(package)
        except ImportError as err:
            return f"the {name} backend needs {package}, which is installed but does not import: {err}"
    try:
        module = _module(spec)
    except ImportError as err:
        return f"the {name} backend does not import here: {err}"
    check: Callable[[], str | None] | None = getattr(module, "unavailable_reason", None)
    return check() if check is not None else None


def available_backends() -> list[str]:
    """Names of the backends that can run on this machine."""
    return [name for name in BACKENDS if unavailable_reason(name) is None]


def auto_backend(values: Any) -> str:
    """``auto``: numpy arrays go to numpy; CUDA tensors and CuPy arrays to triton (torch if triton cannot run);
    other torch tensors to torch. numba is never automatic (its first call in a fresh environment compiles)."""
    lib = library_of(values)
    if lib == NUMPY:
        return "numpy"
    if is_cuda(values) and unavailable_reason("triton") is None:
        return "triton"
    if lib == CUPY and unavailable_reason("torch") is not None:
        raise BackendUnavailableError("CuPy input needs torch and triton: pip install 'gemkernels[gpu]'")
    return "torch"


def get_backend(name: str) -> Backend:
    """Backend ``name`` imported, or ValueError (unknown) / `BackendUnavailableError` saying what is missing."""
    reason = unavailable_reason(name)
    if reason is not None:
        raise (ValueError if name not in REGISTRY else BackendUnavailableError)(reason)
    return _module(REGISTRY[name])


def _module(spec: BackendSpec) -> Any:
    return importlib.import_module(f"{__name__}.{spec.module}")
