"""`GEM.compress` per-call overhead against one ``json.dumps`` of the same request, side by side.

    python -m bench.compress_overhead [--blocks 1000] [--repeats 30]

A warm session of ``--blocks`` blocks that grows by one block a call, each request decoded from its JSON as a
proxy holds it (new objects every call): the append path (the new block appended), the reselection path (a goal
change: evidence rules, selection and guard over every block), and the cache-aware preset's rewrite ranked by the
router (its signals over every block, live references included, and the scores); each also given the body's
bytes, as the proxy gives them, so that nothing is marshalled. The floor is one ``json.dumps`` of a request of the
same size. The synthetic history comes from `gemkernels.testing.histories`, shared with the tests.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Iterator

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
    calls = args.repeats + 3  # compare() makes three untimed warm-up calls of each
    messages = synthetic_history(args.blocks + calls, seed=1)
    prefix = len(messages) - 2 * (args.blocks + calls)

    def growing() -> Iterator[tuple[list, tuple[bytes, list[tuple[int, int]]]]]:
        """Requests of blocks, blocks + 1, ... blocks, each decoded afresh from its body, with the body's bytes and
        each message's byte range in it (what a proxy's scan gives)."""
        requests = []
        for i in range(calls + 1):
            texts = [json.dumps(m).encode() for m in messages[:prefix + 2 * (args.blocks + i)]]
            starts = list(itertools.accumulate((len(t) + 2 for t in texts[:-1]), initial=len(b'{"messages": [')))
            body = b'{"messages": [' + b", ".join(texts) + b"]}"
            requests.append((json.loads(body)["messages"], (body, [(a, a + len(t)) for a, t in zip(starts, texts)])))
        return iter(requests)

    paths = {}
    router = with_overrides("cache-aware", ["reselect_on_goal_change=True"])
    for name, config in (("append", "paper"), ("append, body bytes", "paper"), ("reselection", "paper"),
                         ("reselection, body bytes", "paper"), ("router", router), ("router, body bytes", router)):
        gem = GEM(config, encoder=CachedEncoder(HashEncoder(384)), token_counter=None)
        requests = growing()
        history, written = next(requests)
        gem.compress(history, session_id="bench", message_bytes=written)  # the session's first: a whole parse
        paths[name] = gem, requests
    floor_request = json.loads(json.dumps(messages[:prefix + 2 * (args.blocks + calls // 2)]))
    goals = itertools.count()
    actions: dict[str, set[str]] = {name: set() for name in paths}

    def call(name: str, goal: bool) -> None:
        gem, requests = paths[name]
        history, written = next(requests)
        actions[name].add(gem.compress(history, session_id="bench", goal=f"goal {next(goals)}" if goal else None,
                                       message_bytes=written if name.endswith("bytes") else None).stats.action)

    results = compare({
        "json.dumps(request)": lambda: json.dumps(floor_request),
        "compress, append path": lambda: call("append", False),
        "compress, append path, given the body's bytes (a proxy)": lambda: call("append, body bytes", False),
        "compress, reselection path": lambda: call("reselection", True),
        "compress, reselection path, given the body's bytes": lambda: call("reselection, body bytes", True),
        "compress, router rewrite (cache-aware)": lambda: call("router", True),
        "compress, router rewrite, given the body's bytes": lambda: call("router, body bytes", True),
    }, repeats=args.repeats)
    assert actions["append"] == actions["append, body bytes"] == {"appended"}, actions
    assert actions["reselection"] == actions["reselection, body bytes"] == {"reselected"}, actions
    floor = results["json.dumps(request)"].median
    print(f"{args.blocks} blocks and one more a call, {len(json.dumps(floor_request)):,} serialised characters\n")
    print("| what | median | ratio to json.dumps |\n|---|---|---|")
    for name, timing in results.items():
        print(f"| {name} | {fmt_seconds(timing.median)} | {timing.median / floor:.2f}x |")


if __name__ == "__main__":
    main()
