"""`GEMCondenser` in the OpenHands SDK's own agent loop: recorded runs replayed through a `Conversation` by a scripted
`TestLLM` and a tool that answers with the recorded results, with the condenser first in a `PipelineCondenser`.

What the LLM receives on each call is compared with `GEM.compress` of the history a run without condenser sends at
that call, computed by a GEM of its own, less the blocks it dropped at earlier calls (a condensation is for good);
the conversation's events are those of the run without condenser plus condensations that forget whole action and
observation pairs without summary; each call is logged; a history GEM cannot read reaches the LLM unchanged with the
reason. Runs: the bundled example, the shipped mini-swe-agent and OpenHands SDK fixtures, and the OpenHands SDK
development logs where ``../shared`` has them."""

from __future__ import annotations

import json
import logging
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no model price list from the network
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
pytest.importorskip("openhands.sdk")

from helpers import EXAMPLE, FIXTURES, LOGS  # noqa: E402
from openhands.sdk import Agent, Conversation  # noqa: E402
from openhands.sdk.context.condenser import LLMSummarizingCondenser, NoOpCondenser, PipelineCondenser  # noqa: E402
from openhands.sdk.context.view import View  # noqa: E402
from openhands.sdk.event import (  # noqa: E402
    ActionEvent,
    Condensation,
    LLMConvertibleEvent,
    MessageEvent,
    ObservationBaseEvent,
    ObservationEvent,
)
from openhands.sdk.llm import Message, MessageToolCall, TextContent, ThinkingBlock  # noqa: E402
from openhands.sdk.testing import TestLLM  # noqa: E402
from openhands.sdk.tool import Action, Observation, Tool, ToolDefinition, ToolExecutor, register_tool  # noqa: E402
from pydantic import Field, PrivateAttr, ValidationError  # noqa: E402

from gemkernels.compress.blocks import content_text  # noqa: E402
from gemkernels.compress.config import with_overrides  # noqa: E402
from gemkernels.compress.gem import GEM  # noqa: E402
from gemkernels.evaluate.loaders import load_runs  # noqa: E402
from gemkernels.integrations import openhands as integration  # noqa: E402
from gemkernels.integrations.openhands import GEMCondenser, event_messages, forgettable  # noqa: E402

RUNS = [EXAMPLE, FIXTURES / "text_actions" / "mini_swe_agent_1.text-actions", FIXTURES / "openhands-sdk",
        *sorted(p for p in LOGS.glob("openhands-sdk/*") if "goal_fixture" not in p.name)]
#: Forces drops in short runs: from 3 blocks on, only the newest and the goal's are protected.
TIGHT = ("min_blocks=3", "k=1", "evidence.recent=1")
SETTINGS = {"core": ("core", ()), "cache-aware": ("cache-aware", ()), "tight": ("core", TIGHT)}

#: The recorded results the replay tool answers with, per command, in order (set by `replay`).
RESULTS: dict[str, list[str]] = {}


class ReplayAction(Action):
    command: str = Field(description="the recorded command")


class ReplayObservation(Observation):
    """The recorded result of a command."""


class ReplayExecutor(ToolExecutor):
    def __call__(self, action: ReplayAction, conversation=None) -> ReplayObservation:
        return ReplayObservation.from_text(text=RESULTS[action.command].pop(0))


class ReplayTool(ToolDefinition[ReplayAction, ReplayObservation]):
    """Answers each command with the next recorded result of that command."""

    @classmethod
    def create(cls, conv_state=None, **params):
        return [cls(description="Runs a command of the recorded run.", action_type=ReplayAction,
                    observation_type=ReplayObservation, executor=ReplayExecutor())]


register_tool("ReplayTool", ReplayTool)


def chat(message: Message) -> dict:
    """A message as an OpenAI chat dict with native tool calls (what the test compares)."""
    return message.to_chat_dict(cache_enabled=False, vision_enabled=False, function_calling_enabled=True,
                                force_string_serializer=False, send_reasoning_content=True)


class RecordingLLM(TestLLM):
    """A scripted LLM that records the messages of each call."""

    __test__ = False
    _received: list[list[dict]] = PrivateAttr(default_factory=list)

    def completion(self, messages, *args, **kwargs):
        self._received.append([chat(m) for m in messages])
        return super().completion(messages, *args, **kwargs)


