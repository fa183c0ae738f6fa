"""Runs per second of ``gem online`` and ``gem replay`` on a local Ray instance against the local process pool.

    python -m bench.ray_overhead [--runs 24] [--rounds 3] [--encoder hash|minilm] [--workers 2]

The same runs (the first ``--runs`` development runs of ../shared, mini-swe-agent, else synthetic histories of 40
to 60 blocks), the same encoder and the same policies, replayed in this process (``LocalPool(1)``), the process
pool (``LocalPool(--workers)``; hash encoder only: a pool forked from a process that holds torch's threads can
hang, as ``gem online --help`` warns) and Ray (``ray.init(num_cpus=--workers)``: a task per run, encoding in the
actor), in alternating rounds after a first one, shown apart (it starts the imports, the tokenizer and Ray's
worker processes that later rounds reuse); medians. A round's time includes what a command pays per pool (process
start, Ray's encoder actor); Ray's session start, paid once per command, is reported apart. Each round starts with
cold encoders: the in-process encoders are dropped and the embedding cache folder (a temporary ``XDG_CACHE_HOME``)
emptied. ``gem replay``'s rows replay the checkpoints of runs already encoded. Every process runs one BLAS thread
(``OMP_NUM_THREADS=1`` unless set), as Ray sets for its tasks, so that the rows compare the distribution and not
the BLAS threads (on a busy 2-core machine two BLAS threads per process lose several times); a model encoder runs
``--workers`` threads in this process, one in each pool process, and in Ray's actor as many as
`encoder_placement` gives it (here the instance's CPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

CACHE_HOME = Path(tempfile.mkdtemp(prefix="gem-ray-bench-"))
os.environ["XDG_CACHE_HOME"] = str(CACHE_HOME)  # before gemkernels fixes DEFAULT_CACHE_DIR; Ray's workers inherit it
os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy loads: one BLAS thread per process, as Ray's tasks get

from gemkernels.evaluate.loaders import Run, load_runs  # noqa: E402
from gemkernels.evaluate.online_policies import PolicyOptions  # noqa: E402
from gemkernels.evaluate.online_replay import DEFAULT_POLICIES, replay_runs, report, shared_encoder  # noqa: E402
from gemkernels.evaluate.replay import Plan, prepare, replay  # noqa: E402
from gemkernels.evaluate.runner import LocalPool, Runner  # noqa: E402
from gemkernels.testing.histories import synthetic_history  # noqa: E402

TRAJECTORIES = Path(__file__).resolve().parents[2] / "shared" / "data" / "trajectories" / "mini-swe-agent"


def bench_runs(count: int) -> tuple[list[Run], str]:
    """The first ``count`` development runs, else ``count`` synthetic ones; and where they come from."""
    files = sorted(TRAJECTORIES.glob("*.traj.json"))[:count]
    if files:
        runs, errors = load_runs(files)
        assert not errors, errors
        return runs, f"{len(runs)} mini-swe-agent development runs"
    return [Run(f"synthetic-{i}", "openai", synthetic_history(40 + i % 21, seed=i), None, f"<synthetic {i}>")
            for i in range(count)], f"{count} synthetic histories of 40-60 blocks"


def cold() -> None:
    """Drop this process's encoders and the on-disk embedding cache: the next round encodes everything again."""
    shared_encoder.cache_clear()
    shutil.rmtree(CACHE_HOME / "gemkernels", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--encoder", default="hash")
    parser.add_argument("--workers", type=int, default=2, help="processes of the local pool, CPUs of the Ray instance")
    args = parser.parse_args()
    import ray

    from gemkernels.evaluate.ray_pool import RayPool

    if args.encoder != "hash":  # this process's model encodes with the pool's threads, the pool's with one each
        import torch

        torch.set_num_threads(args.workers)
    runs, source = bench_runs(args.runs)
    options = PolicyOptions(encoder=args.encoder)
    started = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, object_store_memory=512 * 2**20)
    ray_start = time.perf_counter() - started
    with LocalPool() as here:
        jobs = prepare(runs, here.embedding_cache(args.encoder, CACHE_HOME / "replay"), 16, progress=False)
    plan = Plan(("gem", "recent", "random"), (16,), (0.9,), 16)

    def online(runner: Runner) -> str:
        """The online replay's whole report (every call's cost, in order), as JSON."""
        replays, errors = replay_runs(runs, DEFAULT_POLICIES, options, runner, progress=False)
        assert not errors, errors
        return json.dumps(report(replays, options))

    def checkpoints(runner: Runner) -> list[tuple]:
        """The checkpoint replay's rows, values as bytes (nan compares equal)."""
        return [(run, *row[:4], row[4].tobytes()) for run, rows in replay(jobs, plan, runner, False).items()
                for row in rows]

    pools: dict[str, Callable[[], Runner]] = {"this process": LocalPool}
    if args.encoder == "hash":  # a pool forked from a process holding torch's threads (and Ray's) can hang
        pools[f"process pool ({args.workers})"] = lambda: LocalPool(args.workers)
    pools[f"Ray ({args.workers} CPUs)"] = RayPool
    baseline = list(pools)[-2]
    times: dict[tuple[str, str], list[float]] = {}
    results: dict[tuple[str, str], object] = {}
    for _ in range(args.rounds + 1):  # the first round starts what later ones reuse: imports, Ray's worker processes
        for name, make in pools.items():
            for what, work in (("gem online", online), ("gem replay", checkpoints)):
                cold()
                started = time.perf_counter()
                with make() as runner:
                    results[(name, what)] = work(runner)
                times.setdefault((name, what), []).append(time.perf_counter() - started)
    ray.shutdown()
    shutil.rmtree(CACHE_HOME, ignore_errors=True)
    print(f"{source}, encoder {args.encoder}, {len(jobs)} with checkpoints for gem replay; {args.rounds} rounds, "
          f"medians; Ray session start {ray_start:.1f} s (once per command); {os.cpu_count()} cores\n")
    print(f"| what | runner | first round | median, later rounds | runs / s | vs {baseline} | same result |")
    print("|---|---|---|---|---|---|---|")
    for what in ("gem online", "gem replay"):
        count = len(runs) if what == "gem online" else len(jobs)
        floor = statistics.median(times[(baseline, what)][1:])
        for name in pools:
            first, *rest = times[(name, what)]
            median = statistics.median(rest)
            same = "yes" if results[(name, what)] == results[("this process", what)] else "**no**"
            print(f"| {what} | {name} | {first:.2f} s | {median:.2f} s | {count / median:.1f} "
                  f"| {median / floor:.2f}x | {same} |")
    print(f"\nrounds (s): { {f'{w} / {n}': [round(t, 2) for t in ts] for (n, w), ts in times.items()} }",
          file=sys.stderr)


if __name__ == "__main__":
    main()
