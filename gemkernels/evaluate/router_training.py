"""``gem train-router``: fit the keep/ready router (`gemkernels.compress.router`) on recorded runs, and measure it
on agent families it was not trained on.

Samples: at every replay checkpoint t of a run (history ``blocks[:t]``, next action ``blocks[t]``, as `gem
replay`), each history block's signals (`router.request_features`, what GEM computes at a rewrite, with the task
GEM reads from the request, not the run's recorded goal, which a proxy never sees) with two labels
from the recorded future: the block is among the next action's three most similar blocks (``top3``), and the
next action names something it holds (``referenced``, `retention.referenced_blocks`). At most
``max_per_run`` checkpoints a run (drawn with the seed), so that long runs do not outweigh the others.

Fit: one listwise head per label (`fit_listwise`: which blocks of a checkpoint carry the label, a softmax over them)
on the signals as they are, by Newton's method from zero for a fixed number of steps: deterministic for a seed and
the same runs. Listwise, because a rewrite ranks the blocks of one request against each other: a pointwise
logistic head spends itself on what differs between checkpoints (measured in docs/router.md).

Cross-family check (``--cross-family``): for each agent family, a router trained on the other families keeps
blocks on that family's checkpoints, against recency: at the same K (the newest ``RECENT`` blocks, then by
score; against the newest K) and at the same tokens (the newest ``RECENT``, then by score per
token while they fit the tokens of the newest ``BUDGET_BLOCKS``; against the newest blocks of those
tokens); paired differences per checkpoint, with their standard errors.
"""

from __future__ import annotations

import math
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gemkernels.compress.evidence import block_features
from gemkernels.compress.references import block_lexicon
from gemkernels.compress.representation import block_text
from gemkernels.compress.router import FEATURES, Router, call_signature, request_features
from gemkernels.compress.router.ranking import router_order
from gemkernels.evaluate.replay import RunJob
from gemkernels.evaluate.retention import action_references, block_words, nearest, referenced_blocks

HEADS = ("top3", "referenced")
RECENT = 4
BUDGET_BLOCKS = 15
SIZE_POWER = 1.0
DEFAULT_KS = (8, 12, 16, 20)

@dataclass(frozen=True)
class Sample:
    """One checkpoint: the history blocks' signals (t, len(FEATURES)), tokens, and labels."""

    family: str
    run: str
    t: int
    signals: np.ndarray
    tokens: np.ndarray
    top3: np.ndarray
    referenced: np.ndarray

    @property
    def names_any(self) -> bool:
        """Whether the next action names an earlier block (the referenced metric is defined)."""
        return bool(self.referenced.any())

def run_samples(job: RunJob) -> list[Sample]:
    """A `Sample` for every checkpoint of one replay job."""
    blocks = job.blocks
    lexicons = [block_lexicon(b, block_text(b)) for b in blocks]
    signatures = [call_signature(b) for b in blocks]
    features = [block_features(b) for b in blocks]
    texts = [block_text(b, sys.maxsize) for b in blocks]
    words = [block_words(t) for t in texts]
    tokens = np.asarray(job.tokens, dtype=np.float64)
    out = []
    for c, t in enumerate(job.checkpoints):
        task = job.tasks[c] if np.isfinite(job.tasks[c]).all() else None  # what GEM reads at serving, not run.goal
        x = job.embeddings[:t]
        signals = request_features(lexicons[:t], signatures[:t], features[:t], job.chars[:t], x, task)
        top3 = np.zeros(t, dtype=bool)
        top3[nearest(x, job.actions[c], 3)] = True
        referenced = np.zeros(t, dtype=bool)
        referenced[referenced_blocks(action_references(blocks[t]), texts[:t], words[:t])] = True
        out.append(Sample(job.format, job.name, t, signals, tokens[:t].copy(), top3, referenced))
    return out

def subsample(samples: Sequence[Sample], max_per_run: int | None, seed: int) -> list[Sample]:
    """At most ``max_per_run`` checkpoints of each run, drawn without replacement by ``seed`` and the run's name."""
    by_run: dict[str, list[Sample]] = {}
    for s in samples:
        by_run.setdefault(s.run, []).append(s)
    out = []
    for run, items in sorted(by_run.items()):
        if max_per_run is not None and len(items) > max_per_run:
            rng = np.random.default_rng([seed, zlib.crc32(run.encode())])
            items = [items[i] for i in sorted(rng.choice(len(items), max_per_run, replace=False))]
        out += items
    return out