def recorded(path) -> list[dict]:
    """The OpenAI messages of the recorded run at ``path`` (the project's readers)."""
    runs, errors = load_runs(path)
    assert not errors and len(runs) == 1
    return runs[0].messages


def command_of(call: dict) -> str:
    """What the replay tool gets for a recorded call: its ``command`` argument, else its whole arguments."""
    arguments = call["function"]["arguments"]
    try:
        command = json.loads(arguments).get("command")
    except (ValueError, AttributeError):
        command = None
    return command if isinstance(command, str) else arguments


def script(messages: list[dict]) -> list[tuple[str, list[Message]]]:
    """The run as the user's turns, each with the LLM's scripted answers (ending on one without tool calls, which
    ends the turn), and the replay tool's results filled in."""
    RESULTS.clear()
    turns: list[tuple[str, list[Message]]] = []
    commands: dict[str, str] = {}
    for message in messages:
        role = message["role"]
        if role == "user":
            turns.append((content_text(message["content"]), []))
        elif role == "assistant":
            if not turns:
                turns.append(("Continue.", []))
            calls = [MessageToolCall(id=call["id"], name="replay", origin="completion",
                                     arguments=json.dumps({"command": command_of(call)}))
                     for call in message.get("tool_calls") or []]
            commands.update((call["id"], command_of(call)) for call in message.get("tool_calls") or [])
            turns[-1][1].append(Message(role="assistant", content=[TextContent(text=content_text(message["content"]))],
                                        tool_calls=calls or None))
        elif role == "tool":
            RESULTS.setdefault(commands[message["tool_call_id"]], []).append(content_text(message["content"]))
    for _, answers in turns:
        if not answers or answers[-1].tool_calls:
            answers.append(Message(role="assistant", content=[TextContent(text="Done.")]))
    return turns


def replay(messages: list[dict], condenser, tmp_path) -> tuple[Conversation, RecordingLLM]:
    """Drive a `Conversation` through the recorded ``messages`` with ``condenser``."""
    turns = script(messages)
    llm = RecordingLLM.from_messages([answer for _, answers in turns for answer in answers])
    agent = Agent(llm=llm, tools=[Tool(name="ReplayTool")], condenser=condenser)
    workspace = tmp_path / ("gem" if condenser is not None else "plain")
    workspace.mkdir(exist_ok=True)
    conversation = Conversation(agent=agent, workspace=str(workspace), visualizer=None, stuck_detection=False)
    for text, _ in turns:
        conversation.send_message(text)
        conversation.run()
    return conversation, llm


def call_ids(message: dict) -> set[str]:
    """The tool-call ids a message carries (its calls, or the one it answers)."""
    ids = {call["id"] for call in message.get("tool_calls") or []}
    return ids | ({message["tool_call_id"]} if message.get("tool_call_id") else set())


def reference(histories: list[list[dict]], preset: str, overrides: tuple[str, ...]) -> list[list[dict]]:
    """What GEM (one of its own, hash encoder, one session) forwards of each history, less the blocks it dropped at
    an earlier call (forgotten for good)."""
    engine = GEM(with_overrides(preset, overrides), encoder="hash")
    forgotten: set[str] = set()
    expected = []
    for history in histories:
        forwarded = engine.compress(history, session_id="reference").messages
        expected.append([m for m in forwarded if not call_ids(m) & forgotten])
        forgotten |= set().union(*map(call_ids, history)) - set().union(*map(call_ids, forwarded))
    return expected


def paired(messages: list[dict]) -> bool:
    """Every tool call answered by exactly one result after it, every result answering a call before it."""
    open_calls: set[str] = set()
    answered: set[str] = set()
    for message in messages:
        for call in message.get("tool_calls") or []:
            open_calls.add(call["id"])
        if message.get("role") == "tool":
            if message["tool_call_id"] not in open_calls or message["tool_call_id"] in answered:
                return False
            answered.add(message["tool_call_id"])
    return answered == open_calls


def llm_events(conversation: Conversation) -> list:
    return [e for e in conversation.state.events if isinstance(e, LLMConvertibleEvent)]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.name)
