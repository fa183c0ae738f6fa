"""From a reader's draft to a `Run`: every tool call paired with its result or explicitly unanswered.

The last model turn of a run, when any of its calls has no result, is the run's ``final`` turn and the run ends
before it. A call without a result earlier gets an explicit placeholder result (`UNANSWERED`, its id listed in
``unanswered``); a result whose call the log lost is dropped (counted in ``orphans``). Call positions, usage and
compaction points are tracked through this by the identity of the messages the reader made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from gemkernels.compress.blocks import Block, parse_history, parts
from gemkernels.compress.responses_items import CALL_OUTPUTS, OUTPUT_TYPES
from gemkernels.evaluate.loaders.model import (
    Compaction,
    Link,
    Messages,
    Run,
    Usage,
    api_format,
    call_turn,
    checkpoints,
    model_calls,
)

UNANSWERED = "[no result recorded]"


@dataclass
class Draft:
    """What a reader found: the messages (the objects it made or read), and keyed by ``id()`` of a message the
    first message of each model call with its usage, model and time, and the first message after each compaction
    with its kind."""

    name: str
    format: str
    messages: Messages
    goal: str | None
    usage: dict[int, Usage] = field(default_factory=dict)
    models: dict[int, str] = field(default_factory=dict)
    times: dict[int, str] = field(default_factory=dict)
    compactions: dict[int, str] = field(default_factory=dict)
    kept: dict[int, int] = field(default_factory=dict)  # compaction -> the last leading message it keeps (`keep`)
    resumes: dict[int, int] = field(default_factory=dict)  # compaction -> where its history resumes (`resume`)
    starts: set[int] = field(default_factory=set)  # Responses items the log says begin a call (`settle`)
    trailing_compaction: str | None = None  # a compaction after the last message
    id: str | None = None
    parent: str | None = None
    spawned: tuple[Link, ...] = ()
    rename: dict[str, str] = field(default_factory=dict)  # tool name -> canonical name (`NextAction.name`)
    project: str | None = None


@dataclass(frozen=True)
class Settled:
    """Messages with every call answered, the final unanswered turn, placeholder-closed call ids, dropped results."""

    messages: Messages
    final: tuple[dict[str, Any], ...]
    unanswered: tuple[str, ...]
    orphans: int


def build(draft: Draft, path: str, skipped: int = 0) -> Run:
    """The `Run` of a draft: settled (`settle`), calls and compactions placed, validated with `parse_history`."""
    settled = settle(draft.messages, frozenset(draft.starts))
    messages, final = settled.messages, settled.final
    try:
        parse_history(messages)
    except ValueError as err:
        raise type(err)(f"run {draft.name}: {err}") from err
    index = {id(m): i for i, m in enumerate(messages)}
    index.update({id(m): len(messages) for m in final[:1]})
    first_of = {index[key]: key for key in draft.usage.keys() | draft.models.keys() | draft.times.keys()
                if key in index}
    calls = tuple(replace(call, usage=draft.usage.get(first_of.get(call.position)),
                          model=draft.models.get(first_of.get(call.position)),
                          time=draft.times.get(first_of.get(call.position)))
                  for call in model_calls(messages, final, draft.rename))
    marks = [Compaction(index[key], kind, index[draft.kept[key]] + 1 if draft.kept.get(key) in index else 0,
                        index.get(draft.resumes.get(key, -1)))
             for key, kind in draft.compactions.items() if key in index]
    if draft.trailing_compaction:
        marks.append(Compaction(len(messages), draft.trailing_compaction))
    return Run(draft.name, draft.format, messages, draft.goal, path, calls, final, settled.unanswered,
               settled.orphans, tuple(sorted(marks, key=lambda c: c.position)), draft.id, draft.parent,
               None, draft.spawned, skipped, draft.project)


Split = tuple[Messages, tuple[dict[str, Any], ...]]  # the messages before the final turn, the final turn
Closed = tuple[Messages, tuple[str, ...], int]  # messages, placeholder-closed call ids, dropped results


def settle(messages: Messages, starts: frozenset[int] = frozenset()) -> Settled:
    """``messages`` with every call paired (see the module docstring); the caller's objects are not changed.
    ``starts``: ``id()`` of the Responses items that begin a model call where the structure does not show it (the
    log's own call boundaries, e.g. Codex's token counts)."""
    split, close = settlers(api_format(messages), starts)
    kept, final = split(messages)
    closed, unanswered, orphans = close(kept)
    return Settled(closed, final, unanswered, orphans)


def final_block(run: Run) -> Block | None:
    """The run's ``final`` turn as the block it would have been (its calls closed with placeholder results), as
    the next action after the last block of ``messages``; None when the run has no final turn."""
    if not run.final:
        return None
    messages = [*run.messages, *run.final]
    closed = settlers(api_format(messages), frozenset({id(run.final[0])}))[1](messages)[0]
    history = parse_history(closed)
    return history.blocks[-1] if len(history.spans) > len(parse_history(run.messages).spans) else None


def settlers(fmt: str, starts: frozenset[int]) -> tuple[Callable[[Messages], Split], Callable[[Messages], Closed]]:
    """(split off the final turn, close the other calls) for an API format."""
    if fmt == "responses":
        return partial(split_responses, starts=starts), partial(close_responses, starts=starts)
    if fmt == "anthropic":
        return split_anthropic, close_anthropic
    return split_openai, close_openai


def split_openai(messages: Messages) -> Split:
    """OpenAI chat: the last assistant turn with a call no ``tool`` message answers, with its results, split off."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if last is None:
        return messages, ()
    answered = {m.get("tool_call_id") for m in messages[last + 1:] if m.get("role") == "tool"}
    if not open_calls(messages[last], answered):
        return messages, ()
    ids = {call.get("id") for call in messages[last].get("tool_calls") or [] if isinstance(call, dict)}
    return messages[:last], (messages[last], *[m for m in messages[last + 1:]
                                               if m.get("role") == "tool" and m.get("tool_call_id") in ids])


