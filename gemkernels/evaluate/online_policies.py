"""Forwarding policies for the online replay: what an agent would send at each model call.

A policy is one object per run, called once per model call, in order, with the history
before that call (``run.messages[:pos]``); it may keep state between calls. It returns the
messages to forward and the texts it sent to an embedding model for this call. Policies
never mutate the messages they are given; a changed message is a new dict.

Built-ins: ``full`` (the history as recorded), ``window`` (Window(K): every message that
is not part of a removable block, plus the last K blocks), ``masking`` (tool outputs of all
but the last M blocks replaced by a placeholder, as SWE-agent's ``LastNObservations`` and
OpenHands' observation masking do) and ``gem-<preset>`` (one `GEM` per run with a fixed
session id, so its reselect/append policy runs). ``gem-<preset>:field=value:...`` is that
preset with `GEMConfig` fields overridden (``evidence.<field>`` for the evidence limits),
e.g. ``gem-cache-aware:k=20:evidence.recent=4``. Add a policy by registering a builder in
`POLICIES`; `policy_builder` resolves a name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, Protocol

import numpy as np

from gemkernels.compress.blocks import ANTHROPIC, OPENAI, RESPONSES, History, parse_history, reconstruct
from gemkernels.compress.config import PRESETS, GEMConfig, resolve_config, with_overrides
from gemkernels.compress.encoders import Encoder, WrappedEncoder
from gemkernels.compress.gem import GEM
from gemkernels.compress.responses_items import OUTPUT_TYPES
from gemkernels.compress.tokens import Prices
from gemkernels.evaluate.loaders import Run

Messages = list[dict[str, Any]]
PLACEHOLDER = "[output omitted]"


class Forwarded(NamedTuple):
    """What one call forwards, and the texts it newly sent to an embedding model (each text once per run)."""

    messages: Sequence[dict[str, Any]]
    embedded: tuple[str, ...] = ()


class Policy(Protocol):
    """Maps the history before one model call to the request forwarded; called once per call, in order."""

    def __call__(self, messages: Messages) -> Forwarded: ...


@dataclass(frozen=True)
class PolicyOptions:
    """Parameters of the built-in policies: window size K, masking horizon M, GEM's encoder (by name), amortized
    forgetting's budget and keep, and the provider's prices (the replay bills with them; GEM plans with them)."""

    window: int = 10
    mask_after: int = 5
    encoder: str = "minilm"
    amortized_budget: int = 40
    amortized_keep: int = 20
    prices: Prices = Prices()

    def __post_init__(self) -> None:
        if self.window < 0 or self.mask_after < 0:
            raise ValueError(f"window and mask_after must be >= 0, got {self.window}, {self.mask_after}")
        if not 0 <= self.amortized_keep < self.amortized_budget:
            raise ValueError("amortized_keep must lie in [0, amortized_budget)")


class FullHistory:
    """The history as recorded."""

    def __call__(self, messages: Messages) -> Forwarded:
        return Forwarded(messages)


class Window:
    """Window(K): the last ``k`` removable blocks and every message outside blocks (prefix, plain turns)."""

    def __init__(self, k: int):
        self.k = k

    def __call__(self, messages: Messages) -> Forwarded:
        history = parse_history(messages)
        n = len(history.spans)
        return Forwarded(reconstruct(history, set(range(max(0, n - self.k), n))))


class AmortizedForgetting:
    """Recency with a budget: all blocks until more than ``budget`` are forwarded, then only the newest
    ``keep``; append until the budget is passed again (one rewrite per ``budget - keep`` new blocks)."""

    def __init__(self, budget: int, keep: int):
        if not 0 <= keep < budget:
            raise ValueError(f"need 0 <= keep < budget, got keep={keep}, budget={budget}")
        self.budget, self.keep, self.first = budget, keep, 0

    def __call__(self, messages: Messages) -> Forwarded:
        history = parse_history(messages)
        n = len(history.spans)
        if n - self.first > self.budget:
            self.first = n - self.keep
        return Forwarded(reconstruct(history, set(range(self.first, n))))


class Masking:
    """Tool outputs of all but the last ``keep`` blocks replaced by ``placeholder`` (new dicts; inputs untouched)."""

    def __init__(self, keep: int, placeholder: str = PLACEHOLDER):
        self.keep, self.placeholder = keep, placeholder

    def __call__(self, messages: Messages) -> Forwarded:
        history = parse_history(messages)
        old = history.spans[:max(0, len(history.spans) - self.keep)]
        out = list(messages)
        for span in old:
            for p in span.positions:
                if is_result(history.format, out[p]):
                    out[p] = self.masked(history, out[p])
        return Forwarded(out)

    def masked(self, history: History, message: dict[str, Any]) -> dict[str, Any]:
        """A copy of a tool-result message (or Responses output item) with its output(s) replaced by the
        placeholder."""
        if history.format == RESPONSES:
            return {**message, "output": self.placeholder}
        if history.format != ANTHROPIC:
            return {**message, "content": self.placeholder}
        return {**message, "content": [{**part, "content": self.placeholder}
                                       if isinstance(part, dict) and part.get("type") == "tool_result" else part
                                       for part in message["content"]]}


def is_result(fmt: str, message: dict[str, Any]) -> bool:
    """Whether a message of a block holds its tool output: a ``tool`` message, an Anthropic ``tool_result`` user
    message, a Responses output item, or a text-action block's user turn."""
    if fmt == RESPONSES:
        return message.get("type") in OUTPUT_TYPES
    if fmt == OPENAI:
        return message.get("role") == "tool"
    return message.get("role") == "user"