def fit_listwise(samples: Sequence[Sample], head: str, l2: float, steps: int = 20) -> np.ndarray:
    """Weights of a listwise (conditional logit) head: at each checkpoint, softmax(signals @ w) over its blocks is
    the probability that a block is one of the labelled ones; maximises the labelled blocks' log-probability with
    an L2 penalty (per labelled block) by ``steps`` Newton steps from zero. Checkpoints without a label add
    nothing (none at all: zero weights, every block alike); a signal that is the same for every block of a
    checkpoint cancels out."""
    data = [(s.signals, getattr(s, head)) for s in samples if getattr(s, head).any()]
    dim = len(FEATURES) if not samples else samples[0].signals.shape[1]
    w = np.zeros(dim)
    labelled = sum(int(y.sum()) for _, y in data)
    for _ in range(steps):
        grad = l2 * labelled * w
        hess = (l2 * labelled + 1e-9) * np.eye(dim)
        for x, y in data:
            z = x @ w
            p = np.exp(z - z.max())
            p /= p.sum()
            m, mean = int(y.sum()), p @ x
            grad += m * mean - x[y].sum(axis=0)
            hess += m * ((x * p[:, None]).T @ x - np.outer(mean, mean))
        w = w - np.linalg.solve(hess, grad)
    return w

def train(samples: Sequence[Sample], seed: int = 0, max_per_run: int | None = None, l2: float = 1e-3,
          meta: dict[str, Any] | None = None) -> Router:
    """A `Router` fitted on ``samples`` (subsampled per run, `subsample`); ``meta`` is stored with it."""
    chosen = subsample(samples, max_per_run, seed)
    if not chosen:
        raise ValueError("no checkpoints to train on: the runs need more blocks than --min-blocks")

    heads = {h: fit_listwise(chosen, h, l2) for h in HEADS}
    families: dict[str, int] = {}
    for run, family in sorted({(s.run, s.family) for s in chosen}):
        families[family] = families.get(family, 0) + 1
    info = {"seed": seed, "max_per_run": max_per_run, "l2": l2, "checkpoints": len(chosen),
            "rows": sum(s.t for s in chosen), "runs_per_family": families, **(meta or {})}
    return Router(heads, info, FEATURES)

# --------------------------------------------------------------------------- cross-family evaluation

def newest_within(tokens: np.ndarray, budget: float) -> np.ndarray:
    """A mask of the newest blocks whose tokens add up to at most ``budget``."""
    kept = np.zeros(len(tokens), dtype=bool)
    total = 0.0
    for b in range(len(tokens) - 1, -1, -1):
        total += tokens[b]
        if total > budget:
            break
        kept[b] = True
    return kept

def router_keep(scores: np.ndarray, tokens: np.ndarray, k: int | None, budget: float | None) -> np.ndarray:
    """What a router-ranked selection keeps: the newest `RECENT` blocks, then by score (exactly ``k`` blocks), or by
    score / tokens ** `SIZE_POWER` while they fit ``budget`` tokens."""
    n = len(tokens)
    seeds = list(range(max(0, n - RECENT), n))
    order = router_order(scores, tokens, seeds, None, SIZE_POWER if budget is not None else 0.0)
    kept = np.zeros(n, dtype=bool)
    if k is not None:
        kept[order[:k]] = True
        return kept
    room = budget - tokens[seeds].sum()
    kept[seeds] = True
    for b in order[len(seeds):]:
        if tokens[b] <= room:
            kept[b] = True
            room -= tokens[b]
    return kept

def retained(kept: np.ndarray, sample: Sample, weighted: bool = False) -> tuple[float, float]:
    """(Top-3, referenced) retention of a kept mask, as the fraction of those blocks kept or (``weighted``) of their
    tokens; referenced is nan when the action names no block."""
    def share(labels: np.ndarray) -> float:
        if weighted:
            return float(sample.tokens[kept & labels].sum() / max(sample.tokens[labels].sum(), 1e-9))
        return float(kept[labels].mean())
    return share(sample.top3), share(sample.referenced) if sample.names_any else math.nan

def paired(deltas: Sequence[float]) -> dict[str, float]:
    """Mean of the defined paired differences, its standard error, and how many."""
    d = np.asarray([v for v in deltas if not math.isnan(v)])
    if d.size == 0:
        return {"delta": math.nan, "se": math.nan, "n": 0}
    return {"delta": float(d.mean()), "se": float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else math.nan,
            "n": int(d.size)}

