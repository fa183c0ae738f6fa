"""LangChain v1 agents: `GEMMiddleware`, an ``AgentMiddleware`` whose ``wrap_model_call`` hands the model a
GEM-compressed view of the agent's messages (``request.override(messages=...)``) and leaves the agent's state, its
stored history, as it is: ``create_agent(model, tools, middleware=[GEMMiddleware(trigger=("tokens", 20000))])``.

The view is the agent's own message objects minus whole tool-call blocks (an ``AIMessage`` with ``tool_calls`` and
the ``ToolMessage`` of each call), found by GEM on each message's OpenAI form (``convert_to_openai_messages``), so no
``ToolMessage`` is ever sent without its call. Configured as ``SummarizationMiddleware`` is: ``trigger`` (a
``("tokens" | "messages" | "fraction", value)`` threshold or a list of them, any one of which triggers; None: every
call goes to GEM, which leaves histories of under 16 blocks as they are), ``keep=("blocks", n)`` (the newest ``n``
blocks are always kept), ``token_counter``; and as GEM is: ``preset``, ``encoder``, ``overrides``. The session is the
run's ``thread_id`` with a hash of the system prompt (none: GEM's hash of the history's prefix). What GEM did goes into
the model's reply, ``response_metadata["gem"]`` (`summary`), and one INFO line on the ``gemkernels.integrations``
logger; a history GEM cannot handle goes to the model unchanged with the reason there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
    from langchain_core.messages import AIMessage, BaseMessage, convert_to_openai_messages
    from langchain_core.messages.utils import count_tokens_approximately
    from langgraph.config import get_config
except ImportError as err:
    raise ImportError(f"gemkernels.integrations.langchain needs pip install 'gemkernels[langchain]' ({err})") from err

from gemkernels.compress.config import GEMConfig
from gemkernels.compress.encoders import Encoder
from gemkernels.compress.gem import UNCHANGED, CompressionStats
from gemkernels.compress.sessions import GEM_SESSION_HEADER, request_session
from gemkernels.integrations.session_compressor import (
    DEFAULT_SESSION_BYTES,
    SessionCompressor,
    log_call,
    model_thinking,
    summary,
)

#: One threshold, as ``SummarizationMiddleware`` writes it: ``("tokens", 20000)``, ``("messages", 60)``,
#: ``("fraction", 0.5)`` of the model profile's ``max_input_tokens``.
ContextSize = tuple[str, float]
TRIGGER_KINDS = ("tokens", "messages", "fraction")


class GEMMiddleware(AgentMiddleware):
    """Hands the model GEM's compressed view of the agent's messages once ``trigger`` is reached (module doc)."""

    def __init__(self, *, trigger: ContextSize | Sequence[ContextSize] | None = None,
                 keep: tuple[str, int] | None = None, preset: GEMConfig | str = "cache-aware",
                 encoder: Encoder | str = "minilm", overrides: Sequence[str] = (),
                 token_counter: Callable[[Sequence[BaseMessage]], int] = count_tokens_approximately,
                 max_sessions: int = 10_000, max_session_bytes: int | None = DEFAULT_SESSION_BYTES):
        super().__init__()
        self.trigger = trigger_thresholds(trigger)
        self.token_counter = token_counter
        overrides = [*overrides, *keep_overrides(keep)]
        self.compressor = SessionCompressor(preset, encoder, overrides, max_sessions, max_session_bytes)

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> Any:
        """The model called with the compressed view; its reply carries GEM's stats."""
        view, stats = self.compressed(request)
        return with_stats(handler(view), stats)

    async def awrap_model_call(self, request: ModelRequest,
                               handler: Callable[[ModelRequest], Awaitable[ModelResponse]]) -> Any:
        """`wrap_model_call` for async agents (the compression runs in a worker thread)."""
        view, stats = await asyncio.to_thread(self.compressed, request)
        return with_stats(await handler(view), stats)

    def compressed(self, request: ModelRequest) -> tuple[ModelRequest, CompressionStats]:
        """The request with GEM's kept messages (the same objects, in order) and the stats; the system message
        counts as the history's first message."""
        system = [request.system_message] if request.system_message is not None else []
        messages = [*system, *request.messages]
        session = session_of([convert_to_openai_messages(message) for message in system])
        below = self.below_trigger(request, messages)
        if below is not None:
            stats = CompressionStats(UNCHANGED, below, session, messages_before=len(messages),
                                     messages_after=len(messages))
            log_call(stats)
            return request, stats
        views = [convert_to_openai_messages(message) for message in messages]
        for position, view in enumerate(views):
            if not isinstance(view, dict):
                reason = f"message {position} ({type(messages[position]).__name__}) is {len(view)} OpenAI messages"
                return request, self.compressor.passthrough(messages, reason, session)
        model = getattr(request.model, "model", None) or getattr(request.model, "model_name", None)
        kept, stats = self.compressor.compress_views(messages, views, session, thinking=model_thinking(model))
        log_call(stats)
        if len(kept) == len(messages):
            return request, stats
        return request.override(messages=[m for m in kept if m is not request.system_message]), stats

    def below_trigger(self, request: ModelRequest, messages: list[BaseMessage]) -> str | None:
        """Why ``messages`` stay as they are (no threshold of ``trigger`` reached), or None."""
        if not self.trigger:
            return None
        tokens = None
        for kind, value in self.trigger:
            if kind == "messages":
                if len(request.messages) >= value:
                    return None
                continue
            tokens = self.token_counter(messages) if tokens is None else tokens
            limit = value if kind == "tokens" else value * max_input_tokens(request.model)
            if tokens >= limit:
                return None
        return f"below the trigger {self.trigger} ({len(request.messages)} messages, {tokens} tokens)"


