"""``gem compress FILE|-``: run GEM on a chat request, a messages list or a recorded agent run (cut at
``--step N``), print what it kept and why, and write the forwarded request with ``-o``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gemkernels.cli.extras import encoder_extras, missing_extra, require
from gemkernels.cli.help_text import description
from gemkernels.compress.config import OVERRIDE_HELP, PRESETS
from gemkernels.compress.encoders import ENCODER_HELP, check_encoder_name
from gemkernels.compress.tokens import Prices

if TYPE_CHECKING:
    from gemkernels.compress.encoders import Encoder
    from gemkernels.compress.gem import CompressionStats

#: The presets the whole-run table compares.
WHOLE_RUN_PRESETS = ("paper", "balanced", "core", "cache-aware")


def add_parser(subparsers: Any) -> None:
    """Register ``gem compress``."""
    comp = subparsers.add_parser("compress", help="compress a chat request or a recorded run",
                                 description=description(__doc__))
    comp.add_argument("source", help="a request (chat messages or a Responses input) or messages JSON, one "
                                     "recorded run in any format gem replay reads (a file; --run picks one of "
                                     "several), or - for a request on stdin")
    comp.add_argument("--encoder", default="minilm", help=ENCODER_HELP)
    comp.add_argument("--preset", default="paper", choices=sorted(PRESETS), help="default %(default)s")
    comp.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help=OVERRIDE_HELP)
    comp.add_argument("--step", type=int, help="cut a recorded run before its N-th assistant action")
    comp.add_argument("--run", help="which run of a multi-run file (tau-bench)")
    comp.add_argument("--session", help="session id (default: derived from the prefix)")
    comp.add_argument("--goal", help="the current task (default: the latest user instruction)")
    comp.add_argument("-o", "--output", help="write the forwarded request or messages here (- for stdout)")
    comp.add_argument("--stats", help="write the stats as JSON here")
    comp.add_argument("-v", "--verbose", action="store_true", help="list every block with why it was kept")
    comp.add_argument("--no-whole-run", dest="whole_run", action="store_false",
                      help="skip the table of what each preset saves over the whole history, call by call")
    comp.add_argument("--price-cached", type=float, default=0.1,
                      help="the whole-run table's price of a cached input token against a plain one (default "
                           "%(default)s; 1 for a provider without prompt caching)")
    comp.set_defaults(func=run)


#: The roles of a chat message; a list of objects with these (and content or calls) is a history as it is sent.
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def read_request(source: str, run_name: str | None
                 ) -> tuple[dict[str, Any] | None, str, list[dict[str, Any]], str | None]:
    """(request object or None, the request's history field, its history, recorded goal) from a file, a recorded
    run, or ``-`` (stdin); ``ValueError`` naming the file for anything else."""
    if source == "-":
        data = json_value(sys.stdin.read(), "stdin")
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            raise ValueError(f"{source} is a folder: gem compress reads one file (gem replay and gem online read "
                             "folders)")
        data = json_value(path.read_text(encoding="utf-8-sig"), source) if path.suffix == ".json" else None
    if isinstance(data, dict) and "model" in data:
        field = next((key for key in ("messages", "input") if isinstance(data.get(key), list)), None)
        if field is not None:
            return data, field, data[field], None
    if source == "-":
        raise ValueError("stdin must hold a request object with 'model' and 'messages' (or a Responses 'input')")
    messages = data.get("messages") if isinstance(data, dict) and "trajectory_format" not in data else data
    if is_chat_history(messages):
        if run_name is not None:
            raise ValueError(f"--run picks one run of a file of several; {source} holds one history")
        return None, "messages", messages, None  # forwarded as given, even if invalid
    from gemkernels.evaluate.loaders import read_runs

    try:
        runs = read_runs(path)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{source}: {err}") from None
    if run_name is not None:
        runs = [run for run in runs if run.name == run_name]
        if not runs:
            raise ValueError(f"{source} holds no run named {run_name!r}")
    if len(runs) > 1:
        names = ", ".join(run.name for run in runs[:5])
        raise ValueError(f"{source} holds {len(runs)} runs; pick one with --run (e.g. {names})")
    if not runs:
        raise ValueError(f"{source} holds no run")
    return None, "messages", runs[0].messages, runs[0].goal


def json_value(text: str, source: str) -> Any:
    """``text`` parsed, or ``ValueError`` naming ``source`` (empty, or not JSON)."""
    if not text.strip():
        raise ValueError(f"{source} is empty")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{source} is not JSON ({err})") from None


def is_chat_history(value: Any) -> bool:
    """A non-empty list of chat messages as an API takes them: objects with a chat role and content or calls
    (another agent's records, e.g. Gemini CLI's ``parts``, go to the run readers)."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and m.get("role") in CHAT_ROLES and "parts" not in m
        and ("content" in m or "tool_calls" in m or "function_call" in m) for m in value)


