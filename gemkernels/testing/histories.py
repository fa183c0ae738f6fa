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
