"""Synthetic agent histories for tests and benchmarks."""

from __future__ import annotations

import json

import numpy as np

TOPICS = ["models.py migration", "views.py template render", "urls.py routing", "tests failing assertion",
          "settings database config", "forms.py validation", "admin.py registration", "docs build sphinx"]


def synthetic_history(num_blocks: int, seed: int = 0) -> list[dict]:
    """An OpenAI chat history: a system prompt, a task, then ``num_blocks`` bash calls with their results, each on
    one of `TOPICS` with a random body (deterministic in ``seed``)."""
    rng = np.random.default_rng(seed)
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix the failing migration test in models.py"}]
    for b in range(num_blocks):
        topic = TOPICS[int(rng.integers(len(TOPICS)))]
        words = " ".join(f"w{int(v)}" for v in rng.integers(0, 400, size=int(rng.integers(5, 300))))
        call_id = f"call_{b}"
        messages.append({"role": "assistant", "content": f"Inspect {topic} step {b}",
                         "tool_calls": [{"id": call_id, "type": "function",
                                         "function": {"name": "bash",
                                                      "arguments": json.dumps({"command": f"grep -n {topic}"})}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": f"{topic}\n{words}"})
    return messages


def synthetic_responses_input(num_blocks: int, seed: int = 0) -> list[dict]:
    """`synthetic_history` as a Responses API ``input`` (Codex's shape): developer and user messages, then per step
    a reasoning item, a ``shell`` function call and its output, and now and then an assistant message."""
    items: list[dict] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Fix the failing migration test in models.py"}]}]
    for message in synthetic_history(num_blocks, seed)[2:]:
        if message["role"] == "assistant":
            call = message["tool_calls"][0]
            items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": message["content"]}],
                          "encrypted_content": f"gAAAA{call['id']}"})
            items.append({"type": "function_call", "name": "shell", "arguments": call["function"]["arguments"],
                          "call_id": call["id"]})
        else:
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"],
                          "output": json.dumps({"output": message["content"], "metadata": {"exit_code": 0}})})
            if len(items) % 7 == 0:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": "Progress so far."}]})
    return items


def synthetic_anthropic_history(num_blocks: int, seed: int = 0) -> list[dict]:
    """`synthetic_history` in Anthropic Messages form: the task, then per step an assistant ``text`` +
    ``tool_use`` turn and the user turn holding its ``tool_result`` (the system prompt goes in the body)."""
    out: list[dict] = [{"role": "user", "content": "Fix the failing migration test in models.py"}]
    for message in synthetic_history(num_blocks, seed)[2:]:
        if message["role"] == "assistant":
            call = message["tool_calls"][0]
            out.append({"role": "assistant", "content": [
                {"type": "text", "text": message["content"]},
                {"type": "tool_use", "id": call["id"], "name": "bash",
                 "input": json.loads(call["function"]["arguments"])}]})
        else:
            out.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": message["tool_call_id"],
                                                     "content": message["content"]}]})
    return out
