"""The online policy's decisions (DESIGN.md §3, §4): whether a request reselects globally or appends to the
session's saved forwarded set, and the cost model that says when a rewrite repays its prompt-cache miss."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from gemkernels.compress.config import GEMConfig
from gemkernels.compress.sessions import SessionState


def ceiling_drops(forwarded: set[int], sizes: Sequence[int], fixed: int, core: Sequence[int], seeds: Sequence[int],
                  ceiling: int) -> list[int]:
    """The blocks to drop from ``forwarded``, in order, so that their tokens (``sizes``) plus ``fixed`` (the
    messages outside blocks) fit ``ceiling``: oldest first outside ``core``, then in it outside ``seeds``, then
    ``seeds``; never the newest block. As many as it takes, or every other block when that is not enough."""
    total = fixed + sum(sizes[b] for b in forwarded)
    if total <= ceiling:
        return []
    in_core, protected, newest = set(core), set(seeds), len(sizes) - 1
    drops = []
    for b in sorted(forwarded - {newest}, key=lambda b: (b in protected, b in in_core, b)):
        if total <= ceiling:
            break
        drops.append(b)
        total -= sizes[b]
    return drops


def budget_reason(appended: set[int], sizes: Sequence[int], cfg: GEMConfig) -> str | None:
    """Why appending would pass a budget (``rewrite_above_blocks`` or ``rewrite_above_tokens``), or None."""
    if cfg.rewrite_above_blocks is not None and len(appended) > cfg.rewrite_above_blocks:
        return f"{len(appended)} forwarded blocks would pass the budget of {cfg.rewrite_above_blocks}"
    tokens = sum(sizes[b] for b in appended)
    if cfg.rewrite_above_tokens is not None and tokens > cfg.rewrite_above_tokens:
        return f"{tokens} forwarded block tokens would pass the budget of {cfg.rewrite_above_tokens}"
    return None


def guard_reason(forwarded: set[int], block_chars: Sequence[int], total: int, delta: float) -> str | None:
    """Why forwarding only ``forwarded`` would break the guard (DESIGN.md §2.6): the request would keep less than
    ``1 - delta`` of its ``total`` characters (``block_chars``: each block's), as a saved forwarded set can once the
    client shortens messages outside blocks; or None."""
    if delta >= 1.0:  # no floor: nothing to add up
        return None
    kept = total - sum(chars for b, chars in enumerate(block_chars) if b not in forwarded)
    if kept >= (1.0 - delta) * total:
        return None
    return f"the saved forwarded set would keep {kept} of {total} characters, less than 1 - delta = {1.0 - delta:g}"


class RewriteCost(NamedTuple):
    """A rewrite under the cost model of `GEMConfig`: tokens it drops from every call, what that saves over the
    expected remaining calls, the cache miss it pays once, and the per-call saving worth a rewrite."""

    dropped: float
    saving: float
    miss: float
    gap: float
    remaining: float

    @property
    def repays(self) -> bool | np.ndarray:
        """The saving outweighs the miss, and the per-call saving has reached the renewal gap (element-wise for
        terms that are arrays: many candidate rewrites at once)."""
        return np.logical_and(self.saving > self.miss, self.dropped >= self.gap)


def rewrite_cost(dropped: float, resent: float, blocks: int, tokens: int, cfg: GEMConfig) -> RewriteCost:
    """The cost terms of a rewrite that drops ``dropped`` tokens a call and re-sends ``resent`` uncached once, in
    a history of ``blocks`` blocks holding ``tokens`` tokens (``cfg.repay_factor`` set)."""
    c, u = cfg.cached_price, cfg.uncached_price
    remaining = cfg.repay_factor * blocks
    return RewriteCost(dropped, saving=c * dropped * (remaining + 1), miss=(u - c) * resent,
                       gap=renewal_gap(resent, tokens / blocks, c, u), remaining=remaining)


def repay_reason(appended: set[int], kept: set[int], sizes: Sequence[int], cfg: GEMConfig) -> str | None:
    """Why a rewrite to ``kept`` is due under the cost model of `GEMConfig`, or None.

    Due when the rewrite repays itself within the expected remaining calls (the dropped tokens, cached, on
    this call and the R = ``repay_factor`` x blocks to come, outweigh the kept tokens from the first changed
    block on, sent uncached once) and the per-call saving has reached `renewal_gap` (rewriting sooner would
    pay the miss more often than it saves)."""
    changed = appended ^ kept
    if not changed or cfg.repay_factor is None:
        return None
    first = min(changed)
    dropped = sum(sizes[b] for b in appended) - sum(sizes[b] for b in kept)
    cost = rewrite_cost(dropped, sum(sizes[b] for b in kept if b >= first), len(sizes), sum(sizes), cfg)
    if not cost.repays:
        return None
    return (f"rewrite repays: saves {cost.saving:.0f} over {cost.remaining:.0f} expected calls, misses "
            f"{cost.miss:.0f} once; {dropped} tokens dropped per call, past the renewal gap of {cost.gap:.0f}")


def could_repay(appended: set[int], least_kept: int, sizes: Sequence[int], cfg: GEMConfig) -> bool:
    """Whether some rewrite that keeps the newest ``evidence.recent`` blocks and at least ``least_kept`` tokens
    (`least_core_tokens`) could pass `repay_reason`, so that the selection runs only when a rewrite might be due.

    For each block f older than the newest that could be the rewrite's first change: the blocks before f are
    forwarded as appended, so the rewrite drops D = A(>= f) - K(>= f) tokens and re-sends K(>= f), the kept tokens
    from f on, which are at least the newest blocks' and at least ``least_kept`` - A(< f). The saving grows with D,
    the miss and the gap with what is re-sent: if no f repays with the fewest re-sent, no rewrite can (DESIGN.md
    §4). (A first change among the newest blocks, all kept, drops nothing.)"""
    if cfg.repay_factor is None or not sizes:
        return False
    blocks = len(sizes)
    newest = max(0, blocks - cfg.evidence.recent)
    if not newest:
        return False
    tokens = np.asarray(sizes, dtype=np.float64)
    forwarded = np.zeros(blocks, dtype=bool)
    forwarded[np.fromiter(appended, dtype=np.int64, count=len(appended))] = True
    appended_tokens = np.where(forwarded, tokens, 0.0)
    after = np.cumsum(appended_tokens[::-1])[::-1][:newest]  # A(>= f) for each f older than the newest blocks
    resent = np.maximum(tokens[newest:].sum(), least_kept - (appended_tokens.sum() - after))  # A(< f) = F - A(>= f)
    return bool(np.any(rewrite_cost(after - resent, resent, blocks, tokens.sum(), cfg).repays))


def rewrite_core(order: Sequence[int], num_protected: int, sizes: Sequence[int], cfg: GEMConfig) -> list[int]:
    """The core a rewrite keeps from a ranking ``order`` whose first ``num_protected`` blocks are the protected
    ones: with ``keep_recent_size``, those, then each next block that still fits the tokens of the newest ``k``
    blocks; else the first ``max(k, num_protected)``."""
    if not cfg.keep_recent_size:
        return list(order[:max(cfg.k, num_protected)])
    core = list(order[:num_protected])
    room = sum(sizes[max(0, len(sizes) - cfg.k):]) - sum(sizes[b] for b in core)
    for b in order[num_protected:]:
        if sizes[b] <= room:
            core.append(b)
            room -= sizes[b]
    return core


def least_core_tokens(sizes: Sequence[int], seeds: Sequence[int], eligible: np.ndarray | None,
                      cfg: GEMConfig) -> int:
    """The fewest tokens `rewrite_core` can keep whatever the ranking, known before one runs: the protected
    ``seeds``', plus, when every ``eligible`` block is ranked (router or retrieval ranking; a geometric selection may
    stop at tau after the seeds), what its fill cannot leave out (DESIGN.md §4)."""
    tokens = np.asarray(sizes, dtype=np.int64)
    candidate = np.ones(len(tokens), dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool).copy()
    protected = np.unique(np.asarray(seeds, dtype=np.int64))
    candidate[protected] = False
    least = int(tokens[protected].sum())
    if cfg.ranking == "geometry":
        return least
    others = np.sort(tokens[candidate])
    if not cfg.keep_recent_size:  # the k first hold at least the smallest candidates
        return least + int(others[:max(0, cfg.k - len(protected))].sum())
    room = int(tokens[max(0, len(tokens) - cfg.k):].sum()) - least
    if room <= 0 or int(others.sum()) <= room:  # nothing fits, or everything does
        return least + (int(others.sum()) if room > 0 else 0)
    # Some candidate was passed over, larger than the room r the fill leaves; every candidate no larger than r fit
    # when it came (the room only shrinks), so r + their tokens <= room. The largest such r bounds what is left:
    # for r in [the candidate before, this candidate), the candidates before it taken (sizes ascending).
    taken = np.cumsum(others) - others
    below = np.concatenate(([0], others[:-1]))
    possible = room - taken >= below
    most_left = int(np.minimum(others, room - taken)[possible].max(initial=0))
    return least + room - most_left


def renewal_gap(resent: float, per_call: float, cached_price: float, uncached_price: float = 1.0) -> float:
    """The per-call saving at which rewriting is cheapest over a long run: a context that grows by
    ``per_call`` tokens a call and is cut back every g calls, re-sending ``resent`` tokens uncached (u) instead
    of cached (c) each time, costs c (K + per_call (g + 1) / 2) + (u - c) resent / g a call, least at
    g* = sqrt(2 (u - c) resent / (c per_call)); the saving then is g* per_call."""
    if cached_price <= 0:
        return math.inf
    return np.sqrt(2 * (uncached_price - cached_price) * resent * per_call / cached_price)


def reselection_reason(state: SessionState | None, keys: tuple[str, ...], goal: str, cfg: GEMConfig) -> str | None:
    """Why this request needs a global selection, or None to append to the saved forwarded set (a budgeted
    session starts from the full history, so its first eligible request appends)."""
    every = cfg.reselect_every
    if state is None:
        return None if cfg.budgeted else "first eligible request of the session"
    if goal != state.goal and cfg.reselect_on_goal_change:
        return "goal changed"
    if keys[:len(state.block_keys)] != state.block_keys:
        return "history is not an extension of the last request"
    if len(keys) - state.blocks_at_selection >= every:
        return f"{len(keys) - state.blocks_at_selection} new blocks since the last selection (every {every})"
    return None
