"""`GEMMiddleware` in LangChain's v1 agent loop (``create_agent``): recorded runs replayed by a chat model that answers
with the recorded assistant turns and a middleware that answers each tool call with its recorded result; what the
model receives at each call is `GEM.compress` of the same history by an independent GEM (mapped back to the agent's
own message objects), every ``ToolMessage`` with its ``AIMessage`` call, the agent's stored history whole, and the
stats on each reply. A history GEM cannot handle reaches the model unchanged with the reason."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("langchain")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from langchain.agents import create_agent  # noqa: E402
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse  # noqa: E402
from langchain_core.language_models.chat_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.messages.utils import count_tokens_approximately  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import StructuredTool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from pydantic import Field  # noqa: E402
from recorded_runs import GEMInputs, assert_tool_pairing, call_positions, recorded_runs  # noqa: E402

from gemkernels.compress.config import with_overrides  # noqa: E402
from gemkernels.compress.gem import GEM  # noqa: E402
from gemkernels.integrations.langchain import GEMMiddleware  # noqa: E402
from gemkernels.testing.histories import synthetic_history  # noqa: E402

RUNS = recorded_runs()
RUN_IDS = [name for name, _ in RUNS]
FINAL = "replay finished"
ROLES = {SystemMessage: "system", HumanMessage: "user", AIMessage: "assistant", ToolMessage: "tool"}


class ReplayModel(BaseChatModel):
    """Answers the n-th call with the n-th of ``replies`` (then a plain text reply, which ends the agent's loop) and
    keeps the messages each call received."""

    replies: list[AIMessage]
    received: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "replay"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.received.append(list(messages))
        n = len(self.received)
        reply = self.replies[n - 1] if n <= len(self.replies) else AIMessage(FINAL)
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def bind_tools(self, tools, **kwargs):
        return self


class ReplayTools(AgentMiddleware):
    """Answers each tool call with its recorded result instead of running the tool."""

    def __init__(self, results: dict[str, str]):
        super().__init__()
        self.results = results

    def wrap_tool_call(self, request, handler):
        call = request.tool_call
        return ToolMessage(self.results[call["id"]], tool_call_id=call["id"], name=call["name"])

    async def awrap_tool_call(self, request, handler):
        return self.wrap_tool_call(request, handler)


def ai_message(recorded: dict) -> AIMessage:
    calls = [{"name": c["function"]["name"], "args": json.loads(c["function"]["arguments"]), "id": c["id"]}
             for c in recorded.get("tool_calls") or ()]
    return AIMessage(recorded.get("content") or "", tool_calls=calls)


def langchain_message(recorded: dict) -> BaseMessage:
    """A recorded OpenAI message as the LangChain message the agent's state holds."""
    kind = {"system": SystemMessage, "user": HumanMessage}.get(recorded["role"])
    if kind is not None:
        return kind(recorded["content"])
    if recorded["role"] == "tool":
        return ToolMessage(recorded["content"], tool_call_id=recorded["tool_call_id"])
    return ai_message(recorded)


def essentials(message) -> dict:
    """What a message says, for a LangChain message and for a recorded OpenAI one alike (arguments as parsed JSON)."""
    if isinstance(message, dict):
        calls = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in message.get("tool_calls") or ()]
        return {"role": message["role"], "content": message.get("content") or "", "tool_calls": calls,
                "tool_call_id": message.get("tool_call_id")}
    calls = [(c["id"], c["name"], c["args"]) for c in getattr(message, "tool_calls", None) or ()]
    return {"role": ROLES[type(message)], "content": message.content, "tool_calls": calls,
            "tool_call_id": getattr(message, "tool_call_id", None)}


def openai_form(message: BaseMessage) -> dict:
    """A received LangChain message in the OpenAI form `assert_tool_pairing` reads."""
    said = essentials(message)
    out = {"role": said["role"], "tool_call_id": said["tool_call_id"]}
    if said["tool_calls"]:
        out["tool_calls"] = [{"id": i} for i, _, _ in said["tool_calls"]]
    return out


def canonical(recorded: list[dict]) -> list[dict]:
    """The recorded history as LangChain sends it on: arguments re-serialised from the parsed JSON, no null content
    (what the agent's state holds is parsed arguments and a string content)."""
    out = []
    for message in recorded:
        message = {**message, "content": message.get("content") or ""}
        if message.get("tool_calls"):
            message["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.dumps(
                json.loads(c["function"]["arguments"]))}} for c in message["tool_calls"]]
        out.append(message)
    return out


