"""The parts of bench/gpu_check.sh that are no plain sweep, one subcommand each; ``--smoke`` runs each at tiny
sizes on the CPU (Triton's interpreter), as ``gpu_check.sh --cpu-smoke`` and the tests do.

    python -m bench.gpu_checks targets OUT [--smoke] [--budget S | --deadline T]  # both headline targets
    python -m bench.gpu_checks checks [--smoke] [--only NAME ...]  # races, agreement, 2^31, profile, registers
    python -m bench.gpu_checks tiny [--smoke]                      # every path once, tiny: for compute-sanitizer
    python -m bench.gpu_checks probe [--smoke]                     # one trivial kernel: can Triton launch here?

``checks`` runs every check (one failing does not stop the others), prints one verdict line each and exits 1 if
any failed. Run from a checkout: the float64 reference is tests/reference.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import gemkernels as gk
from gemkernels.benchmark.point import VARIANTS, Point, Settings, make_batch, make_values
from gemkernels.benchmark.sweep import sweep

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reference import replay  # noqa: E402  (tests/reference.py: DESIGN.md §1 in float64)

#: The headline targets (bf16, b = 16, fixed-b mode): the serving batch against reading X once, the long histories
#: against b passes over X; the long ones in fp32 too.
TARGETS = (Point("fixed", "bf16", 4096, 256, 1024, 16), Point("fixed", "bf16", 256, 4096, 384, 16),
           Point("fixed", "fp32", 256, 4096, 384, 16))
SMOKE_TARGETS = (Point("fixed", "bf16", 1, 8, 16, 16), Point("fixed", "fp32", 1, 32, 16, 16))
CONTENDERS = ("torch", "triton-gram", "triton-fused", "triton-stepwise") + VARIANTS
#: (name, TritonOptions fields) of every triton path and greedy the race hunt runs.
PATHS = (("gram", dict(path="gram")), ("gram-global", dict(path="gram", resident=False)),
         ("fused", dict(path="fused")), ("fused-global", dict(path="fused", resident=False)),
         ("stepwise", dict(path="stepwise")))
#: The float64 replay's margins for an fp32 computation (tests/select_helpers.py's): the kernels compute in fp32 from
#: the bf16 rows, which the replay is given exactly.
FP32_TOLERANCE = dict(tol=1e-4, pivot_slack=32 * 2.0 ** -24)
#: Tiles narrower than a program's threads (16 rows against 4 warps): where a missing barrier shows.
SMALL_TILES = dict(block_n=16, block_d=16, block_w=4, pivot_block_d=16, block_m=16, block_k=16)


def device_of(smoke: bool) -> str:
    return "cpu" if smoke else "cuda"


def targets(out: Path, smoke: bool, budget: float | None) -> int:
    """Both headline targets in one sweep (one measurement of the ceilings), headline first; 1 if a backend failed."""
    points = SMOKE_TARGETS if smoke else TARGETS
    settings = Settings(device=device_of(smoke), repeats=3 if smoke else 50, warmup=2,
                        point_seconds=0.05 if smoke else 2.0, copies=None, seed=0)
    records = sweep(list(points), list(CONTENDERS), settings, out, time_budget=budget)
    return int(any(r["status"] == "error" for r in records))


@dataclass
class Check:
    """One named check: returns a verdict line, raises AssertionError when it fails."""

    name: str
    run: Callable[[bool], str]


def small_batch(smoke: bool, seed: int = 0):
    """A ragged batch whose sessions reach every greedy kernel at `SMALL_TILES` (G on chip, G in memory with the
    state in registers and not, passes over X), with protected rows; torch on the device."""
    import torch

    rng = np.random.default_rng(seed)
    lengths = (1, 20, 40, 3) if smoke else (1, 40, 3, 17, 64, 300, 700)
    d = 24 if smoke else 96
    xs = [torch.from_numpy(rng.standard_normal((n, d)).astype(np.float32)).to(device_of(smoke)) for n in lengths]
    protected = [[0] if n > 1 else [] for n in lengths]
    return gk.RaggedBatch.from_list(xs, protected, None)


def check_races(smoke: bool) -> str:
    """Each path 20 times (3 under --smoke) on a small-tile batch: every run must give the same bits."""
    from gemkernels.select.backends.triton_backend import TritonOptions, using

    batch, runs = small_batch(smoke), 3 if smoke else 20
    differing = []
    for name, fields in PATHS:
        with using(TritonOptions(**fields, **SMALL_TILES)):
            first = gk.select_ragged(replace(batch), tau=0.99, k=12, backend="triton")
            for _ in range(runs - 1):
                again = gk.select_ragged(replace(batch), tau=0.99, k=12, backend="triton")
                if any(not np.array_equal(np.asarray(getattr(again, f).cpu()), np.asarray(getattr(first, f).cpu()))
                       for f in ("indices", "counts", "coverage", "residuals")):
                    differing.append(name)
                    break
    assert not differing, f"runs differ in their bits: {differing}"
    return f"{len(PATHS)} paths x {runs} runs on {batch.num_sessions} sessions at 16-row tiles: identical bits"


def check_agreement(smoke: bool) -> str:
    """At the headline shapes (bf16): every triton path against torch (share of sessions with the same rows) and
    a few sampled sessions of each replayed through the float64 reference (each decision a legal greedy one)."""
    import torch

    lines, failures = [], []
    for point in SMOKE_TARGETS if smoke else TARGETS[:2]:
        values = make_values(point.sessions * point.n, point.d, "bfloat16", device_of(smoke), seed=1)
        values = values if isinstance(values, torch.Tensor) else torch.from_numpy(values)
        batch = make_batch(values, point.n)
        base = gk.select_ragged(batch, tau=point.tau, k=point.b, backend="torch")
        sample = np.random.default_rng(2).choice(point.sessions, size=min(4, point.sessions), replace=False)
        for path in ("gram", "fused", "stepwise"):
            from gemkernels.select.backends.triton_backend import TritonOptions, using

            with using(TritonOptions(path=path)):
                got = gk.select_ragged(replace(batch), tau=point.tau, k=point.b, backend="triton")
            same = float((got.indices.cpu() == base.indices.cpu()).all(dim=1).double().mean())
            lines.append(f"{point} {path}: {same:.1%} of sessions as torch")
            for s in sample.tolist():
                a, b = int(batch.offsets[s]), int(batch.offsets[s + 1])
                x = values[a:b].float().cpu().numpy()
                chosen = got.indices[s, :int(got.counts[s])].cpu().numpy()
                violations = replay(x, chosen, tau=point.tau, k=point.b, **FP32_TOLERANCE).violations
                if violations:
                    failures.append(f"{point} {path} session {s}: {violations[:2]}")
            if same < 0.9:
                failures.append(f"{point} {path}: only {same:.1%} of sessions as torch")
    assert not failures, "; ".join(failures)
    return "; ".join(lines)


def check_past_2_31(smoke: bool) -> str:
    """One stepwise call on a batch of more than 2^31 elements whose answer is known: session 0 is a small
    random matrix repeated (every copy ties with its original, and ties go to the lowest index, so it selects what
    the small matrix selects), session 1 starts past element 2^31 and is a small matrix itself; both against the
    float64 reference. (--smoke: the same construction below 2^31.)"""
    import torch

    from gemkernels.select.backends.triton_backend import TritonOptions, using

    d, k = 384, 8
    rng = np.random.default_rng(3)
    small = [rng.standard_normal((m, d)).astype(np.float32) for m in (48, 40)]
    rows0 = 64 if smoke else -(-2 ** 31 // d) + 1024  # session 1 starts past element 2^31
    device = device_of(smoke)
    tile = torch.from_numpy(small[0]).to(device, torch.bfloat16)
    x = torch.cat([tile.repeat(-(-rows0 // len(small[0])), 1)[:rows0],
                   torch.from_numpy(small[1]).to(device, torch.bfloat16)])
    offsets = np.array([0, rows0, x.shape[0]], dtype=np.int64)
    batch = gk.RaggedBatch(values=x, offsets=offsets, protected=np.zeros(x.shape[0], bool),
                           eligible=np.ones(x.shape[0], bool))
    with using(TritonOptions(path="stepwise")):
        got = gk.select_ragged(batch, tau=1.0, k=k, backend="triton")
    for s, m in enumerate(small):
        xs = x[offsets[s]:offsets[s] + len(m)].float().cpu().numpy()  # the rows as the kernel saw them (bf16)
        chosen = got.indices[s, :int(got.counts[s])].cpu().numpy()
        assert chosen.max() < len(m), f"session {s} chose a copy, not the original: {chosen}"
        violations = replay(xs, chosen, tau=1.0, k=k, **FP32_TOLERANCE).violations
        assert not violations, f"session {s}: {violations[:2]}"
    return f"{x.numel():,} elements ({x.numel() / 2 ** 31:.2f} x 2^31): both sessions as the float64 reference"


def check_profile(smoke: bool) -> str:
    """A torch.profiler breakdown of one call at the serving headline shape (the default path): the kernels'
    device time and the host work around them, printed as a table."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    point = SMOKE_TARGETS[0] if smoke else TARGETS[0]
    values = make_values(point.sessions * point.n, point.d, "bfloat16", device_of(smoke), seed=4)
    values = values if isinstance(values, torch.Tensor) else torch.from_numpy(values)
    batch = make_batch(values, point.n)
    gk.select_ragged(replace(batch), tau=point.tau, k=point.b, backend="triton")  # compiled, warm
    activities = [ProfilerActivity.CPU] + ([] if smoke else [ProfilerActivity.CUDA])
    with profile(activities=activities) as prof:
        gk.select_ragged(replace(batch), tau=point.tau, k=point.b, backend="triton")
        if not smoke:
            torch.cuda.synchronize()
    sort = "self_cpu_time_total" if smoke else "self_cuda_time_total"
    events = prof.key_averages()
    print(events.table(sort_by=sort, row_limit=15), flush=True)
    if not smoke:  # a container that denies CUPTI profiles every kernel at 0 us: say so instead of an empty table
        device_us = sum(event.self_device_time_total for event in events)
        assert device_us > 0, "no device time recorded (GPU profiling not permitted here?)"
        return f"{point}: table above ({sort}), {device_us:.0f} us on the device"
    return f"{point}: table above ({sort})"


