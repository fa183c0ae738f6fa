"""`GEMCallback` in LiteLLM's SDK: recorded runs replayed call by call through ``litellm.acompletion`` against a fake
OpenAI-compatible upstream (an httpx transport) that answers with the recorded assistant turns; what the upstream
receives is `GEM.compress` of the same history by an independent GEM, tool pairing holds, the agent's history and
metadata are never changed, and the stats reach LiteLLM's logging callbacks. Histories GEM cannot handle, and calls
LiteLLM runs no hook for, go out unchanged with the reason in the stats."""

from __future__ import annotations

import asyncio
import copy
import json
import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of LiteLLM's price list
litellm = pytest.importorskip("litellm")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from litellm.integrations.custom_logger import CustomLogger  # noqa: E402
from litellm.types.utils import CallTypes, Message  # noqa: E402
from recorded_runs import GEMInputs, assert_tool_pairing, call_positions, recorded_runs  # noqa: E402

from gemkernels.compress.config import with_overrides  # noqa: E402
from gemkernels.compress.gem import GEM  # noqa: E402
from gemkernels.integrations.litellm import NO_MESSAGES_REASON, SYNC_REASON, GEMCallback, session_of  # noqa: E402
from gemkernels.testing.histories import synthetic_history  # noqa: E402

RUNS = recorded_runs()
RUN_IDS = [name for name, _ in RUNS]


class ReplayUpstream:
    """An OpenAI chat-completions endpoint answering the n-th request with the n-th of ``replies``; keeps each body."""

    def __init__(self, replies: list[dict]):
        self.replies, self.bodies = replies, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        reply = self.replies[min(len(self.bodies), len(self.replies)) - 1]
        message = {"role": "assistant", "content": reply.get("content")}
        if reply.get("tool_calls"):
            message["tool_calls"] = reply["tool_calls"]
        return httpx.Response(200, json={
            "id": f"chatcmpl-{len(self.bodies)}", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if "tool_calls" in message
                         else "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


class StatsSpy(CustomLogger):
    """Keeps, per successful call, GEM's stats as a logging callback sees them: the call's metadata and the
    standard logging payload's ``spend_logs_metadata``."""

    def __init__(self):
        super().__init__()
        self.stats, self.summaries = [], []

    def record(self, kwargs):
        self.stats.append((kwargs["litellm_params"].get("metadata") or {}).get("gem"))
        payload = kwargs.get("standard_logging_object") or {}
        self.summaries.append(((payload.get("metadata") or {}).get("spend_logs_metadata") or {}).get("gem"))

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self.record(kwargs)

    def log_success_event(self, kwargs, response_obj, start_time, end_time):
        self.record(kwargs)


@pytest.fixture(scope="module")
def run():
    """Runs a coroutine to its end on one event loop for the whole module (LiteLLM's background logging worker
    stays on the loop it first ran on)."""
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete
    loop.close()


#: LiteLLM's callback lists; it adds each of ``litellm.callbacks`` to the others on a call, and never a second
#: logger of a class and settings it holds already.
CALLBACK_LISTS = ("callbacks", "input_callback", "success_callback", "failure_callback", "_async_input_callback",
                  "_async_success_callback", "_async_failure_callback")


@pytest.fixture
def callbacks(monkeypatch):
    """Sets ``litellm.callbacks`` for one test, every callback list starting empty (all restored after)."""
    def install(*handlers):
        for name in CALLBACK_LISTS:
            monkeypatch.setattr(litellm, name, [])
        litellm.callbacks.extend(handlers)
    return install


def essentials(message) -> dict:
    """What a message says, the same whether LiteLLM serialised it from a dict or from its own ``Message``."""
    if not isinstance(message, dict):
        message = message.model_dump(exclude_none=True)
    calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()]
    return {"role": message["role"], "content": message.get("content") or "", "tool_calls": calls,
            "tool_call_id": message.get("tool_call_id")}


def async_client(upstream: ReplayUpstream) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="test", base_url="http://upstream.test/v1",
                              http_client=httpx.AsyncClient(transport=httpx.MockTransport(upstream)))


async def wait_for(spy: StatsSpy, count: int) -> None:
    """LiteLLM runs success callbacks in the background: wait until ``count`` have run."""
    for _ in range(500):
        if len(spy.stats) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(spy.stats)} of {count} success callbacks ran")


