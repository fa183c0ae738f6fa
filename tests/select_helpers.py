"""What the selection tests (tests/select/) share: the backends to parametrise over, the tolerances of each dtype,
random inputs, and `check_selection`, which holds an answer to DESIGN.md §1 against the float64 reference in
tests/reference.py.

Backends are parametrised over the expected list as well as `available_backends()`, so a
backend whose module is missing or broken fails instead of disappearing; triton is
skipped (with a reason) only when triton itself is not installed. Without a GPU the
Triton kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1),
which is slow, so triton gets small shapes (`shapes_for`).

Floating-point ties are legitimately ambiguous: index lists are compared with the
reference only up to its `comparable` prefix, and every answer is also replayed through
the reference (`replay`), which checks each decision was a legal greedy decision within
the dtype's margin and recomputes coverage and residuals for the indices actually chosen.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import numpy as np
import pytest
from reference import expected_stop, reference_select, replay

import gemkernels as gk

try:
    import torch
except ImportError:
    torch = None

HAS_CUDA = torch is not None and torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETED = not HAS_CUDA and os.environ.get("TRITON_INTERPRET") == "1"

EXPECTED_BACKENDS = ("numpy", "numba", "torch", "triton")


def backend_marks(name: str) -> list:
    if name == "numba" and importlib.util.find_spec("numba") is None:
        return [pytest.mark.skip(reason="the numba backend needs numba, which is not installed")]
    if name in ("torch", "triton") and torch is None:
        return [pytest.mark.skip(reason=f"the {name} backend needs torch, which is not installed")]
    if name == "triton" and not HAS_TRITON:
        return [pytest.mark.skip(reason="triton is not installed")]
    if name == "triton" and not HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "1":
        return [pytest.mark.skip(reason="no CUDA device and TRITON_INTERPRET was set to something other than 1")]
    return []


BACKEND_NAMES = list(EXPECTED_BACKENDS) + [b for b in gk.available_backends() if b not in EXPECTED_BACKENDS]
BACKENDS = [pytest.param(b, id=b, marks=backend_marks(b)) for b in BACKEND_NAMES]
CPU_BACKENDS = [pytest.param(b, id=b, marks=backend_marks(b)) for b in ("numpy", "numba", "torch")]


def interpreted(backend: str) -> bool:
    return backend == "triton" and INTERPRETED


# ----------------------------------------------------------------------------- tolerances


@dataclass(frozen=True)
class Tol:
    coverage: float      # |coverage - reference coverage|
    residual: float      # max |residual - reference residual|
    margin: float        # decisions closer than this to flipping are ties (reference prefix, replay)
    u: float             # unit roundoff of the arithmetic (fp16/bf16 inputs are computed in at least fp32)

    # Conditioning (see reference.py): after a pivot of residual r_min, errors of order u/r_min are
    # rounding, not bugs. Measured on the numpy/torch/triton backends: coverage errors up to ~8 u/r_min,
    # residual errors up to ~25 u/r_min (Gram/Cholesky updates), hence these factors.
    @property
    def pivot_slack(self) -> float:        # residuals and decision margins
        return 32 * self.u

    @property
    def coverage_slack(self) -> float:
        return 8 * self.u


U32, U64 = 2.0 ** -24, 2.0 ** -53
TOLS = {
    "float64": Tol(coverage=1e-8, residual=1e-8, margin=1e-4, u=U64),
    "float32": Tol(coverage=1e-5, residual=1e-5, margin=1e-4, u=U32),
    "float16": Tol(coverage=2e-3, residual=2e-3, margin=2e-3, u=U32),
    "bfloat16": Tol(coverage=2e-2, residual=2e-2, margin=2e-2, u=U32),
}


def reference_for(x, protected=None, eligible=None, tau=gk.DEFAULT_TAU, k=gk.DEFAULT_K, eps=gk.DEFAULT_EPS):
    """The reference on the values the library sees, with the margins of x's dtype."""
    tol = TOLS[dtype_name(x)]
    return reference_select(values64(x), mask_np(protected), mask_np(eligible), tau=tau, k=k, eps=eps,
                            margin=tol.margin, pivot_slack=tol.pivot_slack)


def dtype_name(x) -> str:
    return str(x.dtype).replace("torch.", "")


def to_np(a) -> np.ndarray:
    if torch is not None and isinstance(a, torch.Tensor):
        a = a.detach().cpu()
        if a.dtype == torch.bfloat16:
            a = a.float()
        return a.numpy()
    if type(a).__module__.startswith("cupy"):
        return a.get()
    return np.asarray(a)


def sel_idx(sel) -> list[int]:
    return to_np(sel.indices).tolist()


def values64(x) -> np.ndarray:
    """The values exactly as the library receives them (fp16/bf16 already rounded), in float64."""
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x).astype(np.float64)


def mask_np(spec):
    """A protected/eligible spec (list, tuple, numpy or torch; indices or mask) in numpy form for the reference."""
    if spec is None:
        return None
    return to_np(spec) if not isinstance(spec, (list, tuple)) else np.asarray(spec, dtype=np.int64).reshape(-1)


