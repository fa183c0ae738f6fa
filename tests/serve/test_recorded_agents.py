"""Real agents' requests through the proxy, call by call, in their own API (Claude Code: Messages, Codex:
Responses, OpenHands, mini-swe-agent and SWE-agent: chat completions), rebuilt from the recorded sessions in
../shared (skipped where absent): every forwarded body is the client's bytes minus whole history elements, valid
for its API, compressed where the history is long, and its prefix breaks only where the proxy rewrote."""

from __future__ import annotations

import json

import pytest
from helpers import LOGS, TRAJECTORIES

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from starlette.testclient import TestClient  # noqa: E402

from gemkernels.compress.blocks import parse_history  # noqa: E402
from gemkernels.compress.config import with_overrides  # noqa: E402
from gemkernels.evaluate.loaders import load_runs  # noqa: E402
from gemkernels.serve.app import create_app  # noqa: E402
from gemkernels.serve.config import ServerConfig  # noqa: E402

#: family -> (recorded sessions, route, history field, the session header the agent sends)
AGENTS = {
    "claude-code": (LOGS / "claude-code", "/v1/messages", "messages", "x-claude-code-session-id"),
    "codex": (LOGS / "codex", "/v1/responses", "input", "session_id"),
    "openhands": (LOGS / "openhands", "/v1/chat/completions", "messages", None),
    "mini-swe-agent": (TRAJECTORIES / "mini-swe-agent", "/v1/chat/completions", "messages", None),
    "swe-agent": (TRAJECTORIES / "swe-agent", "/v1/chat/completions", "messages", None),
}
RUNS_PER_AGENT = 3
#: cache-aware's budget: it rewrites only once appending would forward more blocks than this.
REWRITE_ABOVE_BLOCKS = with_overrides("cache-aware", ()).rewrite_above_blocks


def elements_of(body: bytes, field: str) -> list[bytes]:
    return [json.dumps(item, ensure_ascii=False).encode() for item in json.loads(body)[field]]


def is_cut_of(forwarded: list[bytes], sent: list[bytes]) -> bool:
    """Whether ``forwarded`` is ``sent`` with some elements left out (order kept, each byte for byte)."""
    at = 0
    for element in forwarded:
        while at < len(sent) and sent[at] != element:
            at += 1
        if at == len(sent):
            return False
        at += 1
    return True


@pytest.mark.parametrize("agent, bound", [(agent, True) for agent in sorted(AGENTS)] + [("claude-code", False)])
def test_recorded_sessions_through_the_proxy(agent, bound):
    """``bound`` (the default ``thinking_bound``): an Anthropic Messages history goes out whole (a model with
    preserved thinking binds its thinking to everything before it); unbound, Claude Code's sessions compress."""
    folder, route, field, header = AGENTS[agent]
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    runs, _ = load_runs(folder)
    runs = sorted((r for r in runs if r.parent is None), key=lambda r: -len(r.calls))[:RUNS_PER_AGENT]
    forwarded_bodies: list[bytes] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        forwarded_bodies.append(request.content)
        return httpx.Response(200, json={"ok": True})

    app = create_app(ServerConfig(upstream="http://upstream/v1", encoder="hash", preset="cache-aware",
                                  overrides=() if bound else ("thinking_bound=False",), encode_budget=30.0),
                     transport=httpx.MockTransport(upstream))
    compressed = breaks = 0
    with TestClient(app) as client:
        for n, run in enumerate(runs):
            previous: list[bytes] | None = None
            rewrites_before, breaks_before = rewrites(client), breaks
            for call in run.calls:
                history = (run.messages + list(run.final))[:call.position]
                if not history:
                    continue
                raw = json.dumps({"model": "m", field: history}, ensure_ascii=False).encode()
                headers = {"authorization": f"Bearer {agent}-{n}"}
                if header is not None:
                    headers[header] = f"{run.name}"
                assert client.post(route, content=raw, headers=headers).status_code == 200
                sent, forwarded = elements_of(raw, field), elements_of(forwarded_bodies[-1], field)
                assert is_cut_of(forwarded, sent), f"{run.name} call at {call.position}: not a cut of the request"
                parse_history(json.loads(forwarded_bodies[-1])[field])  # pairing and order still valid
                compressed += len(forwarded) < len(sent)
                if bound and route == "/v1/messages":
                    assert forwarded == sent, f"{run.name}: an Anthropic history was cut under thinking_bound"
                if previous is not None and forwarded[:len(previous)] != previous:
                    breaks += 1
                previous = forwarded
            assert breaks - breaks_before <= rewrites(client) - rewrites_before, f"{run.name}: a prefix broke " \
                "without a rewrite"
    longest = max(len(parse_history(run.messages).spans) for run in runs)
    if longest > REWRITE_ABOVE_BLOCKS and not (bound and route == "/v1/messages"):  # cache-aware: longer ones
        assert compressed > 0, f"nothing of {agent}'s {len(runs)} longest sessions was compressed"