def check_target(flag: str, target: str | None) -> None:
    """``ValueError`` before any work when ``target`` (a file ``flag`` writes; ``-``: stdout) cannot be written: a
    folder, or in a folder that does not exist."""
    if target is None or target == "-":
        return
    path = Path(target).expanduser()
    if path.is_dir():
        raise ValueError(f"{flag} {target} is a folder; name a file")
    if not path.parent.is_dir():
        raise ValueError(f"{flag} {target}: the folder {path.parent} does not exist")


def summary(stats: CompressionStats, labels: dict[int, str]) -> str:
    """A readable account of one compression."""
    lines = [f"{stats.action}: {stats.reason}"]
    if stats.blocks:
        lines.append(f"blocks: {stats.blocks}, forwarded {stats.forwarded_blocks}, removed {len(stats.removed_blocks)}")
    for rule, picks in stats.protected.items():
        if picks:
            lines.append(f"  protected by {rule}: {picks}")
    if stats.core:
        coverage = "" if stats.coverage is None else f", coverage {stats.coverage:.3f}"  # None: a ranked rewrite
        lines.append(f"  selected core ({len(stats.core)}{coverage}): {stats.core}")
    if stats.removed_blocks:
        lines.append(f"  removed: {stats.removed_blocks}")
    if stats.chars_before:
        saved = 1 - stats.chars_after / stats.chars_before
        lines.append(f"characters: {stats.chars_before} -> {stats.chars_after} ({saved:.1%} saved)")
    if stats.tokens_before:
        saved = 1 - stats.tokens_after / stats.tokens_before
        lines.append(f"tokens (o200k): {stats.tokens_before} -> {stats.tokens_after} ({saved:.1%} saved)")
    lines.append("seconds: " + ", ".join(f"{k} {v:.3f}" for k, v in stats.seconds.items()))
    lines += [f"  block {b}: {label}" for b, label in sorted(labels.items())]
    return "\n".join(lines)


def whole_run(messages: list[dict[str, Any]], encoder: Encoder, prices: Prices) -> str:
    """What each preset forwards over the whole history, model call by model call (each assistant turn answers
    the messages before it), against forwarding it all: o200k input tokens, price with a prompt cache, prefix
    breaks; and which preset to choose. Blocks are encoded once, by ``encoder``, for every preset; GEM reads the
    task from each request, as ``gem serve`` does."""
    if missing_extra("compress", "tokens") is not None:
        return "(the whole-run table counts o200k tokens: pip install 'gemkernels[tokens]')"
    from gemkernels.evaluate.loaders import Run
    from gemkernels.evaluate.online_policies import PolicyOptions
    from gemkernels.evaluate.online_replay import BASELINE, relative, replay_run

    policies = [BASELINE, *(f"gem-{preset}" for preset in WHOLE_RUN_PRESETS)]
    replayed = replay_run(Run("run", "openai", messages, None, ""), policies, PolicyOptions(prices=prices),
                          encoder=lambda name: encoder, evidence=())
    totals = replayed.totals()
    rel = relative(totals, prices)
    lines = [f"whole run: {totals[BASELINE].calls} model calls; against forwarding the full history each time "
             f"(o200k input tokens; a cached token costs {prices.cached:g} of a plain one):",
             f"  {'preset':<14}{'tokens':>8}{'price':>8}{'prefix breaks':>15}"]
    for policy in policies:
        name = "full history" if policy == BASELINE else policy.removeprefix("gem-")
        lines.append(f"  {name:<14}{rel[policy]['tokens']:>8.3f}{rel[policy]['price']:>8.3f}"
                     f"{totals[policy].prefix_breaks:>15}")
    presets = policies[1:]
    cheapest = min(presets, key=lambda p: rel[p]["price"]).removeprefix("gem-")
    fewest = min(presets, key=lambda p: rel[p]["tokens"]).removeprefix("gem-")
    fewest_text = ("and sends the fewest tokens" if fewest == cheapest else f"; {fewest} sends the fewest tokens")
    lines += [f"choose: here {cheapest} costs least ({rel['gem-' + cheapest]['price']:.3f} of the full history's "
              f"price) {fewest_text} ({rel['gem-' + fewest]['tokens']:.3f} of its tokens). cache-aware rewrites only "
              f"past a budget ({PRESETS['cache-aware'].rewrite_above_blocks} blocks) or when a rewrite repays its "
              f"cache miss, so it gains on long runs; paper removes at most {PRESETS['paper'].delta:.0%} of a "
              "request. Pick with --preset NAME; gem online compares presets over many runs."]
    return "\n".join(lines)


