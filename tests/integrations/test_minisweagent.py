"""`GEMModel` in mini-swe-agent's own agent loop: recorded runs replayed by its deterministic test models through
`DefaultAgent`, in tool-call and text-action mode.

What the wrapped model receives on each query is compared with `GEM.compress` of the agent's history at that query,
computed by a GEM of its own; the agent's history equals that of the same replay without GEM; tool calls stay paired
with their results and text actions with their observations; each answer carries GEM's record; a history GEM cannot
read reaches the model unchanged with the reason. Runs: the bundled example, the shipped text-action fixtures, and
some development runs where ``../shared`` has them."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
pytest.importorskip("minisweagent")

from helpers import EXAMPLE, FIXTURES, TRAJECTORIES  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.exceptions import FormatError  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, DeterministicToolcallModel  # noqa: E402

from gemkernels.compress.blocks import content_text  # noqa: E402
from gemkernels.compress.config import with_overrides  # noqa: E402
from gemkernels.compress.gem import GEM  # noqa: E402
from gemkernels.compress.text_actions import MINI_SWE_AGENT  # noqa: E402
from gemkernels.integrations.minisweagent import GEMModel  # noqa: E402

RUNS = [EXAMPLE, FIXTURES / "text_actions" / "mini_swe_agent_1.text-actions",
        FIXTURES / "text_actions" / "mini_swe_agent_1_1.text-actions", FIXTURES / "mini_swe_agent_1_1.traj.json",
        *sorted(TRAJECTORIES.glob("mini-swe-agent/*.json"))[::20]]
MODES = {"toolcall": "minisweagent.models.test_models.DeterministicToolcallModel",
         "text": "minisweagent.models.test_models.DeterministicModel"}


class Recording:
    """What a deterministic test model receives: the messages of each query and the agent's history length then. An
    output with ``extra.format_error`` raises the FormatError mini-swe-agent raises for a malformed answer."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.received: list[list[dict]] = []
        self.history_lengths: list[int] = []
        self.agent: DefaultAgent | None = None

    def query(self, messages, **kwargs):
        self.received.append(list(messages))
        self.history_lengths.append(len(self.agent.messages))
        error = self.config.outputs[self.current_index + 1]["extra"].get("format_error")
        if error is not None:
            self.current_index += 1
            raise FormatError({"role": "user", "content": error, "extra": {"interrupt_type": "FormatError"}})
        return super().query(messages, **kwargs)


class RecordingToolcallModel(Recording, DeterministicToolcallModel):
    pass


class RecordingTextModel(Recording, DeterministicModel):
    pass


RECORDING = {"toolcall": f"{__name__}.RecordingToolcallModel", "text": f"{__name__}.RecordingTextModel"}


class ReplayEnvironment:
    """A mini-swe-agent environment that answers each action with the next recorded observation."""

    def __init__(self, observations: list[str]):
        self.config = None
        self.observations = list(observations)

    def execute(self, action: dict, cwd: str = "") -> dict:
        return {"output": self.observations.pop(0), "returncode": 0, "exception_info": ""}

    def get_template_vars(self, **kwargs) -> dict:
        return {}

    def serialize(self) -> dict:
        return {}


def recorded(path) -> tuple[str, str, list[tuple[str, str | None, str]]]:
    """A recorded mini-swe-agent run (1.x text actions or tool calls): its system prompt, its task, and each step as
    (the assistant's text, its one command or None for a turn refused as malformed, the next message's text)."""
    messages = [m for m in json.loads(path.read_text())["messages"] if m["role"] != "exit"]
    steps = []
    for message, answer in zip(messages[2:], messages[3:]):
        if message["role"] != "assistant":
            continue
        text = content_text(message.get("content"))
        calls = message.get("tool_calls") or []
        commands = ([json.loads(call["function"]["arguments"])["command"] for call in calls] if calls
                    else MINI_SWE_AGENT.commands(text))
        steps.append((text, commands[0] if len(commands) == 1 else None, content_text(answer.get("content"))))
    return content_text(messages[0]["content"]), content_text(messages[1]["content"]), steps