def check_registers(smoke: bool) -> str:
    """Registers and spills of every kernel variant this process compiled, read from the JIT's cache (what ran,
    against tests/compile_kernels.py's ahead-of-time figures)."""
    from gemkernels.kernels import gram, greedy_exact, greedy_fused, greedy_resident, greedy_stepwise, norms

    kernels = (gram.gram_kernel, norms.row_norms_kernel, greedy_resident.greedy_resident_kernel,
               greedy_fused.greedy_fused_kernel, greedy_stepwise.pivot_direction_kernel,
               greedy_stepwise.residual_update_kernel, greedy_exact.greedy_exact_kernel)
    rows = []
    for fn in kernels:
        for caches in getattr(fn, "device_caches", {}).values():
            for compiled in caches[0].values():
                compiled._init_handles()
                constants = {fn.arg_names[k[0]]: v for k, v in compiled.src.constants.items()
                             if fn.arg_names[k[0]].isupper()}
                rows.append(f"  {compiled.name} {constants} warps={compiled.metadata.num_warps}: "
                            f"{compiled.n_regs} registers, {compiled.n_spills} spilled")
    print("\n".join(rows) or "  (nothing compiled: Triton's interpreter runs the kernels)", flush=True)
    spilled = [r for r in rows if not r.endswith(" 0 spilled")]
    assert not spilled, f"variants that spill: {spilled}"
    return f"{len(rows)} compiled variants, none spilling"


