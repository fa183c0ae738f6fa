"""OpenHands (software-agent-sdk): `GEMCondenser`, a condenser whose `Condensation` forgets the action and
observation events of the blocks GEM drops, with no summary.

The events of the view become the OpenAI messages the agent's LLM would get (the SDK's own ``events_to_messages``);
GEM compresses them in the conversation's session, as a proxy would see the agent's requests, and the events behind
the dropped blocks are forgotten, each action with its observations. A condensation is for good, so the condenser
remembers what it forgot and gives GEM the whole history on the next call (GEM's online policy, cache-aware, sees each
request extend the last one); a history that does not extend what it remembers (another condenser rewrote it) starts
afresh. It forgets only whole spans between the view's manipulation indices (the SDK's tool-call, batch and tool-loop
atomicity); what GEM drops inside a span it must keep stays. Each call is one INFO line on the
``gemkernels.integrations`` logger; a history GEM cannot read reaches the model unchanged, and the ``gemkernels``
logger says why.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

try:
    from openhands.sdk.context.condenser import CondenserBase
    from openhands.sdk.context.view import View
    from openhands.sdk.event import ActionEvent, Condensation, LLMConvertibleEvent
    from openhands.sdk.llm import LLM, Message
    from pydantic import Field, PrivateAttr, model_validator
except ImportError as err:  # pragma: no cover - exercised in a venv without the SDK
    raise ImportError("gemkernels.integrations.openhands needs the OpenHands software-agent-sdk: "
                      "pip install 'gemkernels[openhands]'") from err

from gemkernels.compress.config import with_overrides
from gemkernels.compress.gem import CompressionStats
from gemkernels.integrations.session_compressor import SessionCompressor, log_call

logger = logging.getLogger("gemkernels.integrations")

#: Conversations whose forgotten events one condenser remembers (least recently condensed dropped first).
MAX_CONVERSATIONS = 64

#: One compressor per settings in the process: the encoder loads once, the sessions of all conversations share it.
shared_compressor = functools.lru_cache(maxsize=8)(SessionCompressor)


@dataclass
class Remembered:
    """One conversation's history as GEM saw it: every event so far, and the ids this condenser forgot."""

    events: list[LLMConvertibleEvent] = field(default_factory=list)
    forgotten: set[str] = field(default_factory=set)

    def extended_by(self, view_events: Sequence[LLMConvertibleEvent]) -> bool:
        """Whether the view is what remains of these events (minus the forgotten ones), then new events."""
        remaining = [event.id for event in self.events if event.id not in self.forgotten]
        return [event.id for event in view_events[:len(remaining)]] == remaining


class GEMCondenser(CondenserBase):
    """Forgets the events of the blocks GEM drops (`Condensation` without summary), else returns the view as it is.

    ``preset``: a GEM preset (``paper``, ``balanced``, ``core``, ``cache-aware``); ``overrides``: ``field=value``
    items of its `GEMConfig` (``gem serve --set``); ``encoder``: ``minilm``, ``hash`` or ``openai:<model>``. Put it
    first in a `PipelineCondenser`, before a summarizing condenser that handles context-window requests."""

    preset: str = Field(default="cache-aware", description="GEM preset: paper, balanced, core or cache-aware")
    overrides: list[str] = Field(default_factory=list,
                                 description="GEMConfig field=value items applied to the preset, e.g. k=24")
    encoder: str = Field(default="minilm", description="block encoder: minilm, hash or openai:<model>[:<dims>]")

    _conversations: OrderedDict[str, Remembered] = PrivateAttr(default_factory=OrderedDict)

    @model_validator(mode="after")
    def _check_settings(self) -> GEMCondenser:
        with_overrides(self.preset, self.overrides)  # a ValueError names the bad preset or item
        return self

    def condense(self, view: View, agent_llm: LLM | None = None) -> View | Condensation:  # noqa: ARG002
        """A `Condensation` forgetting the events of the blocks GEM drops that the view still shows, or the view
        itself when there are none (fewer than GEM's ``min_blocks``, an append, a history GEM cannot read)."""
        events = list(view.events)
        if not events:
            return view
        remembered = self._remembered(events)
        history = remembered.events
        compressor = shared_compressor(self.preset, self.encoder, tuple(self.overrides))
        try:
            groups, views = event_messages(history)
        except Exception as err:  # an event the SDK cannot turn into a message: the view goes out as it is
            compressor.passthrough(history, f"events not convertible: {type(err).__name__}: {err}", events[0].id)
            return view
        kept_groups, stats = compressor.compress_views(groups, views, session_id=events[0].id)
        log_call(stats)
        kept = {event.id for group in kept_groups for event in group}
        dropped = {event.id for event in history} - kept
        forget = forgettable(view, dropped)
        if not forget:
            return view
        remembered.forgotten |= forget
        log_condensation(stats, forget, kept & remembered.forgotten)
        return Condensation(forgotten_event_ids=forget, summary=None, llm_response_id=f"gemkernels-{uuid.uuid4()}")

    def _remembered(self, view_events: list[LLMConvertibleEvent]) -> Remembered:
        """The conversation's history with the events of the view appended; a new one for a conversation not seen
        or whose view does not extend what was remembered."""
        key = view_events[0].id
        remembered = self._conversations.pop(key, None)
        if remembered is None or not remembered.extended_by(view_events):
            remembered = Remembered()
        shown = len(remembered.events) - len(remembered.forgotten)
        remembered.events = remembered.events + view_events[shown:]
        self._conversations[key] = remembered
        while len(self._conversations) > MAX_CONVERSATIONS:
            self._conversations.popitem(last=False)
        return remembered