def close_openai(messages: Messages) -> Closed:
    """OpenAI chat: ``tool`` messages by ``tool_call_id``; placeholders right after the call's own results."""
    calls = {call.get("id") for m in messages if m.get("role") == "assistant"
             for call in m.get("tool_calls") or [] if isinstance(call, dict)}
    kept = [m for m in messages if m.get("role") != "tool" or m.get("tool_call_id") in calls]
    answered = {m.get("tool_call_id") for m in kept if m.get("role") == "tool"}
    out: Messages = []
    unanswered: list[str] = []
    pending: list[str] = []
    for message in kept:
        if pending and message.get("role") != "tool":
            out.extend(placeholders_openai(pending))
            unanswered.extend(pending)
            pending = []
        out.append(message)
        if message.get("role") == "assistant":
            pending = open_calls(message, answered)
    out.extend(placeholders_openai(pending))
    unanswered.extend(pending)
    return out, tuple(unanswered), len(messages) - len(kept)


def open_calls(message: dict[str, Any], answered: set[Any]) -> list[str]:
    """The call ids of an OpenAI assistant message that no ``tool`` message answers."""
    return [call["id"] for call in message.get("tool_calls") or []
            if isinstance(call, dict) and isinstance(call.get("id"), str) and call["id"] not in answered]


def placeholders_openai(ids: Sequence[str]) -> Messages:
    return [{"role": "tool", "tool_call_id": call_id, "content": UNANSWERED} for call_id in ids]


