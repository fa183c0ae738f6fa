"""The billed usage each log records, as `Usage`: Anthropic's, OpenAI's (and litellm's), Codex's, OpenHands'."""

from __future__ import annotations

from typing import Any

from gemkernels.evaluate.loaders.model import Usage


def tokens(usage: Any, key: str) -> int:
    """``usage[key]`` when it is a whole number, else 0 (logs leave counts out or write null)."""
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def prompt_usage(prompt: int, cached: int, written: int, output: int) -> Usage:
    """`Usage` from a prompt count that includes the tokens read from and written to the cache."""
    return Usage(max(prompt - cached - written, 0), cached, written, output)


def anthropic_usage(usage: dict[str, Any]) -> Usage:
    """Anthropic's usage: ``input_tokens`` (uncached), cache reads, cache creation, output."""
    return Usage(tokens(usage, "input_tokens"), tokens(usage, "cache_read_input_tokens"),
                 tokens(usage, "cache_creation_input_tokens"), tokens(usage, "output_tokens"))


def openai_usage(usage: dict[str, Any]) -> Usage:
    """An OpenAI-style usage object: ``prompt_tokens`` counting the cached ones (``prompt_tokens_details``), and
    litellm's Anthropic cache reads and writes (``cache_read_input_tokens``, ``cache_creation_input_tokens``)."""
    cached = tokens(usage.get("prompt_tokens_details"), "cached_tokens") or tokens(usage, "cache_read_input_tokens")
    return prompt_usage(tokens(usage, "prompt_tokens"), cached, tokens(usage, "cache_creation_input_tokens"),
                        tokens(usage, "completion_tokens"))


def codex_usage(usage: dict[str, Any]) -> Usage:
    """Codex's ``last_token_usage``: ``input_tokens`` including ``cached_input_tokens``."""
    return prompt_usage(tokens(usage, "input_tokens"), tokens(usage, "cached_input_tokens"), 0,
                        tokens(usage, "output_tokens"))


def metrics_usage(now: dict[str, Any], before: dict[str, Any] | None) -> Usage:
    """The usage between two OpenHands ``accumulated_token_usage`` readings (``prompt_tokens`` counting the
    cache's)."""
    def grown(key: str) -> int:
        return tokens(now, key) - tokens(before, key)
    return prompt_usage(grown("prompt_tokens"), grown("cache_read_tokens"), grown("cache_write_tokens"),
                        grown("completion_tokens"))
