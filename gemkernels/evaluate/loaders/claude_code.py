"""Claude Code transcripts (``~/.claude/projects/<project>/<session>.jsonl``) as Anthropic Messages runs.

Claude Code writes one record per content block: the ``assistant`` records of one API response (``message.id``) are
merged into one assistant message, and the ``tool_result`` parts of the ``user`` records after it into the one user
message that answers it (a record's other parts follow as a user message of their own). A block written again for the
same response (a tool_use of the same id, an equal block) is read once; a tool_use id reused after its result was
recorded gets a fresh ``<id>-<n>`` (`unique_call_ids`). Each response is one call, billed with the ``usage`` of its last
record (input, output, cache read, cache creation), made at its first record's ``timestamp``; the project is the
records' ``cwd``. Records in file order; API-error and ``<synthetic>`` assistant records are left out (they are not
model output). A ``compact_boundary`` system record and the ``isCompactSummary`` user record after it, or an old
``summary`` record whose leaf is an earlier message of the file, mark a compaction. Sub-agents (``isSidechain``: inline,
in ``agent-<id>.jsonl`` beside the session, or in ``<session>/subagents/``) are runs of their own, with the session as
``parent``, linked to the ``Task`` / ``Agent`` call that started them (its id as renamed) by ``toolUseResult.agentId``
or, in older logs, by prompt.
"""

from __future__ import annotations

import json
from typing import Any

from gemkernels.evaluate.loaders.chat import is_tool_use, unique_call_ids
from gemkernels.evaluate.loaders.model import Link, Messages, opening_task
from gemkernels.evaluate.loaders.settle import Draft, Format
from gemkernels.evaluate.loaders.usage import anthropic_usage

#: Tools that start a sub-agent (renamed from ``Task`` to ``Agent`` in later versions).
SUBAGENT_TOOLS = frozenset({"Task", "Agent"})


def is_claude_code(data: Any) -> bool:
    """JSON Lines of Claude Code records: ``user`` / ``assistant`` records carry a ``message`` and a ``uuid``."""
    return isinstance(data, list) and any(
        isinstance(r, dict) and r.get("type") in ("user", "assistant") and isinstance(r.get("message"), dict)
        and isinstance(r.get("uuid"), str) for r in data)


def read_claude_code(data: list[Any], stem: str) -> list[Draft]:
    """The session's own run (when the file has main-chain records) and one run per sub-agent in the file."""
    records = [r for r in data if isinstance(r, dict)]
    session = next((r["sessionId"] for r in records if isinstance(r.get("sessionId"), str)), stem)
    main = [r for r in records if not r.get("isSidechain")]
    agents = sidechains([r for r in records if r.get("isSidechain")])
    drafts = []
    if any(r.get("type") in ("user", "assistant") for r in main):
        drafts.append(transcript(main, stem, session, session))
    for key, group in agents.items():
        name = stem if not drafts and len(agents) == 1 else f"{stem}/{key}"
        draft = transcript(group, name, f"{session}/{key}", session)
        draft.parent = session
        drafts.append(draft)
    return drafts