def check_selection(sel, x, protected=None, eligible=None, tau=gk.DEFAULT_TAU, k=gk.DEFAULT_K,
                    eps=gk.DEFAULT_EPS, tol: Tol | None = None):
    """Assert ``sel`` answers §1 for these inputs; return the reference."""
    x64 = values64(x)
    n = x64.shape[0]
    tol = tol or TOLS[dtype_name(x)]
    protected, eligible = mask_np(protected), mask_np(eligible)
    idx = to_np(sel.indices)
    res = to_np(sel.residuals).astype(np.float64)
    assert idx.dtype == np.int64 and idx.ndim == 1, (idx.dtype, idx.shape)
    assert res.shape == (n,)
    assert isinstance(sel.coverage, float)

    ref = reference_select(x64, protected, eligible, tau=tau, k=k, eps=eps, margin=tol.margin,
                           pivot_slack=tol.pivot_slack)
    c = ref.comparable
    assert idx[:c].tolist() == ref.indices[:c].tolist(), (
        f"indices {idx.tolist()} differ from the reference {ref.indices.tolist()} within the unambiguous "
        f"prefix of {c}; steps: {ref.steps}")
    assert sel.num_protected == ref.num_protected
    assert sel.stop == expected_stop(len(idx), ref.capacity, sel.coverage, tau), (sel.stop, len(idx), sel.coverage)
    if ref.exact:
        assert idx.tolist() == ref.indices.tolist()
        assert sel.stop == ref.stop
        assert abs(sel.coverage - ref.coverage) <= tol.coverage + tol.coverage_slack / ref.min_pivot, (
            sel.coverage, ref.coverage, ref.min_pivot)
        np.testing.assert_allclose(res, ref.residuals, rtol=0, atol=tol.residual + tol.pivot_slack / ref.min_pivot)

    rp = replay(x64, idx, protected, eligible, tau=tau, k=k, eps=eps, tol=tol.margin, pivot_slack=tol.pivot_slack)
    assert not rp.violations, rp.violations
    assert abs(sel.coverage - rp.coverage) <= tol.coverage + tol.coverage_slack / rp.min_pivot, (
        sel.coverage, rp.coverage, rp.min_pivot)
    np.testing.assert_allclose(res, rp.residuals, rtol=0, atol=tol.residual + tol.pivot_slack / rp.min_pivot)
    return ref


# ----------------------------------------------------------------------------- random inputs

SHAPES = [(1, 7), (1, 384), (17, 33), (17, 7), (255, 100), (255, 7), (1000, 384), (1000, 33)]
INTERPRETER_SHAPES = [(1, 7), (17, 33), (64, 48), (40, 7), (64, 33), (33, 17)]
KINDS = ("gaussian", "lowrank", "clustered", "embedding")


def shapes_for(backend: str) -> list[tuple[int, int]]:
    return INTERPRETER_SHAPES if interpreted(backend) else SHAPES


def make_x(rng: np.random.Generator, n: int, d: int, kind: str) -> np.ndarray:
    """float64 rows with some structure; row norms vary in [0.5, 4] (normalisation is the library's job)."""
    if kind == "gaussian":
        x = rng.standard_normal((n, d))
    elif kind == "lowrank":
        r = int(rng.integers(1, min(n, d) + 1))
        x = rng.standard_normal((n, r)) @ rng.standard_normal((r, d)) + 1e-2 * rng.standard_normal((n, d))
    elif kind == "clustered":
        c = int(rng.integers(1, 6))
        x = rng.standard_normal((c, d))[rng.integers(0, c, size=n)] + 0.3 * rng.standard_normal((n, d))
    else:  # "embedding": a shared mean direction plus noise, like sentence embeddings
        x = 1.0 + 0.7 * rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0.5, 4.0, size=(n, 1))


def random_problem(rng: np.random.Generator, n: int, d: int, max_k: int = 32):
    """(x64, protected, eligible, tau, k) with protected/eligible in a random accepted form."""
    x = make_x(rng, n, d, KINDS[int(rng.integers(len(KINDS)))])
    n_p = int(rng.choice([0, 1, int(rng.integers(0, min(n, 6) + 1))]))
    p = rng.choice(n, size=n_p, replace=False)
    form = int(rng.integers(3))
    if form == 0:
        protected = p.tolist() + p[: n_p // 2].tolist()          # list with duplicates
    elif form == 1:
        protected = np.zeros(n, dtype=bool)
        protected[p] = True                                        # bool mask
    else:
        protected = p.astype(np.int64)                             # index array
    if rng.random() < 0.4:
        eligible = None
    else:
        eligible = rng.random(n) < rng.uniform(0.3, 1.0)
        if rng.random() < 0.5:
            eligible = np.flatnonzero(eligible)
    tau = float(rng.choice([0.9, rng.uniform(0.2, 1.0), 1.0]))
    k = int(rng.choice([16, int(rng.integers(0, max_k + 1))]))
    return x, protected, eligible, tau, k


#: A small well-conditioned input for the refusal tests.
rng0 = np.random.default_rng(0)
X = rng0.standard_normal((5, 7)).astype(np.float32)