def rewrites(client: TestClient) -> int:
    """The proxy's rewrites so far (``gem_requests_total`` with action ``reselected``, all routes)."""
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("gem_requests_total{") and 'action="reselected"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def test_sub_agents_and_side_requests_leave_the_main_session_as_it_was():
    """A recorded Claude Code session and its sub-agent, the sub-agent's calls sent between the main session's from
    its middle on (as a sub-agent started mid-session is; one session header, each agent its own system prompt),
    plus a title request after every main call: the main session's forwarded bodies are byte for byte those of
    the main session sent alone (cache-aware appends to its saved state, so another agent's request taken for
    the main session would show)."""
    folder = LOGS / "claude-code"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    runs, _ = load_runs(folder)
    pairs = [(parent, child) for child in runs if child.parent is not None
             for parent in runs if parent.id == child.parent]
    if not pairs:
        pytest.skip("no recorded Claude Code session with a sub-agent")

    def requests(run, system: str) -> list[bytes]:
        histories = [(run.messages + list(run.final))[:call.position] for call in run.calls]
        return [json.dumps({"model": "m", "system": system, "messages": history}, ensure_ascii=False).encode()
                for history in histories if history]

    def main_bodies(schedule: list[bytes], main_system: str) -> list[bytes]:
        forwarded: list[bytes] = []

        def upstream(request: httpx.Request) -> httpx.Response:
            if json.loads(request.content)["system"] == main_system:
                forwarded.append(request.content)
            return httpx.Response(200, json={"ok": True})

        app = create_app(ServerConfig(upstream="http://upstream/v1", encoder="hash", preset="cache-aware",
                                      overrides=("rewrite_above_blocks=24", "min_blocks=4", "thinking_bound=False"),
                                      encode_budget=30.0),
                         transport=httpx.MockTransport(upstream))
        with TestClient(app) as client:
            for body in schedule:
                headers = {"authorization": "Bearer sk-cc", "x-claude-code-session-id": "one-session"}
                assert client.post("/v1/messages", content=body, headers=headers).status_code == 200
        return forwarded

    title = json.dumps({"model": "m", "system": "Write a 5-10 word title for the conversation.",
                        "messages": [{"role": "user", "content": "Please write a title."}]}).encode()
    for parent, child in pairs:
        main_system = "You are Claude Code, Anthropic's official CLI for Claude."
        main = requests(parent, main_system)
        sub = requests(child, f"You are a sub-agent for Claude Code ({child.name}).")
        middle = len(main) // 2
        schedule = []
        for i, body in enumerate(main):
            schedule += [body, title]
            if middle <= i < middle + len(sub):
                schedule.append(sub[i - middle])
        alone = main_bodies(main, main_system)
        assert any(len(a) < len(m) for a, m in zip(alone, main)), "the main session was never compressed"
        assert main_bodies(schedule, main_system) == alone
