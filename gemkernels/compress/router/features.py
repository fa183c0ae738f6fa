"""What the router reads at a rewrite: one row of signals per block, from what the session keeps per block.

Encoder-free signals: the block's age (bins), size (its serialised characters, so that it reads the same with or
without a token counter), error / edit / source flags, whether a newer block supersedes it (the same tool calls
again), and live references (which of the last
``LIVE_WINDOW`` actions name something the block holds, how many, and how specific those names are, log1p). Encoder
signals: cosine to the latest block, the largest cosine to the last three, cosine to the task, each also as a
z-score and as a rank within the request, so that encoders of other scales read alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gemkernels.compress.blocks import Block
from gemkernels.compress.evidence import BlockFeatures
from gemkernels.compress.references import HeldIndex, Lexicon

AGE_BINS = (1, 2, 3, 4, 6, 9, 13, 21, 41)  # ages 0, 1, 2, 3, 4-5, 6-8, 9-12, 13-20, 21-40, 41+
LIVE_WINDOW = 3
FEATURES = (
    *(f"age<{b}" for b in AGE_BINS), f"age>={AGE_BINS[-1]}",
    "log_chars", "error", "edit", "source", "superseded",
    "live_actions", "named_by_latest", "live_specificity",
    "cos_latest", "cos_recent", "cos_task", "z_cos_latest", "z_cos_recent", "z_cos_task",
    *(f"{name}_{kind}" for name in ("latest", "recent", "task") for kind in ("top3", "top8", "log_rank")),
)


def superseded(signatures: Sequence[int]) -> np.ndarray:
    """Whether a newer block repeats a block's tool calls exactly (same `call_signature`, not 0: the same command
    re-run, the same file read again the same way): the older one is what the newer replaces. Reads of the same
    file that differ (other lines, a grep, then a cat) replace nothing."""
    keys = np.asarray(signatures, dtype=np.int64)
    _, last_from_end = np.unique(keys[::-1], return_index=True)
    latest = np.zeros(len(keys), dtype=bool)
    latest[len(keys) - 1 - last_from_end] = True  # the newest block of each signature
    return (keys != 0) & ~latest


def live_references(lexicons: Sequence[Lexicon], window: int = LIVE_WINDOW,
                    held: HeldIndex | None = None) -> np.ndarray:
    """(n, 3): per block, how many of the last ``window`` actions name something it holds, whether the latest one
    does, and the specificity of those names (each name counts 1 / the number of blocks that hold it); a block
    is not its own reference. ``held``: the lexicons' `HeldIndex`, if kept (a session's), else built here."""
    n = len(lexicons)
    out = np.zeros((n, 3))
    if n < 2:
        return out
    held = HeldIndex.of(lexicons) if held is None else held
    if held.blocks != n:
        raise ValueError(f"the held index has {held.blocks} blocks, the request {n}")
    for j in range(max(0, n - window), n):
        names = lexicons[j].names
        if not names.size:
            continue
        blocks, tokens = held.holders(names)
        other = blocks != j
        blocks, tokens = blocks[other], tokens[other]
        if not blocks.size:
            continue
        _, inverse, holders = np.unique(tokens, return_inverse=True, return_counts=True)
        np.add.at(out[:, 2], blocks, 1.0 / holders[inverse])
        named = np.unique(blocks)
        out[named, 0] += 1
        if j == n - 1:
            out[named, 1] = 1
    return out


def rank_signals(values: np.ndarray) -> np.ndarray:
    """(n, 3): whether each value is among the 3 and the 8 largest, and log1p of its rank (0: the largest; ties:
    the newer block first), so that encoders of any scale read alike."""
    order = np.lexsort((-np.arange(len(values)), -values))
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    return np.column_stack([ranks < 3, ranks < 8, np.log1p(ranks)])


def zscore(values: np.ndarray) -> np.ndarray:
    """``values`` centred and scaled within the request (zeros when they do not vary)."""
    spread = values.std()
    return (values - values.mean()) / spread if spread > 1e-9 else np.zeros_like(values)


def call_signature(block: Block) -> int:
    """One hash of a block's tool calls (names and arguments as sent; 0 without calls): equal for a repeated call."""
    return hash(tuple((action.name, action.arguments) for action in block.actions)) if block.actions else 0


def request_features(lexicons: Sequence[Lexicon], signatures: Sequence[int], features: Sequence[BlockFeatures],
                     chars: Sequence[int], embeddings: np.ndarray, task: np.ndarray | None,
                     held: HeldIndex | None = None) -> np.ndarray:
    """The (n, len(`FEATURES`)) signals of a request's n blocks, oldest first, from each block's `Lexicon`,
    `call_signature`, evidence features and serialised characters (`gem.serialised_chars` summed over its
    messages), the unit block ``embeddings`` (n, d) and the task's unit embedding (None without a task);
    ``held``, the lexicons' `HeldIndex` where the caller keeps one."""
    n = len(lexicons)
    flags = [(f.is_error, f.is_edit, f.is_source) for f in features]
    age = np.arange(n - 1, -1, -1)
    bins = np.eye(len(AGE_BINS) + 1)[np.digitize(age, AGE_BINS)]
    x = np.asarray(embeddings, dtype=np.float64)
    latest = x @ x[-1]
    recent = (x @ x[-LIVE_WINDOW:].T).max(axis=1)
    to_task = x @ np.asarray(task, dtype=np.float64) if task is not None else np.zeros(n)
    live = live_references(lexicons, held=held)
    live[:, 2] = np.log1p(live[:, 2])
    return np.column_stack([
        bins, np.log1p(np.asarray(chars, dtype=np.float64)), np.asarray(flags, dtype=np.float64),
        superseded(signatures), live,
        latest, recent, to_task, zscore(latest), zscore(recent), zscore(to_task),
        rank_signals(latest), rank_signals(recent), rank_signals(to_task)])
