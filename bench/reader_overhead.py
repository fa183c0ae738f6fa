"""Reading a recorded session against tokenising it once: reading is not the bottleneck of a replay.

    python -m bench.reader_overhead [PATH] [--repeats 15]

PATH defaults to the largest Claude Code transcript in ../shared/data/logs/claude-code (1.7 MB). Timed side by side
in one process (`gemkernels.benchmark.timing.compare`, interleaved rounds, medians of CPU wall time): `read_runs` (the
file read, its JSON lines parsed, the records merged into the run model, every call settled and the history checked
with `parse_history`), and tokenising the run's messages once with o200k as the replays count them (a fresh
`TokenCache`, so each message is serialised and tokenised once per repeat). The ratio is reading over tokenising.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gemkernels.benchmark.timing import compare, fmt_seconds
from gemkernels.compress.tokens import TokenCache, o200k_encode
from gemkernels.evaluate.loaders import read_runs

LOGS = Path(__file__).resolve().parents[2] / "shared" / "data" / "logs" / "claude-code"


def main() -> None:
    """Time both on the transcript and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", type=Path, help="a recorded session (default: the largest Claude Code "
                                                             "transcript of ../shared/data/logs)")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    path = args.path or max(LOGS.glob("*.jsonl"), key=lambda p: p.stat().st_size, default=None)
    if path is None:
        sys.exit(f"no transcript given and none in {LOGS}")
    encode = o200k_encode()
    runs = read_runs(path)
    messages = [m for run in runs for m in [*run.messages, *run.final]]

    def tokenise() -> int:
        return sum(len(t) for t in TokenCache(encode).request(messages))

    timings = compare({"read": lambda: read_runs(path), "tokenise": tokenise}, repeats=args.repeats, warmup=2)
    read, once = timings["read"].median, timings["tokenise"].median
    print(f"{path.name}: {path.stat().st_size / 1e6:.2f} MB, {len(runs)} runs, {len(messages)} messages, "
          f"{tokenise():,} o200k tokens")
    print("| read_runs | tokenise once (o200k) | read / tokenise |\n|---|---|---|")
    print(f"| {fmt_seconds(read)} (IQR {fmt_seconds(timings['read'].q1)}-{fmt_seconds(timings['read'].q3)}) "
          f"| {fmt_seconds(once)} (IQR {fmt_seconds(timings['tokenise'].q1)}-{fmt_seconds(timings['tokenise'].q3)}) "
          f"| {read / once:.2f}x |")


if __name__ == "__main__":
    main()
