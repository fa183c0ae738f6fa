"""The APIs the proxy compresses (DESIGN.md §5): where each keeps its history, which upstream serves it, and when a
request must go out as sent whatever its history."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gemkernels.compress.gem import THINKING_CONTENT, anthropic_thinking
from gemkernels.compress.responses_items import is_responses_input

OPENAI_UPSTREAM, ANTHROPIC_UPSTREAM = "openai", "anthropic"
#: Paths only Anthropic's API has; any other path goes to the OpenAI-format upstream unless the request carries
#: ``anthropic-version`` (Claude Code's ``GET /v1/models``, say).
ANTHROPIC_PATHS = ("/v1/messages", "/v1/complete")


@dataclass(frozen=True)
class ApiFormat:
    """One compressing route: its path, the body field holding the history, and its upstream's format."""

    path: str
    history: str
    upstream: str

    def unchanged_reason(self, body: Mapping[str, Any]) -> str | None:
        """Why this request goes out as sent before its history is read, or None to compress it."""
        history = body.get(self.history)
        if self.history == "input":
            for field in ("previous_response_id", "conversation"):
                if body.get(field) is not None:
                    return "stored_conversation"  # the history is on the provider's side
            if isinstance(history, str):
                return "no_history"
        if not isinstance(history, list):
            return f"no_{self.history}"
        if self.history == "messages" and is_responses_input(history):
            return "responses_items"  # GEM would pair it by Responses call_ids, not by this API's tool-call ids
        return None

    def thinking_mode(self, body: Mapping[str, Any]) -> str:
        """How Anthropic thinking binds this request (`GEM.compress`'s ``thinking``): on Anthropic's Messages API
        as `anthropic_thinking` says (``api``, or ``drop`` for ``drop_block``), elsewhere as the history shows."""
        return anthropic_thinking(body) if self.upstream == ANTHROPIC_UPSTREAM else THINKING_CONTENT

CHAT_COMPLETIONS = ApiFormat("/v1/chat/completions", "messages", OPENAI_UPSTREAM)
MESSAGES = ApiFormat("/v1/messages", "messages", ANTHROPIC_UPSTREAM)
RESPONSES = ApiFormat("/v1/responses", "input", OPENAI_UPSTREAM)
FORMATS = (CHAT_COMPLETIONS, MESSAGES, RESPONSES)


def upstream_for(path: str, headers: Mapping[str, str]) -> str:
    """Which upstream a relayed (not compressed) request goes to."""
    if path.startswith(ANTHROPIC_PATHS) or "anthropic-version" in headers:
        return ANTHROPIC_UPSTREAM
    return OPENAI_UPSTREAM