def event_messages(events: Sequence[LLMConvertibleEvent]) -> tuple[list[list[LLMConvertibleEvent]], list[dict]]:
    """The SDK's messages of ``events`` as OpenAI chat dicts, and the events behind each: the action events of one
    LLM response make one assistant message, consecutive plain user messages one message (``events_to_messages``);
    ``ValueError`` when the SDK's grouping differs from that."""
    messages = LLMConvertibleEvent.events_to_messages(list(events))
    groups: list[list[LLMConvertibleEvent]] = []
    plain: list[bool] = []  # whether each group's message is a plain user turn (the SDK merges those)
    for event in events:
        single = LLMConvertibleEvent.events_to_messages([event])[0] if not isinstance(event, ActionEvent) else None
        is_plain = single is not None and is_plain_user(single)
        previous = groups[-1][-1] if groups else None
        if (isinstance(event, ActionEvent) and isinstance(previous, ActionEvent)
                and previous.llm_response_id == event.llm_response_id) or (is_plain and plain and plain[-1]):
            groups[-1].append(event)
            continue
        groups.append([event])
        plain.append(is_plain)
    if len(groups) != len(messages):
        raise ValueError(f"{len(events)} events make {len(messages)} messages, not the {len(groups)} expected")
    return groups, [chat_dict(message) for message in messages]


def is_plain_user(message: Message) -> bool:
    """A user turn without tool-call fields (the SDK joins consecutive ones into one message)."""
    return message.role == "user" and not message.tool_calls and message.tool_call_id is None and message.name is None


def chat_dict(message: Message) -> dict[str, Any]:
    """``message`` as an OpenAI chat message with native tool calls, reasoning content included, no cache marks."""
    return message.to_chat_dict(cache_enabled=False, vision_enabled=False, function_calling_enabled=True,
                                force_string_serializer=False, send_reasoning_content=True)


def forgettable(view: View, dropped: set[str]) -> set[str]:
    """The ids in ``dropped`` that the view shows and may forget: the events of each span between consecutive
    manipulation indices of the view whose events are all dropped."""
    bounds = sorted(view.manipulation_indices)
    events = view.events
    forget: set[str] = set()
    for start, end in zip(bounds, bounds[1:]):
        span = {event.id for event in events[start:end]}
        if span and span <= dropped:
            forget |= span
    return forget


def log_condensation(stats: CompressionStats, forget: set[str], wanted_back: set[str]) -> None:
    """One INFO line for a condensation: the events forgotten, and those GEM keeps that were forgotten before."""
    logger.info("gemkernels: session %s: forgetting %d events (%d of %d blocks dropped)%s", stats.session_id,
                len(forget), len(stats.removed_blocks), stats.blocks,
                f"; {len(wanted_back)} events GEM keeps were forgotten earlier" if wanted_back else "")
