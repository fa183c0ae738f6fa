"""Array-library interop: tell numpy, torch and CuPy arrays apart and move between them.

Conversions are zero-copy where the device allows (``torch.from_numpy``, DLPack for
CuPy <-> torch); torch and CuPy are imported only when the caller already uses them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NUMPY, TORCH, CUPY = "numpy", "torch", "cupy"


def library_of(x: Any) -> str:
    """Return ``"numpy"``, ``"torch"`` or ``"cupy"`` for an array; anything else counts as numpy."""
    module = type(x).__module__
    if module.startswith("torch"):
        return TORCH
    if module.startswith("cupy"):
        return CUPY
    return NUMPY


def is_floating(x: Any) -> bool:
    """True for a floating-point array of any library (bf16 included)."""
    lib = library_of(x)
    if lib == TORCH:
        return x.is_floating_point()
    return np.dtype(x.dtype).kind == "f"


def is_cuda(x: Any) -> bool:
    """True when the array lives in GPU memory."""
    lib = library_of(x)
    return lib == CUPY or (lib == TORCH and x.is_cuda)


def to_numpy(x: Any) -> np.ndarray:
    """Host numpy view or copy of ``x`` (bf16 is widened to float32, which numpy lacks)."""
    lib = library_of(x)
    if lib == TORCH:
        import torch

        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.cpu().numpy()
    if lib == CUPY:
        return x.get()
    return np.asarray(x)


def to_torch(x: Any, device: Any = None) -> Any:
    """Torch tensor sharing memory with ``x`` where possible (numpy: from_numpy, CuPy: DLPack)."""
    import torch

    lib = library_of(x)
    if lib == TORCH:
        t = x.detach()
    elif lib == CUPY:
        t = torch.from_dlpack(x)
    else:
        t = torch.from_numpy(np.ascontiguousarray(x))
    return t if device is None else t.to(device)


def convert_like(x: Any, library: str, device: Any = None) -> Any:
    """Convert a numpy array or torch tensor to ``library`` (on ``device`` for torch)."""
    if library == NUMPY:
        return to_numpy(x)
    if library == TORCH:
        return to_torch(x, device)
    import cupy

    return cupy.from_dlpack(to_torch(x, "cuda" if device is None else device))
