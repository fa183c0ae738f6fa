"""A long session that first reaches the proxy mid-way (an agent resumed, a proxy restarted): its first request and
its next through the proxy's `Compressor`, and a warm session's requests sent meanwhile.

    python -m bench.resumed_session [PATHS ...] [--copies 12] [--encoder hash] [--preset cache-aware]

The long history is the blocks of one recorded run (default ``../shared/data/trajectories``, else the bundled
example) repeated ``--copies`` times, each copy's tool outputs and call ids tagged so that no block repeats. The
first request holds the whole history, the next one block more; between them the script waits until the proxy is
idle (as an agent waits for the model's answer). The warm session replays another run's last requests while the
long one is compressed. Printed: each request's seconds in the compressor and what GEM did.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import time
from pathlib import Path
from typing import Any

from bench.load import checkpoints
from bench.presets import DEFAULT_RUNS
from gemkernels.compress.blocks import parse_history
from gemkernels.evaluate.loaders import load_run, load_runs
from gemkernels.serve.compressor import Compressor
from gemkernels.serve.config import ServerConfig
from gemkernels.serve.metrics import Metrics

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "django-11276.json"


def tagged(message: dict[str, Any], tag: str) -> dict[str, Any]:
    """``message`` with its tool call ids and text content marked ``tag`` (a copy)."""
    out = copy.deepcopy(message)
    if isinstance(out.get("content"), str) and out.get("role") in ("tool", "user"):
        out["content"] += f"\n[{tag}]"
    for call in out.get("tool_calls") or ():
        call["id"] = f"{call['id']}-{tag}"
    if "tool_call_id" in out:
        out["tool_call_id"] = f"{out['tool_call_id']}-{tag}"
    return out


def long_histories(messages: list[dict[str, Any]], copies: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's prefix, then its blocks ``copies`` times, each copy tagged; and that history one block longer."""
    history = parse_history(messages)
    body = messages[history.prefix_end:history.spans[-1].positions[-1] + 1]
    first = messages[:history.prefix_end] + [tagged(m, f"c{j}") for j in range(copies) for m in body]
    return first, first + [tagged(messages[p], f"c{copies}") for p in history.spans[0].positions]


async def timed(compressor: Compressor, messages: list[dict[str, Any]], session: str) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await compressor.compress("/v1/chat/completions", messages, session, tenant="bench")
    return time.perf_counter() - started, result


async def idle(compressor: Compressor) -> float:
    """Until the compressor has nothing in flight (and, where it has one, its preparing thread is done): the
    seconds that took; then 0.2 s more, for encoding left in its queue (which nothing counts)."""
    started = time.perf_counter()
    while compressor.pending or getattr(compressor, "preparing", None):
        await asyncio.sleep(0.01)
    busy = time.perf_counter() - started
    await asyncio.sleep(0.2)
    return busy


async def scenario(compressor: Compressor, long: list[dict[str, Any]], longer: list[dict[str, Any]],
                   warm: list[list[dict[str, Any]]]) -> None:
    await compressor.start()
    for messages in warm[:-4]:
        await timed(compressor, messages, "warm")
    first = asyncio.ensure_future(timed(compressor, long, "long"))
    warm_seconds = []
    for messages in warm[-4:]:
        await asyncio.sleep(0.02)
        warm_seconds.append((await timed(compressor, messages, "warm"))[0])
    rows = [("first request", *await first)]
    idle_seconds = await idle(compressor)
    rows.append(("next request (one block more)", *await timed(compressor, longer, "long")))
    blocks = len(parse_history(long).spans)
    print(f"long session: {blocks} blocks, {len(json.dumps(long)) / 1e6:.1f} MB")
    print("| request | seconds | action | reason |\n|---|---|---|---|")
    for name, seconds, result in rows:
        print(f"| {name} | {seconds:.3f} | {result.stats.action} | {result.stats.reason[:90]} |")
    print(f"proxy busy after the first request for {idle_seconds:.2f} s; the warm session's 4 requests meanwhile: "
          f"max {max(warm_seconds) * 1e3:.1f} ms, median {sorted(warm_seconds)[2] * 1e3:.1f} ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=[str(DEFAULT_RUNS)])
    parser.add_argument("--copies", type=int, default=12)
    parser.add_argument("--encoder", default="hash")
    parser.add_argument("--preset", default="cache-aware")
    parser.add_argument("--budget-ms", type=float, default=200.0)
    args = parser.parse_args(argv)
    existing = [p for p in args.paths if Path(p).exists()]
    runs = load_runs(existing)[0] if existing else [load_run(EXAMPLE)]
    runs = sorted(runs, key=lambda run: -len(run.messages))
    long, longer = long_histories(runs[0].messages, args.copies)
    other = runs[1 if len(runs) > 1 else 0].messages
    warm = [[tagged(m, "warm") for m in other[:cut]] for cut in checkpoints(other)[-24:]]
    config = ServerConfig(upstream="http://127.0.0.1:9", encoder=args.encoder, preset=args.preset,
                          encode_budget=args.budget_ms / 1000)
    compressor = Compressor(config, Metrics())
    try:
        asyncio.run(scenario(compressor, long, longer, warm))
    finally:
        compressor.close()


if __name__ == "__main__":
    main()