def replay_agent(recorded: list[dict], middleware: GEMMiddleware):
    """``create_agent`` over the recorded run with a checkpointer: (agent, its model, its input, its run config)."""
    positions = call_positions(recorded)
    model = ReplayModel(replies=[ai_message(recorded[p]) for p in positions])
    results = {m["tool_call_id"]: m["content"] for m in recorded if m["role"] == "tool"}
    names = sorted({c["function"]["name"] for p in positions for c in recorded[p]["tool_calls"]})
    tools = [StructuredTool.from_function(func=lambda **kwargs: "", name=name, description="replayed",
                                          args_schema={"type": "object", "properties": {}}) for name in names]
    agent = create_agent(model, tools, system_prompt=recorded[0]["content"], checkpointer=InMemorySaver(),
                         middleware=[ReplayTools(results), middleware])
    config = {"configurable": {"thread_id": "thread-1"}, "recursion_limit": 10 * len(positions) + 10}
    return agent, model, {"messages": [HumanMessage(recorded[1]["content"])]}, config


#: (name, GEMMiddleware arguments, async): ``trigger`` in tokens is a fraction of the run's full request;
#: cache-aware with a budget of 16 blocks, so that it rewrites within these short runs.
SETTINGS = [("balanced", {"preset": "balanced"}, False),
            ("cache-aware-async", {"preset": "cache-aware", "overrides": ["rewrite_above_blocks=16"]}, True),
            ("trigger-keep", {"preset": "balanced", "trigger": 0.5, "keep": ("blocks", 8)}, False)]


@pytest.mark.parametrize("setting", SETTINGS, ids=[s[0] for s in SETTINGS])
@pytest.mark.parametrize("name", RUN_IDS)
def test_recorded_run_through_create_agent_sees_what_gem_forwards(name, setting, monkeypatch):
    inputs = GEMInputs(monkeypatch)
    _, arguments, use_async = setting
    recorded = canonical(dict(RUNS)[name])
    positions = call_positions(recorded)
    full = [langchain_message(m) for m in recorded]
    threshold = None
    if "trigger" in arguments:
        threshold = int(arguments["trigger"] * count_tokens_approximately(full))
        arguments = {**arguments, "trigger": ("tokens", threshold)}
    agent, model, state, config = replay_agent(recorded, GEMMiddleware(encoder="hash", **arguments))
    asyncio.run(agent.ainvoke(state, config)) if use_async else agent.invoke(state, config)
    stored = agent.get_state(config).values["messages"]

    assert [essentials(m) for m in stored] == [essentials(m) for m in recorded[1:]] + [essentials(AIMessage(FINAL))]
    assert len(model.received) == len(positions) + 1
    overrides = [*arguments.get("overrides", ()), *([f"evidence.recent={arguments['keep'][1]}"] if "keep" in arguments
                                                   else [])]
    reference = GEM(with_overrides(arguments["preset"], overrides), encoder="hash")
    replies = [m for m in stored if isinstance(m, AIMessage)]
    compressed, gem_inputs = 0, iter(inputs.only())
    for call, position in enumerate(positions + [len(recorded)]):
        received, history = model.received[call], recorded[:position]
        stats = replies[call].response_metadata["gem"]
        if threshold is not None and count_tokens_approximately(full[:1] + stored[:position - 1]) < threshold:
            assert [essentials(m) for m in received] == [essentials(m) for m in history], f"call {call}"
            assert stats["action"] == "unchanged" and stats["reason"].startswith("below the trigger")
            continue
        views = next(gem_inputs)  # the middleware's OpenAI-format views of the history, as GEM was given them
        assert [essentials(m) for m in views] == [essentials(m) for m in history], f"call {call}"
        expected = reference.compress(views, session_id="reference")
        assert [essentials(m) for m in received] == [essentials(m) for m in expected.messages], f"call {call}"
        assert_tool_pairing([openai_form(m) for m in received])
        assert (stats["action"], stats["messages_after"], stats["removed_blocks"]) == (
            expected.stats.action, len(expected.messages), len(expected.stats.removed_blocks))
        compressed += len(received) < position
    assert compressed > 0  # each setting cuts a run of 20 blocks or more


def test_threads_are_kept_apart(monkeypatch):
    """Two agents on the same task sharing one middleware, the second half a run behind, stepped in turn: each
    thread is compressed as if it ran alone."""
    inputs = GEMInputs(monkeypatch)
    recorded = canonical(dict(RUNS)[RUN_IDS[0]])
    middleware = GEMMiddleware(preset="cache-aware", overrides=["rewrite_above_blocks=16"], encoder="hash")
    agents = [replay_agent(recorded, middleware) for _ in range(2)]
    for n, (_, _, _, config) in enumerate(agents):
        config["configurable"]["thread_id"] = f"thread-{n}"
    first, second = (agent.stream(state, config) for agent, _, state, config in agents)
    lag = len(call_positions(recorded))  # steps: a model call and a tool call each
    for _ in range(lag):
        next(first)
    for _ in zip(first, second):
        pass
    for _ in second:
        pass
    positions = call_positions(recorded) + [len(recorded)]
    assert len(inputs.calls) == 2  # one session per thread
    for (_, model, _, _), thread_inputs in zip(agents, inputs.calls.values()):  # the first thread started first
        reference = GEM(with_overrides("cache-aware", ["rewrite_above_blocks=16"]), encoder="hash")
        assert [[essentials(m) for m in views] for views in thread_inputs] == [
            [essentials(m) for m in recorded[:p]] for p in positions]
        expected = [[essentials(m) for m in reference.compress(views, session_id="reference").messages]
                    for views in thread_inputs]
        assert any(len(e) < p for e, p in zip(expected, positions))  # the budget makes it rewrite
        assert [[essentials(m) for m in received] for received in model.received] == expected


