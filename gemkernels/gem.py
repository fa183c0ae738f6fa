"""`GEM`: a chat request in, an evidence-preserving forwarded request out (DESIGN.md §2).

``GEM(config, encoder).compress(messages, session_id, goal)`` returns the caller's own
message objects minus the blocks it drops, in order, plus stats. Per-block work (size,
tokens, text, rule features, embedding) is done once per block and kept with the session.
Whatever goes wrong, the original request goes out unchanged and the stats say why.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .api import select
from .arrays import to_numpy
from .blocks import BlockStructureError, History, Span, parse_history, reconstruct
from .config import GEMConfig, resolve_config
from .encoders import Encoder, make_encoder
from .evidence import BlockFeatures, block_features, evidence_picks
from .guard import guarded_removals
from .representation import block_text
from .sessions import SessionState, SessionStore

logger = logging.getLogger("gemkernels")

PASSTHROUGH, UNCHANGED, RESELECTED, APPENDED = "passthrough", "unchanged", "reselected", "appended"


@dataclass(frozen=True)
class BlockInfo:
    """Everything GEM needs from one block, computed once."""

    chars: int
    tokens: int | None
    features: BlockFeatures
    embedding: np.ndarray


@dataclass
class CompressionStats:
    """What one `GEM.compress` call did; ``action`` is passthrough, unchanged, reselected or appended."""

    action: str
    reason: str
    session_id: str | None = None
    blocks: int = 0
    protected: dict[str, list[int]] = field(default_factory=dict)
    core: list[int] = field(default_factory=list)
    coverage: float | None = None
    forwarded_blocks: int = 0
    removed_blocks: list[int] = field(default_factory=list)
    messages_before: int = 0
    messages_after: int = 0
    chars_before: int = 0
    chars_after: int = 0
    tokens_before: int | None = None
    tokens_after: int | None = None
    encoded_blocks: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Compressed:
    """The messages to forward (the caller's objects) and the stats of the call."""

    messages: Any
    stats: CompressionStats


def default_token_counter() -> Callable[[str], int] | None:
    """o200k token counts through ``bpe-openai`` (offline) when installed, else None."""
    try:
        import bpe_openai
    except ImportError:
        return None
    encoding = bpe_openai.get_encoding("o200k_base")
    return lambda text: len(encoding.encode_ordinary(text))


class GEM:
    """The compressor: evidence protection, residual completion, forwarding guard, online sessions."""

    def __init__(self, config: GEMConfig | str = "paper", encoder: Encoder | str = "minilm",
                 store: SessionStore | None = None, token_counter: Callable[[str], int] | None | str = "auto"):
        self.config = resolve_config(config)
        self.encoder = make_encoder(encoder) if isinstance(encoder, str) else encoder
        self.store = store or SessionStore()
        self.count_tokens = default_token_counter() if token_counter == "auto" else token_counter

    def compress(self, messages: Any, session_id: str | None = None, goal: str | None = None) -> Compressed:
        """Compress one request; never raises for bad input, never mutates ``messages``."""
        started = time.perf_counter()
        try:
            history = parse_history(messages)
        except BlockStructureError as err:
            return self._passthrough(messages, f"invalid structure: {err}", session_id, started)
        try:
            return self._compress(history, session_id, goal, started)
        except Exception as err:  # the request must go out whatever happened here
            logger.exception("gemkernels: compression failed; forwarding the original request")
            return self._passthrough(messages, f"{type(err).__name__}: {err}", session_id, started)

    def _passthrough(self, messages: Any, reason: str, session_id: str | None, started: float) -> Compressed:
        logger.warning("gemkernels: forwarding unchanged: %s", reason)
        count = len(messages) if isinstance(messages, (list, tuple)) else 0
        stats = CompressionStats(PASSTHROUGH, reason, session_id, messages_before=count, messages_after=count,
                                 seconds={"total": time.perf_counter() - started})
        return Compressed(messages, stats)

    def _compress(self, history: History, session_id: str | None, goal: str | None,
                  started: float) -> Compressed:
        cfg = self.config
        messages, spans = history.messages, history.spans
        n = len(spans)
        session_id = session_id or prefix_session_id(history)
        if n < cfg.min_blocks:
            stats = CompressionStats(UNCHANGED, f"{n} complete blocks, fewer than {cfg.min_blocks}", session_id,
                                     blocks=n, messages_before=len(messages), messages_after=len(messages))
            stats.seconds["total"] = time.perf_counter() - started
            return Compressed(messages, stats)

        goal_text = goal if goal is not None else history.task_text()
        state = self.store.get(session_id)
        keys = tuple(block_identity(messages, span) for span in spans)
        cache = state.block_cache if state is not None else {}
        encode_started = time.perf_counter()
        infos, encoded = self._block_infos(history, keys, cache)
        embeddings = np.stack([info.embedding for info in infos])
        task_embedding = self.encoder.encode([goal_text])[0] if goal_text.strip() else None
        encode_seconds = time.perf_counter() - encode_started

        protected = evidence_picks([info.features for info in infos], embeddings, task_embedding, cfg.evidence)
        seeds = sorted({b for picks in protected.values() for b in picks})

        reason = reselection_reason(state, keys, goal_text, cfg)
        appended: set[int] = set()
        if reason is None:
            seen = len(state.block_keys)
            appended = {b for b in range(seen) if keys[b] in state.forwarded} | set(range(seen, n)) | set(seeds)
            if cfg.rewrite_above_blocks is not None and len(appended) > cfg.rewrite_above_blocks:
                reason = f"{len(appended)} forwarded blocks would pass the budget of {cfg.rewrite_above_blocks}"
        select_started = time.perf_counter()
        core: list[int] = []
        coverage = None
        if reason is not None:
            sel = select(embeddings, protected=seeds, tau=cfg.tau, k=cfg.k, eps=cfg.eps, backend=cfg.backend)
            core = to_numpy(sel.indices).tolist()
            coverage = sel.coverage
            total = request_chars(messages, history, infos)
            in_core = set(core)
            removable = [b for b in range(n) if b not in in_core]
            dropped = set(guarded_removals([info.chars for info in infos], removable, total, cfg.delta))
            forwarded = set(range(n)) - dropped
            action, selected_at = RESELECTED, n
        else:
            forwarded = appended
            action, selected_at = APPENDED, state.blocks_at_selection
            reason = f"{n - len(state.block_keys)} new blocks appended to the saved forwarded set"
        select_seconds = time.perf_counter() - select_started

        out = reconstruct(history, forwarded)
        self.store.put(session_id, SessionState(keys, frozenset(keys[b] for b in forwarded), goal_text,
                                                selected_at, cache))
        removed = sorted(set(range(n)) - forwarded)
        chars_before = request_chars(messages, history, infos)
        tokens_before = tokens_after = None
        if self.count_tokens is not None:
            other = sum(self.count_tokens(json.dumps(messages[p], ensure_ascii=False))
                        for p in range(len(messages)) if p not in history.block_positions)
            tokens_before = other + sum(info.tokens for info in infos)
            tokens_after = tokens_before - sum(infos[b].tokens for b in removed)
        stats = CompressionStats(
            action, reason, session_id, blocks=n, protected=protected, core=core, coverage=coverage,
            forwarded_blocks=len(forwarded), removed_blocks=removed, messages_before=len(messages),
            messages_after=len(out), chars_before=chars_before,
            chars_after=chars_before - sum(infos[b].chars for b in removed),
            tokens_before=tokens_before, tokens_after=tokens_after, encoded_blocks=encoded,
            seconds={"encode": encode_seconds, "select": select_seconds,
                     "total": time.perf_counter() - started},
        )
        return Compressed(out, stats)

    def _block_infos(self, history: History, keys: Sequence[str],
                     cache: dict[str, BlockInfo]) -> tuple[list[BlockInfo], int]:
        """Cached per-block info; new blocks are encoded in one batch. Returns (infos, newly encoded)."""
        new_ids = [b for b, key in enumerate(keys) if key not in cache]
        new = [history.block(b) for b in new_ids]
        if new:
            embeddings = np.asarray(self.encoder.encode([block_text(block, self.config.max_text_chars)
                                                         for block in new]), dtype=np.float32)
            if embeddings.shape != (len(new), self.encoder.dim) or not np.isfinite(embeddings).all():
                raise ValueError(f"encoder {self.encoder.name} returned unusable embeddings "
                                 f"(shape {embeddings.shape}, expected {(len(new), self.encoder.dim)}, "
                                 "or not finite)")
            for b, block, embedding in zip(new_ids, new, embeddings):
                messages = [history.messages[p] for p in block.positions]
                cache[keys[b]] = BlockInfo(
                    chars=sum(serialised_chars(m) for m in messages),
                    tokens=None if self.count_tokens is None else sum(
                        self.count_tokens(json.dumps(m, ensure_ascii=False)) for m in messages),
                    features=block_features(block), embedding=embedding)
        return [cache[key] for key in keys], len(new)


def block_identity(messages: Sequence[Any], span: Span) -> str:
    """A block's identity within a session: its tool-call ids plus a hash of what it says, so a block
    rewritten under the same ids (an elided old output, say) counts as a new block."""
    said: list[Any] = []
    for p in span.positions:
        message = messages[p]
        for name in ("content", "reasoning_content", "reasoning"):
            value = message.get(name)
            said.append(value if value is None or isinstance(value, str) else repr(value))
        for call in message.get("tool_calls") or ():
            function = call.get("function")
            if not isinstance(function, dict):
                said.append(repr(function))
                continue
            name, arguments = function.get("name"), function.get("arguments")
            said.append((repr(name), arguments if isinstance(arguments, str) else repr(arguments)))
    return f"{span.key}\x1e{hash(tuple(said)):x}"


def serialised_chars(message: Any) -> int:
    """A message's share of ``len(json.dumps(messages))``: its JSON and one ``", "`` separator."""
    return len(json.dumps(message)) + 2


def request_chars(messages: Sequence[Any], history: History, infos: Sequence[BlockInfo]) -> int:
    """``len(json.dumps(messages))`` from cached block sizes plus the non-block messages."""
    in_blocks = history.block_positions
    other = sum(serialised_chars(m) for p, m in enumerate(messages) if p not in in_blocks)
    return sum(info.chars for info in infos) + other


def prefix_session_id(history: History) -> str:
    """A session id for callers that give none: the hash of the prefix (system prompt and task)."""
    prefix = json.dumps(list(history.messages[:history.prefix_end]), sort_keys=True, default=str)
    return "prefix-" + hashlib.sha256(prefix.encode()).hexdigest()[:16]


def reselection_reason(state: SessionState | None, keys: tuple[str, ...], goal: str, cfg: GEMConfig) -> str | None:
    """Why this request needs a global selection, or None to append to the saved forwarded set."""
    every = cfg.reselect_every
    if state is None:
        return "first eligible request of the session"
    if goal != state.goal and cfg.reselect_on_goal_change:
        return "goal changed"
    if keys[:len(state.block_keys)] != state.block_keys:
        return "history is not an extension of the last request"
    if len(keys) - state.blocks_at_selection >= every:
        return f"{len(keys) - state.blocks_at_selection} new blocks since the last selection (every {every})"
    return None
