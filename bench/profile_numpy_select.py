"""Where ``gk.select(backend="numpy")`` spends its time at the floor shape (n=512, d=1024, 16 steps).

    python -m bench.profile_numpy_select [--repeats N]

Two views, both timed in interleaved rounds (`bench.timing.compare`):

1. layers, by calling the real functions: ``gk.select`` > ``select_ragged`` (prebuilt batch) >
   ``numpy_backend.select_packed`` > ``numpy_backend.select_session``, plus ``api.check_rows``;
   each layer's own cost is the difference to the one below it.
2. inside ``select_session``: its statements, copied verbatim and run at the real shapes, once
   (normalise) or 16 times (per step), set beside the sequential floor (16 x ``X @ v``).
   The copies must be kept in step with gemkernels/backends/numpy_backend.py.
"""

from __future__ import annotations

import argparse

import numpy as np

import gemkernels as gk
from gemkernels import api
from gemkernels.backends import numpy_backend
from gemkernels.ragged import RaggedBatch

from . import cases
from .timing import compare, fmt_seconds


def layers(x: np.ndarray, case: cases.Case, repeats: int) -> dict:
    n = x.shape[0]
    batch = RaggedBatch(values=x, offsets=np.array([0, n]), protected=np.zeros(n, bool), eligible=np.ones(n, bool))
    tau, capacity = np.array([case.tau]), np.array([case.k])
    none, every = np.zeros(0, dtype=np.int64), np.ones(n, bool)
    return compare({
        "gk.select": lambda: gk.select(x, tau=case.tau, k=case.k, backend="numpy"),
        "select_ragged": lambda: gk.select_ragged(batch, tau=case.tau, k=case.k, backend="numpy"),
        "select_packed": lambda: numpy_backend.select_packed(batch, tau, capacity, 1e-6),
        "select_session": lambda: numpy_backend.select_session(x, none, every, case.tau, case.k, 1e-6),
        "check_rows": lambda: api.check_rows(batch),
    }, repeats)


def statements(x: np.ndarray, case: cases.Case, repeats: int) -> dict:
    """select_session's statements at the shapes of step ~k/2 (8 directions), per-step ones run k times."""
    n, steps, m = x.shape[0], case.k, case.k // 2
    xn = x / np.sqrt(np.einsum("ij,ij->i", x, x))[:, None]
    rng = np.random.default_rng(1)
    coords = rng.standard_normal((case.k, n)).astype(x.dtype) * 0.01
    residuals = np.full(n, 0.9, dtype=x.dtype)
    candidates = np.ones(n, bool)
    rows = list(range(steps))

    def floor():
        for i in rows:
            x @ x[i]

    def normalise():
        x / np.sqrt(np.einsum("ij,ij->i", x, x))[:, None]

    def matvec():
        for j in rows:
            xn @ xn[j]

    def correction():
        g = np.zeros(n, dtype=x.dtype)
        for j in rows:
            g -= coords[:m, j] @ coords[:m]

    def update():
        g = np.zeros(n, dtype=x.dtype)
        r = residuals.copy()
        for j in rows:
            coords[m] = g / np.sqrt(r[j])
            np.subtract(r, coords[m] ** 2, out=r)
            np.maximum(r, 0, out=r)

    def pick():
        for _ in rows:
            1.0 - residuals.mean(dtype=np.float64) < case.tau
            scores = np.where(candidates, residuals, -np.inf)
            j = int(np.argmax(scores))
            scores[j] <= 1e-6

    return compare({"floor (16 x X@v)": floor, "normalise (x / norms)": normalise,
                    "16 x matvec x @ x[j]": matvec, "16 x correction coords[:m, j] @ coords[:m]": correction,
                    "16 x coords/residual update": update, "16 x stop test + pick (mean, where, argmax)": pick},
                   repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_numpy_select", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    case = cases.NUMPY_ONE
    x = cases.numpy_sessions(case)[0]

    t = {name: timing.median for name, timing in layers(x, case, args.repeats).items()}
    total = t["gk.select"]
    own = {
        "gk.select wrapper (index_mask, RaggedBatch, sessions())": t["gk.select"] - t["select_ragged"],
        "select_ragged minus select_packed (validation, conversion, results)": t["select_ragged"] - t["select_packed"],
        "  of which api.check_rows": t["check_rows"],
        "select_packed minus select_session (packing loop)": t["select_packed"] - t["select_session"],
        "select_session": t["select_session"],
    }
    print(f"## numpy gk.select, n={case.n} d={case.d} {case.k} steps: layers (median of {args.repeats})\n")
    print("| part | median | share of gk.select |\n|---|---|---|")
    print(f"| gk.select total | {fmt_seconds(total)} | 100% |")
    for name, seconds in own.items():
        print(f"| {name} | {fmt_seconds(seconds)} | {seconds / total:.0%} |")

    s = {name: timing.median for name, timing in statements(x, case, args.repeats).items()}
    floor = s.pop("floor (16 x X@v)")
    print(f"\n## inside select_session (statements at the real shapes; floor {fmt_seconds(floor)})\n")
    print("| statement | median | x floor | share of select_session |\n|---|---|---|---|")
    for name, seconds in s.items():
        print(f"| {name} | {fmt_seconds(seconds)} | {seconds / floor:.2f} | {seconds / t['select_session']:.0%} |")
    accounted = sum(s.values())
    print(f"| sum of the above | {fmt_seconds(accounted)} | {accounted / floor:.2f} | "
          f"{accounted / t['select_session']:.0%} |")
    print(f"| select_session measured | {fmt_seconds(t['select_session'])} | {t['select_session'] / floor:.2f} | 100% |")


if __name__ == "__main__":
    main()
