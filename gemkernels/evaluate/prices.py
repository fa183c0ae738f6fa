"""The providers' list prices per model, in USD per million tokens, for pricing the usage an agent log records.

`PRICES` is a small dated table (below: the date and the pages the figures come from); `load_prices` reads a JSON or
TOML file of the same shape that adds models or replaces them (``gem online --prices FILE``). A model named in a log
is matched to the longest table key its name starts with, after any provider prefix (``anthropic/``,
``openrouter/openai/``, Bedrock's ``us.anthropic.``, ``models/``) and the version suffixes after ``@`` or ``:``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens: uncached input, input read from the prompt cache, input written to it (None: the
    provider does not bill cache writes apart, it caches on its own), output (reasoning included)."""

    input: float
    cache_read: float
    cache_write: float | None
    output: float

    def __post_init__(self) -> None:
        values = [v for v in (self.input, self.cache_read, self.cache_write, self.output) if v is not None]
        if any(not isinstance(v, (int, float)) or v < 0 for v in values):
            raise ValueError(f"prices must be non-negative numbers, got {self}")


# as of 2025-11-20, list prices of the standard (not batch, not priority) tier, prompts up to 200k tokens:
#   https://docs.anthropic.com/en/docs/about-claude/pricing (cache writes: the 5-minute cache)
#   https://platform.openai.com/docs/pricing
#   https://ai.google.dev/gemini-api/docs/pricing (cache reads: implicit caching, storage not counted)
PRICES_AS_OF = "2025-11-20"
PRICES: dict[str, ModelPrice] = {
    # Anthropic, later models: from https://platform.claude.com/docs/en/about-claude/pricing as read 2026-12-01;
    # Sonnet 5 / 5.5 and Opus 5.5 from the same page's model overviews (Sonnet 5.5 cache reads after 2026-10-07)
    "claude-fable-5-1": ModelPrice(10.0, 0.25, 12.50, 50.0),
    "claude-mythos-5-1": ModelPrice(10.0, 0.25, 12.50, 50.0),
    "claude-fable-5": ModelPrice(10.0, 1.0, 12.50, 50.0),
    "claude-mythos-5": ModelPrice(10.0, 1.0, 12.50, 50.0),
    "claude-opus-5-5": ModelPrice(4.0, 0.20, 5.0, 20.0),
    "claude-opus-5": ModelPrice(5.0, 0.50, 6.25, 25.0),
    "claude-opus-4-8": ModelPrice(5.0, 0.50, 6.25, 25.0),
    "claude-opus-4-7": ModelPrice(5.0, 0.50, 6.25, 25.0),
    "claude-opus-4-6": ModelPrice(5.0, 0.50, 6.25, 25.0),
    "claude-sonnet-5-5": ModelPrice(2.0, 0.10, 2.50, 10.0),
    "claude-sonnet-5": ModelPrice(2.0, 0.20, 2.50, 10.0),
    # Anthropic
    "claude-opus-4-5": ModelPrice(5.0, 0.50, 6.25, 25.0),
    "claude-opus-4-1": ModelPrice(15.0, 1.50, 18.75, 75.0),
    "claude-opus-4": ModelPrice(15.0, 1.50, 18.75, 75.0),
    "claude-sonnet-4-5": ModelPrice(3.0, 0.30, 3.75, 15.0),
    "claude-sonnet-4": ModelPrice(3.0, 0.30, 3.75, 15.0),
    "claude-3-7-sonnet": ModelPrice(3.0, 0.30, 3.75, 15.0),
    "claude-3-5-sonnet": ModelPrice(3.0, 0.30, 3.75, 15.0),
    "claude-haiku-4-5": ModelPrice(1.0, 0.10, 1.25, 5.0),
    "claude-3-5-haiku": ModelPrice(0.80, 0.08, 1.0, 4.0),
    "claude-3-haiku": ModelPrice(0.25, 0.03, 0.30, 1.25),
    "claude-3-opus": ModelPrice(15.0, 1.50, 18.75, 75.0),
    # OpenAI
    "gpt-5.1-codex-mini": ModelPrice(0.25, 0.025, None, 2.0),
    "gpt-5.1": ModelPrice(1.25, 0.125, None, 10.0),
    "gpt-5-codex": ModelPrice(1.25, 0.125, None, 10.0),
    "gpt-5-mini": ModelPrice(0.25, 0.025, None, 2.0),
    "gpt-5-nano": ModelPrice(0.05, 0.005, None, 0.40),
    "gpt-5": ModelPrice(1.25, 0.125, None, 10.0),
    "gpt-4.1-mini": ModelPrice(0.40, 0.10, None, 1.60),
    "gpt-4.1-nano": ModelPrice(0.10, 0.025, None, 0.40),
    "gpt-4.1": ModelPrice(2.0, 0.50, None, 8.0),
    "gpt-4o-mini": ModelPrice(0.15, 0.075, None, 0.60),
    "gpt-4o": ModelPrice(2.50, 1.25, None, 10.0),
    "o4-mini": ModelPrice(1.10, 0.275, None, 4.40),
    "o3-mini": ModelPrice(1.10, 0.55, None, 4.40),
    "o3": ModelPrice(2.0, 0.50, None, 8.0),
    "codex-mini-latest": ModelPrice(1.50, 0.375, None, 6.0),
    # Google
    "gemini-3-pro": ModelPrice(2.0, 0.20, None, 12.0),
    "gemini-2.5-pro": ModelPrice(1.25, 0.125, None, 10.0),
    "gemini-2.5-flash-lite": ModelPrice(0.10, 0.01, None, 0.40),
    "gemini-2.5-flash": ModelPrice(0.30, 0.03, None, 2.50),
    "gemini-2.0-flash": ModelPrice(0.10, 0.025, None, 0.40),
}
#: Cloud and router prefixes a log may put before a provider's own model name.
PREFIX = re.compile(r"^(?:.*/)?(?:(?:us|eu|apac|global)\.)?(?:anthropic\.|google\.|openai\.)?")