def sidechains(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Sub-agent records by sub-agent: ``agent-<agentId>``, or (no ``agentId``) ``sidechain-<root uuid>`` of the
    ``parentUuid`` chain the record belongs to."""
    roots = chain_roots({r.get("uuid"): r.get("parentUuid") for r in records})
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        agent = record.get("agentId")
        key = f"agent-{agent}" if isinstance(agent, str) else f"sidechain-{roots[record.get('uuid')]}"
        groups.setdefault(key, []).append(record)
    return groups


def chain_roots(parent: dict[Any, Any]) -> dict[Any, Any]:
    """Each uuid's root: the first of its ``parent`` chain whose parent is none of the uuids (in a cycle, the uuid
    the walk came back to). Each uuid is walked once: a walk stops at a uuid whose root is known."""
    roots: dict[Any, Any] = {}
    for uuid in parent:
        path: dict[Any, None] = {}  # the uuids walked to reach ``node``
        node = uuid
        while node not in roots and node not in path and parent[node] in parent:
            path[node] = None
            node = parent[node]
        root = roots.setdefault(node, node)
        roots.update(dict.fromkeys(path, root))
    return roots


def transcript(records: list[dict[str, Any]], name: str, run_id: str, session: str) -> Draft:
    """One chain of records as Anthropic messages, with each response's usage and model, the compactions, and the
    sub-agents it started (`spawned`, children of ``session``)."""
    draft = Draft(name, "claude-code", [], None, id=run_id)
    messages = draft.messages
    turn: dict[str, Any] | None = None  # the latest assistant message, while only its results follow it
    turn_id = None
    answer: dict[str, Any] | None = None  # the user message holding the results that answer ``turn``
    billed: dict[str, int] = {}  # message.id -> id() of the message that carries its usage
    merged: dict[str, set[str]] = {}  # message.id -> `block_key` of each block read so far
    leaves: set[str] = set()
    pending: str | None = None  # a compaction marker waiting for the next message
    agents: dict[tuple[int, int], str] = {}  # (message, part) of a tool_result -> the agentId its record names
    for record in records:
        kind, message = record.get("type"), record.get("message")
        if kind == "system" and record.get("subtype") == "compact_boundary":
            pending = "compact_boundary"
        elif kind == "summary" and record.get("leafUuid") in leaves:
            pending = "summary"
        if kind not in ("user", "assistant") or not isinstance(message, dict):
            continue
        leaves.add(record.get("uuid"))
        content = message.get("content")
        blocks = [p for p in content if isinstance(p, dict)] if isinstance(content, list) else (
            [{"type": "text", "text": content}] if isinstance(content, str) else [])
        added: dict[str, Any] | None = None
        if kind == "assistant":
            if record.get("isApiErrorMessage") or message.get("model") == "<synthetic>":
                continue
            response = None if message.get("id") is None else str(message["id"])
            again = response in merged  # a later record of a response read before
            if response is not None:
                blocks = unseen(blocks, merged.setdefault(response, set()))
            if turn is not None and response is not None and response == turn_id:
                turn["content"].extend(blocks)
            elif blocks or not again:
                turn, turn_id, answer = {"role": "assistant", "content": blocks}, response, None
                added = turn
                messages.append(turn)
            key = billed.setdefault(str(response), id(turn))
            if isinstance(message.get("usage"), dict):
                draft.usage[key] = anthropic_usage(message["usage"])
            if isinstance(message.get("model"), str):
                draft.models.setdefault(key, message["model"])
            if isinstance(record.get("timestamp"), str):
                draft.times.setdefault(key, record["timestamp"])
        else:
            results = [p for p in blocks if p.get("type") == "tool_result"]
            others = [p for p in blocks if p.get("type") != "tool_result"]
            if results:
                if answer is None or messages[-1] is not answer:
                    answer = {"role": "user", "content": []}
                    added = answer
                    messages.append(answer)
                agent = record.get("toolUseResult")
                if isinstance(agent, dict) and isinstance(agent.get("agentId"), str):
                    for i in range(len(results)):
                        agents[len(messages) - 1, len(answer["content"]) + i] = agent["agentId"]
                answer["content"].extend(results)
            if others:
                user = {"role": "user", "content": content if isinstance(content, str) else others}
                added = added or user
                messages.append(user)
                turn = answer = None
        if pending and added is not None:
            draft.compactions[id(added)] = pending
            pending = None
    draft.trailing_compaction = pending
    draft.goal = opening_task(messages)
    draft.project = next((r["cwd"] for r in records if isinstance(r.get("cwd"), str)), None)
    renamed(draft)
    draft.spawned = spawned(draft.messages, agents, session)
    return draft


def unseen(blocks: list[dict[str, Any]], seen: set[str]) -> list[dict[str, Any]]:
    """The blocks whose `block_key` is not in ``seen`` (nor earlier in ``blocks``), their keys added to it."""
    fresh = []
    for block in blocks:
        key = block_key(block)
        if key not in seen:
            seen.add(key)
            fresh.append(block)
    return fresh


def block_key(block: dict[str, Any]) -> str:
    """What makes a content block a repeat of another: a tool_use's id, any other block's whole JSON."""
    if block.get("type") == "tool_use" and isinstance(block.get("id"), str):
        return f"tool_use {block['id']}"
    return json.dumps(block, sort_keys=True)


def renamed(draft: Draft) -> None:
    """Gives ``draft`` copies of its messages with reused tool_use ids renamed (`unique_call_ids`), its usage,
    models, times and compactions moved to the copies."""
    messages = unique_call_ids(draft.messages)
    moved = {id(old): id(new) for old, new in zip(draft.messages, messages)}
    for table in (draft.usage, draft.models, draft.times, draft.compactions):
        entries = {moved[key]: value for key, value in table.items()}
        table.clear()
        table.update(entries)
    draft.messages = messages


def spawned(messages: Messages, agents: dict[tuple[int, int], str], session: str) -> tuple[Link, ...]:
    """The sub-agent calls in ``messages`` (ids as renamed): each ``Task`` / ``Agent`` tool_use, with the child's id
    where the result answering it is at a ``(message, part)`` of ``agents`` (its record's agentId), and its prompt."""
    children = {messages[i]["content"][j].get("tool_use_id"): f"{session}/agent-{agent}"
                for (i, j), agent in agents.items()}
    links = []
    for message in messages:
        for part in message["content"] if message["role"] == "assistant" else []:
            if is_tool_use(part) and isinstance(part.get("id"), str) and (
                    part.get("name") in SUBAGENT_TOOLS or "subagent_type" in (part.get("input") or {})):
                prompt = (part.get("input") or {}).get("prompt")
                links.append(Link(part["id"], children.get(part["id"]), prompt if isinstance(prompt, str) else None))
    return tuple(links)


FORMATS = (Format("claude-code", is_claude_code, read_claude_code),)
