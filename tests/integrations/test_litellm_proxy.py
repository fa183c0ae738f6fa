"""`GEMCallback` on the LiteLLM proxy, loaded from a ``config.yaml`` that names it under ``litellm_settings:
callbacks:`` (``$GEM_PRESET`` / ``$GEM_ENCODER`` choose its preset and encoder): a recorded run sent call by call
through the proxy's ``/v1/chat/completions`` reaches a fake OpenAI upstream as `GEM.compress` of each history by an
independent GEM, in one session named by ``x-litellm-session-id``, with the stats in the standard logging payload's
``spend_logs_metadata``; a broken history reaches the upstream unchanged with the reason."""

from __future__ import annotations

import json
import os
import time

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of LiteLLM's price list
pytest.importorskip("litellm.proxy.proxy_server", reason="needs pip install 'gemkernels[litellm-proxy]'")
pytest.importorskip("uvicorn")

import litellm  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from litellm.integrations.custom_logger import CustomLogger  # noqa: E402
from litellm.proxy import proxy_server  # noqa: E402
from recorded_runs import assert_tool_pairing, call_positions, recorded_runs  # noqa: E402

import gemkernels.integrations.litellm as gem_litellm  # noqa: E402
from gemkernels.compress.gem import GEM  # noqa: E402
from gemkernels.testing.fake_upstream import FakeUpstream, ServerThread  # noqa: E402

MASTER_KEY = "sk-gem-test-0123456789abcdef0123456789abcdef"
RUNS = recorded_runs()
CALLBACK_LISTS = ("callbacks", "input_callback", "success_callback", "failure_callback", "_async_input_callback",
                  "_async_success_callback", "_async_failure_callback")


class SpendLogsSpy(CustomLogger):
    """GEM's summary as the standard logging payload carries it to every logging integration, per call."""

    def __init__(self):
        super().__init__()
        self.summaries = []

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        metadata = (kwargs.get("standard_logging_object") or {}).get("metadata") or {}
        self.summaries.append((metadata.get("spend_logs_metadata") or {}).get("gem"))

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.summaries) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.summaries) >= count, f"{len(self.summaries)} of {count} success callbacks ran"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    """(a client of the LiteLLM proxy started from config.yaml, the fake upstream, the spy) for this module."""
    upstream = FakeUpstream()
    server = ServerThread(upstream.app())
    config = tmp_path_factory.mktemp("litellm") / "config.yaml"
    config.write_text(f"""\
model_list:
  - model_name: replay
    litellm_params:
      model: openai/replay
      api_base: {server.url}/v1
      api_key: upstream-key
general_settings:
  master_key: {MASTER_KEY}
litellm_settings:
  callbacks: gemkernels.integrations.litellm.gem_callback
""")
    spy = SpendLogsSpy()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"CONFIG_FILE_PATH": str(config), "GEM_PRESET": "balanced", "GEM_ENCODER": "hash"}.items():
            patch.setenv(name, value)
        for name in CALLBACK_LISTS:
            patch.setattr(litellm, name, [])
        patch.delattr(gem_litellm, "gem_callback", raising=False)  # built afresh from the environment above
        with TestClient(proxy_server.app) as client:
            assert any(isinstance(c, gem_litellm.GEMCallback) for c in litellm.callbacks)
            litellm.callbacks.append(spy)
            yield client, upstream, spy
    server.stop()


def chat_bodies(upstream: FakeUpstream) -> list[dict]:
    return [r.body for r in upstream.received if r.path == "/v1/chat/completions"]


def test_recorded_run_through_the_proxy_is_what_gem_forwards(proxy):
    client, upstream, spy = proxy
    name, recorded = RUNS[0]
    positions = call_positions(recorded)
    sent_before, logged_before = len(chat_bodies(upstream)), len(spy.summaries)
    for position in positions:
        response = client.post("/v1/chat/completions", json={"model": "replay", "messages": recorded[:position]},
                               headers={"authorization": f"Bearer {MASTER_KEY}",
                                        "x-litellm-session-id": "gem-proxy-session"})
        assert response.status_code == 200, response.text
    spy.wait_for(logged_before + len(positions))
    reference = GEM("balanced", encoder="hash")
    bodies = chat_bodies(upstream)[sent_before:]
    summaries = spy.summaries[logged_before:]
    assert len(bodies) == len(positions)
    for body, position in zip(bodies, positions):
        expected = reference.compress(recorded[:position], session_id="reference")
        assert body["messages"] == json.loads(json.dumps(expected.messages)), f"{name} at {position}"
        assert_tool_pairing(body["messages"])
        summary = next(s for s in summaries if s["messages_before"] == position)
        assert (summary["action"], summary["messages_after"]) == (expected.stats.action, len(expected.messages))
        assert summary["session_id"].startswith("gem-proxy-session#")
    assert any(len(body["messages"]) < position for body, position in zip(bodies, positions))


def test_broken_history_reaches_the_upstream_unchanged(proxy):
    client, upstream, spy = proxy
    recorded = [dict(m) for m in RUNS[0][1]]
    del recorded[call_positions(recorded)[1]]["tool_calls"]  # its results now answer no call
    sent_before, logged_before = len(chat_bodies(upstream)), len(spy.summaries)
    response = client.post("/v1/chat/completions", json={"model": "replay", "messages": recorded},
                           headers={"authorization": f"Bearer {MASTER_KEY}"})
    assert response.status_code == 200, response.text
    spy.wait_for(logged_before + 1)
    assert chat_bodies(upstream)[sent_before]["messages"] == recorded
    summary = spy.summaries[logged_before]
    assert summary["action"] == "passthrough" and "invalid structure" in summary["reason"]