def block_labels(stats: CompressionStats) -> dict[int, str]:
    """Why each block was kept or dropped."""
    rules: dict[int, list[str]] = {}
    for rule, picks in stats.protected.items():
        for b in picks:
            rules.setdefault(b, []).append(rule)
    core, removed = set(stats.core), set(stats.removed_blocks)
    labels = {}
    for b in range(stats.blocks if stats.action in ("reselected", "appended") else 0):
        why = rules.get(b, []) + (["core"] if b in core and b not in rules else [])
        if b in removed:
            labels[b] = "removed"
        else:
            labels[b] = f"kept ({', '.join(why)})" if why else "kept (outside the core, within the guard's budget)"
    return labels


def run(args: argparse.Namespace) -> int:
    """Compress, print the account, write ``-o`` / ``--stats``; 2 on bad input or a missing extra."""
    if not require("compress", *encoder_extras(args.encoder)):
        return 2
    from gemkernels.compress.config import with_overrides
    from gemkernels.compress.gem import GEM
    from gemkernels.evaluate.loaders import checkpoints

    try:
        check_target("-o", args.output)
        check_target("--stats", args.stats)
        check_encoder_name(args.encoder)
        request, field, messages, recorded_goal = read_request(args.source, args.run)
    except (OSError, ValueError) as err:
        print(f"gem compress: {err}", file=sys.stderr)
        return 2
    if args.step is not None:
        starts = checkpoints(messages)
        if not 0 <= args.step < len(starts):
            print(f"gem compress: --step must lie in [0, {len(starts) - 1}] for this run", file=sys.stderr)
            return 2
        messages = messages[:starts[args.step]]
    try:
        config = with_overrides(args.preset, args.set)
        prices = Prices(cached=args.price_cached)
    except ValueError as err:
        print(f"gem compress: {err}", file=sys.stderr)
        return 2
    gem = GEM(config, encoder=args.encoder)
    result = gem.compress(messages, session_id=args.session, goal=args.goal or recorded_goal)
    print(summary(result.stats, block_labels(result.stats) if args.verbose else {}), file=sys.stderr)
    if args.output:
        forwarded = {**request, field: result.messages} if request is not None else result.messages
        text = json.dumps(forwarded, ensure_ascii=False, indent=1)
        if args.output == "-":
            try:
                print(text, flush=True)
            except BrokenPipeError:  # the reader stopped (``| head``): what it read is what was wanted
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        else:
            Path(args.output).expanduser().write_text(text)
    if args.stats:
        Path(args.stats).expanduser().write_text(json.dumps(result.stats.to_dict(), indent=1))
    if args.whole_run and field == "messages" and len(checkpoints(messages)) > 1:
        print(whole_run(messages, gem.encoder, prices), file=sys.stderr)
    return 0

