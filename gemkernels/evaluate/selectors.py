"""Block selectors compared at the same retained count K (paper appendix D.1-D.3), and GEM at its natural budget.

A selector sees only a checkpoint's `View` (the history's block embeddings and evidence features,
the task embedding, a seed) and returns exactly ``min(K, n)`` distinct block indices. GEM keeps its
protected set and completes it by largest residual; when the protected set alone exceeds K it keeps
the first K in rule priority order: recent (newest first), goal, state, error, source, initial, reference,
each rule in its own priority order, duplicates counted once.

Issue 22's variants: ``router`` (the newest 4 blocks, then by the shipped router's score), ``retrieval`` (the
newest 4, then by the largest cosine to the last three blocks), ``superseded`` (GEM whose completion skips blocks
a newer one supersedes) and ``references`` (GEM with the live-reference rule protecting 2 blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from gemkernels.compress.evidence import RULES, BlockFeatures, EvidenceConfig, evidence_picks, rank
from gemkernels.compress.references import Lexicon
from gemkernels.compress.router import default_router, request_features
from gemkernels.compress.router.features import superseded
from gemkernels.compress.router.ranking import retrieval_scores, router_order
from gemkernels.select.api import select

ROUTER_RECENT = 4  # the ranked selectors keep the newest 4 blocks first, as the cache-aware preset does


@dataclass(frozen=True)
class View:
    """What a selector may see at a checkpoint: unit block embeddings (n, d), their evidence features,
    the task embedding (None without task text), a seed for the random selectors, and what the router reads per
    block (`Lexicon`, call signature, tokens, serialised characters) with the task GEM itself would read."""

    embeddings: np.ndarray
    features: tuple[BlockFeatures, ...]
    goal: np.ndarray | None
    seed: tuple[int, ...] = (0,)
    lexicons: tuple[Lexicon, ...] = ()
    signatures: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    chars: tuple[int, ...] = ()
    task: np.ndarray | None = None  # the task GEM reads from the request (the router's), None: no task text
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)  # protected sets, signals

    def signals(self) -> np.ndarray:
        """The router's signals of these blocks (`router.request_features`), computed once per view."""
        if "signals" not in self.memo:
            self.memo["signals"] = request_features(self.lexicons, self.signatures, self.features, self.chars,
                                                    self.embeddings, self.task)
        return self.memo["signals"]

    @property
    def n(self) -> int:
        return int(self.embeddings.shape[0])

    def rng(self, k: int) -> np.random.Generator:
        """A generator determined by the seed and K alone."""
        return np.random.default_rng([*self.seed, k])


Selector = Callable[[View, int], np.ndarray]


def protected(view: View, config: EvidenceConfig) -> list[int]:
    """The deduplicated protected set in rule priority order (see the module docstring), computed once per view."""
    if config not in view.memo:
        picks = evidence_picks(view.features, view.embeddings, view.goal, config, view.lexicons or None)
        view.memo[config] = list(dict.fromkeys(b for rule in RULES for b in picks[rule]))
    return view.memo[config]


def residual_completion(x: np.ndarray, seeds: list[int], k: int) -> np.ndarray:
    """``seeds`` (cut to the first k) completed to exactly ``min(k, n)`` blocks by largest residual; once no
    independent block is left, by largest final residual, then lowest index."""
    k = min(k, x.shape[0])
    sel = select(x, protected=seeds[:k], tau=1.0, k=k, backend="numpy")
    chosen = [int(i) for i in sel.indices]
    if len(chosen) < k:
        rest = np.setdiff1d(np.arange(x.shape[0]), chosen)
        order = rest[np.argsort(-np.asarray(sel.residuals)[rest], kind="stable")]
        chosen += [int(i) for i in order[:k - len(chosen)]]
    return np.asarray(chosen, dtype=np.int64)


def evidence_selector(config: EvidenceConfig, view: View, k: int) -> np.ndarray:
    """GEM at exactly K: protected evidence first, then residual completion."""
    return residual_completion(view.embeddings, protected(view, config), k)


def random_completion(view: View, k: int) -> np.ndarray:
    """GEM's protected set, the remaining slots filled by seeded random sampling (paper D.2, random completion)."""
    seeds = protected(view, EvidenceConfig())[:k]
    rest = np.setdiff1d(np.arange(view.n), seeds)
    fill = view.rng(k).choice(rest, size=min(k, view.n) - len(seeds), replace=False)
    return np.concatenate([np.asarray(seeds, dtype=np.int64), fill.astype(np.int64)])