def trigger_thresholds(trigger: ContextSize | Sequence[ContextSize] | None) -> list[ContextSize]:
    """``trigger`` as a list of checked ``(kind, value)`` thresholds ([]: always)."""
    if trigger is None:
        return []
    thresholds = [trigger] if isinstance(trigger, tuple) and trigger and isinstance(trigger[0], str) else trigger
    checked = []
    for threshold in thresholds:
        if (not isinstance(threshold, tuple) or len(threshold) != 2 or threshold[0] not in TRIGGER_KINDS
                or not isinstance(threshold[1], (int, float)) or isinstance(threshold[1], bool) or threshold[1] <= 0):
            raise ValueError(f"trigger {threshold!r} is not (kind, positive number) with kind one of "
                             f"{', '.join(TRIGGER_KINDS)}, e.g. ('tokens', 20000)")
        checked.append((threshold[0], threshold[1]))
    return checked


def keep_overrides(keep: tuple[str, int] | None) -> list[str]:
    """The GEM setting that ``keep=("blocks", n)`` stands for: the newest n blocks protected as recent evidence."""
    if keep is None:
        return []
    if (not isinstance(keep, tuple) or len(keep) != 2 or keep[0] != "blocks" or not isinstance(keep[1], int)
            or isinstance(keep[1], bool) or keep[1] < 0):
        raise ValueError(f"keep {keep!r} is not ('blocks', n): GEM keeps whole tool-call blocks, the newest n of them "
                         "always")
    return [f"evidence.recent={keep[1]}"]


def max_input_tokens(model: Any) -> float:
    """The model profile's ``max_input_tokens`` (a ``fraction`` trigger's whole); infinite when it has none."""
    profile = getattr(model, "profile", None)
    limit = profile.get("max_input_tokens") if isinstance(profile, dict) else None
    return limit if isinstance(limit, int) and limit > 0 else float("inf")


def session_of(system: Sequence[dict[str, Any]]) -> str | None:
    """The run's ``thread_id`` with a hash of the system prompt (``system``: its OpenAI form, if any;
    `request_session`), or None outside a thread."""
    try:
        thread = get_config().get("configurable", {}).get("thread_id")
    except RuntimeError:  # called outside a runnable context
        thread = None
    if thread is None:
        return None
    return request_session({"messages": list(system)}, {GEM_SESSION_HEADER: str(thread)})


def with_stats(response: Any, stats: CompressionStats) -> Any:
    """``response`` with `summary` of ``stats`` under ``response_metadata["gem"]`` of its AI messages (copies)."""
    if not isinstance(response, ModelResponse):
        return response
    record = summary(stats)
    result = [message.model_copy(update={"response_metadata": {**message.response_metadata, "gem": record}})
              if isinstance(message, AIMessage) else message for message in response.result]
    return replace(response, result=result)
