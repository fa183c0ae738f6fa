"""Evidence protection (DESIGN.md §2.4; paper §5.2 and appendix B.2): the blocks GEM must keep.

`gemkernels.compress.evidence.features.block_features` reads one block once (the caller caches it by
``block.key``): the paths it may have changed, whether it records an error, and the sources it read.
Each rule is a small pure function over those features and the block embeddings that returns block
indices in priority order; `protect` runs them all and the caller unions the picks. The detectors are cheap cues,
not a model of the environment: a detected write is a *possible* change, not proof that it
happened, and an error that ages out of the window is not thereby resolved (paper §5.2).
"""


from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gemkernels.compress.evidence.features import BlockFeatures
from gemkernels.compress.references import Lexicon
from gemkernels.select.arrays import to_numpy
from gemkernels.select.ragged import index_mask

RULES = ("recent", "goal", "state", "error", "source", "initial", "reference")


@dataclass(frozen=True)
class EvidenceConfig:
    """Protection limits; defaults are the paper's Table B.1.

    Table B.1 gives no count for source protection, only its activation (source-like blocks
    >= half of the history). ``source=4`` matches the recent window, so source protection can
    reach past the last four blocks (which often read the same files), while the worst-case
    protected union (4 + 1 + 3 + 2 + 4 = 14) stays below the core capacity K = 16, so the
    defaults never force the core to grow and always leave room for geometric completion.

    ``reference`` (live references; not in the paper, 0 there): up to that many blocks older than the last
    ``reference_window`` that hold something one of those actions names (a path, an identifier, a literal), the
    latest such holder for each action, the latest action first (`reference_blocks`).
    """

    recent: int = 4
    goal: int = 1
    state: int = 3
    error: int = 2
    error_window: int = 8
    source_fraction: float = 0.5
    source: int = 4
    initial: int = 0
    reference: int = 0
    reference_window: int = 3

    def __post_init__(self) -> None:
        for name in ("recent", "goal", "state", "error", "error_window", "source", "initial", "reference",
                     "reference_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not 0.0 <= self.source_fraction <= 1.0:
            raise ValueError(f"source_fraction must lie in [0, 1], got {self.source_fraction!r}")




def recent_blocks(num_blocks: int, count: int) -> list[int]:
    """The last ``count`` blocks, most recent first."""
    return list(range(num_blocks - 1, max(num_blocks - count, 0) - 1, -1))


def initial_blocks(num_blocks: int, count: int) -> list[int]:
    """The first ``count`` blocks, in order."""
    return list(range(min(count, num_blocks)))


def goal_blocks(embeddings: Any, task_embedding: Any, eligible: Any, count: int) -> list[int]:
    """The ``count`` eligible blocks most similar to the task (dot product; ties: more recent first).

    None without a task embedding."""
    if task_embedding is None or count <= 0:
        return []
    x = to_numpy(embeddings)
    candidates = np.flatnonzero(index_mask(eligible, x.shape[0], "eligible", True))
    scores = (x @ np.asarray(to_numpy(task_embedding), dtype=x.dtype))[candidates].astype(np.float64)
    return [int(candidates[i]) for i in rank(scores, candidates)[:count]]


def state_blocks(features: Sequence[BlockFeatures], embeddings: Any, state_query: Any, count: int) -> list[int]:
    """Up to ``count`` change records: each edited path is represented by its latest change, paths ranked by
    that record's similarity to ``state_query`` (the caller's L2-normalised view of the task and recent blocks;
    ties, or no query: more recent first); one block per pick."""
    latest: dict[str, int] = {}
    for index, feature in enumerate(features):
        for path in feature.edited_paths:
            latest[path] = index
    records = np.array(sorted(set(latest.values())), dtype=np.int64)
    if count <= 0 or records.size == 0:
        return []
    if state_query is None:
        scores = np.zeros(records.size)
    else:
        x = np.asarray(to_numpy(embeddings), dtype=np.float64)
        scores = x[records] @ np.asarray(to_numpy(state_query), dtype=np.float64)
    return [int(records[i]) for i in rank(scores, records)[:count]]


def error_blocks(features: Sequence[BlockFeatures], window: int, count: int) -> list[int]:
    """Up to ``count`` error blocks among the last ``window`` blocks, most recent first."""
    n = len(features)
    picks = [i for i in range(n - 1, max(n - window, 0) - 1, -1) if features[i].is_error]
    return picks[:count]


def source_blocks(features: Sequence[BlockFeatures], fraction: float, count: int) -> list[int]:
    """When source-like blocks are >= ``fraction`` of all blocks: the latest block of each distinct source,
    most recent first, up to ``count``; else none."""
    n = len(features)
    if n == 0 or count <= 0 or sum(f.is_source for f in features) < fraction * n:
        return []
    seen: set[str] = set()
    picks = []
    for i in range(n - 1, -1, -1):
        if features[i].is_source and not seen.issuperset(features[i].sources):
            picks.append(i)
            seen.update(features[i].sources)
            if len(picks) == count:
                break
    return picks


def reference_blocks(lexicons: Sequence[Lexicon] | None, window: int, count: int) -> list[int]:
    """Live references: for each of the last ``window`` blocks, latest first, the latest older block outside that
    window that holds a name its actions give (`Lexicon`): the block that defines what the recent actions use;
    distinct, up to ``count``; none without lexicons."""
    if not lexicons or count <= 0:
        return []
    n, picks = len(lexicons), []
    first = max(n - window, 0)
    for j in range(n - 1, first - 1, -1):
        names = lexicons[j].names
        holder = next((i for i in range(first - 1, -1, -1) if names.size and np.isin(lexicons[i].holds, names).any()),
                      None)
        if holder is not None and holder not in picks:
            picks.append(holder)
            if len(picks) == count:
                break
    return picks


def protect(features: Sequence[BlockFeatures], embeddings: Any, task_embedding: Any, state_query: Any,
            eligible: Any, config: EvidenceConfig | None = None,
            lexicons: Sequence[Lexicon] | None = None) -> dict[str, list[int]]:
    """Every rule's picks by rule name (keys: `RULES`); the caller unions them. Inputs are not modified."""
    cfg = config or EvidenceConfig()
    n = len(features)
    x = to_numpy(embeddings)
    if x.shape[0] != n:
        raise ValueError(f"{x.shape[0]} embeddings for {n} blocks")
    return {
        "recent": recent_blocks(n, cfg.recent),
        "goal": goal_blocks(x, task_embedding, eligible, cfg.goal),
        "state": state_blocks(features, x, state_query, cfg.state),
        "error": error_blocks(features, cfg.error_window, cfg.error),
        "source": source_blocks(features, cfg.source_fraction, cfg.source),
        "initial": initial_blocks(n, cfg.initial),
        "reference": reference_blocks(lexicons, cfg.reference_window, cfg.reference),
    }


def evidence_picks(features: Sequence[BlockFeatures], embeddings: np.ndarray, task_embedding: Any,
                   config: EvidenceConfig, lexicons: Sequence[Lexicon] | None = None) -> dict[str, list[int]]:
    """`protect` over every block with GEM's state query: the normalised sum of the recent window's mean
    embedding and the task embedding."""
    recent = embeddings[-config.recent:] if config.recent else embeddings[-1:]
    query = recent.mean(axis=0) + (task_embedding if task_embedding is not None else 0)
    norm = float(np.linalg.norm(query))
    state_query = query / norm if norm > 0 else None
    return protect(features, embeddings, task_embedding, state_query, np.ones(len(features), dtype=bool), config,
                   lexicons)


def rank(scores: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Positions ordered by score, highest first; equal scores: larger index (more recent) first."""
    return np.lexsort((-np.asarray(indices), -np.asarray(scores)))
