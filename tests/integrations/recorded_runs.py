"""Recorded agent runs that the integration tests replay through each framework's own loop: the bundled example and,
where ../shared is present, a few development runs; each an OpenAI chat history of a system prompt, the task, then
only assistant turns that call tools and the results of those calls."""

from __future__ import annotations

import json
from typing import Any

from helpers import EXAMPLE, TRAJECTORIES

from gemkernels.compress.blocks import parse_history

#: Development runs replayed besides the example, from each of these folders of ../shared/data/trajectories.
DEVELOPMENT_FOLDERS = {"mini-swe-agent": 2, "swe-agent": 1}
#: Runs with fewer blocks are never compressed and prove nothing here.
MIN_BLOCKS = 20


def replayable(messages: list[dict[str, Any]]) -> bool:
    """Whether an agent loop of model calls and tool runs alone can produce ``messages`` after their first two."""
    rest = messages[2:]
    return (len(messages) > 2 and [m["role"] for m in messages[:2]] == ["system", "user"] and bool(rest)
            and all(m["role"] == "tool" or (m["role"] == "assistant" and m.get("tool_calls")) for m in rest)
            and rest[-1]["role"] == "tool")


def recorded_runs() -> list[tuple[str, list[dict[str, Any]]]]:
    """(name, messages) of the example and of the first replayable development runs by name (those present)."""
    runs = [(EXAMPLE.stem, json.loads(EXAMPLE.read_text())["messages"])]
    from gemkernels.evaluate.loaders import load_runs

    for folder, count in DEVELOPMENT_FOLDERS.items():
        if not (TRAJECTORIES / folder).is_dir():
            continue
        found, _ = load_runs(TRAJECTORIES / folder)
        fit = [run for run in sorted(found, key=lambda run: run.name) if replayable(run.messages)
               and len(parse_history(run.messages).spans) >= MIN_BLOCKS]
        runs.extend((f"{folder}/{run.name}", run.messages) for run in fit[:count])
    return runs


def call_positions(messages: list[dict[str, Any]]) -> list[int]:
    """The position of each assistant turn: the model call that produced it was sent ``messages[:position]``."""
    return [p for p, message in enumerate(messages) if message["role"] == "assistant"]


def assert_tool_pairing(messages: list[dict[str, Any]]) -> None:
    """Every tool call of an assistant turn is answered exactly once by the tool messages right after it, and every
    tool message answers a call of the assistant turn before it (what a chat-completions API accepts)."""
    open_calls: set[str] = set()
    answered: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_calls, f"tool result {message['tool_call_id']} answers no call"
            open_calls.discard(message["tool_call_id"])
            answered.add(message["tool_call_id"])
            continue
        assert not open_calls, f"calls {sorted(open_calls)} left unanswered"
        for call in message.get("tool_calls") or ():
            assert call["id"] not in answered and call["id"] not in open_calls, f"call id {call['id']} twice"
            open_calls.add(call["id"])
    assert not open_calls, f"calls {sorted(open_calls)} left unanswered"


class GEMInputs:
    """Records what every `GEM.compress` of sessions other than ``reference`` was given (a copy of the list), so a
    test can compress the very same messages with a reference GEM: a framework may hand GEM its own version of the
    history (keys added or reordered, arguments re-serialised), and the selection reads its sizes and text."""

    def __init__(self, monkeypatch):
        from gemkernels.compress.gem import GEM

        self.calls: dict[str | None, list[list[Any]]] = {}
        compress = GEM.compress

        def recording(gem, messages, *args, **kwargs):
            session = kwargs.get("session_id", args[0] if args else None)
            if session != "reference":
                self.calls.setdefault(session, []).append(list(messages))
            return compress(gem, messages, *args, **kwargs)

        monkeypatch.setattr(GEM, "compress", recording)

    def only(self) -> list[list[Any]]:
        """The inputs of the one session that was compressed."""
        (calls,) = self.calls.values()
        return calls
