"""`GEM`: a chat request in, an evidence-preserving forwarded request out (DESIGN.md §2).

``GEM(config, encoder).compress(messages, session_id, goal)`` returns the caller's own
message objects minus the blocks it drops, in order, plus stats. Per-block work (size,
tokens, text, rule features, embedding) is done once per block and kept with the session.
Whatever goes wrong, the original request goes out unchanged and the stats say why.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from gemkernels.compress.blocks import (
    ANTHROPIC,
    RESPONSES,
    Block,
    BlockStructureError,
    History,
    Span,
    carries_thinking,
    detect_format,
    loop_start,
    parse_history,
    reconstruct,
)
from gemkernels.compress.config import GEMConfig, resolve_config
from gemkernels.compress.encoders import Encoder, EncodingDeferred, make_encoder
from gemkernels.compress.evidence import BlockFeatures, block_features, evidence_picks
from gemkernels.compress.guard import guarded_removals
from gemkernels.compress.identity import local_digest, responses_said, said, stable_digest
from gemkernels.compress.policy import (
    budget_reason,
    ceiling_drops,
    could_repay,
    guard_reason,
    least_core_tokens,
    repay_reason,
    reselection_reason,
    rewrite_core,
)
from gemkernels.compress.references import EMPTY, HeldIndex, Lexicon, block_lexicon
from gemkernels.compress.representation import block_text
from gemkernels.compress.responses_items import is_responses_input
from gemkernels.compress.resume import Marshalled, RawMessages, resume
from gemkernels.compress.router import Router, call_signature, load_router, request_features
from gemkernels.compress.router.features import superseded
from gemkernels.compress.router.ranking import retrieval_scores, router_order
from gemkernels.compress.sessions import (
    PendingAnalysis,
    SessionConflict,
    SessionState,
    SessionStore,
    StateStore,
    StoreUnavailable,
    goal_digest,
)
from gemkernels.compress.text_actions import text_action_profiles
from gemkernels.compress.tokens import TextCache, o200k_encode, serialise
from gemkernels.select.api import select
from gemkernels.select.arrays import to_numpy
from gemkernels.select.result import Selection

logger = logging.getLogger("gemkernels")
#: What a compression's reason says when the shared store did not confirm saving its session's state.
UNSAVED = "; the session's state was not saved"
NO_LEXICON = Lexicon(EMPTY, EMPTY)  # a block's, under a config that reads no lexicon

PASSTHROUGH, UNCHANGED, RESELECTED, APPENDED = "passthrough", "unchanged", "reselected", "appended"
#: How the reason of a request that went out before its blocks were encoded, or analysed, begins.
ENCODING_DEFERRED, ANALYSIS_DEFERRED = "encoding deferred", "analysis deferred"
DEFERRED = (ENCODING_DEFERRED, ANALYSIS_DEFERRED)


class AnalysisDeferred(EncodingDeferred):
    """A request's deadline passed while its blocks were analysed; ``analysed``: the infos it computed (block
    identity -> `BlockInfo`), which wait for its session's next request (`PendingAnalysis`)."""

    def __init__(self, message: str, analysed: Mapping[Hashable, BlockInfo]):
        super().__init__(message)
        self.analysed = analysed


@dataclass(frozen=True)
class BlockInfo:
    """Everything GEM needs from one block, computed once."""

    chars: int
    tokens: int | None
    features: BlockFeatures
    embedding: np.ndarray
    nbytes: int  # what keeping it in a session state costs (`block_nbytes`)
    tools: tuple[str, ...] = ()  # the names of the tools it calls
    # what it holds and names (`references.block_lexicon`) if the config reads it; None: not read yet (the
    # router's, read when a rewrite ranks: `GEM._read_lexicons`)
    lexicon: Lexicon | None = NO_LEXICON
    signature: int = 0  # its tool calls (`router.call_signature`)