async def replay(recorded: list[dict], session: str, upstream: ReplayUpstream, **request) -> list:
    """The agent: from the system prompt and the task, one ``acompletion`` per recorded assistant turn, appending
    the model's reply (LiteLLM's ``Message``) and the recorded results of its calls; returns its history."""
    client = async_client(upstream)
    history = copy.deepcopy(recorded[:2])
    metadata = {"session_id": session}
    for position in call_positions(recorded):
        before = [json.dumps(essentials(m)) for m in history]
        response = await litellm.acompletion(model="openai/replay", messages=history, client=client,
                                             metadata=metadata, **request)
        assert [json.dumps(essentials(m)) for m in history] == before  # the agent's messages were left as they were
        history.append(response.choices[0].message)
        end = next((q for q in range(position + 1, len(recorded)) if recorded[q]["role"] != "tool"), len(recorded))
        history.extend(copy.deepcopy(recorded[position + 1:end]))
    assert metadata == {"session_id": session}  # and so was the metadata it passes
    return history


#: (preset, overrides): cache-aware with a budget of 16 blocks, so that it rewrites within these short runs.
SETTINGS = {"balanced": ("balanced", []), "cache-aware": ("cache-aware", ["rewrite_above_blocks=16"])}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("name", RUN_IDS)
def test_recorded_run_through_acompletion_is_what_gem_forwards(name, setting, callbacks, run, monkeypatch):
    inputs = GEMInputs(monkeypatch)
    recorded = dict(RUNS)[name]
    positions = call_positions(recorded)
    upstream, spy = ReplayUpstream([recorded[p] for p in positions]), StatsSpy()
    preset, overrides = SETTINGS[setting]
    callbacks(GEMCallback(preset, encoder="hash", overrides=overrides), spy)

    async def agent():
        history = await replay(recorded, "agent-1", upstream)
        await wait_for(spy, len(positions))
        return history

    history = run(agent())
    assert [essentials(m) for m in history] == [essentials(m) for m in recorded]  # the agent's own history, whole

    reference = GEM(with_overrides(preset, overrides), encoder="hash")
    compressed = 0
    given = inputs.only()
    for call, position in enumerate(positions):
        assert [essentials(m) for m in given[call]] == [essentials(m) for m in recorded[:position]], f"call {call}"
        expected = reference.compress(given[call], session_id="reference")  # what litellm handed GEM, as it was
        sent = upstream.bodies[call]["messages"]
        assert [essentials(m) for m in sent] == [essentials(m) for m in expected.messages], f"call {call}"
        assert_tool_pairing(sent)
        stats = next(s for s in spy.stats if s["messages_before"] == position)
        assert (stats["action"], stats["messages_after"], stats["removed_blocks"]) == (
            expected.stats.action, len(expected.messages), expected.stats.removed_blocks)
        summary = next(s for s in spy.summaries if s["messages_before"] == position)
        assert (summary["action"], summary["messages_after"]) == (expected.stats.action, len(expected.messages))
        compressed += len(sent) < position
    assert compressed > 0  # each setting cuts a run of 20 blocks or more


def test_sessions_are_kept_apart(callbacks, run):
    """Two agents on the same task, the second half a run behind, interleaved call by call, one naming its session by
    ``litellm_session_id``, one by ``metadata.session_id``: each is compressed as if it ran alone."""
    recorded = dict(RUNS)[RUN_IDS[0]]
    positions = call_positions(recorded)
    lag = len(positions) // 2
    spy = StatsSpy()
    callbacks(GEMCallback("cache-aware", encoder="hash", overrides=["rewrite_above_blocks=16"]), spy)
    upstreams = [ReplayUpstream([recorded[p] for p in positions]) for _ in range(2)]

    async def agents():
        clients = [async_client(upstream) for upstream in upstreams]
        for step in range(len(positions) + lag):
            if step < len(positions):
                await litellm.acompletion(model="openai/replay", messages=copy.deepcopy(recorded[:positions[step]]),
                                          client=clients[0], litellm_session_id="first")
            if step >= lag:
                await litellm.acompletion(model="openai/replay", client=clients[1], metadata={"session_id": "second"},
                                          messages=copy.deepcopy(recorded[:positions[step - lag]]))
        await wait_for(spy, 2 * len(positions))  # before the next test's calls

    run(agents())
    reference = GEM(with_overrides("cache-aware", ["rewrite_above_blocks=16"]), encoder="hash")
    expected = [[essentials(m) for m in reference.compress(recorded[:p], session_id="alone").messages]
                for p in positions]
    assert any(len(e) < p for e, p in zip(expected, positions))  # the budget makes it rewrite
    for upstream in upstreams:
        assert [[essentials(m) for m in body["messages"]] for body in upstream.bodies] == expected