def recent_k(view: View, k: int) -> np.ndarray:
    """The last K blocks."""
    return np.arange(max(view.n - k, 0), view.n, dtype=np.int64)


def random_k(view: View, k: int) -> np.ndarray:
    """K blocks drawn uniformly without replacement (seeded)."""
    return np.sort(view.rng(k).choice(view.n, size=min(k, view.n), replace=False)).astype(np.int64)


def cosine_top_k(view: View, k: int) -> np.ndarray:
    """The K blocks most similar to the task (ties, or no task: more recent first)."""
    scores = view.embeddings @ view.goal if view.goal is not None else np.zeros(view.n)
    return rank(np.asarray(scores, dtype=np.float64), np.arange(view.n))[:k].astype(np.int64)


def novelty_top_k(view: View, k: int) -> np.ndarray:
    """The K blocks that were most novel when they arrived: 1 - max cosine to any earlier block (the first
    block scores 1; ties: more recent first)."""
    x = np.asarray(view.embeddings, dtype=np.float64)
    earlier = np.tril(np.ones((view.n, view.n), dtype=bool), k=-1)
    closest = np.where(earlier, x @ x.T, -np.inf).max(axis=1)
    novelty = np.where(np.isfinite(closest), 1 - closest, 1.0)
    return rank(novelty, np.arange(view.n))[:k].astype(np.int64)


def superseded_completion(view: View, k: int) -> np.ndarray:
    """GEM at exactly K with superseded blocks (a newer block repeats their calls) never completion candidates;
    filled by recency once no other candidate is left."""
    stale = superseded(view.signatures)
    seeds = protected(view, EvidenceConfig())[:k]
    sel = select(view.embeddings, protected=seeds, eligible=~stale, tau=1.0, k=min(k, view.n), backend="numpy")
    chosen = [int(i) for i in sel.indices]
    rest = [b for b in range(view.n - 1, -1, -1) if b not in set(chosen)]
    return np.asarray(chosen + rest[:min(k, view.n) - len(chosen)], dtype=np.int64)


def ranked(scores: Callable[[View], np.ndarray], view: View, k: int) -> np.ndarray:
    """The newest `ROUTER_RECENT` blocks, then the others by ``scores(view)``, highest first: exactly K."""
    seeds = list(range(max(0, view.n - ROUTER_RECENT), view.n))
    order = router_order(scores(view), view.tokens or [1] * view.n, seeds, None, 0.0)
    return np.asarray(order[:k], dtype=np.int64)


def natural_budget(view: View, tau: float, k: int | None) -> np.ndarray:
    """GEM as deployed: the whole protected set, completed until E(B) >= tau or K_t = max(k, |P|) blocks
    (``k=None``: until tau or no independent block is left)."""
    sel = select(view.embeddings, protected=protected(view, EvidenceConfig()), tau=tau,
                 k=view.n if k is None else k, backend="numpy")
    return np.asarray(sel.indices, dtype=np.int64)


SELECTORS: dict[str, Selector] = {
    "gem": partial(evidence_selector, EvidenceConfig()),
    "geometry": partial(evidence_selector, EvidenceConfig(recent=0, goal=0, state=0, error=0, source=0)),
    "random_completion": random_completion,
    "recent": recent_k,
    "random": random_k,
    "cosine": cosine_top_k,
    "novelty": novelty_top_k,
    "no_state": partial(evidence_selector, EvidenceConfig(state=0)),
    "no_error": partial(evidence_selector, EvidenceConfig(error=0)),
    "recent_goal": partial(evidence_selector, EvidenceConfig(state=0, error=0, source=0)),
    "router": partial(ranked, lambda view: default_router().scores(view.signals())),
    "retrieval": partial(ranked, lambda view: retrieval_scores(view.embeddings)),
    "superseded": superseded_completion,
    "references": partial(evidence_selector, EvidenceConfig(reference=2)),
}
LABELS = {
    "gem": "GEM", "geometry": "Geometry only", "random_completion": "Random completion", "recent": "Recent-K",
    "random": "Random-K", "cosine": "Cosine Top-K", "novelty": "Novelty Top-K", "no_state": "Without State",
    "no_error": "Without Error", "recent_goal": "Recent + Goal only", "router": "Router",
    "retrieval": "Retrieval", "superseded": "GEM, superseded dropped", "references": "GEM + live references",
}