@dataclass(frozen=True)
class BlockColumns:
    """A request's per-block values in block order, kept with its session state: the next request whose history
    extends it reuses them (one copy of each column) and computes only its new blocks'."""

    infos: tuple[BlockInfo, ...]
    embeddings: np.ndarray  # (blocks, dim) float32, a copy of the infos' rows
    sizes: tuple[int, ...]  # `block_tokens`
    chars: tuple[int, ...]
    features: tuple[BlockFeatures, ...]
    lexicons: tuple[Lexicon | None, ...]  # None: not read yet (`BlockInfo.lexicon`)
    nbytes: int  # the infos', the embedding matrix's and the held index's
    held: HeldIndex | None = None  # the held tokens of the first held.blocks lexicons, sorted (a router's, `indexed`)

    @classmethod
    def of(cls, infos: Sequence[BlockInfo]) -> BlockColumns:
        embeddings = np.stack([info.embedding for info in infos])
        return cls(tuple(infos), embeddings, tuple(map(block_tokens, infos)), tuple(info.chars for info in infos),
                   tuple(info.features for info in infos), tuple(info.lexicon for info in infos),
                   sum(info.nbytes for info in infos) + embeddings.nbytes)

    def extended(self, infos: Sequence[BlockInfo]) -> BlockColumns:
        """These columns followed by those of ``infos`` (a held index kept as it is: `indexed` brings it up)."""
        if not infos:
            return self
        new = BlockColumns.of(infos)
        return BlockColumns(self.infos + new.infos, np.concatenate([self.embeddings, new.embeddings]),
                            self.sizes + new.sizes, self.chars + new.chars, self.features + new.features,
                            self.lexicons + new.lexicons, self.nbytes + new.nbytes, self.held)

    def indexed(self) -> BlockColumns:
        """These columns with the `HeldIndex` of all their lexicons: the kept one grown by the blocks it lacks (a
        merge, only when a rewrite reads it), else one built here."""
        if self.held is not None and self.held.blocks == len(self.lexicons):
            return self
        if self.held is None:
            held, kept_bytes = HeldIndex.of(self.lexicons), 0
        else:
            held, kept_bytes = self.held.extended(self.lexicons[self.held.blocks:]), self.held.nbytes
        return replace(self, held=held, nbytes=self.nbytes - kept_bytes + held.nbytes)


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
        encode = o200k_encode()
    except ImportError:
        return None
    return lambda text: len(encode(text))