def scripted(steps, mode: str) -> list[dict]:
    """The deterministic model's outputs replaying ``steps``: each command as the mode writes actions, each refused
    turn as the FormatError mini-swe-agent raises for it (its recorded answer is the error message)."""
    outputs = []
    for i, (text, command, answer) in enumerate(steps):
        if command is None:
            outputs.append({"role": "assistant", "content": text, "extra": {"actions": [], "format_error": answer}})
        elif mode == "toolcall":
            call = {"id": f"call_{i}", "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
            outputs.append({"role": "assistant", "content": text, "tool_calls": [call],
                            "extra": {"actions": [{"command": command, "tool_call_id": f"call_{i}"}]}})
        else:
            outputs.append({"role": "assistant", "content": text, "extra": {"actions": [{"command": command}]}})
    return outputs


def replay(path, mode: str, gem: dict | None, outputs: list[dict] | None = None):
    """Run ``DefaultAgent`` over the recorded run at ``path`` with the recording test model, wrapped in `GEMModel`
    with the ``gem`` settings (None: not wrapped); the agent and the recording model."""
    system, task, steps = recorded(path)
    outputs = scripted(steps, mode) if outputs is None else outputs
    model_config = {"model_name": "replay", "outputs": outputs, "observation_template": "{{output.output}}"}
    if gem is None:
        model = (RecordingToolcallModel if mode == "toolcall" else RecordingTextModel)(**model_config)
        inner = model
    else:
        model = GEMModel(**model_config, gem_model_class=RECORDING[mode], **gem)
        inner = model.model
    agent = DefaultAgent(model, ReplayEnvironment([answer for _, command, answer in steps if command is not None]),
                         system_template="{{ recorded_system }}", instance_template="{{ task }}",
                         step_limit=len(outputs), cost_limit=0)
    inner.agent = agent
    agent.run(task, recorded_system=system)
    return agent, inner


def model_session(agent: DefaultAgent) -> str:
    """The GEM session of the agent's `GEMModel`."""
    return agent.model.session_id


def api_view(message: dict) -> dict:
    """A message as the API gets it (mini-swe-agent keeps its own record under ``extra``)."""
    return {k: v for k, v in message.items() if k != "extra"}


def reference(agent: DefaultAgent, lengths: list[int], gem: dict) -> list[list[dict]]:
    """What GEM (one of its own, hash encoder, one session) forwards of the agent's history at each query."""
    engine = GEM(with_overrides(gem["gem_preset"], gem.get("gem_overrides", ())), encoder="hash")
    forwarded = []
    for length in lengths:
        out = engine.compress([api_view(m) for m in agent.messages[:length]], session_id="reference")
        forwarded.append(out.messages)
    return forwarded


def paired(received: list[dict], history: list[dict], mode: str) -> bool:
    """Tool calls answered by exactly their results (tool-call mode), or each command turn followed by the
    observation that followed it in the history (text mode)."""
    if mode == "toolcall":
        calls = [call["id"] for m in received for call in m.get("tool_calls") or []]
        results = [m["tool_call_id"] for m in received if m["role"] == "tool"]
        return sorted(calls) == sorted(results) and len(set(calls)) == len(calls)
    position = {id(m): p for p, m in enumerate(history)}
    for i, message in enumerate(received):
        p = position[id(message)]
        if (message["role"] == "assistant" and p + 1 < len(history)
                and MINI_SWE_AGENT.observation.search(content_text(history[p + 1]["content"]))):
            if i + 1 >= len(received) or received[i + 1] is not history[p + 1]:
                return False
    return True


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.name)
@pytest.mark.parametrize("preset", ["core", "cache-aware"])
def test_model_receives_gem_compression_of_agent_history(path, mode, preset):
    gem = {"gem_preset": preset, "gem_encoder": "hash"}
    agent, model = replay(path, mode, gem)
    plain, _ = replay(path, mode, None)

    assert [api_view(m) for m in agent.messages] == [api_view(m) for m in plain.messages]  # history unchanged
    assert len(model.received) == len(recorded(path)[2])
    expected = reference(agent, model.history_lengths, gem)
    for received, length, forwarded in zip(model.received, model.history_lengths, expected):
        history = agent.messages[:length]
        assert [api_view(m) for m in received] == forwarded
        assert all(any(m is h for h in history) for m in received)  # the agent's own objects
        assert paired(received, history, mode)
    for length, received in zip(model.history_lengths, model.received):
        answer = agent.messages[length]  # what the query added: the model's answer, or the format error
        if answer["role"] == "assistant":
            record = answer["extra"]["gem"]
            assert (record["messages_before"], record["messages_after"]) == (length, len(received))
            assert record["session_id"] == model_session(agent)


def test_long_history_is_compressed_and_recorded_in_the_trajectory(tmp_path):
    gem = {"gem_preset": "core", "gem_encoder": "hash"}
    agent, model = replay(EXAMPLE, "toolcall", gem)
    records = [m["extra"]["gem"] for m in agent.messages if m["role"] == "assistant"]
    assert {r["action"] for r in records} >= {"unchanged", "reselected"}
    assert max(r["removed_blocks"] for r in records) > 0
    assert min(len(received) for received in model.received[-5:]) < min(model.history_lengths[-5:])
    saved = agent.save(tmp_path / "run.traj.json")
    on_disk = json.loads((tmp_path / "run.traj.json").read_text())
    assert on_disk["info"]["config"]["gem"]["gem_preset"] == "core"
    assert [m["extra"]["gem"] for m in on_disk["messages"] if m["role"] == "assistant"] == records
    assert saved["info"]["config"]["gem"]["session_id"] == records[0]["session_id"]


def test_broken_history_reaches_the_model_unchanged_with_the_reason():
    gem = {"gem_preset": "core", "gem_encoder": "hash", "gem_overrides": ["min_blocks=3", "k=1", "evidence.recent=1"]}
    _, _, steps = recorded(EXAMPLE)
    outputs = scripted(steps[:9], "toolcall")
    call = outputs[5]["tool_calls"][0]
    outputs[5] = {**outputs[5], "tool_calls": [call, call],  # one call id, answered twice
                  "extra": {"actions": outputs[5]["extra"]["actions"] * 2}}
    agent, model = replay(EXAMPLE, "toolcall", gem, outputs)
    records = [agent.messages[length]["extra"]["gem"] for length in model.history_lengths]
    assert any(r["removed_blocks"] for r in records[:6])  # compressed while the history was sound
    for received, length, record in list(zip(model.received, model.history_lengths, records))[6:]:
        assert received == agent.messages[:length] and all(m is h for m, h in zip(received, agent.messages))
        assert record["action"] == "passthrough" and "used twice" in record["reason"]


def test_settings_are_checked_and_the_wrapped_class_is_named():
    with pytest.raises(ValueError, match="unknown preset"):
        GEMModel(model_name="replay", outputs=[], gem_preset="fastest", gem_model_class=MODES["text"])
    with pytest.raises(ValueError, match="gem_presets"):
        GEMModel(model_name="replay", outputs=[], gem_presets="core", gem_model_class=MODES["text"])
    model = GEMModel(model_name="replay", outputs=[], gem_model_class=MODES["text"], gem_encoder="hash")
    assert isinstance(model.model, DeterministicModel) and model.config.model_name == "replay"
    assert model.serialize()["info"]["config"]["model_type"].endswith("DeterministicModel")
