"""Backend registry: which backends can run here, and the ``backend="auto"`` rule.

Every backend module exposes ``LIBRARY`` (the array library it computes in) and
``select_packed(batch, values, sq_norms, tau, capacity, eps) -> PackedSelection``: ``batch``
is validated, ``values`` and ``sq_norms`` (squared row norms) are its rows already in that
library, ``capacity`` is K_t = max(k, |P|) per session.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, NamedTuple

from gemkernels.select.arrays import CUPY, NUMPY, TORCH, is_cuda, library_of

BACKENDS = ("numpy", "numba", "torch", "triton", "cupy")


class BackendUnavailableError(RuntimeError):
    """A backend was named explicitly but cannot run on this machine; the message says what is missing."""


class PackedSelection(NamedTuple):
    """What a backend returns, in its own library: indices (S, W) -1 padded, counts (S,), coverage (S,),
    residuals (N,)."""

    indices: Any
    counts: Any
    coverage: Any
    residuals: Any


def unavailable_reason(name: str) -> str | None:
    """None when backend ``name`` can run here, else a sentence saying what is missing."""
    if name not in BACKENDS:
        return f"unknown backend {name!r}; choose one of {', '.join(('auto',) + BACKENDS)}"
    if name == "numpy":
        return None
    if name == "numba":
        try:
            importlib.import_module("numba")
        except ImportError:
            return "the numba backend needs numba: pip install 'gemkernels[numba]'"
        return None
    if name == "cupy":
        return ("there is no separate CuPy backend: CuPy arrays run zero-copy (DLPack) on the triton "
                "backend; pass backend='auto' or 'triton'")
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return f"the {name} backend needs torch: pip install 'gemkernels[{name}]'"
    if name == "torch":
        return None
    try:
        importlib.import_module("triton")
    except ImportError:
        return "the triton backend needs triton: pip install 'gemkernels[triton]'"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return ("the triton backend needs a CUDA GPU (or TRITON_INTERPRET=1, set before import, "
                "to run its kernels on the CPU in Triton's interpreter)")
    return None


def available_backends() -> list[str]:
    """Names of the backends that can run on this machine."""
    return [name for name in BACKENDS if unavailable_reason(name) is None]


def auto_backend(values: Any) -> str:
    """``auto``: CUDA tensors and CuPy arrays go to triton (torch if triton is missing), other torch tensors to
    torch, numpy to numpy."""
    lib = library_of(values)
    if lib == NUMPY:
        return "numpy"
    if is_cuda(values):
        if unavailable_reason("triton") is None:
            return "triton"
        if lib == CUPY and unavailable_reason("torch") is not None:
            raise BackendUnavailableError("CuPy input needs torch and triton: pip install 'gemkernels[gpu]'")
        return "torch"
    return TORCH


def get_backend(name: str) -> ModuleType:
    """Import backend ``name`` or raise `BackendUnavailableError` saying what is missing."""
    reason = unavailable_reason(name)
    if reason is not None:
        raise (ValueError if name not in BACKENDS else BackendUnavailableError)(reason)
    return importlib.import_module(f"{__name__}.{name}_backend")