CHECKS = (Check("races", check_races), Check("agreement", check_agreement), Check("past-2^31", check_past_2_31),
          Check("profile", check_profile), Check("registers", check_registers))


def checks(smoke: bool, only: list[str] | None) -> int:
    """Every check (or those named), each timed, then `tiny` once (so that compute-sanitizer's stages find its
    kernels compiled); 1 if any failed."""
    failed = 0
    for check in CHECKS:
        if only and check.name not in only:
            continue
        start = time.perf_counter()
        try:
            verdict, status = check.run(smoke), "ok"
        except Exception as err:  # a check's failure, whatever it is, is reported and the next one runs
            verdict, status, failed = f"{type(err).__name__}: {err}", "FAILED", 1
        print(f"[check {check.name}] {status} in {time.perf_counter() - start:.1f} s: {verdict}", flush=True)
    if not only:
        start = time.perf_counter()
        try:
            failed |= tiny(smoke)
            verdict = "ok"
        except Exception as err:  # noqa: BLE001 - as a check's
            verdict, failed = f"FAILED: {type(err).__name__}: {err}", 1
        print(f"[tiny, compiled for the sanitizer stages] {verdict} in {time.perf_counter() - start:.1f} s", flush=True)
    return failed


def tiny(smoke: bool) -> int:
    """Every path once at the tiles the backend launches, on tiny sessions (for compute-sanitizer's tools)."""
    batch = small_batch(smoke, seed=5)
    from gemkernels.select.backends.triton_backend import TritonOptions, using

    for name, fields in PATHS:
        with using(TritonOptions(**fields)):
            out = gk.select_ragged(replace(batch), tau=0.99, k=8, backend="triton")
        print(f"{name}: counts {out.counts.tolist()}", flush=True)
    return 0


def probe(smoke: bool) -> int:
    """Launch one trivial Triton kernel (a C compiler and ptxas are needed for the first launch): 0 when it ran."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def store_one(x):
        tl.store(x, 1.0)

    x = torch.zeros(1, device=device_of(smoke))
    store_one[(1,)](x)
    assert x.item() == 1.0, x
    print("a Triton kernel launched", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("targets", help="both headline targets in one sweep")
    t.add_argument("out", type=Path)
    limit = t.add_mutually_exclusive_group()
    limit.add_argument("--budget", type=float, help="seconds the sweep may take (the points left are noted)")
    limit.add_argument("--deadline", type=float, help="the Unix time by which the sweep must be done (a shell's "
                       "stage limit counted from before this process started and imported torch)")
    c = sub.add_parser("checks", help="races, agreement, 2^31, profile, registers")
    c.add_argument("--only", nargs="+", choices=[check.name for check in CHECKS])
    sub.add_parser("tiny", help="every path once on tiny shapes")
    sub.add_parser("probe", help="launch one trivial kernel")
    for p in (t, c, sub.choices["tiny"], sub.choices["probe"]):
        p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, in Triton's interpreter")
    args = parser.parse_args(argv)
    if args.smoke:  # the kernels read it when first imported, which none has been yet
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if args.command == "targets":
        budget = args.budget if args.deadline is None else args.deadline - time.time()
        return targets(args.out, args.smoke, budget)
    if args.command == "checks":
        return checks(args.smoke, args.only)
    if args.command == "probe":
        return probe(args.smoke)
    return tiny(args.smoke)


if __name__ == "__main__":
    sys.exit(main())
