"""Every Triton path, forced, in Triton's interpreter without a GPU (or on one): the options reach the greedy
kernels and the answers match the reference and the torch backend. Shared helpers: tests/select_helpers.py."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")
from helpers import KernelSpy  # noqa: E402
from select_helpers import INTERPRETED, backend_marks, check_selection, random_problem, reference_for, sel_idx  # noqa: E402

import gemkernels as gk  # noqa: E402

#: Session lengths of a batch: "short" fit every register-resident greedy (G on chip included), "medium" only the
#: one reading G from memory. Interpreted (slow) and on CUDA (the default tiles).
TRITON_LENGTHS = {"short": ([1, 40, 3, 17, 64], [1, 60, 3, 17, 64]),
                  "medium": ([1, 40, 3, 260], [1, 700, 3, 257, 64, 1000])}


@pytest.mark.parametrize("path,resident,lengths,greedy", [
    ("gram", True, "short", ("greedy_resident", "chip")), ("gram", True, "medium", ("greedy_resident", "gram")),
    ("gram", False, "short", ("greedy_fused", None)), ("fused", True, "short", ("greedy_resident", "x")),
    ("fused", True, "medium", ("greedy_fused", None)), ("stepwise", False, "medium", None)])
def test_triton_paths_match_reference(path, resident, lengths, greedy, monkeypatch, triton_options):
    """Every Triton path, forced, with tiles small enough that the shapes cross tile edges, and every greedy
    kernel behind them (``greedy``: the kernel and the resident greedy's source of Gram rows)."""
    for mark in backend_marks("triton"):
        pytest.skip(mark.kwargs["reason"])
    from gemkernels.kernels import greedy_fused, greedy_resident

    from gemkernels.select.backends import triton_backend

    assert path in triton_backend.PATHS
    triton_options(triton_backend.TritonOptions(
        path=path, resident=resident, block_n=16, block_d=16, block_w=4, pivot_block_d=16, block_m=16, block_k=16))
    launched = []  # which greedy kernel ran: the options must reach it
    for module, name in ((greedy_fused, "greedy_fused"), (greedy_resident, "greedy_resident")):
        monkeypatch.setattr(module, f"{name}_kernel", KernelSpy(getattr(module, f"{name}_kernel"), name, launched))
    rng = np.random.default_rng(17)
    ns, d = (TRITON_LENGTHS[lengths][0], 24) if INTERPRETED else (TRITON_LENGTHS[lengths][1], 100)
    for dtype in ("float32", "float16"):
        problems = [random_problem(rng, n, d, max_k=16) for n in ns]
        xs = [p[0].astype(dtype) for p in problems]
        ps = [p[1] for p in problems]
        es = [p[2] for p in problems]
        taus, ks = np.array([p[3] for p in problems]), np.array([p[4] for p in problems])
        sels = gk.select_batch(xs, protected=ps, eligible=es, tau=taus, k=ks, backend="triton")
        for x, p, e, tau, k, sel in zip(xs, ps, es, taus.tolist(), ks.tolist(), sels):
            check_selection(sel, x, p, e, tau, k)
        # the same batch through the torch backend agrees on the unambiguous prefixes
        base = gk.select_batch(xs, protected=ps, eligible=es, tau=taus, k=ks, backend="torch")
        for s, (x, a, b) in enumerate(zip(xs, sels, base)):
            ref = reference_for(x, ps[s], es[s], float(taus[s]), int(ks[s]))
            c = ref.comparable
            assert sel_idx(a)[:c] == sel_idx(b)[:c], f"{path} session {s}"
    assert {(name, constexprs.get("SOURCE")) for name, constexprs in launched} == ({greedy} if greedy else set())
