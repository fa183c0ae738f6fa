"""`GEM.compress` per-call overhead against one ``json.dumps`` of the same request, side by side.

    python -m bench.compress_overhead [--blocks 1000] [--repeats 30]

A warm session (every block already embedded): the append path (one new block), the
reselection path (goal change: evidence rules, selection and guard over every block), and the cache-aware
preset's rewrite ranked by the router (its signals over every block, live references included, and the scores).
The synthetic history comes from `gemkernels.testing.histories`, shared with the tests.
"""

from __future__ import annotations

import argparse
import itertools
import json

from gemkernels import GEM
from gemkernels.benchmark.timing import compare, fmt_seconds
from gemkernels.compress.config import with_overrides
from gemkernels.compress.encoders import CachedEncoder, HashEncoder
from gemkernels.testing.histories import synthetic_history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    messages = synthetic_history(args.blocks, seed=1)
    appending, reselecting, ranked = (GEM(config, encoder=CachedEncoder(HashEncoder(384)), token_counter=None)
                                      for config in ("paper", "paper", with_overrides(
                                          "cache-aware", ["reselect_on_goal_change=True"])))
    for gem in (appending, reselecting, ranked):  # one GEM each: a goal change would make every path reselect
        gem.compress(messages[:-2], session_id="bench")
    goals = itertools.count()
    results = compare({
        "json.dumps(request)": lambda: json.dumps(messages),
        "compress, append path": lambda: appending.compress(messages, session_id="bench"),
        "compress, reselection path": lambda: reselecting.compress(messages, session_id="bench",
                                                                   goal=f"goal {next(goals)}"),
        "compress, router rewrite (cache-aware)": lambda: ranked.compress(messages, session_id="bench",
                                                                          goal=f"goal {next(goals)}"),
    }, repeats=args.repeats)
    actions = {name: gem.compress(messages, session_id="bench", goal=goal).stats.action
               for name, gem, goal in (("append", appending, None), ("reselection", reselecting, "another goal"))}
    assert actions == {"append": "appended", "reselection": "reselected"}, actions  # each path is the one named
    floor = results["json.dumps(request)"].median
    print(f"{args.blocks} blocks, {len(json.dumps(messages)):,} serialised characters\n")
    print("| what | median | ratio to json.dumps |\n|---|---|---|")
    for name, timing in results.items():
        print(f"| {name} | {fmt_seconds(timing.median)} | {timing.median / floor:.2f}x |")


if __name__ == "__main__":
    main()
