"""Blocks of an OpenAI Responses API ``input`` (DESIGN.md §2.1): tool calls with their outputs and reasoning.

A removable block is a run of consecutive tool-call items (``function_call``, ``custom_tool_call``,
``local_shell_call``), the ``reasoning`` items right before the run, and the ``*_output`` item answering each call
(matched by ``call_id``, after its call). A reasoning item goes only with the calls it precedes, so a kept call keeps
its reasoning and encrypted reasoning is never sent without its call; an ``item_reference`` to a reasoning item (an
``rs_`` id) counts as one. Messages of every role, ``compaction`` items, reasoning before a message, items of any other
type, and a run of calls that more output of the same response follows (a hosted tool's call, an assistant message),
which would lose its reasoning, are never removed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import repeat
from typing import Any

from gemkernels.compress.blocks import Action, Block, BlockStructureError, Span

#: Item types that call a tool, each answered by the item type it maps to.
CALL_OUTPUTS = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output",
                "local_shell_call": "local_shell_call_output"}
OUTPUT_TYPES = frozenset(CALL_OUTPUTS.values())
#: Item types that only the Responses API has (a list holding one is a Responses ``input``).
RESPONSES_TYPES = frozenset(CALL_OUTPUTS) | OUTPUT_TYPES | {"reasoning", "compaction", "item_reference"}


def is_responses_input(items: Sequence[Any]) -> bool:
    """Whether ``items`` holds an item type of the Responses API (a chat history never does)."""
    if set(map(type, items)) <= {dict}:  # the usual input: read in C
        kinds = list(map(dict.get, items, repeat("type")))
    else:
        kinds = [item.get("type") for item in items if isinstance(item, dict)]
    try:
        return not RESPONSES_TYPES.isdisjoint(kinds)
    except TypeError:  # an unhashable "type" (a client's list): it names no Responses type
        return any(type(kind) is str and kind in RESPONSES_TYPES for kind in kinds)


def responses_spans(items: Sequence[dict[str, Any]]) -> list[Span]:
    """The blocks of a Responses ``input``, in order; raises `BlockStructureError` for an output before or without
    its call, a call id used twice, or a call without its output."""
    blocks: list[tuple[list[int], list[str]]] = []
    owner: dict[str, int] = {}  # call id -> its block
    kind_of: dict[str, str] = {}
    answered: set[str] = set()
    reasoning: list[int] = []
    pinned: set[int] = set()  # blocks whose response goes on with an item kept whatever happens
    in_run = False  # the previous item was a call: a further call joins its block
    for i, item in enumerate(items):
        kind = item.get("type")
        if type(kind) is not str:  # not a type this parser knows (and maybe unhashable): never removed
            kind = None
        if kind == "item_reference" and is_reasoning_reference(item):
            kind = "reasoning"
        call_id = item.get("call_id")
        if kind in CALL_OUTPUTS:
            if not isinstance(call_id, str) or not call_id:
                raise BlockStructureError(f"input item {i} is a {kind} without a call_id")
            if call_id in owner:
                raise BlockStructureError(f"call_id {call_id!r} is used twice")
            if not in_run:
                blocks.append((reasoning, []))
            owner[call_id], kind_of[call_id] = len(blocks) - 1, kind
            blocks[-1][0].append(i)
            blocks[-1][1].append(call_id)
            reasoning, in_run = [], True
            continue
        after_call, in_run = in_run, False
        if kind in OUTPUT_TYPES:
            if not isinstance(call_id, str) or call_id not in owner:
                raise BlockStructureError(f"input item {i} answers no earlier call (call_id {call_id!r})")
            if call_id in answered:
                raise BlockStructureError(f"call_id {call_id!r} is answered twice")
            if CALL_OUTPUTS[kind_of[call_id]] != kind:
                raise BlockStructureError(f"input item {i} is a {kind} for a {kind_of[call_id]}")
            answered.add(call_id)
            blocks[owner[call_id]][0].append(i)
        elif kind == "reasoning":
            reasoning = reasoning + [i]
        else:
            if after_call and item.get("role") not in ("user", "system", "developer"):
                pinned.add(len(blocks) - 1)  # more output of the same response needs the block's reasoning
            reasoning = []  # reasoning before a message (or anything else) stays with it
    missing = next((call_id for call_id in owner if call_id not in answered), None)
    if missing is not None:
        raise BlockStructureError(f"call {missing!r} has no output")
    return [Span(tuple(sorted(positions)), tuple(ids)) for b, (positions, ids) in enumerate(blocks) if b not in pinned]


def is_reasoning_reference(item: dict[str, Any]) -> bool:
    """Whether an ``item_reference`` names a reasoning item (``rs_`` ids): it then goes with the next call, as the
    reasoning item would."""
    reference = item.get("id")
    return type(reference) is str and reference.startswith("rs_")


def ends_open(items: Sequence[Any]) -> bool:
    """Whether `responses_spans` leaves reasoning items pending at the end of ``items``: a reasoning item after the
    last call with only outputs after it, which a later call will take into its block."""
    for item in reversed(items):
        kind = item.get("type") if isinstance(item, dict) else None
        kind = kind if type(kind) is str else None
        if kind == "reasoning" or kind == "item_reference" and is_reasoning_reference(item):
            return True
        if kind not in OUTPUT_TYPES:
            return False
    return False


def responses_block(items: Sequence[dict[str, Any]], span: Span) -> Block:
    """Content of a Responses block: reasoning summaries, calls and outputs."""
    chosen = [items[p] for p in span.positions]
    outputs = [output_text(item) for item in chosen if item.get("type") in OUTPUT_TYPES]
    return Block(span.positions, span.call_ids,
                 reasoning="\n".join(reasoning_text(item) for item in chosen if item.get("type") == "reasoning"),
                 text="",
                 actions=tuple(Action(*call_action(item)) for item in chosen if item.get("type") in CALL_OUTPUTS),
                 observations=tuple(text for text, _ in outputs), failed=any(failed for _, failed in outputs))


def output_text(item: dict[str, Any]) -> tuple[str, bool]:
    """An output item's text, and whether it reports a failure (Codex wraps shell output as
    ``{"output": ..., "metadata": {"exit_code": ...}}``)."""
    output = item.get("output")
    if isinstance(output, list):  # content parts
        output = "\n".join(part.get("text", "") for part in output if isinstance(part, dict))
    if not isinstance(output, str):
        return json.dumps(output, ensure_ascii=False, default=str), False
    try:
        wrapped = json.loads(output) if output.startswith("{") else None
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        wrapped = None
    if isinstance(wrapped, dict) and isinstance(wrapped.get("output"), str):
        code = wrapped.get("metadata", {}).get("exit_code") if isinstance(wrapped.get("metadata"), dict) else None
        return wrapped["output"], isinstance(code, int) and code != 0
    return output, False


def call_action(item: dict[str, Any]) -> tuple[str, str]:
    """(tool name, arguments as text) of a call item."""
    if item.get("type") == "local_shell_call":
        action = item.get("action")
        return "local_shell", json.dumps(action, ensure_ascii=False, default=str)
    arguments = item.get("arguments") if item.get("type") == "function_call" else item.get("input")
    return str(item.get("name", "")), arguments if isinstance(arguments, str) else json.dumps(arguments, default=str)


def reasoning_text(item: dict[str, Any]) -> str:
    """The readable part of a reasoning item: its summary texts (the encrypted content is opaque)."""
    summary = item.get("summary")
    if not isinstance(summary, list):
        return ""
    return "\n".join(part.get("text", "") for part in summary if isinstance(part, dict))