def split_anthropic(messages: Messages) -> Split:
    """Anthropic Messages: the last assistant turn with a ``tool_use`` the next message does not answer, split off
    with that message when it answers some of them."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if last is None:
        return messages, ()
    answer = messages[last + 1] if last + 1 < len(messages) else {}
    answered = {p.get("tool_use_id") for p in parts(answer) if p.get("type") == "tool_result"}
    if not set(use_ids(messages[last])) - answered:
        return messages, ()
    return messages[:last], (messages[last], *((answer,) if answered else ()))


def close_anthropic(messages: Messages) -> Closed:
    """Anthropic Messages: the user message right after a ``tool_use`` turn answers it with ``tool_result`` parts;
    placeholders join that message (or a new one), results answering no call of the turn before are dropped."""
    out: Messages = []
    unanswered: list[str] = []
    orphans = 0
    open_ids: list[str] = []  # the tool_use ids of the turn just before
    for message in messages:
        results = [p for p in parts(message) if p.get("type") == "tool_result"]
        if results:
            kept = [p for p in results if p.get("tool_use_id") in open_ids]
            orphans += len(results) - len(kept)
            missing = [x for x in open_ids if x not in {p.get("tool_use_id") for p in kept}]
            others = [p for p in message["content"] if not (isinstance(p, dict) and p.get("type") == "tool_result")]
            content = kept + placeholders_anthropic(missing) + others
            unanswered.extend(missing)
            open_ids = []
            if content:
                out.append(message if content == message["content"] else {**message, "content": content})
            continue
        if open_ids:
            out.append({"role": "user", "content": placeholders_anthropic(open_ids)})
            unanswered.extend(open_ids)
        out.append(message)
        open_ids = use_ids(message) if message.get("role") == "assistant" else []
    if open_ids:
        out.append({"role": "user", "content": placeholders_anthropic(open_ids)})
        unanswered.extend(open_ids)
    return out, tuple(unanswered), orphans


def use_ids(message: dict[str, Any]) -> list[str]:
    """The ids of a message's ``tool_use`` parts."""
    return [p["id"] for p in parts(message) if p.get("type") == "tool_use" and isinstance(p.get("id"), str)]


def placeholders_anthropic(ids: Sequence[str]) -> list[dict[str, Any]]:
    return [{"type": "tool_result", "tool_use_id": call_id, "content": UNANSWERED, "is_error": True} for call_id in ids]


def call_starts(items: Messages, starts: frozenset[int]) -> list[int]:
    """Where the model calls of a Responses ``input`` begin: `checkpoints`, and the items in ``starts``."""
    return sorted(set(checkpoints(items)) | {i for i, item in enumerate(items) if id(item) in starts})


def split_responses(items: Messages, starts: frozenset[int]) -> Split:
    """A Responses ``input``: the last model call's output items, when one of its calls has no later output, split
    off with the outputs that answer its other calls."""
    begins = call_starts(items, starts)
    if not begins:
        return items, ()
    turn = call_turn(items, begins[-1], True)
    ids = {item.get("call_id") for item in turn if item.get("type") in CALL_OUTPUTS}
    rest = items[begins[-1] + len(turn):]
    if not ids - {item.get("call_id") for item in rest if item.get("type") in OUTPUT_TYPES}:
        return items, ()
    return items[:begins[-1]], (*turn, *(x for x in rest if x.get("type") in OUTPUT_TYPES and x.get("call_id") in ids))


def close_responses(items: Messages, starts: frozenset[int]) -> Closed:
    """A Responses ``input``: outputs by ``call_id`` after their call; placeholders right after the calls of one
    model call; an output before (or without) its call is dropped."""
    seen: set[Any] = set()
    kept = []
    for item in items:
        if item.get("type") in CALL_OUTPUTS:
            seen.add(item.get("call_id"))
        if item.get("type") not in OUTPUT_TYPES or item.get("call_id") in seen:
            kept.append(item)
    answered = {item.get("call_id") for item in kept if item.get("type") in OUTPUT_TYPES}
    out: Messages = []
    unanswered: list[str] = []
    run: list[dict[str, Any]] = []  # the calls of the current model call
    for i, item in enumerate(kept):
        out.append(item)
        if item.get("type") not in CALL_OUTPUTS:
            continue
        run.append(item)
        after = kept[i + 1] if i + 1 < len(kept) else None
        if after is None or after.get("type") not in CALL_OUTPUTS or id(after) in starts:
            for call in (c for c in run if c.get("call_id") not in answered):
                out.append({"type": CALL_OUTPUTS[call["type"]], "call_id": call.get("call_id"), "output": UNANSWERED})
                unanswered.append(call.get("call_id"))
            run = []
    return out, tuple(unanswered), len(items) - len(kept)


@dataclass(frozen=True)
class Format:
    """One log format: its name(s) as runs report them, whether a parsed file has its structure, and its reader
    (parsed file, file stem -> the drafts of the runs in it)."""

    name: str
    matches: Callable[[Any], bool]
    read: Callable[[Any, str], list[Draft]]
