"""The run model every reader produces: messages in the agent's API format and what the log says about its calls.

A `Run`'s ``messages`` parse with `parse_history` (OpenAI chat, Anthropic Messages, a Responses ``input`` or a
text-action history). Each recorded model call is a `Call`: its request is ``messages[:position]``, its response the
`NextAction` list, its billed `Usage` where the log has it. A run whose last call has no result ends there: that
call is ``final`` (not in ``messages``) at position ``len(messages)``. Sub-agents are runs of their own, linked by
``parent`` / ``parent_call``; the agent's own rewrites of its history are `Compaction` points.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from gemkernels.compress.blocks import content_text, detect_format, is_tool_result_message, parts
from gemkernels.compress.responses_items import CALL_OUTPUTS, call_action, is_responses_input

Messages = list[dict[str, Any]]
#: Responses items a model call outputs; a call is a maximal run of them (`is_output_item`).
RESPONSE_OUTPUT_TYPES = frozenset(CALL_OUTPUTS) | {"reasoning", "web_search_call", "image_generation_call",
                                                   "tool_search_call"}


@dataclass(frozen=True)
class Usage:
    """Tokens one call was billed for: uncached input, input read from the prompt cache, input written to it,
    output (reasoning included)."""

    input: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


@dataclass(frozen=True)
class NextAction:
    """One tool call of a model response: its id, its tool (named as the reader canonicalises it across the
    agent's versions) and its arguments as recorded (JSON text, or the raw input of a free-form tool)."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Call:
    """One recorded model call: its request is ``messages[:position]``, ``actions`` what it called (empty: a text
    reply), ``usage`` what it was billed (None: not in the log), ``model`` the model the log names, ``time`` when
    the log says it was made (ISO 8601 as recorded; None: not in the log)."""

    position: int
    actions: tuple[NextAction, ...] = ()
    usage: Usage | None = None
    model: str | None = None
    time: str | None = None


@dataclass(frozen=True)
class Compaction:
    """The agent replaced its history: its requests after ``messages[position]`` (its summary, where the log keeps
    one) hold the history from there on (from ``resume`` where it cut a range out instead, as Cline does), after
    their first ``keep`` messages (Cline keeps the task). ``kind`` names the log's marker."""

    position: int
    kind: str
    keep: int = 0
    resume: int | None = None


@dataclass(frozen=True)
class Link:
    """A sub-agent started by the tool call ``call_id``: the child run's ``id``, else (older logs) its prompt."""

    call_id: str
    child: str | None = None
    prompt: str | None = None


@dataclass(frozen=True)
class Run:
    """One recorded run: messages `parse_history` accepts, the opening task text (None if absent), its source;
    then what the log records beyond the messages (see the module docstring). ``calls`` left empty are derived from
    the messages (every assistant turn, or every model output of a Responses ``input``)."""

    name: str
    format: str
    messages: Messages
    goal: str | None
    path: str
    calls: tuple[Call, ...] = ()
    final: tuple[dict[str, Any], ...] = ()
    unanswered: tuple[str, ...] = ()  # call ids closed with an explicit placeholder result (`UNANSWERED`)
    orphans: int = 0  # results whose call the log lost, dropped
    compactions: tuple[Compaction, ...] = ()
    id: str | None = None  # the log's own id of the run (session or sub-agent id)
    parent: str | None = None  # the id of the run that started this one
    parent_call: str | None = None  # the parent's tool call that started it
    spawned: tuple[Link, ...] = field(default=(), repr=False)
    skipped: int = 0  # unreadable lines of its file, skipped
    project: str | None = None  # the project (working directory) the log names

    def __post_init__(self) -> None:
        if not self.calls:
            object.__setattr__(self, "calls", model_calls(self.messages, self.final))

    @property
    def usage(self) -> Usage | None:
        """The billed usage summed over the calls that record it (None: no call does)."""
        billed = [call.usage for call in self.calls if call.usage is not None]
        return sum(billed[1:], billed[0]) if billed else None

    def request(self, position: int) -> Messages:
        """The history the agent sent with the call at ``position``: ``messages[:position]``, from the latest
        compaction before it on (with the messages it keeps and the leading system messages), as the agent's own
        requests were."""
        latest = max((c for c in self.compactions if c.position < position), key=lambda c: c.position, default=None)
        if latest is None:
            return self.messages[:position]
        start = latest.position if latest.resume is None else latest.resume
        head = min(latest.keep, start)
        while head < start and self.messages[head].get("role") in ("system", "developer"):
            head += 1
        return self.messages[:head] + self.messages[start:position]

    @property
    def workspace(self) -> str:
        """The project the run belongs to: the one its log names, else the folder its file is in."""
        return self.project or os.path.dirname(self.path)

    @property
    def api(self) -> str:
        """The API format of ``messages`` and ``final``: ``responses``, ``anthropic`` or ``openai``."""
        return api_format([*self.messages, *self.final])


def model_calls(messages: Sequence[dict[str, Any]], final: Sequence[dict[str, Any]] = (),
                rename: dict[str, str] | None = None) -> tuple[Call, ...]:
    """The calls the messages record (`checkpoints`), and the ``final`` turn's at ``len(messages)``, with their
    actions (tool names through ``rename``) and no usage."""
    responses = is_responses_input(messages) or is_responses_input(final)
    calls = [Call(p, turn_actions(call_turn(messages, p, responses), rename)) for p in checkpoints(messages)]
    if final:
        calls.append(Call(len(messages), turn_actions(call_turn(final, 0, responses), rename)))
    return tuple(calls)


def api_format(messages: Sequence[dict[str, Any]]) -> str:
    """``responses`` for a Responses ``input``, else ``anthropic`` or ``openai`` (`detect_format`)."""
    return "responses" if is_responses_input(messages) else detect_format(messages)


def is_output_item(item: dict[str, Any]) -> bool:
    """Whether a Responses item is model output: reasoning, a tool call, an assistant message, or the result of a
    tool search the API ran (``execution: server``; a client's search result is input)."""
    kind = item.get("type")
    return kind in RESPONSE_OUTPUT_TYPES or (kind == "message" and item.get("role") == "assistant") or (
        kind == "tool_search_output" and item.get("execution") == "server")


def is_client_call(item: dict[str, Any]) -> bool:
    """Whether a Responses item is a call the client answers: a `CALL_OUTPUTS` call, or a ``tool_search_call`` the
    API does not run itself (not ``execution: server``)."""
    kind = item.get("type")
    return kind in CALL_OUTPUTS or (kind == "tool_search_call" and item.get("execution") != "server")


def call_turn(items: Sequence[dict[str, Any]], start: int, responses: bool) -> list[dict[str, Any]]:
    """The output of the call whose output starts at ``items[start]``: one assistant message, or (``responses``) a
    run of Responses output items up to its calls (a response ends with its calls)."""
    if not responses:
        return list(items[start:start + 1])
    end = start + 1
    while end < len(items) and is_output_item(items[end]) and not ends_response(items[end - 1], items[end]):
        end += 1
    return list(items[start:end])


def ends_response(item: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether a Responses output item ``after`` that follows ``item`` belongs to a later model response: a
    response's client calls (`is_client_call`) come last, so anything but a further one after one starts a new one."""
    return is_client_call(item) and not is_client_call(after)


def checkpoints(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Positions of the model calls' outputs: each assistant turn (of a Responses ``input``, each run of model
    output items, `call_turn`), and ``messages[:pos]`` is the request it answered."""
    if is_responses_input(messages):
        return [i for i, item in enumerate(messages) if is_output_item(item) and (
            i == 0 or not is_output_item(messages[i - 1]) or ends_response(messages[i - 1], item))]
    return [i for i, message in enumerate(messages) if message.get("role") == "assistant"]


def turn_actions(turn: Sequence[dict[str, Any]], rename: dict[str, str] | None = None) -> tuple[NextAction, ...]:
    """The tool calls of one model output (OpenAI ``tool_calls``, Anthropic ``tool_use``, Responses call items; a
    client's tool search is ``tool_search`` with its arguments), in order, names mapped through ``rename``."""
    rename = rename or {}
    found = []
    for item in turn:
        for call in item.get("tool_calls") or []:
            if isinstance(call, dict):
                function = call.get("function") if isinstance(call.get("function"), dict) else {}
                arguments = function.get("arguments", "")
                found.append((call.get("id"), function.get("name", ""),
                              arguments if isinstance(arguments, str) else json.dumps(arguments)))
        for part in parts(item):
            if part.get("type") == "tool_use":
                found.append((part.get("id"), part.get("name", ""), json.dumps(part.get("input", {}),
                                                                               ensure_ascii=False)))
        if item.get("type") in CALL_OUTPUTS:
            found.append((item.get("call_id"), *call_action(item)))
        elif is_client_call(item):
            found.append((item.get("call_id"), "tool_search", json.dumps(item.get("arguments"), ensure_ascii=False)))
    return tuple(NextAction(str(call_id), rename.get(str(name), str(name)), arguments)
                 for call_id, name, arguments in found)


def opening_task(messages: Sequence[dict[str, Any]]) -> str | None:
    """Text of the first user message that is not a tool result (None if there is none)."""
    for message in messages:
        if message.get("role") == "user" and not is_tool_result_message(message):
            return content_text(message.get("content"))
    return None
