"""Selectors at the same K: exactly min(K, n) distinct blocks, GEM's priority cut, the baselines' definitions."""

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gemkernels.compress.evidence import BlockFeatures, EvidenceConfig  # noqa: E402
from gemkernels.compress.references import Lexicon, hashed  # noqa: E402
from gemkernels.evaluate.selectors import (  # noqa: E402
    SELECTORS,
    View,
    cosine_top_k,
    natural_budget,
    novelty_top_k,
    protected,
    recent_k,
    residual_completion,
)

E = np.eye(6, dtype=np.float32)


@st.composite
def views(draw):
    n = draw(st.integers(1, 24))
    d = draw(st.integers(2, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.normal(size=(n, d))
    copies = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=4))
    for src, dst in copies:  # exact duplicates: dependent rows the kernel cannot add
        x[dst] = x[src]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    features = tuple(BlockFeatures(edited_paths=(f"f{i % 3}.py",) if draw(st.booleans()) else (),
                                   is_error=draw(st.booleans())) for i in range(n))
    goal = x[draw(st.integers(0, n - 1))] if draw(st.booleans()) else None
    names = st.sets(st.sampled_from(["a.py", "b/c.py", "parse", "1234"]), max_size=3)
    lexicons = tuple(Lexicon(hashed(draw(names)), hashed(draw(names))) for _ in range(n))
    signatures = tuple(draw(st.integers(0, 3)) for _ in range(n))  # repeated calls: superseded blocks
    tokens = tuple(draw(st.integers(1, 5000)) for _ in range(n))
    chars = tuple(4 * t + draw(st.integers(0, 3)) for t in tokens)
    return View(x.astype(np.float32), features, goal, (draw(st.integers(0, 99)),), lexicons, signatures, tokens,
                chars, goal)


@settings(max_examples=60, deadline=None)
@given(views(), st.integers(1, 30))
def test_every_selector_returns_exactly_k_distinct_blocks(view, k):
    for name, selector in SELECTORS.items():
        picks = selector(view, k)
        assert picks.dtype == np.int64, name
        assert len(picks) == min(k, view.n) == len(set(picks.tolist())), name
        assert all(0 <= i < view.n for i in picks.tolist()), name


def view_with_evidence(n=12):
    """Block 2 edits a file, blocks 5 and 10 record errors, the task is block 1's direction."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 16))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    features = [BlockFeatures() for _ in range(n)]
    features[2] = BlockFeatures(edited_paths=("a.py",))
    features[5] = features[10] = BlockFeatures(is_error=True)
    return View(x, tuple(features), x[1].copy())


def test_protected_set_is_in_rule_priority_order():
    view = view_with_evidence()
    assert protected(view, EvidenceConfig()) == [11, 10, 9, 8, 1, 2, 5]  # recent, goal, state, error (10 again)


def test_gem_keeps_the_first_k_protected_blocks_when_they_exceed_k():
    view = view_with_evidence()
    assert SELECTORS["gem"](view, 5).tolist() == [1, 8, 9, 10, 11]  # the kernel returns protected rows ascending
    assert SELECTORS["gem"](view, 4).tolist() == [8, 9, 10, 11]
    assert SELECTORS["recent_goal"](view, 5).tolist() == [1, 8, 9, 10, 11]
    assert SELECTORS["gem"](view, 9)[:7].tolist() == [1, 2, 5, 8, 9, 10, 11]  # the kernel sorts the seeds
    assert set(SELECTORS["random_completion"](view, 9).tolist()) >= {1, 2, 5, 8, 9, 10, 11}


def test_residual_completion_pads_past_dependent_rows():
    x = E[[0, 0, 0, 1]]
    assert residual_completion(x, [], 3).tolist() == [0, 3, 1]
    assert residual_completion(x, [2], 2).tolist() == [2, 3]


def test_geometry_only_prefers_new_directions():
    x = E[[0, 0, 1, 1, 2]]
    assert sorted(SELECTORS["geometry"](View(x, (BlockFeatures(),) * 5, None), 3).tolist()) == [0, 2, 4]


def test_baselines():
    x = E[[0, 1, 0, 2, 1]]
    view = View(x, (BlockFeatures(),) * 5, E[1])
    assert recent_k(view, 2).tolist() == [3, 4]
    assert cosine_top_k(view, 3).tolist() == [4, 1, 3]  # ties: more recent first
    assert cosine_top_k(View(x, view.features, None), 2).tolist() == [4, 3]
    assert novelty_top_k(view, 3).tolist() == [3, 1, 0]  # repeats (blocks 2, 4) are not novel


def test_random_selectors_follow_the_seed():
    view = view_with_evidence(30)
    again = View(view.embeddings, view.features, view.goal, seed=view.seed)
    other = View(view.embeddings, view.features, view.goal, seed=(7,))
    for name in ("random", "random_completion"):
        assert SELECTORS[name](view, 10).tolist() == SELECTORS[name](again, 10).tolist()
        assert SELECTORS[name](view, 10).tolist() != SELECTORS[name](other, 10).tolist()


def test_natural_budget_stops_at_tau_or_capacity():
    x = E[[0, 1, 2, 3, 4, 5, 0, 1, 2, 3]]
    view = View(x, (BlockFeatures(),) * 10, None)
    assert natural_budget(view, 0.5, None).tolist() == [6, 7, 8, 9]  # the recent four already cover 0.8
    assert natural_budget(view, 0.9, None).tolist() == [6, 7, 8, 9, 4]
    assert natural_budget(view, 0.95, None).tolist() == [6, 7, 8, 9, 4, 5]
    assert natural_budget(view, 0.95, 5).tolist() == [6, 7, 8, 9, 4]  # K_t = max(5, |P|)
    assert natural_budget(view, 0.95, 2).tolist() == [6, 7, 8, 9]  # protected blocks are never dropped