def test_the_model_gets_the_agents_own_message_objects():
    recorded = canonical(dict(RUNS)[RUN_IDS[0]])
    messages = [langchain_message(m) for m in recorded[1:]]
    before = [m.model_copy(deep=True) for m in messages]
    system = SystemMessage(recorded[0]["content"])
    model = ReplayModel(replies=[])
    seen = []

    def handler(request):
        seen.append(request)
        return ModelResponse(result=[AIMessage("ok")])

    request = ModelRequest(model=model, messages=messages, system_message=system)
    response = GEMMiddleware(preset="core", encoder="hash").wrap_model_call(request, handler)
    kept = seen[0].messages
    assert len(kept) < len(messages)
    originals = iter(messages)  # each kept message is one of the agent's, in order
    assert all(any(m is k for m in originals) for k in kept)
    assert seen[0].system_message is system
    assert request.messages is messages and messages == before  # the agent's list and messages, unchanged
    assert response.result[0].response_metadata["gem"]["messages_after"] == len(kept) + 1


@settings(max_examples=25, deadline=None)
@given(blocks=st.integers(0, 40), seed=st.integers(0, 10**6), preset=st.sampled_from(["paper", "balanced", "core"]),
       trigger=st.none() | st.integers(1, 90))
def test_the_view_is_gems_choice_of_the_agents_messages(blocks, seed, preset, trigger):
    """Any history, with or without a ``("messages", n)`` trigger: the model gets the agent's message objects at the
    positions an independent GEM keeps (all of them below the trigger), every ToolMessage with its call."""
    history = canonical(synthetic_history(blocks, seed))
    messages = [langchain_message(m) for m in history]
    seen = []
    middleware = GEMMiddleware(preset=preset, encoder="hash",
                               trigger=None if trigger is None else ("messages", trigger))
    request = ModelRequest(model=ReplayModel(replies=[]), messages=messages[1:], system_message=messages[0])
    middleware.wrap_model_call(request, lambda r: seen.append(r) or ModelResponse(result=[AIMessage("ok")]))
    kept = list(range(len(history)))
    if trigger is None or len(history) - 1 >= trigger:
        position = {id(m): p for p, m in enumerate(history)}
        kept = [position[id(m)] for m in GEM(preset, encoder="hash").compress(history, session_id="ref").messages]
    received = [seen[0].system_message, *seen[0].messages]
    assert [id(m) for m in received] == [id(messages[p]) for p in kept]
    assert_tool_pairing([openai_form(m) for m in received])


def test_broken_history_reaches_the_model_unchanged_with_the_reason():
    recorded = canonical(dict(RUNS)[RUN_IDS[0]])
    history = [langchain_message(m) for m in recorded[1:]]
    broken = call_positions(recorded)[1] - 1
    history[broken] = AIMessage(history[broken].content)  # its ToolMessage now answers no call
    model = ReplayModel(replies=[])
    agent = create_agent(model, [], middleware=[GEMMiddleware(preset="core", encoder="hash")],
                         system_prompt=recorded[0]["content"])
    state = agent.invoke({"messages": history})
    assert [essentials(m) for m in model.received[0]] == [essentials(SystemMessage(recorded[0]["content"]))] + [
        essentials(m) for m in history]
    stats = state["messages"][-1].response_metadata["gem"]
    assert stats["action"] == "passthrough" and "invalid structure" in stats["reason"]


@pytest.mark.parametrize("trigger", [("words", 3), ("tokens", 0), ("tokens",), "tokens"])
def test_a_trigger_that_is_not_a_threshold_is_refused(trigger):
    with pytest.raises(ValueError, match="trigger"):
        GEMMiddleware(trigger=trigger, encoder="hash")


@pytest.mark.parametrize("keep", [("messages", 20), ("blocks", -1), ("blocks", 2.5)])
def test_keep_counts_blocks(keep):
    with pytest.raises(ValueError, match="blocks"):
        GEMMiddleware(keep=keep, encoder="hash")
