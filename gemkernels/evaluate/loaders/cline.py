"""Cline tasks (``.../saoudrizwan.claude-dev/tasks/<task id>/``) as Anthropic Messages runs.

``api_conversation_history.json`` is the history as Cline sent it, Anthropic Messages (Cline's own fields ``ts``,
``modelInfo``, ``metrics``, ``id`` are not sent and are left out). Newer versions call tools natively (``tool_use`` /
``tool_result``); older ones write one XML tool call into the assistant's text (``<read_file><path>...</path>
</read_file>``; Cline runs the first) and answer it in the next user message with a ``[read_file for '...'] Result:``
text part: such a call becomes a ``tool_use`` part (ids ``cline_0000``, ...) next to the text, and its result the
``tool_result`` part answering it. A user message's ``tool_result`` parts are a message of their own and its other parts
(the environment details) the user message after it, as the Claude Code reader splits them. Usage per call from
``ui_messages.json`` beside it: each ``api_req_started`` record's ``tokensIn`` (uncached, or counting the cache's reads
where its ``apiProtocol`` is ``openai``), ``tokensOut``, ``cacheWrites``, ``cacheReads``, given to the assistant message
after its ``conversationHistoryIndex`` (in order where it has none; the retries of one call add up); else the message's
own ``metrics.tokens``. A change of the ``conversationHistoryDeletedRange`` (Cline truncating its context) is a
compaction from the first request made with it on: the requests resume after the range and keep the messages before it
(the task); a message marked ``isSummary`` (a condensed history) is one too. The goal is the ``<task>``, the project the
working directory the environment details name. The model: ``modelInfo.modelId``, ``api_req_started``'s ``modelId``,
else the task's ``task_metadata.json`` ``model_usage``.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

from gemkernels.compress.blocks import parts
from gemkernels.evaluate.loaders.model import Messages, Usage, opening_task
from gemkernels.evaluate.loaders.settle import Draft, Format
from gemkernels.evaluate.loaders.usage import prompt_usage, tokens

#: The names Cline's task folder files are read under (`gemkernels.evaluate.loaders.files.read_task_folder`).
API_HISTORY, UI_MESSAGES, TASK_METADATA = "api_conversation_history.json", "ui_messages.json", "task_metadata.json"
#: Cline's XML tools (its system prompt's names across versions).
TOOLS = ("execute_command", "read_file", "write_to_file", "replace_in_file", "apply_diff", "search_files",
         "list_files", "list_code_definition_names", "browser_action", "use_mcp_tool", "access_mcp_resource",
         "ask_followup_question", "attempt_completion", "plan_mode_respond", "plan_mode_response", "new_task",
         "load_mcp_documentation", "web_fetch", "condense", "summarize_task", "new_rule", "report_bug",
         "insert_content", "search_and_replace", "codebase_search", "fetch_instructions", "switch_mode")
XML_CALL = re.compile(r"<(" + "|".join(TOOLS) + r")>(.*?)</\1>", re.S)
XML_PARAM = re.compile(r"<(\w+)>(.*?)</\1>", re.S)
RESULT_HEADER = re.compile(r"\A\s*\[(\w+)(?: for [^\]]*)?\] Result:\s*")
ENVIRONMENT = "<environment_details>"
TASK = re.compile(r"\A<task>\s*(.*?)\s*</task>", re.S)
WORKING_DIRECTORY = re.compile(r"# Current Working Directory \(([^)\n]+)\)")


def is_cline_task(data: Any) -> bool:
    """A Cline task folder as read (`API_HISTORY`, `UI_MESSAGES`, `TASK_METADATA` keys), or the API history alone
    when its first user message is Cline's ``<task>``."""
    if isinstance(data, dict):
        return isinstance(data.get(API_HISTORY), list)
    return isinstance(data, list) and bool(data) and all(isinstance(m, dict) and m.get("role") in ("user", "assistant")
                                                         for m in data) and first_text(data[0]).startswith("<task>")


def first_text(message: dict[str, Any]) -> str:
    """The first text of a message (its string content, or its first text part)."""
    content = message.get("content")
    if isinstance(content, str):
        return content.lstrip()
    return next((p["text"].lstrip() for p in parts(message) if isinstance(p.get("text"), str)), "")