@settings(max_examples=25, deadline=None)
@given(blocks=st.integers(0, 40), seed=st.integers(0, 10**6), preset=st.sampled_from(["paper", "balanced", "core"]),
       replies=st.lists(st.booleans(), min_size=40, max_size=40))
def test_the_hook_forwards_gems_choice_of_the_callers_own_objects(blocks, seed, preset, replies):
    """Any history, its assistant turns dicts or LiteLLM ``Message`` objects (an agent's appended replies): the hook
    forwards the caller's objects at the positions an independent GEM keeps, in a new list, the request untouched."""
    history = synthetic_history(blocks, seed)
    turns = iter(replies)
    sent = [Message(**m) if m["role"] == "assistant" and next(turns) else m for m in history]
    metadata = {"session_id": "caller"}
    request = {"model": "openai/m", "messages": sent, "metadata": metadata}
    out = asyncio.run(GEMCallback(preset, encoder="hash").async_pre_call_deployment_hook(dict(request),
                                                                                         CallTypes.acompletion))
    position = {id(m): p for p, m in enumerate(history)}
    kept = [position[id(m)] for m in GEM(preset, encoder="hash").compress(history, session_id="reference").messages]
    assert [id(m) for m in out.get("messages", sent)] == [id(sent[p]) for p in kept]
    assert request == {"model": "openai/m", "messages": sent, "metadata": {"session_id": "caller"}}
    assert metadata == {"session_id": "caller"} and out["metadata"]["gem"]["messages_after"] == len(kept)


def test_session_names():
    system = {"role": "system", "content": "you are an agent"}
    other = {"role": "system", "content": "you write titles"}
    assert session_of({"messages": [system], "litellm_session_id": "s"}) == session_of(
        {"messages": [system], "metadata": {"session_id": "s"}})
    assert session_of({"messages": [system], "litellm_session_id": "s"}) != session_of(
        {"messages": [other], "litellm_session_id": "s"})  # a side request under the same name: a session of its own
    assert session_of({"messages": [system], "user": "u"}) != session_of({"messages": [system], "user": "v"})
    assert session_of({"messages": [system]}) is None


def test_broken_history_goes_out_unchanged_with_the_reason(callbacks, run):
    recorded = dict(RUNS)[RUN_IDS[0]]
    broken = copy.deepcopy(recorded)
    orphaned = call_positions(broken)[1]
    del broken[orphaned]["tool_calls"]  # its results now answer no call
    upstream, spy = ReplayUpstream([{"content": "ok"}]), StatsSpy()
    callbacks(GEMCallback("balanced", encoder="hash"), spy)

    async def agent():
        await litellm.acompletion(model="openai/replay", messages=broken, client=async_client(upstream))
        await wait_for(spy, 1)

    run(agent())
    assert [essentials(m) for m in upstream.bodies[0]["messages"]] == [essentials(m) for m in broken]
    assert spy.stats[0]["action"] == "passthrough" and "invalid structure" in spy.stats[0]["reason"]
    assert spy.summaries[0]["reason"] == spy.stats[0]["reason"]


def test_messages_passed_positionally_go_out_unchanged_with_the_reason(callbacks, run):
    recorded = dict(RUNS)[RUN_IDS[0]]
    upstream, spy = ReplayUpstream([{"content": "ok"}]), StatsSpy()
    callbacks(GEMCallback("core", encoder="hash"), spy)

    async def agent():
        await litellm.acompletion("openai/replay", recorded, client=async_client(upstream))
        await wait_for(spy, 1)

    run(agent())
    assert len(upstream.bodies[0]["messages"]) == len(recorded)
    assert (spy.stats[0]["action"], spy.stats[0]["reason"]) == ("passthrough", NO_MESSAGES_REASON)


def test_sync_completion_goes_out_unchanged_with_the_reason(callbacks, run):
    """LiteLLM runs no request-changing hook for the sync ``completion``: the callback says so in the stats. If a
    LiteLLM release adds one, this test fails and the callback should use it."""
    recorded = dict(RUNS)[RUN_IDS[0]]
    upstream, spy = ReplayUpstream([{"content": "ok"}]), StatsSpy()
    callbacks(GEMCallback("core", encoder="hash"), spy)
    client = openai.OpenAI(api_key="test", base_url="http://upstream.test/v1",
                           http_client=httpx.Client(transport=httpx.MockTransport(upstream)))
    litellm.completion(model="openai/replay", messages=recorded, client=client)
    run(wait_for(spy, 1))
    assert len(upstream.bodies[0]["messages"]) == len(recorded)
    assert (spy.stats[0]["action"], spy.stats[0]["reason"]) == ("passthrough", SYNC_REASON)
