"""``gem train-router``: the listwise fit against an independent optimiser, determinism, the per-run draw, the
cross-family comparison against recency, and the command end to end on the bundled fixtures."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import FIXTURES, needs_extra

from gemkernels.compress.router import FEATURES, Router
from gemkernels.evaluate.router_training import (
    Sample,
    compare,
    cross_family,
    fit_listwise,
    newest_within,
    paired,
    router_keep,
    subsample,
    train,
)


def synthetic(n_runs: int = 12, seed: int = 0, families=("a", "b", "c")) -> list[Sample]:
    """Checkpoints whose labels are drawn from a known listwise model over random signals."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=len(FEATURES)) * 0.8
    out = []
    for r in range(n_runs):
        for t in range(18, 18 + int(rng.integers(2, 6))):
            x = rng.normal(size=(t, len(FEATURES)))
            p = np.exp(x @ truth)
            p /= p.sum()
            top3 = np.zeros(t, dtype=bool)
            top3[rng.choice(t, 3, replace=False, p=p)] = True
            referenced = np.zeros(t, dtype=bool)
            referenced[rng.choice(t, int(rng.integers(0, 3)), replace=False, p=p)] = True
            out.append(Sample(families[r % len(families)], f"run{r}", t, x, rng.integers(10, 500, t).astype(float),
                              top3, referenced))
    return out


def listwise_objective(w: np.ndarray, samples, head: str, l2: float) -> float:
    """The penalised negative log-likelihood the fit minimises, written out directly."""
    total, labelled = 0.0, 0
    for s in samples:
        y = getattr(s, head)
        if not y.any():
            continue
        z = s.signals @ w
        log_z = np.log(np.exp(z - z.max()).sum()) + z.max()
        total -= (z[y] - log_z).sum()
        labelled += int(y.sum())
    return total + 0.5 * l2 * labelled * float(w @ w)


@pytest.mark.parametrize("head", ["top3", "referenced"])
def test_the_listwise_fit_is_the_minimum_an_independent_optimiser_finds(head):
    optimize = pytest.importorskip("scipy.optimize")
    samples = synthetic()
    w = fit_listwise(samples, head, l2=1e-2)
    found = optimize.minimize(listwise_objective, np.zeros(len(FEATURES)), args=(samples, head, 1e-2),
                              method="BFGS", options={"gtol": 1e-9, "maxiter": 2000})
    assert listwise_objective(w, samples, head, 1e-2) <= found.fun + 1e-7
    assert np.allclose(w, found.x, atol=2e-3)


def test_training_is_deterministic_for_a_seed_and_the_draw_depends_on_it():
    samples = synthetic()
    a, b = train(samples, seed=1, max_per_run=2), train(samples, seed=1, max_per_run=2)
    assert all(np.array_equal(a.heads[h], b.heads[h]) for h in a.heads) and a.meta == b.meta
    drawn = [{(s.run, s.t) for s in subsample(samples, 2, seed)} for seed in (1, 2)]
    assert all(sum(run == "run0" for run, _ in d) == 2 for d in drawn) and drawn[0] != drawn[1]
    assert len(subsample(samples, None, 0)) == len(samples)
    with pytest.raises(ValueError, match="no checkpoints"):
        train([])


def test_router_keep_at_k_and_within_a_token_budget():
    tokens = np.array([100, 10, 10, 500, 10, 50, 50, 50, 50], dtype=float)
    scores = np.array([0.9, 0.5, 0.1, 0.95, 0.2, 0, 0, 0, 0])
    kept = router_keep(scores, tokens, 6, None)
    assert kept.sum() == 6 and kept[-4:].all() and kept[[3, 0]].all()  # the newest 4, then the two best scores
    budget = 260.0
    kept = router_keep(scores, tokens, None, budget)
    assert tokens[kept].sum() <= budget and kept[-4:].all()
    assert kept[[1, 2, 4]].all() and not kept[3]  # per token, the small blocks first; 500 tokens never fit
    assert newest_within(tokens, 110).tolist() == [False] * 7 + [True, True]


def test_paired_differences_and_their_standard_error():
    out = paired([0.1, 0.3, math.nan, 0.2])
    assert out["n"] == 3 and abs(out["delta"] - 0.2) < 1e-12 and abs(out["se"] - 0.1 / math.sqrt(3)) < 1e-12
    assert paired([])["n"] == 0


def test_a_router_that_knows_the_labels_beats_recency_and_cross_family_holds_each_family_out():
    samples = synthetic(n_runs=9)

    class Oracle(Router):
        def scores(self, signals):
            match = [s for s in samples if s.signals is signals][0]
            return match.top3 * 2.0 + match.referenced

    oracle = Oracle({}, {})
    out = compare(oracle, samples, (6,))
    assert out["k"]["6"]["top3"]["delta"] > 0 and out["k"]["6"]["top3"]["router"] > out["k"]["6"]["top3"]["recent"]
    report = cross_family(samples, ks=(6,))
    assert sorted(report) == ["a", "b", "c"]
    for family, result in report.items():
        assert result["k"]["6"]["checkpoints"] == sum(s.family == family for s in samples)


def test_train_router_command_writes_a_loadable_deterministic_file_and_the_cross_family_report(tmp_path):
    needs_extra("replay")
    from gemkernels.cli import main

    argv = [str(FIXTURES), "--encoder", "hash", "--min-blocks", "2", "--quiet", "--cache-dir", str(tmp_path / "c")]
    assert main(["train-router", *argv, "--out", str(tmp_path / "a.json"),
                 "--cross-family", str(tmp_path / "report")]) == 0
    assert main(["train-router", *argv, "--out", str(tmp_path / "b.json")]) == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    router = Router.load(tmp_path / "a.json")
    assert router.meta["checkpoints"] > 0 and set(router.heads) == {"top3", "referenced"}
    report = json.loads((tmp_path / "report" / "router_families.json").read_text())
    assert report and "| family |" in (tmp_path / "report" / "router_families.md").read_text()