class RecordingEncoder(WrappedEncoder):
    """Delegates to ``encoder`` and records each distinct text it is asked to embed, in first-seen order."""

    def __init__(self, encoder: Encoder):
        super().__init__(encoder)
        self.texts: list[str] = []
        self._seen: set[str] = set()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        for text in texts:
            if text not in self._seen:
                self._seen.add(text)
                self.texts.append(text)
        return self.encoder.encode(texts)


class GEMPolicy:
    """One `GEM` for one run: a fixed session id and goal, so the online policy reselects or appends.

    ``embedded`` lists the texts GEM sent to its encoder for the first time in this run (block
    representation texts and the goal): with GEM's per-session block cache each block is embedded once.
    """

    def __init__(self, config: GEMConfig | str, encoder: Encoder, session_id: str, goal: str | None):
        self.recorder = RecordingEncoder(encoder)
        self.gem = GEM(config, encoder=self.recorder, token_counter=None)
        self.session_id, self.goal = session_id, goal

    def __call__(self, messages: Messages) -> Forwarded:
        seen = len(self.recorder.texts)
        out = self.gem.compress(messages, session_id=self.session_id, goal=self.goal).messages
        return Forwarded(out, tuple(self.recorder.texts[seen:]))


PolicyBuilder = Callable[[Run, PolicyOptions, Callable[[str], Encoder]], Policy]


def gem_policy(config: GEMConfig | str, run: Run, options: PolicyOptions,
               encoder: Callable[[str], Encoder]) -> GEMPolicy:
    """GEM with ``config`` (or a preset name) planning with ``options.prices``, for ``run``: session id
    ``online:<run name>``, and no goal: GEM reads the task from each request, as ``gem serve`` and the framework
    hooks do (they never see a run's recorded task), so the replay shows what they would forward."""
    config = resolve_config(config, cached_price=options.prices.cached, uncached_price=options.prices.uncached)
    return GEMPolicy(config, encoder(options.encoder), f"online:{run.name}", None)


# name -> builder(run, options, encoder_by_name); one policy object per run.
POLICIES: dict[str, PolicyBuilder] = {
    "full": lambda run, options, encoder: FullHistory(),
    "masking": lambda run, options, encoder: Masking(options.mask_after),
    "window": lambda run, options, encoder: Window(options.window),
    "amortized": lambda run, options, encoder: AmortizedForgetting(options.amortized_budget, options.amortized_keep),
    **{f"gem-{preset}": partial(gem_policy, preset) for preset in PRESETS},
}


def policy_builder(name: str) -> PolicyBuilder:
    """The builder of a registered policy, or of ``gem-<preset>:field=value:...`` (a preset with `GEMConfig`
    overrides; ``evidence.<field>`` sets an `EvidenceConfig` limit); ``ValueError`` naming what is wrong."""
    if name in POLICIES:
        return POLICIES[name]
    base, *overrides = name.split(":")
    if not base.startswith("gem-") or base[4:] not in PRESETS or not overrides:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}, or gem-<preset>:field=value:...")
    priced = [item for item in overrides if item.partition("=")[0] in ("cached_price", "uncached_price")]
    if priced:
        raise ValueError(f"policy {name!r}: {', '.join(priced)}: GEM policies plan with the replay's prices "
                         "(--price-cached, --price-uncached)")
    return partial(gem_policy, with_overrides(base[4:], overrides))


def policy_label(name: str, options: PolicyOptions) -> str:
    """A policy's name with its parameter: ``window(10)``, ``masking(5)``; others as named."""
    if name == "window":
        return f"window({options.window})"
    if name == "masking":
        return f"masking({options.mask_after})"
    if name == "amortized":
        return f"amortized({options.amortized_budget}->{options.amortized_keep})"
    return name