def model_key(model: str, table: dict[str, ModelPrice]) -> str | None:
    """The table key for a model the log names: the longest key its bare name (no provider prefix, no ``@`` or
    ``:`` suffix, lower case) starts with; None when there is none."""
    bare = PREFIX.sub("", model.strip().lower()).split("@")[0].split(":")[0]
    matches = [key for key in table if bare.startswith(key.lower())]
    return max(matches, key=len) if matches else None


def price_for(model: str | None, table: dict[str, ModelPrice] = PRICES) -> ModelPrice | None:
    """The price of a logged model (None: no model named, or none in the table)."""
    key = model_key(model, table) if model else None
    return table[key] if key else None


def load_prices(path: str | os.PathLike[str]) -> dict[str, ModelPrice]:
    """`PRICES` updated from a JSON or TOML file: ``{model: {input, cache_read, cache_write, output}}`` in USD per
    million tokens (``cache_write`` may be left out: no separate write price); ``ValueError`` naming what is
    wrong."""
    path = Path(path)
    text = path.read_text()
    if path.suffix == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib
            except ImportError as err:
                raise ValueError("reading a TOML price file on Python 3.10 needs pip install tomli; or write JSON"
                                 ) from err
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path}: {err}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not JSON ({err}); a .toml file is read as TOML") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a table of models")
    names = {f.name for f in fields(ModelPrice)}
    table = dict(PRICES)
    for model, entry in data.items():
        if not isinstance(entry, dict) or not {"input", "cache_read", "output"} <= set(entry) or set(entry) - names:
            raise ValueError(f"{path}: model {model!r} needs input, cache_read, output (and optionally cache_write) "
                             f"in USD per million tokens, got {entry!r}")
        table[str(model)] = ModelPrice(entry["input"], entry["cache_read"], entry.get("cache_write"), entry["output"])
    return table