def test_llm_receives_gem_compression_of_the_history(path, setting, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gemkernels")
    preset, overrides = SETTINGS[setting]
    messages = recorded(path)
    plain, plain_llm = replay(messages, None, tmp_path)
    condenser = PipelineCondenser(condensers=[GEMCondenser(preset=preset, overrides=list(overrides), encoder="hash"),
                                              NoOpCondenser()])
    conversation, llm = replay(messages, condenser, tmp_path)

    received, histories = llm._received, plain_llm._received
    assert len(received) == len(histories)
    assert received == reference(histories, preset, overrides)
    assert all(paired(messages) for messages in received)
    # the stored history: the events of the run without condenser, plus condensations without summary
    stored = llm_events(conversation)
    assert [chat(m) for m in LLMConvertibleEvent.events_to_messages(stored)] == [
        chat(m) for m in LLMConvertibleEvent.events_to_messages(llm_events(plain))]
    condensations = [e for e in conversation.state.events if isinstance(e, Condensation)]
    by_id = {e.id: e for e in stored}
    for condensation in condensations:
        assert condensation.summary is None and condensation.forgotten_event_ids
        forgotten = [by_id[i] for i in condensation.forgotten_event_ids]
        assert all(isinstance(e, (ActionEvent, ObservationBaseEvent)) for e in forgotten)
        actions = {e.tool_call_id for e in forgotten if isinstance(e, ActionEvent)}
        assert actions == {e.tool_call_id for e in forgotten if isinstance(e, ObservationBaseEvent)}
    dropped_at_some_call = sum(len(h) - len(r) for h, r in zip(histories, received)) > 0
    assert bool(condensations) == dropped_at_some_call
    lines = [r.getMessage() for r in caplog.records if r.name == "gemkernels.integrations"]
    assert len([line for line in lines if "forgetting" in line]) == len(condensations)
    read = [line for line in lines if " -> " in line or ": unchanged, " in line]  # log_call: one line per call
    assert len(read) >= len(received)


def test_a_long_run_is_condensed_and_the_condenser_serialises(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gemkernels.integrations")
    condenser = GEMCondenser(preset="core", encoder="hash")
    conversation, llm = replay(recorded(EXAMPLE), condenser, tmp_path)
    assert any(isinstance(e, Condensation) for e in conversation.state.events)
    assert len(llm._received[-1]) < len(llm_events(conversation))
    assert any("reselected" in r.getMessage() for r in caplog.records)
    summarizer = LLMSummarizingCondenser(llm=TestLLM(model="summarizer"), max_size=400)
    pipeline = PipelineCondenser(condensers=[condenser, summarizer])
    again = PipelineCondenser.model_validate_json(pipeline.model_dump_json())
    assert isinstance(again.condensers[0], GEMCondenser) and again.condensers[0].preset == "core"
    assert json.loads(pipeline.model_dump_json())["condensers"][0]["kind"] == "GEMCondenser"
    with pytest.raises(ValidationError, match="unknown preset"):
        GEMCondenser(preset="fastest")
    with pytest.raises(ValidationError, match="override"):
        GEMCondenser(overrides=["no_such_field=1"])


def test_broken_history_reaches_the_llm_unchanged_with_the_reason(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gemkernels")
    messages = recorded(EXAMPLE)[:2 + 2 * 8]
    reused = messages[2 + 2 * 4]["tool_calls"][0]["id"]  # the fifth call's id, given to the sixth call too
    messages[2 + 2 * 5] = {**messages[2 + 2 * 5], "tool_calls": [{**messages[2 + 2 * 5]["tool_calls"][0],
                                                                  "id": reused}]}
    messages[3 + 2 * 5] = {**messages[3 + 2 * 5], "tool_call_id": reused}
    condenser = GEMCondenser(preset="core", overrides=list(TIGHT), encoder="hash")
    conversation, llm = replay(messages, condenser, tmp_path)
    plain, plain_llm = replay(messages, None, tmp_path)
    events = list(conversation.state.events)
    broken_at = [i for i, e in enumerate(events) if isinstance(e, ActionEvent) and e.tool_call_id == reused][1]
    condensations = [e for e in events if isinstance(e, Condensation)]
    assert condensations and all(events.index(c) < broken_at for c in condensations)  # none once it broke
    forgotten = {e.tool_call_id for e in events if isinstance(e, (ActionEvent, ObservationBaseEvent))
                 and any(e.id in c.forgotten_event_ids for c in condensations)}
    assert forgotten and reused not in forgotten
    calls_before = sum(1 for e in events[:broken_at] if isinstance(e, ActionEvent))  # one LLM call each
    assert len(llm._received) == len(plain_llm._received) > calls_before + 2
    for received, history in zip(llm._received[calls_before + 1:], plain_llm._received[calls_before + 1:]):
        assert received == [m for m in history if not call_ids(m) & forgotten]  # the view, as it is
    assert any("forwarding unchanged" in r.getMessage() and "used twice" in r.getMessage() for r in caplog.records)


def test_events_the_sdk_cannot_turn_into_messages_reach_the_llm_unchanged(monkeypatch, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gemkernels")

    def unconvertible(events):
        raise ValueError(f"{len(events)} events make 1 message")

    monkeypatch.setattr(integration, "event_messages", unconvertible)
    messages = recorded(EXAMPLE)
    conversation, llm = replay(messages, GEMCondenser(preset="core", overrides=list(TIGHT), encoder="hash"), tmp_path)
    plain, plain_llm = replay(messages, None, tmp_path)
    assert llm._received == plain_llm._received
    assert not any(isinstance(e, Condensation) for e in conversation.state.events)
    assert any("forwarding unchanged: events not convertible: ValueError" in r.getMessage() for r in caplog.records)

@st.composite
def event_histories(draw) -> tuple[list, set[str]]:
    """SDK events: user messages (some in a row), agent answers, and responses of one to three parallel tool calls
    (some with thinking, which makes a tool loop), each call answered; and a set of their ids to drop."""
    events: list = []
    for turn in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["user", "agent", "response", "response"]))
        if kind != "response":
            role, source = ("user", "user") if kind == "user" else ("assistant", "agent")
            events.append(MessageEvent(source=source, llm_message=Message(role=role, content=[TextContent(
                text=f"{kind} {turn}")])))
            continue
        thinking = [ThinkingBlock(thinking="hm", signature="s")] if draw(st.booleans()) else []
        actions = [ActionEvent(source="agent", thought=[TextContent(text=f"step {turn}")] if i == 0 else [],
                               action=ReplayAction(command=f"ls {turn}.{i}"), tool_name="replay",
                               tool_call_id=f"c{turn}.{i}", llm_response_id=f"r{turn}",
                               thinking_blocks=thinking if i == 0 else [],
                               tool_call=MessageToolCall(id=f"c{turn}.{i}", name="replay", origin="completion",
                                                         arguments=json.dumps({"command": f"ls {turn}.{i}"})))
                   for i in range(draw(st.integers(1, 3)))]
        events += actions + [ObservationEvent(source="environment", observation=ReplayObservation.from_text(
            text=f"out {a.tool_call_id}"), action_id=a.id, tool_name="replay", tool_call_id=a.tool_call_id)
            for a in actions]
    return events, draw(st.sets(st.sampled_from([e.id for e in events])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_histories())
def test_events_map_onto_the_sdk_messages_and_forgetting_keeps_the_view_valid(case):
    events, dropped = case
    groups, views = event_messages(events)
    messages = LLMConvertibleEvent.events_to_messages(events)
    assert [e for group in groups for e in group] == events and views == [chat(m) for m in messages]
    for group, view in zip(groups, views):
        assert call_ids(view) == {e.tool_call_id for e in group if isinstance(e, (ActionEvent, ObservationEvent))}
    forget = forgettable(View(events=events), dropped)
    assert forget <= dropped
    kept = [e for e in events if e.id not in forget]
    after = View(events=kept)
    after.enforce_properties(events)
    assert after.events == kept  # the SDK's view properties hold: it drops nothing more
    actions = {e.tool_call_id for e in events if isinstance(e, ActionEvent) and e.id in forget}
    assert actions == {e.tool_call_id for e in events if isinstance(e, ObservationEvent) and e.id in forget}