def read_cline_task(data: Any, stem: str) -> list[Draft]:
    """One run: the history (XML calls as ``tool_use``), each call's usage, model and time, the compactions."""
    history = data[API_HISTORY] if isinstance(data, dict) else data
    ui = data.get(UI_MESSAGES) if isinstance(data, dict) and isinstance(data.get(UI_MESSAGES), list) else []
    meta = data.get(TASK_METADATA) if isinstance(data, dict) and isinstance(data.get(TASK_METADATA), dict) else {}
    recorded = [m for m in history if isinstance(m, dict) and m.get("role") in ("user", "assistant")]
    sent = [{"role": m["role"], "content": m.get("content")} for m in recorded]
    if not any(p.get("type") == "tool_use" for m in sent for p in parts(m)):
        sent = with_xml_calls(sent)
    draft = Draft(stem, "cline", sent, opening_task(sent), id=stem)
    requests = [r for r in ui if isinstance(r, dict) and r.get("say") == "api_req_started"]
    assistants = [i for i, m in enumerate(sent) if m["role"] == "assistant"]
    billed: dict[int, Usage] = {}
    for n, request in enumerate(requests):
        at = answer_of(request, n, assistants)
        info = request_info(request)
        if at is None or info is None:
            continue
        usage = request_usage(info)
        billed[at] = billed[at] + usage if at in billed else usage
        if isinstance(info.get("modelId"), str):
            draft.models.setdefault(id(sent[at]), info["modelId"])
        if isinstance(request.get("ts"), (int, float)):
            draft.times.setdefault(id(sent[at]), iso_time(request["ts"]))
    for i in assistants:
        source, key = recorded[i], id(sent[i])
        metrics = (source.get("metrics") or {}).get("tokens") if isinstance(source.get("metrics"), dict) else None
        if i in billed:
            draft.usage[key] = billed[i]
        elif isinstance(metrics, dict):
            draft.usage[key] = prompt_usage(tokens(metrics, "prompt"), tokens(metrics, "cached"), 0,
                                            tokens(metrics, "completion"))
        model = (source.get("modelInfo") or {}).get("modelId") if isinstance(source.get("modelInfo"), dict) else None
        model = model or draft.models.get(key) or metadata_model(meta, source.get("ts"))
        if isinstance(model, str):
            draft.models[key] = model
        if isinstance(source.get("ts"), (int, float)):
            draft.times.setdefault(key, iso_time(source["ts"]))
    for position, kind, keep, resume in compactions(recorded, requests):
        if position < len(sent):
            key = id(sent[position])
            draft.compactions[key] = kind
            if 0 < keep <= resume:
                draft.kept[key] = id(sent[keep - 1])
            if resume < len(sent):
                draft.resumes[key] = id(sent[resume])
    task = TASK.search(first_text(sent[0])) if sent else None
    draft.goal = task.group(1).strip() if task else draft.goal
    draft.project = next((found.group(1) for m in sent if m["role"] == "user" for p in parts(m)
                          if isinstance(p.get("text"), str) and (found := WORKING_DIRECTORY.search(p["text"]))), None)
    draft.messages = answers_apart(draft)
    return [draft]


def answers_apart(draft: Draft) -> Messages:
    """The draft's messages with each user message's ``tool_result`` parts as a message of their own, its other
    parts (the environment details) as the user message after it, so that a call and its results are a block; the
    draft's compaction marks follow the first of the two."""
    out: Messages = []
    for message in draft.messages:
        results = [p for p in parts(message) if p.get("type") == "tool_result"]
        others = [p for p in parts(message) if p.get("type") != "tool_result"]
        if message["role"] != "user" or not results or not others:
            out.append(message)
            continue
        answer, rest = {"role": "user", "content": results}, {"role": "user", "content": others}
        out += [answer, rest]
        for marks in (draft.compactions, draft.kept, draft.resumes):
            if id(message) in marks:
                marks[id(answer)] = marks.pop(id(message))
        for marks, now in ((draft.kept, rest), (draft.resumes, answer)):  # the last message kept; the first resumed
            for key, value in marks.items():
                if value == id(message):
                    marks[key] = id(now)
    return out


