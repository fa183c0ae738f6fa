"""LiteLLM: `GEMCallback`, a ``CustomLogger`` whose ``async_pre_call_deployment_hook`` hands LiteLLM each chat request
with its history compressed by GEM just before LiteLLM sends it, in the SDK (``litellm.acompletion``, a Router's
``acompletion``) and on the LiteLLM proxy (``callbacks: gemkernels.integrations.litellm.gem_callback`` under
``litellm_settings`` in its ``config.yaml``): both run that hook on every chat call.

The session is LiteLLM's ``litellm_session_id``, else ``metadata.session_id``, else the request's
``prompt_cache_key``, ``user`` or ``metadata.user_id``, each with a hash of the system prompt
(`gemkernels.compress.sessions.request_session`); none: GEM's hash of the history's prefix. On the proxy the
sessions of different API keys never meet. What GEM did goes into the call's ``metadata["gem"]`` (every
`CompressionStats` field) and ``metadata["spend_logs_metadata"]["gem"]`` (its `summary`, which LiteLLM carries into
the standard logging payload and the proxy's spend logs). The caller's messages and metadata are never changed; a
history GEM cannot handle goes out unchanged with the reason there. The sync ``litellm.completion`` runs no hook
that can change a request: its calls go out unchanged, with that reason recorded.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from litellm.integrations.custom_logger import CustomLogger
    from litellm.types.utils import CallTypes
except ImportError as err:
    raise ImportError(f"gemkernels.integrations.litellm needs pip install 'gemkernels[litellm]' ({err})") from err

from gemkernels.compress.config import GEMConfig
from gemkernels.compress.encoders import Encoder
from gemkernels.compress.gem import PASSTHROUGH, CompressionStats
from gemkernels.compress.sessions import GEM_SESSION_HEADER, request_session
from gemkernels.integrations.session_compressor import (
    DEFAULT_SESSION_BYTES,
    SessionCompressor,
    log_call,
    model_thinking,
    summary,
)

logger = logging.getLogger("gemkernels.integrations")

#: The call types whose ``messages`` are compressed: chat completions.
CHAT_CALLS = (CallTypes.acompletion, CallTypes.completion)
SYNC_REASON = ("litellm.completion (sync) runs no callback hook that can change a request; call litellm.acompletion "
               "(or a Router's acompletion, or the proxy) to have it compressed")
NO_MESSAGES_REASON = ("LiteLLM passed this hook no messages list (litellm.acompletion(model, messages) with messages "
                      "positional?); pass messages=...")


class GEMCallback(CustomLogger):
    """Compresses the ``messages`` of every chat call LiteLLM makes through ``acompletion`` (SDK, Router, proxy) with
    one `SessionCompressor` (``preset``, ``encoder``, ``overrides`` and the session bounds are its arguments); use
    as ``litellm.callbacks = [GEMCallback()]``."""

    def __init__(self, preset: GEMConfig | str = "cache-aware", encoder: Encoder | str = "minilm",
                 overrides: Sequence[str] = (), max_sessions: int = 10_000,
                 max_session_bytes: int | None = DEFAULT_SESSION_BYTES, **kwargs: Any):
        super().__init__(**kwargs)
        self.compressor = SessionCompressor(preset, encoder, overrides, max_sessions, max_session_bytes)
        self.warned_sync = False

    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any],
                                             call_type: CallTypes | None) -> dict[str, Any] | None:
        """The request with its ``messages`` compressed and GEM's stats in its metadata; None (as it is) for a call
        that is not a chat completion."""
        if call_type not in CHAT_CALLS:
            return None
        messages, session = kwargs.get("messages"), session_of(kwargs)
        if not isinstance(messages, list):
            return with_stats(kwargs, self.compressor.passthrough([], NO_MESSAGES_REASON, session))
        views = [message_view(message) for message in messages]
        kept, stats = await asyncio.to_thread(self.compressor.compress_views, messages, views, session, None,
                                              tenant_of(kwargs), model_thinking(kwargs.get("model"), kwargs))
        log_call(stats)
        out = with_stats(kwargs, stats)
        if len(kept) != len(messages):
            out["messages"] = kept
        return out

    def log_pre_api_call(self, model: str, messages: Any, kwargs: dict[str, Any]) -> None:
        """A sync ``litellm.completion`` about to go out uncompressed: its stats say why (the first one warns)."""
        litellm_params = kwargs.get("litellm_params")
        if kwargs.get("call_type") != CallTypes.completion.value or not isinstance(litellm_params, dict):
            return
        metadata = litellm_params.get("metadata")
        if isinstance(metadata, dict) and "gem" in metadata:
            return
        if not self.warned_sync:
            logger.warning("gemkernels: %s", SYNC_REASON)
            self.warned_sync = True
        count = len(messages) if isinstance(messages, list) else 0
        stats = CompressionStats(PASSTHROUGH, SYNC_REASON, messages_before=count, messages_after=count)
        litellm_params["metadata"] = stats_metadata(metadata, stats)


def message_view(message: Any) -> Any:
    """A message as the OpenAI-format dict GEM reads: a dict as it is, a pydantic message (LiteLLM's ``Message``, the
    OpenAI SDK's ``ChatCompletionMessage`` an agent appended from a response) as its ``model_dump``."""
    if isinstance(message, dict) or not hasattr(message, "model_dump"):
        return message
    return message.model_dump(exclude_none=True)


def session_of(kwargs: Mapping[str, Any]) -> str | None:
    """The session a LiteLLM request belongs to (module doc), or None."""
    metadata = kwargs.get("metadata")
    names = (kwargs.get("litellm_session_id"), metadata.get("session_id") if isinstance(metadata, dict) else None)
    name = next((value for value in names if isinstance(value, str) and value), None)
    return request_session(kwargs, {GEM_SESSION_HEADER: name} if name is not None else None)


def tenant_of(kwargs: Mapping[str, Any]) -> str | None:
    """Whose sessions these are: the hashed API key the LiteLLM proxy puts in the metadata (None in the SDK)."""
    metadata = kwargs.get("metadata")
    if not isinstance(metadata, dict):
        return None
    key = metadata.get("user_api_key_hash") or metadata.get("user_api_key")
    return key if isinstance(key, str) and key else None


def stats_metadata(metadata: Any, stats: CompressionStats) -> dict[str, Any]:
    """A copy of ``metadata`` with GEM's stats under ``gem`` and their summary under ``spend_logs_metadata.gem``."""
    metadata = dict(metadata) if isinstance(metadata, dict) else {}
    spend = metadata.get("spend_logs_metadata")
    metadata["spend_logs_metadata"] = {**(spend if isinstance(spend, dict) else {}), "gem": summary(stats)}
    metadata["gem"] = stats.to_dict()
    return metadata


def with_stats(kwargs: dict[str, Any], stats: CompressionStats) -> dict[str, Any]:
    """A copy of the request ``kwargs`` whose metadata carries ``stats``."""
    return {**kwargs, "metadata": stats_metadata(kwargs.get("metadata"), stats)}


def __getattr__(name: str) -> Any:
    """``gem_callback``: the instance a proxy ``config.yaml`` names, built on first use with the preset and encoder of
    ``$GEM_PRESET`` (default cache-aware) and ``$GEM_ENCODER`` (default minilm), as ``gem serve`` reads them."""
    if name != "gem_callback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    callback = GEMCallback(os.environ.get("GEM_PRESET", "cache-aware"), os.environ.get("GEM_ENCODER", "minilm"))
    globals()["gem_callback"] = callback
    return callback