class GEM:
    """The compressor: evidence protection, residual completion, forwarding guard, online sessions."""

    def __init__(self, config: GEMConfig | str = "paper", encoder: Encoder | str = "minilm",
                 store: StateStore | None = None, token_counter: Callable[[str], int] | None | str = "auto",
                 select_fn: Callable[..., Selection] = select):
        """``select_fn`` runs the selection (`gk.select`'s signature); a server passes a cross-session batcher."""
        self.config = resolve_config(config)
        cfg = self.config
        self.text_actions = text_action_profiles(cfg.text_actions, cfg.text_action_regex, cfg.text_observation_regex)
        # lexicons (0.4 ms a block, 8x its evidence features): with each new block for evidence rules that read
        # them on every request; for the router's ranking only once a rewrite ranks (most calls append)
        self.reads_lexicons = cfg.evidence.reference > 0
        self.ranks_lexicons = cfg.ranking == "router" and not self.reads_lexicons
        self.encoder = make_encoder(encoder) if isinstance(encoder, str) else encoder
        self.store = store if store is not None else SessionStore()  # an empty store is falsy (__len__)
        self.pending = PendingAnalysis()  # what deferred requests analysed, for their sessions' next requests
        # block identities: Python's hash for a store in this process, one every process computes for a shared one
        self.digest = stable_digest if getattr(self.store, "shared", False) else local_digest
        self.count_tokens = default_token_counter() if token_counter == "auto" else token_counter
        # blocks carry their token counts in the session's block cache; the messages outside blocks (system
        # prompt, task) come back on every request, so the last 1,024 of those texts are remembered
        self.count_other_tokens = None if self.count_tokens is None else TextCache(self.count_tokens, max_texts=1024)
        self.select_fn = select_fn
        if self.config.ranking == "router":  # a missing or stale router file is a configuration error: say it now
            check_router(load_router(self.config.router), self.encoder.name)

    def compress(self, messages: Any, session_id: str | None = None, goal: str | None = None,
                 message_sizes: Sequence[int] | None = None, tenant: str | None = None,
                 save: bool = True, message_bytes: tuple[bytes, Sequence[tuple[int, int]]] | None = None,
                 thinking: str = "content", deadline: float | None = None) -> Compressed:
        """Compress one request; never raises for bad input, never mutates ``messages``.

        ``tenant``: whose session this is (a proxy passes a hash of the caller's credential): sessions of two
        tenants never meet, whatever session ids they send.

        ``message_sizes``: the bytes each message takes in the body that will go out (a proxy forwarding the
        client's bytes passes them), which the guard's budget and the stats' characters then count; default the
        length of each message's JSON.

        ``save=False``: a dry run (what this request would be forwarded as), leaving the session as it was.

        ``message_bytes``: the body the messages were read from and each message's ``[start, end)`` in it (a
        proxy's byte scan); the next request of the session then resumes this one's parse on a digest of those
        bytes (`gemkernels.compress.resume`) instead of marshalling the messages.

        ``thinking``: how Anthropic thinking binds this request (`THINKING_MODES`): ``content``, as its messages show
        (an Anthropic history, or one carrying thinking); ``api``, bound whatever its messages hold (it goes to
        Anthropic's Messages API, whose next response may think); ``drop``, not bound (the request lets the API drop
        a thinking block whose preceding messages changed: ``prefix_mismatch_behavior: "drop_block"``).
        ``thinking_bound=False`` in the config makes every request unbound.

        ``deadline``: a ``time.monotonic()`` past which the request stops analysing blocks (token counts, evidence
        features, the router's lexicons) and goes out as one whose encoding was deferred does: the session's saved
        forwarded set with the new blocks appended, else unchanged, the session left as it was; what it analysed
        waits for the session's next request, and `prepare` does the rest. A rewrite that only might repay (the
        cost bound let its ranking run) and runs out of time appends instead, as if the bound had said no, and
        saves the lexicons it read."""
        started = time.perf_counter()
        if thinking not in THINKING_MODES:
            raise ValueError(f"thinking must be one of {', '.join(THINKING_MODES)}, got {thinking!r}")
        mode = thinking if self.config.thinking_bound else THINKING_DROPPED
        try:
            try:
                return self._compress(messages, session_id, goal, started, message_sizes, tenant, save,
                                      message_bytes, mode, deadline)
            except SessionConflict:  # another request of the session saved first: once more, from its state
                return self._compress(messages, session_id, goal, started, message_sizes, tenant, save,
                                      message_bytes, mode, deadline)
        except BlockStructureError as err:
            return self._passthrough(messages, f"invalid structure: {err}", session_id, started)
        except (SessionConflict, StoreUnavailable) as err:  # a shared store's, expected: no traceback each
            return self._passthrough(messages, f"{type(err).__name__}: {err}", session_id, started)
        except Exception as err:  # the request must go out whatever happened here
            logger.exception("gemkernels: compression failed; forwarding the original request")
            return self._passthrough(messages, f"{type(err).__name__}: {err}", session_id, started)

    def prepare(self, messages: Any, session_id: str | None = None, tenant: str | None = None) -> int:
        """Analyse the blocks of ``messages`` that its session's saved state lacks (and read their lexicons where
        the router ranks) into the session's pending analysis: what a request that went out deferred left undone
        (`compress`'s ``deadline``), done after it so that the session's next request need not wait for it. The
        session state is left as it was. Returns the blocks held pending; 0 when there is nothing to analyse, when a
        request of the session saved another block list meanwhile, or when anything goes wrong (logged)."""
        try:
            return self._prepare(messages, session_id, tenant)
        except EncodingDeferred as err:  # the encoding queue is full: the next request encodes them
            logger.info("gemkernels: a deferred request's blocks were not prepared: %s", err)
        except Exception:
            logger.exception("gemkernels: could not analyse a deferred request's blocks ahead of its next request")
        return 0

    def _prepare(self, messages: Any, session_id: str | None, tenant: str | None) -> int:
        history = parse_history(messages, text_actions=self.text_actions)
        if len(history.spans) < self.config.min_blocks:
            return 0
        store_key = session_key(session_id or prefix_session_id(history), tenant)
        read_state = getattr(self.store, "local_get", self.store.get)  # a shared store's copy here: no round trip
        state = read_state(store_key)
        saved = {} if state is None else state.block_cache
        keys = self._identities(history.format, messages, history.spans)
        cache, pending = dict(saved), self.pending.get(store_key)
        infos, _ = self._block_infos(history, keys, cache, 0, None, pending)
        if self.ranks_lexicons:
            columns = self._with_lexicons(BlockColumns.of(infos), keys, pending, cache)
            infos = list(self._read_lexicons(columns, history, keys, cache).infos)
        now = read_state(store_key)
        if (now is None) != (state is None) or (now is not None and now.block_keys != state.block_keys):
            return 0  # a request of the session saved meanwhile, with its own analyses
        fresh = {key: info for key, info in zip(keys, infos) if saved.get(key) is not info}
        self.pending.add(store_key, fresh)
        return len(fresh)

    def _bound(self, messages: Any, session_id: str | None, started: float, blocks: int = 0) -> Compressed:
        """``messages`` unchanged: their thinking is or may become bound to every message before it
        (``thinking_bound``); the session named by the caller, else by the messages before the first call."""
        count = len(messages) if isinstance(messages, (list, tuple)) else 0
        if session_id is None and count and set(map(type, messages)) <= {dict}:
            session_id = prefix_id(messages[:first_call(messages)])
        stats = CompressionStats(UNCHANGED, THINKING_BOUND, session_id, blocks=blocks, messages_before=count,
                                 messages_after=count, seconds={"total": time.perf_counter() - started})
        return Compressed(messages, stats)

    def _passthrough(self, messages: Any, reason: str, session_id: str | None, started: float) -> Compressed:
        logger.info("gemkernels: forwarding unchanged: %s", reason)  # info: a reason can quote a client's ids
        count = len(messages) if isinstance(messages, (list, tuple)) else 0
        stats = CompressionStats(PASSTHROUGH, reason, session_id, messages_before=count, messages_after=count,
                                 seconds={"total": time.perf_counter() - started})
        return Compressed(messages, stats)

    def _compress(self, messages: Any, session_id: str | None, goal: str | None, started: float,
                  message_sizes: Sequence[int] | None, tenant: str | None, save: bool,
                  message_bytes: tuple[bytes, Sequence[tuple[int, int]]] | None, thinking: str,
                  deadline: float | None) -> Compressed:
        cfg = self.config
        if thinking == THINKING_API:  # whole, so not even read
            return self._bound(messages, session_id, started)
        history = keys = call_ids = written = None
        if session_id is not None and isinstance(messages, (list, tuple)):  # the last request's parse may go on
            written = (RawMessages(*message_bytes) if message_bytes is not None
                       and len(message_bytes[1]) == len(messages) else Marshalled(messages))
            local_get = getattr(self.store, "local_get", None)  # this process's copy (a shared store's, no round trip)
            last = local_get(session_key(session_id, tenant)) if local_get is not None else None
            if last is not None and last.parsed is not None:
                history, keys, call_ids = (resume(last.parsed, messages, written, self._identities, self.text_actions)
                                           or (None,) * 3)
        if history is None:  # a resumed parse knows its format; a bound Anthropic history saves none, so comes here
            if thinking == THINKING_CONTENT and is_anthropic_messages(messages):  # whole, so not parsed
                return self._bound(messages, session_id, started)
            history = parse_history(messages, text_actions=self.text_actions)
        if message_sizes is not None and len(message_sizes) != len(history.messages):
            return self._passthrough(messages, f"{len(message_sizes)} message sizes for {len(history.messages)} "
                                     "messages", session_id, started)
        spans = history.spans
        n = len(spans)
        if n < cfg.min_blocks:
            stats = CompressionStats(UNCHANGED, f"{n} complete blocks, fewer than {cfg.min_blocks}",
                                     session_id or prefix_session_id(history), blocks=n,
                                     messages_before=len(messages), messages_after=len(messages))
            stats.seconds["total"] = time.perf_counter() - started
            return Compressed(messages, stats)
        if thinking != THINKING_DROPPED and history.carries_thinking:
            return self._bound(messages, session_id or prefix_session_id(history), started, n)
        session_id = session_id or prefix_session_id(history)
        store_key = session_key(session_id, tenant)
        state = self.store.get(store_key)

        goal_text = goal if goal is not None else history.task_text(cfg.goal_from)
        if keys is None:
            keys = self._identities(history.format, messages, spans)
        seen = len(state.block_keys) if state is not None else 0  # blocks of the last request
        prior = state.columns if state is not None and keys[:seen] == state.block_keys else None
        cache = {} if state is None else dict(state.block_cache)  # the saved state's is left as it is until a save
        pending = self.pending.get(store_key)  # what deferred requests of the session and `prepare` analysed
        encode_started = time.perf_counter()
        try:
            start = seen if prior is not None else 0
            new_infos, encoded = self._block_infos(history, keys, cache, start, deadline, pending)
            columns = prior.extended(new_infos) if prior is not None else BlockColumns.of(new_infos)
            if pending and self.ranks_lexicons:  # lexicons read for blocks the saved state holds without one
                columns = self._with_lexicons(columns, keys, pending, cache)
            task_embedding = self.encoder.encode([goal_text])[0] if goal_text.strip() else None
        except EncodingDeferred as err:
            why = ENCODING_DEFERRED
            if isinstance(err, AnalysisDeferred):
                why = ANALYSIS_DEFERRED
                self.pending.add(store_key, err.analysed)
            return self._deferred(history, keys, state, session_id, f"{why}: {err}", started, message_sizes)
        infos, embeddings, sizes = columns.infos, columns.embeddings, columns.sizes
        encode_seconds = time.perf_counter() - encode_started

        protected = evidence_picks(columns.features, embeddings, task_embedding, cfg.evidence, columns.lexicons)
        if cfg.keep_tools:
            keep = set(cfg.keep_tools)
            protected["kept_tool"] = [b for b, info in enumerate(infos) if keep.intersection(info.tools)]
        pinned = loop_thinking_blocks(history)
        if pinned:
            protected["thinking"] = pinned
        seeds = sorted({b for picks in protected.values() for b in picks})

        goal_key = goal_digest(goal_text)
        reason = reselection_reason(state, keys, goal_key, cfg)
        if message_sizes is None:
            block_chars: Sequence[int] = columns.chars
            chars_before = request_chars(messages, history, sum(block_chars))
        else:
            block_chars = [sum(message_sizes[p] for p in span.positions) for span in spans]
            chars_before = sum(message_sizes)
        appended: set[int] = set()
        if reason is None:
            before = set(range(n)) if state is None else {b for b in range(seen) if keys[b] in state.forwarded}
            appended = before | set(range(seen, n)) | (set() if cfg.budgeted else set(seeds))
            reason = budget_reason(appended, sizes, cfg) or guard_reason(appended, block_chars, chars_before, cfg.delta)
        select_started = time.perf_counter()

        # what a rewrite may rank after the protected blocks: those no newer block supersedes, or all (None)
        eligible = ~superseded([info.signature for info in infos]) if cfg.drop_superseded else None

        def rewritten() -> tuple[set[int], list[int], float | None]:
            nonlocal columns
            if cfg.ranking == "router":  # its live references read the held index: brought up to date, then kept
                columns = self._read_lexicons(columns, history, keys, cache, deadline).indexed()
            return self._rewrite(columns, block_chars, seeds, eligible, chars_before, task_embedding)

        rewrite: tuple[set[int], list[int], float | None] | None = None
        core: list[int] = []
        coverage = None
        ranking_cut = ""
        if reason is None and cfg.repay_factor is not None and could_repay(
                appended, least_core_tokens(sizes, seeds, eligible, cfg), sizes, cfg):
            try:
                rewrite = rewritten()
                reason = repay_reason(appended, rewrite[0], sizes, cfg)
            except AnalysisDeferred as err:  # a rewrite that may repay, out of time: it appends, as if it did not
                columns = self._with_lexicons(columns, keys, err.analysed, cache)  # saved: a ranking reads the rest
                ranking_cut = f"; the rewrite's ranking was deferred: {err}"
        if reason is not None:
            try:
                forwarded, core, coverage = rewrite or rewritten()
            except AnalysisDeferred as err:  # a due selection out of time: deferred, what it analysed pending
                self.pending.add(store_key, {**{key: info for key, info in cache.items()
                                                if state is None or state.block_cache.get(key) is not info},
                                             **err.analysed})
                return self._deferred(history, keys, state, session_id, f"{ANALYSIS_DEFERRED}: {err}", started,
                                      message_sizes)
            action, selected_at = RESELECTED, n
        else:
            forwarded, action = appended, APPENDED
            selected_at = state.blocks_at_selection if state is not None else 0
            reason = f"{n - seen} new blocks appended to the saved forwarded set{ranking_cut}"
        select_seconds = time.perf_counter() - select_started
        other = self._other_tokens(history)
        forwarded, reason = self._ceiling(history, forwarded, sizes, other, core, seeds, reason, pinned)
        forwarded |= set(pinned)  # an appended saved set may lack them (a rewind made them the current loop again)

        out = reconstruct(history, forwarded)
        if save:  # the cache holds exactly this request's blocks when it extended the last one's
            block_cache = cache if len(cache) == n else dict(zip(keys, columns.infos))
            parsed = written.parsed(history, keys, call_ids) if written is not None else None
            try:
                self.store.put(store_key, SessionState(
                    keys, frozenset(map(keys.__getitem__, forwarded)), goal_key, selected_at, block_cache,
                    columns.nbytes + (parsed.held_bytes if parsed is not None else 0), columns, parsed))
                self.pending.discard(store_key)  # the state holds its blocks' analyses now
            except StoreUnavailable as err:  # a save whose answer was lost may have landed, and then says that this
                reason += f"{UNSAVED} ({err})"  # went out compressed: so it does (DESIGN.md §5.1)
        removed = sorted(set(range(n)) - forwarded)
        tokens_before = tokens_after = None
        if other is not None:
            tokens_before = other + sum(info.tokens for info in infos)
            tokens_after = tokens_before - sum(infos[b].tokens for b in removed)
        stats = CompressionStats(
            action, reason, session_id, blocks=n, protected=protected, core=core, coverage=coverage,
            forwarded_blocks=len(forwarded), removed_blocks=removed, messages_before=len(messages),
            messages_after=len(out), chars_before=chars_before,
            chars_after=chars_before - sum(block_chars[b] for b in removed),
            tokens_before=tokens_before, tokens_after=tokens_after, encoded_blocks=encoded,
            seconds={"encode": encode_seconds, "select": select_seconds,
                     "total": time.perf_counter() - started},
        )
        return Compressed(out, stats)

    def _identities(self, format: str, messages: Sequence[Any], spans: Sequence[Span]) -> tuple[Hashable, ...]:
        """The identities of the blocks at ``spans`` (`gemkernels.compress.identity`)."""
        what, digest = responses_said if format == RESPONSES else said, self.digest
        return tuple([digest(what(messages, span)) for span in spans])

    def _deferred(self, history: History, keys: tuple[str, ...], state: SessionState | None, session_id: str,
                  why: str, started: float, message_sizes: Sequence[int] | None) -> Compressed:
        """The request when its blocks could not be encoded or analysed in time: the session's saved forwarded set
        with every newer block appended when the history extends the last request (the upstream's cached prefix
        holds) and that keeps what the guard requires, else unchanged; the session state is left as it was."""
        messages = history.messages
        if state is None or keys[:len(state.block_keys)] != state.block_keys:
            return self._passthrough(messages, why, session_id, started)
        n, seen = len(keys), len(state.block_keys)
        forwarded = {b for b in range(seen) if keys[b] in state.forwarded} | set(range(seen, n))
        sizes = message_sizes if message_sizes is not None else [serialised_chars(m) for m in messages]
        chars_before = sum(sizes)
        block_chars = [sum(sizes[p] for p in span.positions) for span in history.spans]
        if (broken := guard_reason(forwarded, block_chars, chars_before, self.config.delta)) is not None:
            return self._passthrough(messages, f"{why}; {broken}", session_id, started)
        reason = f"{why}; {n - seen} new blocks appended to the saved forwarded set"
        pinned = loop_thinking_blocks(history)
        if self.config.max_forward_tokens is not None:  # new blocks weigh their characters / 4 (not counted yet)
            tokens = [block_tokens(state.block_cache[key]) if key in state.block_cache else
                      -(-sum(serialised_chars(messages[p]) for p in span.positions) // 4)
                      for key, span in zip(keys, history.spans)]
            forwarded, reason = self._ceiling(history, forwarded, tokens, self._other_tokens(history), (), (), reason,
                                              pinned)
        forwarded |= set(pinned)  # a saved set may lack what the API now needs
        removed = sorted(set(range(n)) - forwarded)
        out = reconstruct(history, forwarded)
        stats = CompressionStats(
            APPENDED, reason, session_id, blocks=n,
            forwarded_blocks=len(forwarded), removed_blocks=removed, messages_before=len(messages),
            messages_after=len(out), chars_before=chars_before,
            chars_after=chars_before - sum(block_chars[b] for b in removed),
            seconds={"total": time.perf_counter() - started})
        return Compressed(out, stats)

    def _other_tokens(self, history: History) -> int | None:
        """The tokens of the messages outside blocks (None without a token counter)."""
        if self.count_tokens is None:
            return None
        messages = history.messages
        return sum(self.count_other_tokens(serialise(messages[p])) for p in history.other_positions)

    def _ceiling(self, history: History, forwarded: set[int], sizes: Sequence[int], other: int | None,
                 core: Sequence[int], seeds: Sequence[int], reason: str, pinned: Sequence[int] = ()
                 ) -> tuple[set[int], str]:
        """``forwarded`` within ``max_forward_tokens`` (`ceiling_drops`; ``sizes``: each block's tokens, ``other``:
        those outside blocks, else their characters / 4; ``pinned`` never dropped), and ``reason`` saying what that
        dropped."""
        ceiling = self.config.max_forward_tokens
        if ceiling is None:
            return forwarded, reason
        fixed = other if other is not None else -(-request_chars(history.messages, history, 0) // 4)
        fixed += sum(sizes[b] for b in pinned if b in forwarded)
        dropped = ceiling_drops(forwarded - set(pinned), sizes, fixed, core, seeds, ceiling)
        if not dropped:
            return forwarded, reason
        note = f"; {len(dropped)} more blocks dropped to fit max_forward_tokens {ceiling}"
        return forwarded - set(dropped), reason + note

    def _read_lexicons(self, columns: BlockColumns, history: History, keys: Sequence[Hashable],
                       cache: dict[Hashable, BlockInfo], deadline: float | None = None) -> BlockColumns:
        """``columns`` with the lexicon of every block that has none yet read from ``history``, their infos replaced
        in ``cache`` too (the session keeps them); past ``deadline``, `AnalysisDeferred` with the infos of those
        read so far (``cache`` left as it was)."""
        read: dict[Hashable, BlockInfo] = {}
        missing = [b for b, lexicon in enumerate(columns.lexicons) if lexicon is None]
        for b in missing:
            if deadline is not None and time.monotonic() > deadline:
                raise AnalysisDeferred(f"{len(read)} of {len(missing)} lexicons read at the deadline", read)
            block = history.block(b)
            lexicon = block_lexicon(block, block_text(block, self.config.max_text_chars))
            read[keys[b]] = replace(columns.infos[b], lexicon=lexicon, nbytes=columns.infos[b].nbytes + lexicon.nbytes)
        return self._with_lexicons(columns, keys, read, cache)

    @staticmethod
    def _with_lexicons(columns: BlockColumns, keys: Sequence[Hashable], analysed: Mapping[Hashable, BlockInfo],
                       cache: dict[Hashable, BlockInfo]) -> BlockColumns:
        """``columns`` with the lexicons that ``analysed``'s infos hold for blocks that have none yet (only the lexicon:
        each block keeps its own counts and embedding; a held index stays, as it covers only blocks with one), their
        infos replaced in ``cache`` too."""
        found = [b for b, lexicon in enumerate(columns.lexicons) if lexicon is None
                 and (info := analysed.get(keys[b])) is not None and info.lexicon is not None]
        if not found:
            return columns
        infos, added = list(columns.infos), 0
        for b in found:
            lexicon = analysed[keys[b]].lexicon
            infos[b] = cache[keys[b]] = replace(infos[b], lexicon=lexicon, nbytes=infos[b].nbytes + lexicon.nbytes)
            added += lexicon.nbytes
        return replace(columns, infos=tuple(infos), lexicons=tuple(info.lexicon for info in infos),
                       nbytes=columns.nbytes + added)

    def _rewrite(self, columns: BlockColumns, block_chars: Sequence[int], seeds: list[int],
                 eligible: np.ndarray | None, total_chars: int, task_embedding: np.ndarray | None
                 ) -> tuple[set[int], list[int], float | None]:
        """A global selection: (blocks to forward, selected core, its coverage; None unless geometry ranks). The
        core is the protected seeds, then the blocks in ranking order (residual completion, router or retrieval score),
        up to ``k`` blocks or, with ``keep_recent_size``, while its tokens fit those of the newest ``k`` blocks;
        the forwarding guard then drops blocks outside it, larger first."""
        cfg, embeddings, sizes = self.config, columns.embeddings, columns.sizes
        n, signatures = len(sizes), [info.signature for info in columns.infos]
        if cfg.ranking != "geometry":
            if cfg.ranking == "router":
                scores = load_router(cfg.router).scores(request_features(
                    columns.lexicons, signatures, columns.features, columns.chars, embeddings, task_embedding,
                    columns.held))
            else:
                scores = retrieval_scores(embeddings)
            order = router_order(scores, sizes, seeds, eligible, cfg.size_power if cfg.keep_recent_size else 0.0)
            coverage, num_protected = None, len(set(seeds))
        else:
            sel = self.select_fn(embeddings, protected=seeds, eligible=eligible, tau=cfg.tau,
                                 k=n if cfg.keep_recent_size else cfg.k, eps=cfg.eps, backend=cfg.backend)
            order, coverage, num_protected = to_numpy(sel.indices).tolist(), sel.coverage, sel.num_protected
        core = rewrite_core(order, num_protected, sizes, cfg)
        removable = sorted(set(range(n)).difference(core))
        dropped = set(guarded_removals(block_chars, removable, total_chars, cfg.delta))
        return set(range(n)) - dropped, core, coverage

    def _block_infos(self, history: History, keys: Sequence[Hashable], cache: dict[Hashable, BlockInfo],
                     start: int = 0, deadline: float | None = None,
                     pending: Mapping[Hashable, BlockInfo] | None = None) -> tuple[list[BlockInfo], int]:
        """The infos of blocks ``start`` onwards, cached, ``pending`` (the session's `PendingAnalysis`) or computed
        (new blocks encoded in one batch), the others added to ``cache``: (infos, newly encoded). Past ``deadline``
        (`time.monotonic`), `AnalysisDeferred` with the infos computed so far (``cache`` left as it was)."""
        new_ids = [b for b in range(start, len(keys)) if keys[b] not in cache]
        done: dict[Hashable, BlockInfo] = {}
        if new_ids and pending:
            done.update((keys[b], pending[keys[b]]) for b in new_ids if keys[b] in pending)
            new_ids = [b for b in new_ids if keys[b] not in done]
        new = [history.block(b) for b in new_ids]
        if new:
            texts = [block_text(block, self.config.max_text_chars) for block in new]
            embeddings = np.asarray(self.encoder.encode(texts), dtype=np.float32)
            if embeddings.shape != (len(new), self.encoder.dim) or not np.isfinite(embeddings).all():
                raise ValueError(f"encoder {self.encoder.name} returned unusable embeddings "
                                 f"(shape {embeddings.shape}, expected {(len(new), self.encoder.dim)}, "
                                 "or not finite)")
            computed: dict[Hashable, BlockInfo] = {}
            for b, block, embedding, text in zip(new_ids, new, embeddings, texts):
                if deadline is not None and time.monotonic() > deadline:
                    raise AnalysisDeferred(f"{len(computed)} of {len(new)} new blocks analysed at the deadline",
                                           computed)
                computed[keys[b]] = self._block_info(history, block, keys[b], embedding.copy(), text)
            done.update(computed)
        cache.update(done)
        return [cache[key] for key in keys[start:]], len(new)

    def _block_info(self, history: History, block: Block, key: Hashable, embedding: np.ndarray,
                    text: str) -> BlockInfo:
        """A new block's `BlockInfo` (``text``: its representation, ``embedding``: that text's, a row of its own)."""
        messages = [history.messages[p] for p in block.positions]
        lexicon = block_lexicon(block, text) if self.reads_lexicons else None if self.ranks_lexicons else NO_LEXICON
        features = block_features(block)
        return BlockInfo(
            chars=sum(serialised_chars(m) for m in messages),
            tokens=None if self.count_tokens is None else sum(self.count_tokens(serialise(m)) for m in messages),
            features=features, embedding=embedding, nbytes=block_nbytes(key, embedding, features, lexicon),
            tools=tuple(dict.fromkeys(action.name for action in block.actions)), lexicon=lexicon,
            signature=call_signature(block))


def check_router(router: Router, encoder: str) -> None:
    """Log a warning (once per process for each pair) when ``router`` was trained with another encoder than
    ``encoder``: its cosine signals then come from another geometry; it still ranks (docs/router.md measures it
    with the hash encoder), but a router trained on yours fits better."""
    trained = router.meta.get("encoder")
    if trained and trained != encoder:
        warn_encoder_mismatch(trained, encoder)


@functools.cache
def warn_encoder_mismatch(trained: str, encoder: str) -> None:
    logger.warning("gemkernels: the router was trained with encoder %s, GEM runs %s; `gem train-router RUNS... "
                   "--encoder` makes one for yours", trained, encoder)


#: Why a history whose thinking may be bound to its prefix goes out whole (`is_anthropic_messages`,
#: `History.carries_thinking`).
THINKING_BOUND = ("thinking_bound: a model with preserved thinking binds each thinking block to every message before "
                  "it, so no block is removed (set thinking_bound=false for a model without that binding)")


#: `GEM.compress`'s ``thinking`` modes: bound as the messages show, bound by the API, dropped by the API.
THINKING_CONTENT, THINKING_API, THINKING_DROPPED = "content", "api", "drop"
THINKING_MODES = (THINKING_CONTENT, THINKING_API, THINKING_DROPPED)


def anthropic_thinking(request: Mapping[str, Any]) -> str:
    """The ``thinking`` mode of a request to Anthropic's Messages API: ``api`` (any response may think, bound to what
    it was sent), or ``drop`` when it asks the API to drop a thinking block whose preceding messages changed
    (``thinking.block_binding.prefix_mismatch_behavior: "drop_block"``)."""
    thinking = request.get("thinking")
    binding = thinking.get("block_binding") if isinstance(thinking, dict) else None
    drops = isinstance(binding, dict) and binding.get("prefix_mismatch_behavior") == "drop_block"
    return THINKING_DROPPED if drops else THINKING_API


def first_call(messages: Sequence[dict[str, Any]]) -> int:
    """The position of the first message that calls a tool (content parts, ``tool_calls``), else the length."""
    return next((i for i, m in enumerate(messages) if m.get("tool_calls") or isinstance(m.get("content"), list)
                 and any(isinstance(p, dict) and p.get("type") == "tool_use" for p in m["content"])), len(messages))


def is_anthropic_messages(messages: Any) -> bool:
    """Whether ``messages`` is an Anthropic Messages history (`detect_format`), which a model with preserved thinking
    may think after in any response: a list of objects, no Responses input, with ``tool_use``/``tool_result`` parts."""
    return isinstance(messages, (list, tuple)) and set(map(type, messages)) <= {dict} and not is_responses_input(
        messages) and detect_format(messages) == ANTHROPIC


def loop_thinking_blocks(history: History) -> list[int]:
    """The blocks of the current tool loop with a thinking message (`carries_thinking`): the API refuses a tool loop
    whose last assistant turn lost its thinking, so they are always sent."""
    messages, spans = history.messages, history.spans
    if not spans or history.format == RESPONSES or not history.carries_thinking:
        return []
    loop, found = loop_start(messages), []
    for b in range(len(spans) - 1, -1, -1):
        if spans[b].start < loop:
            break
        if any(carries_thinking(messages[p]) for p in spans[b].positions):
            found.append(b)
    return found[::-1]


def block_nbytes(key: Hashable, embedding: np.ndarray, features: BlockFeatures, lexicon: Lexicon | None) -> int:
    """About what one block costs a session state: its embedding, its key (in the cache, the block list and the
    forwarded set), the paths and sources of its features, its lexicon, and some 500 bytes of Python objects
    around them."""
    return (embedding.nbytes + 3 * (len(key) if isinstance(key, str) else 8)
            + sum(map(len, features.edited_paths + features.sources))
            + (lexicon.nbytes if lexicon is not None else 0) + 500)


def without_cache_marks(content: Any) -> Any:
    """``content`` with the ``cache_control`` key left out of its parts (Anthropic's prompt-cache breakpoints)."""
    if isinstance(content, list):
        return [{k: v for k, v in part.items() if k != "cache_control"} if isinstance(part, dict) else part
                for part in content]
    return content


def serialised_chars(message: Any) -> int:
    """A message's share of ``len(json.dumps(messages))``: its JSON and one ``", "`` separator."""
    return len(json.dumps(message)) + 2


def request_chars(messages: Sequence[Any], history: History, block_chars: int) -> int:
    """``len(json.dumps(messages))`` from the blocks' cached sizes (``block_chars`` in all) plus the non-block
    messages."""
    return block_chars + sum(serialised_chars(messages[p]) for p in history.other_positions)


def session_key(session_id: str, tenant: str | None) -> str:
    """Where a tenant's session lives in the store: a different key for every (tenant, session id) pair, so sessions
    of two tenants never meet whatever ids they send (``tenant\x1fsession``, or the bare id without a tenant, when
    neither can be mistaken for the other; else a key that starts with the separator)."""
    if tenant is None and "\x1f" not in session_id:
        return session_id
    if tenant and "\x1f" not in tenant:
        return f"{tenant}\x1f{session_id}"
    return "\x1f" + json.dumps([tenant, session_id])


def prefix_session_id(history: History) -> str:
    """A session id for callers that give none: the hash of the prefix (system prompt and task)."""
    return prefix_id(history.messages[:history.prefix_end])


def prefix_id(prefix: Sequence[Any]) -> str:
    """The session id of the messages before a history's first block (`prefix_session_id`)."""
    text = json.dumps([{**m, "content": without_cache_marks(m.get("content"))} if isinstance(m, dict) else m
                       for m in prefix], sort_keys=True, default=str)
    return "prefix-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def block_tokens(info: BlockInfo) -> int:
    """A block's tokens: counted, or estimated as its serialised characters / 4 without a token counter."""
    return info.tokens if info.tokens is not None else -(-info.chars // 4)