def compare(router: Router, samples: Sequence[Sample], ks: Sequence[int]) -> dict[str, Any]:
    """The router against recency on ``samples``: at each K (checkpoints with t > K) and at the same tokens."""
    out: dict[str, Any] = {"k": {}, "tokens": {}}
    scores = [router.scores(s.signals) for s in samples]
    for k in ks:
        rows = []
        for s, sc in zip(samples, scores):
            if s.t > k:
                recent = np.zeros(s.t, dtype=bool)
                recent[-k:] = True
                rows.append((retained(router_keep(sc, s.tokens, k, None), s), retained(recent, s)))
        out["k"][str(k)] = summary(rows)
    rows = []
    for s, sc in zip(samples, scores):
        if s.t > BUDGET_BLOCKS:
            budget = float(s.tokens[-BUDGET_BLOCKS:].sum())
            kept = router_keep(sc, s.tokens, None, budget)
            recent = newest_within(s.tokens, budget)
            rows.append((retained(kept, s), retained(recent, s), int(kept.sum()), int(recent.sum()),
                         retained(kept, s, weighted=True), retained(recent, s, weighted=True)))
    out["tokens"] = summary([r[:2] for r in rows])
    out["tokens_weighted"] = summary([r[4:] for r in rows])
    if rows:
        out["tokens"]["blocks_router"] = float(np.mean([r[2] for r in rows]))
        out["tokens"]["blocks_recent"] = float(np.mean([r[3] for r in rows]))
    return out

def summary(rows: Sequence[tuple[tuple[float, float], tuple[float, float]]]) -> dict[str, Any]:
    """Means of (router, recent) retention and their paired differences, per metric."""
    out: dict[str, Any] = {"checkpoints": len(rows)}
    for m, name in enumerate(HEADS):
        pairs = [(a[m], b[m]) for a, b in rows if not math.isnan(a[m])]
        out[name] = {"router": float(np.mean([a for a, _ in pairs])) if pairs else math.nan,
                     "recent": float(np.mean([b for _, b in pairs])) if pairs else math.nan,
                     **paired([a - b for a, b in pairs])}
    return out

def cross_family(samples: Sequence[Sample], ks: Sequence[int] = DEFAULT_KS, seed: int = 0,
                 max_per_run: int | None = None, l2: float = 1e-3) -> dict[str, Any]:
    """Per family: a router trained on every other family, compared with recency on this family's checkpoints."""
    families = sorted({s.family for s in samples})
    out = {}
    for family in families:
        train_on = [s for s in samples if s.family != family]
        if not train_on:
            continue
        router = train(train_on, seed, max_per_run, l2)
        out[family] = compare(router, [s for s in samples if s.family == family], ks)
    return out

def cell(stats: dict[str, Any], metric: str) -> str:
    """``0.612 vs 0.580: +0.032 ± 0.010``."""
    m = stats.get(metric, {})
    if not m or m.get("n", 0) == 0:
        return "–"
    return f"{m['router']:.3f} vs {m['recent']:.3f}: {m['delta']:+.3f} ± {m['se']:.3f}"

def markdown(report: dict[str, Any]) -> str:
    """The cross-family tables: per held-out family, at each K and at the same tokens."""
    lines = ["# Router across agent families", "",
             "Each family's checkpoints, scored by a router trained on the other families only. Cells: router vs "
             "recency, paired difference ± standard error over checkpoints. Same K: the newest "
             f"{RECENT} blocks then by score, against the newest K. Same tokens: the newest {RECENT} "
             f"then by score per token^{SIZE_POWER} within the tokens of the newest {BUDGET_BLOCKS} blocks, "
             "against the newest blocks of those tokens; also as the share of the labelled blocks' tokens kept "
             "(the router keeps more, smaller blocks: a large block counts for its size there).", ""]
    for metric in HEADS:
        ks = sorted({k for fam in report.values() for k in fam["k"]}, key=int)
        header = " | ".join(f"K={k}" for k in ks)
        lines += [f"## {metric}", "", f"| family | {header} | same tokens | same tokens, share of their tokens "
                  "| blocks kept (router / recent) |", "|---|" + "---|" * (len(ks) + 3)]
        for family, fam in report.items():
            t = fam["tokens"]
            blocks = f"{t['blocks_router']:.1f} / {t['blocks_recent']:.1f}" if "blocks_router" in t else "–"
            lines.append(f"| {family} | " + " | ".join(cell(fam["k"][k], metric) for k in ks)
                         + f" | {cell(t, metric)} | {cell(fam['tokens_weighted'], metric)} | {blocks} |")
        lines.append("")
    return "\n".join(lines)