def request_info(request: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON an ``api_req_started`` record's ``text`` holds (None: unreadable)."""
    try:
        info = json.loads(request.get("text") or "")
    except (json.JSONDecodeError, TypeError):
        return None
    return info if isinstance(info, dict) else None


def request_usage(info: dict[str, Any]) -> Usage:
    """One request's usage: ``tokensIn`` uncached, except under the ``openai`` protocol, where it counts the cache
    reads."""
    read, write, out = tokens(info, "cacheReads"), tokens(info, "cacheWrites"), tokens(info, "tokensOut")
    if info.get("apiProtocol") == "openai":
        return prompt_usage(tokens(info, "tokensIn"), read, write, out)
    return Usage(tokens(info, "tokensIn"), read, write, out)


def answer_of(request: dict[str, Any], n: int, assistants: list[int]) -> int | None:
    """The position of the assistant message an ``api_req_started`` record billed: the first after its
    ``conversationHistoryIndex`` (the user message it sent), else the ``n``-th."""
    index = request.get("conversationHistoryIndex")
    if isinstance(index, int) and not isinstance(index, bool):
        return next((i for i in assistants if i > index), None)
    return assistants[n] if n < len(assistants) else None


def metadata_model(meta: dict[str, Any], ts: Any) -> str | None:
    """The model ``task_metadata.json`` says was in use at ``ts`` (its latest ``model_usage`` entry by then)."""
    usage = [u for u in meta.get("model_usage") or [] if isinstance(u, dict) and isinstance(u.get("model_id"), str)]
    before = [u for u in usage if not isinstance(ts, (int, float)) or tokens(u, "ts") <= ts]
    return (before or usage)[-1]["model_id"] if usage else None


def compactions(recorded: list[dict[str, Any]], requests: list[dict[str, Any]]
                ) -> list[tuple[int, str, int, int]]:
    """(position, kind, leading messages kept, where the history resumes): each message marked ``isSummary``, and
    each new ``conversationHistoryDeletedRange``: at the message its first request sent (after its
    ``conversationHistoryIndex``), keeping the messages before the range, resuming after it."""
    found = [(i, "condense", 0, i) for i, m in enumerate(recorded) if m.get("isSummary")]
    previous = None
    for request in requests:
        deleted, index = request.get("conversationHistoryDeletedRange"), request.get("conversationHistoryIndex")
        if isinstance(deleted, list) and len(deleted) == 2 and all(isinstance(x, int) for x in deleted) \
                and deleted != previous and isinstance(index, int):
            found.append((max(index + 1, deleted[1] + 1), "truncation", deleted[0], deleted[1] + 1))
            previous = deleted
    return sorted(set(found))


def iso_time(ms: float) -> str:
    """A millisecond Unix time as ISO 8601 UTC."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def with_xml_calls(messages: Messages) -> Messages:
    """Each assistant turn's first XML tool call as a ``tool_use`` part beside its text, and the ``Result:`` text
    of the next user message as the ``tool_result`` answering it; other messages as they are."""
    out: Messages = []
    open_call: tuple[str, str] | None = None  # (id, tool) of the previous assistant turn's call
    made = 0
    for message in messages:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else [
            p for p in content or [] if isinstance(p, dict)]
        if message["role"] == "assistant":
            text = "\n".join(p["text"] for p in blocks if p.get("type") == "text" and isinstance(p.get("text"), str))
            call = XML_CALL.search(text)
            open_call = None
            if call is not None:
                open_call, made = (f"cline_{made:04d}", call.group(1)), made + 1
                params = {name: value.strip() for name, value in XML_PARAM.findall(call.group(2))}
                blocks = [*blocks, {"type": "tool_use", "id": open_call[0], "name": call.group(1), "input": params}]
                out.append({"role": "assistant", "content": blocks})
            else:
                out.append(message)
            continue
        result = split_result(blocks, open_call[1]) if open_call else None
        if result is None:
            out.append(message)
        else:
            answer, rest = result
            out.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": open_call[0],
                                                     "content": answer}, *rest]})
        open_call = None
    return out


def split_result(blocks: list[dict[str, Any]], tool: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """(the parts of ``tool``'s result, the parts after it) when the message opens with its ``Result:`` header;
    the result runs to the environment details."""
    start = next((i for i, p in enumerate(blocks) if p.get("type") == "text" and isinstance(p.get("text"), str)
                  and (header := RESULT_HEADER.match(p["text"])) and header.group(1) == tool), None)
    if start is None:
        return None
    body = RESULT_HEADER.sub("", blocks[start]["text"], count=1)
    answer = ([{"type": "text", "text": body}] if body.strip() else [])
    end = start + 1
    while end < len(blocks) and not (isinstance(blocks[end].get("text"), str)
                                     and blocks[end]["text"].lstrip().startswith(ENVIRONMENT)):
        answer.append(blocks[end])
        end += 1
    return answer or [{"type": "text", "text": ""}], blocks[:start] + blocks[end:]


FORMATS = (Format("cline", is_cline_task, read_cline_task),)
