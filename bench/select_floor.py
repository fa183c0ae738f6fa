"""Selection against its floors, side by side in one process: medians and ratios, never pass/fail.

    python -m bench.select_floor [--out DIR] [--only numpy torch gpu gram] [--repeats-scale X]

a. CPU backends, one session (n=512, d=1024, tau=1.0, k=16: exactly 16 steps, float32): ``gk.select``
   on numpy (and numba, where installed) against the sequential floor (16 back-to-back ``X @ v``, the
   matrix-vector products the greedy cannot avoid) and against one GEMM ``X @ Q.T`` with 16 rows in Q;
   where threadpoolctl is installed, the floor and numpy again with one BLAS thread, against the floor as the
   process runs it (its default BLAS threads); and what bounds a numpy loop: the norms and the 16 steps'
   arithmetic alone (`numpy_step_floor`), and ``X @ Q.T`` with 2, 4, 8 and 16 rows in Q (fewer, larger BLAS
   calls: the price of a block of Gram rows against as many ``X @ v``) with the blocks that speculating on the next
   pivots would need (`speculative_blocks`).
b. torch on the CPU, 64 sessions of 64 x 384 (tau=0.9, k=16): one ``select_batch`` against 64
   ``select`` calls; the numpy and numba backends on the same batch alongside.
c. CUDA only: each triton path (gram, fused, stepwise) against the torch backend at S=1024,
   n=256, d=1024, b=16 in fp32 and bf16, and the time to read X once at the measured
   device-to-device copy bandwidth. Skipped, with a note, without a GPU.
d. CUDA only: the gram path's tile candidates (`kernels.gram.TILE_CANDIDATES`) at S=4096, n=256, d=1024, b=16: the Gram
   kernel against its byte and flop floors, the whole selection against reading X once.

Contenders of one measurement are timed in interleaved rounds (`gemkernels.benchmark.timing.compare`), so the
ratios hold up on a noisy machine. Every row is printed as markdown and appended as one JSON
line (config, medians, ratios, versions, git commit, CPU, date) to DIR/results.jsonl.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

import gemkernels as gk
from gemkernels.benchmark.machine import copy_bandwidth, environment, version
from gemkernels.benchmark.point import run_selection
from gemkernels.benchmark.sweep import resolve_device, say
from gemkernels.benchmark.timing import Timing, compare, cpu_call, cuda_call, fmt_seconds

from . import cases

DEFAULT_OUT = Path(__file__).resolve().parent / "out"

try:
    from tqdm import tqdm
except ImportError:  # plain progress lines instead of a bar
    tqdm = None


# --------------------------------------------------------------------------- reporting


class Recorder:
    """Prints markdown rows and appends JSON lines to ``out_dir/results.jsonl``."""

    HEADER = "| measurement | config | median | IQR | ratio | target |\n|---|---|---|---|---|---|"

    def __init__(self, out_dir: Path):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "results.jsonl"
        self.env = environment(resolve_device("auto"))

    def section(self, title: str, note: str | None = None) -> None:
        say(f"\n### {title}\n" + (f"\n{note}\n" if note else "") + f"\n{self.HEADER}")

    def row(self, measurement: str, config: dict, timing: Timing | float | None,
            ratios: dict[str, float] | None = None, target: str | None = None, **extra) -> None:
        """``timing``: a measured `Timing`, a derived time in seconds (no spread), or None (nothing timed)."""
        ratios = ratios or {}
        ratio_text = ", ".join(f"{name} {value:.2f}x" for name, value in ratios.items()) or extra.get("error", "-")
        short = " ".join(f"{k}={v}" for k, v in config.items() if k != "name")
        if isinstance(timing, Timing):
            median, spread = fmt_seconds(timing.median), f"{fmt_seconds(timing.q1)}-{fmt_seconds(timing.q3)}"
            numbers = {"median_s": timing.median, "q1_s": timing.q1, "q3_s": timing.q3, "repeats": timing.repeats}
        elif timing is not None:
            median, spread = fmt_seconds(timing), "derived"
            numbers = {"median_s": timing, "q1_s": None, "q3_s": None, "repeats": None, "derived": True}
        else:
            median, spread = "-", "-"
            numbers = {"median_s": None, "q1_s": None, "q3_s": None, "repeats": None}
        say(f"| {measurement} | {short} | {median} | {spread} | {ratio_text} | {target or '-'} |")
        record = {
            "measurement": measurement, "config": config, **numbers,
            "ratio": next(iter(ratios.values()), None), "ratios": ratios, "target": target, **extra,
            "loadavg_1m": os.getloadavg()[0], **self.env,
        }
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def expect_steps(counts, k: int, what: str) -> None:
    """Every session must have taken exactly k steps, or the comparison with a k-step floor is void."""
    counts = np.asarray(counts)
    if not (counts == k).all():
        raise RuntimeError(f"{what}: expected {k} selected rows per session, got {sorted(set(counts.tolist()))}")


# --------------------------------------------------------------------------- a. numpy against its floor


def cpu_backends() -> list[str]:
    """The numpy backend, and numba where it is installed."""
    return [name for name in ("numpy", "numba") if name in gk.available_backends()]


def one_blas_thread() -> Callable[[Callable[[], object]], Callable[[], object]] | None:
    """A wrapper that runs a function with the BLAS limited to one thread and then restores it (threadpoolctl's
    direct call, about a microsecond either way); None without threadpoolctl or a BLAS it knows."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    blas = [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]
    if not blas:
        return None

    def wrap(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            before = [lib.num_threads for lib in blas]
            for lib in blas:
                lib.set_num_threads(1)
            try:
                return fn()
            finally:
                for lib, threads in zip(blas, before):
                    lib.set_num_threads(threads)
        return run

    return wrap


def numpy_step_floor(x: np.ndarray, steps: int) -> float:
    """The numpy backend's formulation with nothing but its arithmetic: the row norms, then ``steps`` steps of one Gram
    row ``X @ x_j``, its correction by the earlier directions, its scale, the residual and energy update and the
    argmax (no checks, stop tests, copies or near-dependence: the least any numpy loop of this formulation
    costs). Returns the captured energy."""
    n = x.shape[0]
    inv_norms = (1.0 / np.sqrt(np.vecdot(x, x))).astype(np.float32)
    inv_sq = np.square(inv_norms)
    scaled, decrease = np.empty((steps, n), dtype=np.float32), np.empty(n, dtype=np.float32)
    residuals, scores = np.ones(n, dtype=np.float32), np.ones(n, dtype=np.float32)
    energy = 0.0
    for m in range(steps):
        j = int(scores.argmax())
        new = scaled[m]
        np.matmul(x, x[j], out=new)
        if m:
            np.subtract(new, np.dot(scaled[:m, j], scaled[:m], out=decrease), out=new)
        np.multiply(new, float(inv_norms[j]) / np.sqrt(float(residuals[j])), out=new)
        np.multiply(new, inv_sq, out=decrease)
        energy += float(np.dot(decrease, new))
        np.multiply(decrease, new, out=decrease)
        np.subtract(residuals, decrease, out=residuals)
        np.subtract(scores, decrease, out=scores)
        scores[j] = -np.inf
    return energy


def speculative_blocks(x: np.ndarray, steps: int, rows: int) -> int:
    """How many GEMMs of ``rows`` Gram rows the greedy's ``steps`` pivots need when each one, made where a pivot's
    row is missing, takes the ``rows`` candidates then leading (the pivot first): the best case of speculating on
    the next pivots, from the float64 greedy."""
    unit = x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
    residuals, coords, taken, block, blocks = np.ones(len(x)), [], [], set(), 0
    for _ in range(steps):
        scores = residuals.copy()
        scores[taken] = -np.inf
        j = int(scores.argmax())
        if j not in block:
            blocks += 1
            block = set(np.argsort(-scores, kind="stable")[:rows].tolist())
        c = (unit @ unit[j] - sum(ct[j] * ct for ct in coords)) / np.sqrt(residuals[j])
        coords.append(c)
        residuals = residuals - c * c
        taken.append(j)
    return blocks


#: Rows of Q in the narrow GEMMs `bench_numpy` times against as many matrix-vector products.
BLOCK_ROWS = (2, 4, 8, 16)


def bench_numpy(rec: Recorder, repeats: int) -> None:
    case = cases.NUMPY_ONE
    n, d, b = case.n, case.d, case.k
    x = cases.numpy_sessions(case)[0]
    bytes_moved, flops = b * n * d * x.itemsize, 2 * n * d * b
    one_thread = one_blas_thread()
    rec.section(f"a. CPU backends (numpy, and numba where installed), one session (n={n}, d={d}, {b} steps, "
                f"float32)", f"floor: {b} passes over X = {b} x {n}*{d}*{x.itemsize} B = {bytes_moved / 1e6:.1f} MB "
                f"moved, 2*n*d*b = {flops / 1e6:.1f} MFLOP; BLAS threads as the process has them"
                + ("" if one_thread is None else ", and the rows marked 1 BLAS thread with one (threadpoolctl)"))

    def select(backend: str):
        return lambda: gk.select(x, tau=case.tau, k=case.k, backend=backend)

    def floor():
        for i in range(b):
            x @ x[i]

    q = np.ascontiguousarray(x[:b])

    def gemm():
        return x @ q.T

    blocks = {p: np.ascontiguousarray(x[:p]) for p in BLOCK_ROWS[:-1]}  # 16 rows: "gemm" above
    backends = cpu_backends()
    for name in backends:
        expect_steps([len(select(name)().indices)], b, f"{name} select")
    limited = {} if one_thread is None else {"floor": one_thread(floor), "numpy": one_thread(select("numpy"))}
    t = compare({"floor": floor, "gemm": gemm} | {name: select(name) for name in backends}
                | {f"{name}, 1 BLAS thread": fn for name, fn in limited.items()}
                | {"step floor": lambda: numpy_step_floor(x, b)}
                | {f"gemm {p}": (lambda q=q: x @ q.T) for p, q in blocks.items()}, repeats)
    config = case.describe() | {"dtype": "float32"}
    rec.row(f"sequential floor ({b} x X@v)", config, t["floor"],
            bytes_moved=bytes_moved, flops=flops, gb_per_s=bytes_moved / t["floor"].median / 1e9)
    rec.row("one GEMM X@Q.T", config, t["gemm"], {"gemm/floor": t["gemm"].median / t["floor"].median},
            gflop_per_s=flops / t["gemm"].median / 1e9)
    for name in backends:
        rec.row(f"gk.select {name}", config | {"backend": name}, t[name],
                {"select/floor": t[name].median / t["floor"].median,
                 "select/gemm": t[name].median / t["gemm"].median}, target="select/floor <= 1.5")
    for name in limited:  # against the floor as the process runs it
        timing = t[f"{name}, 1 BLAS thread"]
        rec.row(f"{'sequential floor' if name == 'floor' else 'gk.select numpy'}, 1 BLAS thread",
                config | {"blas_threads": 1}, timing, {"/floor": timing.median / t["floor"].median})
    rec.row(f"numpy's step floor (norms + {b} steps' arithmetic)", config, t["step floor"],
            {"/floor": t["step floor"].median / t["floor"].median})
    for p in BLOCK_ROWS:  # a block of p Gram rows in one BLAS call, against p of the floor's X @ v
        timing = t[f"gemm {p}"] if p < b else t["gemm"]
        rec.row(f"one GEMM X@Q.T, {p} rows in Q", config | {"rows": p}, timing,
                {f"/({p} x X@v)": timing.median / (p * t["floor"].median / b)})
        count = speculative_blocks(x, b, p)  # speculating on the next pivots: that many blocks for b pivots
        rec.row(f"{b} pivots from speculative blocks of {p}: {count} GEMMs", config | {"rows": p, "blocks": count},
                count * timing.median, {"/floor": count * timing.median / t["floor"].median})


# --------------------------------------------------------------------------- b. torch batch against a loop


def bench_torch(rec: Recorder, repeats: int) -> None:
    import torch

    case = cases.TORCH_BATCH
    xs, xn = cases.torch_sessions(case), cases.numpy_sessions(case)
    kw = dict(tau=case.tau, k=case.k)
    rec.section(f"b. torch backend on the CPU ({torch.get_num_threads()} threads), "
                f"{case.sessions} sessions of {case.n} x {case.d}")

    def torch_batch():
        return gk.select_batch(xs, backend="torch", **kw)

    def torch_loop():
        return [gk.select(x, backend="torch", **kw) for x in xs]

    def cpu_batch(backend: str):
        return lambda: gk.select_batch(xn, backend=backend, **kw)

    backends = cpu_backends()
    contenders = {"torch loop": torch_loop, "torch batch": torch_batch} | {name: cpu_batch(name) for name in backends}
    for name, fn in contenders.items():
        expect_steps([len(s.indices) for s in fn()], case.k, name)
    t = compare(contenders, repeats)
    config = case.describe() | {"dtype": "float32", "device": "cpu"}
    rec.row(f"{case.sessions} x gk.select torch", config, t["torch loop"])
    rec.row("1 x gk.select_batch torch", config, t["torch batch"],
            {"speed-up loop/batch": t["torch loop"].median / t["torch batch"].median}, target="speed-up >= 5")
    for name in backends:
        rec.row(f"1 x gk.select_batch {name}", config | {"backend": name}, t[name],
                {f"{name}/torch batch": t[name].median / t["torch batch"].median})


# --------------------------------------------------------------------------- c. GPU: triton paths against torch


def gpu_unavailable() -> str | None:
    """Why section c cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (CPU-only machine)"
    if version("triton") is None:
        return "triton is not installed"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 is set; the interpreter would time the CPU, not the GPU"
    return None


COPY_BYTES = 2 << 30


def bench_gpu(rec: Recorder, repeats: int) -> None:
    case = cases.GPU_BATCH
    rec.section(f"c. GPU: triton paths against torch, {case.sessions} sessions of {case.n} x {case.d}, {case.k} steps")
    reason = gpu_unavailable()
    if reason is not None:
        say(f"skipped: {reason}. On a CUDA machine run: python -m bench.select_floor --only gpu")
        return

    import torch

    from gemkernels.select.backends import triton_backend
    from gemkernels.select.backends.triton_backend import PATHS

    bandwidth = copy_bandwidth("cuda", COPY_BYTES, repeats)
    say(f"device-to-device copy bandwidth (copy of {COPY_BYTES >> 30} GiB, read+write): {bandwidth / 1e9:.0f} GB/s; "
        f"default path for this shape: {triton_backend.choose_path(np.full(case.sessions, case.n), case.d)}\n")
    for dtype in (torch.float32, torch.bfloat16):
        batch = cases.ragged_batch(case, "cuda", dtype)
        config = case.describe() | {"dtype": str(dtype).removeprefix("torch."), "device": torch.cuda.get_device_name()}
        read_once = batch.values.nbytes / bandwidth
        rec.row("read X once (floor)", config, read_once, x_bytes=batch.values.nbytes,
                copy_bandwidth_b_per_s=bandwidth)

        def run(contender: str, batch=batch):
            return run_selection(batch, contender, case.tau, case.k)

        fns, reference = {"torch": lambda: run("torch")}, run("torch")
        expect_steps(reference.counts.cpu(), case.k, "torch backend")
        agreement = {}
        for path in PATHS:
            try:
                out = run(f"triton-{path}")
                expect_steps(out.counts.cpu(), case.k, f"triton {path}")
            except Exception as exc:  # report a broken path, keep measuring the others
                rec.row(f"gk.select_ragged triton {path}", config, None, error=f"failed: {type(exc).__name__}: {exc}")
                continue
            agreement[path] = float((out.indices == reference.indices).all(dim=1).float().mean())
            fns[f"triton {path}"] = lambda path=path: run(f"triton-{path}")
        del reference
        t = compare(fns, repeats, timer=cuda_call)
        rec.row("gk.select_ragged torch", config, t["torch"], {"torch/read-once": t["torch"].median / read_once})
        for path in agreement:
            timing = t[f"triton {path}"]
            rec.row(f"gk.select_ragged triton {path}", config, timing,
                    {"torch/triton": t["torch"].median / timing.median, "triton/read-once": timing.median / read_once},
                    same_indices_as_torch=agreement[path])
        del batch, fns
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- d. GPU: Gram tiles against their floors

def bench_gram(rec: Recorder, repeats: int) -> None:
    """The gram path's tile candidates at the headline shape (S=4096, n=256, d=1024, b=16), bf16 and fp32."""
    reason = gpu_unavailable()
    if reason is not None:
        rec.section("d. GPU: Gram tiles")
        say(f"skipped: {reason}. On a CUDA machine run: python -m bench.select_floor --only gram")
        return
    gram_tiles(rec, cases.GPU_HEADLINE, "cuda", repeats)


def gram_tiles(rec: Recorder, case: cases.Case, device: str, repeats: int, tiles=None,
               dtypes=("bfloat16", "float32")) -> None:
    """Each tile candidate (default: `kernels.gram.TILE_CANDIDATES`) alone and in the whole gram-path selection,
    timed interleaved, against the floors measured here: bytes (read X once, write the n^2 fp32 Gram matrices)
    at the copy bandwidth, the symmetric product's useful flops (S n (n+1) d) at the matmul rate, and reading X
    once for the selection."""
    bandwidth = copy_bandwidth(device, COPY_BYTES if device == "cuda" else 64 << 20, max(3, repeats // 2))
    rec.section(f"d. Gram tiles: {case.sessions} sessions of {case.n} x {case.d}, {case.k} steps, gram path",
                f"copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + write); tiles (BLOCK_M x BLOCK_K, warps, stages)")
    from gemkernels.kernels.gram import TILE_CANDIDATES

    for dtype in dtypes:
        gram_tiles_one_dtype(rec, case, device, dtype, bandwidth, repeats, tiles or TILE_CANDIDATES)
        if device == "cuda":
            import torch

            torch.cuda.empty_cache()


def gram_tiles_one_dtype(rec: Recorder, case: cases.Case, device: str, dtype: str, bandwidth: float, repeats: int,
                         tiles) -> None:
    """`gram_tiles` for one torch dtype name."""
    import torch
    from gemkernels.kernels.gram import gram_plan, ragged_gram

    from gemkernels.benchmark.machine import matmul_rate
    from gemkernels.select.api import select_ragged
    from gemkernels.select.backends.triton_backend import TritonOptions, using

    rate = matmul_rate(device, dtype, 8192 if device == "cuda" else 512, max(3, repeats // 4))
    batch = cases.ragged_batch(case, device, getattr(torch, dtype))
    x = batch.values
    offsets = torch.tensor(batch.offsets, device=x.device)  # a copy of the batch's read-only offsets
    lengths = batch.lengths
    bytes_floor = (x.nbytes + 4 * case.sessions * case.n ** 2) / bandwidth
    flop_floor = case.sessions * case.n * (case.n + 1) * case.d / rate
    read_once = x.nbytes / bandwidth
    floor = max(bytes_floor, flop_floor)
    config = case.describe() | {"dtype": dtype, "device": device, "copy_bandwidth_b_per_s": bandwidth,
                                "matmul_flop_per_s": rate}
    rec.row("floor: max(X + G bytes, symmetric flops)", config, floor,
            {"bytes": bytes_floor / floor, "flops": flop_floor / floor}, read_once_s=read_once)
    fns, checks, first = {}, {}, None
    for block_m, block_k, warps, stages in tiles:
        name = f"{block_m}x{block_k} w{warps} s{stages}"
        options = TritonOptions(path="gram", block_m=block_m, block_k=block_k, gram_warps=warps, gram_stages=stages)

        def gram(block_m=block_m, block_k=block_k, warps=warps, stages=stages):
            return ragged_gram(x, offsets, lengths, block_m, block_k, warps, stages)

        def select(options=options):
            with using(options):
                return select_ragged(dataclasses.replace(batch), tau=case.tau, k=case.k, backend="triton")

        try:
            g, out = gram()[0], select()
            expect_steps(out.counts.cpu(), case.k, f"gram path {name}")
        except Exception as exc:  # report a failing candidate, keep measuring the others
            rec.row(f"gram {name}", config, None, error=f"failed: {type(exc).__name__}: {exc}")
            continue
        first = first or (g, out.indices)
        checks[name] = {"block_m": block_m, "tiles": len(gram_plan(lengths, block_m)[1]),
                        "gram_max_abs_diff_vs_first": float((g - first[0]).abs().max()),
                        "same_indices_as_first": float((out.indices == first[1]).all(dim=1).float().mean())}
        fns[f"gram {name}"], fns[f"select {name}"] = gram, select
    if not fns:
        return
    g = out = first = None  # free the candidates' Gram matrices before timing
    t = compare(fns, repeats, timer=cuda_call if device == "cuda" else cpu_call)
    for name, check in checks.items():
        computed = 2 * check["tiles"] * check["block_m"] ** 2 * case.d
        gram_t, select_t = t[f"gram {name}"], t[f"select {name}"]
        rec.row(f"gram {name}", config, gram_t,
                {"gram/floor": gram_t.median / floor, "gram/flop-floor": gram_t.median / flop_floor},
                computed_flops=computed, tflop_per_s=computed / gram_t.median / 1e12, **check)
        rec.row(f"select gram {name}", config, select_t, {"select/read-once": select_t.median / read_once},
                target="select/read-once <= 2 (bf16)")


# --------------------------------------------------------------------------- main

SECTIONS = {"numpy": (bench_numpy, 200), "torch": (bench_torch, 15), "gpu": (bench_gpu, 20), "gram": (bench_gram, 20)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.select_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory (default: bench/out/)")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), default=list(SECTIONS), help="sections to run")
    parser.add_argument("--repeats-scale", type=float, default=1.0, help="multiply every section's repeat count")
    args = parser.parse_args(argv)

    rec = Recorder(args.out)
    env = rec.env
    say(f"gemkernels select benchmarks - {env['date']} - commit {env['git_commit']}"
        f"{' (dirty)' if env['git_dirty'] else ''}\n{env['cpu']}, {env['cpu_count']} cores, numpy {env['numpy']}, "
        f"torch {env['torch']}, GPU: {env['gpu'] or 'none'}\nresults appended to {rec.path}")
    names = args.only
    steps = tqdm(names, desc="sections", leave=False) if tqdm is not None else names
    for i, name in enumerate(steps):
        if tqdm is None:
            print(f"[{i + 1}/{len(names)}] {name}", file=sys.stderr)
        fn, repeats = SECTIONS[name]
        fn(rec, max(3, round(repeats * args.repeats_scale)))


if __name__ == "__main__":
    main()
