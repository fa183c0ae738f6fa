"""Encoders side by side: CPU seconds per block and blocks per second at 1 and 2 threads on the same texts, and the
installed size of each extra's dependencies.

    python -m bench.encoders [PATH...] [--encoders hash,minilm-static,minilm-numpy,minilm-torch] [--threads 1,2]

Texts: the blocks of the bundled example, or of the runs under PATH (`gemkernels.evaluate.loaders`), as GEM
encodes them (`block_text`). Each (encoder, threads) runs in its own process with the BLAS/OpenMP thread variables
(and torch's thread count) set before anything is imported; the encoder is built without its cache, warmed up on
one text, then encodes all the texts in rounds for at least ``--seconds``: the medians of the rounds are reported,
and the first round alone ("first pass": texts and, for the static table, their parts not seen before).
CPU seconds count every thread of the process (``time.process_time``). Sizes: the files of every distribution an
extra brings besides numpy, as installed here (recursively through their requirements; what is not installed here
is left out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")


def block_texts(paths: list[str]) -> list[str]:
    """The block texts of the runs under ``paths``, or of the bundled example when there are none."""
    from gemkernels.compress.blocks import parse_history
    from gemkernels.compress.representation import block_text

    if not paths:
        messages = json.loads((ROOT / "examples" / "django-11276.json").read_text())["messages"]
        return [block_text(b) for b in parse_history(messages).blocks]
    from gemkernels.evaluate.loaders import load_runs

    runs, _ = load_runs(paths)
    return [block_text(b) for run in runs for b in parse_history(run.messages).blocks]


def worker(name: str, threads: int, texts_file: str, seconds: float) -> dict[str, float]:
    """Run in a fresh process: the medians of encoding every text, in rounds, with ``threads`` threads."""
    if name == "minilm-torch":
        import torch

        torch.set_num_threads(threads)
    from gemkernels.compress.encoders import make_encoder

    texts = json.loads(Path(texts_file).read_text())
    encoder = make_encoder(name, cached=False)
    encoder.encode(texts[:1])
    cpu, wall = [], []
    started = time.perf_counter()
    while not cpu or (time.perf_counter() - started < seconds and len(cpu) < 50):
        c, w = time.process_time(), time.perf_counter()
        encoder.encode(texts)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return {"cpu_per_block": statistics.median(cpu) / len(texts), "blocks_per_s": len(texts) / statistics.median(wall),
            "first_cpu_per_block": cpu[0] / len(texts), "rounds": len(cpu)}


def measure(name: str, threads: int, texts_file: str, seconds: float) -> dict[str, float] | str:
    """`worker` in a subprocess with the thread variables set; its figures, or why it failed."""
    env = {**os.environ, **{v: str(threads) for v in THREAD_VARIABLES}}
    code = (f"import json, bench.encoders as b; "
            f"print(json.dumps(b.worker({name!r}, {threads}, {texts_file!r}, {seconds})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def extra_requirements(extra: str) -> list[str]:
    """The distribution names ``extra`` of pyproject.toml lists (``gemkernels[...]`` expanded)."""
    import tomllib
    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = []
    for line in extras[extra]:
        requirement = Requirement(line)
        if requirement.name == "gemkernels":
            names += [n for e in sorted(requirement.extras) for n in extra_requirements(e)]
        elif requirement.marker is None or requirement.marker.evaluate():
            names.append(requirement.name)
    return names


def installed_size(names: list[str]) -> tuple[int, list[str]]:
    """Bytes of the installed files of ``names`` and of everything they require (recursively), and the names that
    are not installed here."""
    from packaging.requirements import Requirement

    seen, missing, total, todo = {"numpy"}, [], 0, list(names)  # numpy: the core install has it
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        total += sum(f.size or 0 for f in dist.files or ())
        for line in dist.requires or ():
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return total, sorted(missing)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="runs to take the blocks from (default: the bundled example)")
    parser.add_argument("--encoders", default="hash,minilm-static,minilm-numpy,minilm-torch")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--max-texts", type=int, default=64,
                        help="at most this many blocks, evenly spread (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=2.0, help="least time per measurement (default 2)")
    args = parser.parse_args(argv)
    texts = block_texts(args.paths)
    texts = texts[::max(1, len(texts) // args.max_texts)][:args.max_texts]  # spread over the runs
    names, thread_counts = args.encoders.split(","), [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        texts_file = str(Path(tmp) / "texts.json")
        Path(texts_file).write_text(json.dumps(texts))
        results = {(n, t): measure(n, t, texts_file, args.seconds) for t in thread_counts for n in names}
    print(f"{len(texts)} blocks, {sum(map(len, texts)) / len(texts):,.0f} characters on average\n")
    print("| encoder | threads | CPU s per block | first pass | blocks per s | CPU vs minilm-torch |\n"
          "|---|---|---|---|---|---|")
    for (name, threads), r in results.items():
        if isinstance(r, str):
            print(f"| {name} | {threads} | failed: {r} | | | |")
            continue
        base = results.get(("minilm-torch", threads))
        ratio = f"{r['cpu_per_block'] / base['cpu_per_block']:.4f}x" if isinstance(base, dict) else ""
        print(f"| {name} | {threads} | {r['cpu_per_block']:.3g} | {r['first_cpu_per_block']:.3g} | "
              f"{r['blocks_per_s']:.3g} | {ratio} |")
    print("\n| extra | installed here | not installed here |\n|---|---|---|")
    for extra in ("embed", "minilm", "minilm-torch"):
        size, missing = installed_size(extra_requirements(extra))
        print(f"| [{extra}] | {size / 1e6:,.0f} MB | {', '.join(missing) or '-'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
