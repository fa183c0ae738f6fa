"""gemkernels.evaluate.analysis and gem analyze on constructed data with known answers."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

pytest.importorskip("scipy")
from helpers import FIXTURES, needs_extra  # noqa: E402

from gemkernels.cli import analyze as analyze_cli  # noqa: E402
from gemkernels.evaluate import analysis  # noqa: E402
from gemkernels.evaluate.analysis import Subspace, Tolerance  # noqa: E402
from gemkernels.evaluate.retention import nearest  # noqa: E402


def unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def rank_r(n: int, d: int, r: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, r)) @ rng.standard_normal((r, d))


@pytest.mark.parametrize("r", [1, 3, 7])
def test_rank_r_matrix_has_effective_rank_and_r90_at_most_r(r):
    x = rank_r(30, 64, r, seed=r)
    eff, r90, frac = analysis.batched_stats([x])[0]
    assert eff <= r + 1e-9 and r90 <= r and frac == pytest.approx(r90 / 30)


def test_equal_energy_directions_have_known_statistics():
    # centred rows +-e_1, ..., +-e_4: four equal singular values -> effective rank 4, r_0.9 = 4
    x = np.concatenate([np.eye(4), -np.eye(4)])
    assert analysis.batched_stats([x])[0] == pytest.approx([4.0, 4.0, 0.5])


def test_batched_stats_match_one_by_one_and_mixed_shapes():
    xs = [rank_r(12, 20, 5, 0), rank_r(12, 20, 2, 1), rank_r(9, 20, 4, 2)]
    batched = analysis.batched_stats(xs)
    single = np.stack([analysis.spectral_stats(analysis.centred_energies(x), len(x)) for x in xs])
    assert batched == pytest.approx(single)


def test_feature_shift_keeps_each_column_multiset_and_breaks_alignment():
    x = unit_rows(rank_r(25, 40, 2, 3))
    shifted = analysis.feature_shift(x, np.random.default_rng(0))
    assert np.array_equal(np.sort(shifted, axis=0), np.sort(x, axis=0))
    assert not np.allclose(shifted, x)
    real, control = analysis.batched_stats([x, shifted])[:, 0]
    assert real < control


def test_gaussian_control_is_standard_normal_of_the_shape():
    x = np.ones((400, 500))
    g = analysis.gaussian_like(x, np.random.default_rng(0))
    assert g.shape == x.shape and abs(g.mean()) < 0.01 and abs(g.std() - 1) < 0.01
    assert np.array_equal(g, analysis.gaussian_like(x, np.random.default_rng(0)))  # the seed fixes it
    assert not np.array_equal(g, analysis.gaussian_like(x, np.random.default_rng(1)))


def test_spectral_comparison_is_deterministic_for_a_seed():
    xs = [unit_rows(rank_r(20, 32, 3, s)) for s in range(4)]
    first, again = analysis.spectral_comparison(xs, seed=5), analysis.spectral_comparison(xs, seed=5)
    assert first.shape == (4, 3, 3) and np.array_equal(first, again)
    assert not np.array_equal(first, analysis.spectral_comparison(xs, seed=6))


def test_holm_adjustment():
    assert analysis.holm([0.01, 0.04, 0.03, np.nan]) == pytest.approx([0.03, 0.06, 0.06, np.nan], nan_ok=True)


def test_paired_tests_detect_a_consistent_shift():
    rng = np.random.default_rng(0)
    tests = analysis.paired_tests(["low", "none"], [-1 - rng.random(20), np.zeros(20)], "less")
    assert tests[0]["p_holm"] < 1e-4 and np.isnan(tests[1]["p"])


def history_with_low_energy_direction(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows varying strongly along e_0..e_2 and weakly along e_3: e_3 lies after the 90% cut-off."""
    rng = np.random.default_rng(seed)
    centred = rng.standard_normal((40, 4))
    orthonormal = np.linalg.qr(centred - centred.mean(axis=0))[0]  # centred, orthogonal columns
    coeffs = orthonormal * np.array([3.0, 2.0, 1.5, 0.2]) * np.sqrt(40)
    x = np.zeros((40, 16))
    x[:, :4] = coeffs
    x[:, 5] = 4.0  # a shared mean direction, removed by centring
    return x, np.eye(16)[3]


def test_action_in_the_low_energy_subspace_has_m_low_near_one():
    x, action = history_with_low_energy_direction()
    space = Subspace.of(x)
    assert space.cut == 3
    assert space.low_share(action[None])[0] == pytest.approx(1.0)
    assert space.low_share(np.eye(16)[:1])[0] == pytest.approx(0.0, abs=1e-12)
    bands = analysis.band_shares(space.coefficients(action[None])[0] ** 2, 4)
    assert bands == pytest.approx([0, 0, 0, 1], abs=1e-12)


def test_band_shares_leave_empty_bands_undefined():
    assert analysis.band_shares(np.array([3.0, 1.0]), 4) == pytest.approx([0.75, np.nan, 0.25, np.nan], nan_ok=True)


def test_low_alignment_is_the_cosine_inside_the_low_subspace():
    x, action = history_with_low_energy_direction()
    space = Subspace.of(x)
    alignment = space.low_alignment(x, action)
    centred = x - x.mean(axis=0)
    assert alignment == pytest.approx(np.sign(centred[:, 3]))


TARGET = 9


def replacement_case() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """20 unit blocks in 48 dimensions around a shared direction with a decaying spectrum, their lengths, and
    an action equal to the low-energy component of block `TARGET` (so A_TARGET = 1 and m_low = 1)."""
    rng = np.random.default_rng(1)
    x = unit_rows(0.5 * rng.standard_normal(48) + rng.standard_normal((20, 48)) * np.linspace(1, 0.05, 48))
    space = Subspace.of(x)
    low = space.directions[space.cut:]
    action = low.T @ (low @ (x[TARGET] - space.mean))
    return x, action / np.linalg.norm(action), rng.integers(100, 400, size=20).astype(float)


def test_matched_removal_satisfies_the_tolerances():
    x, action, lengths = replacement_case()
    tol = Tolerance(similarity=0.5, recency=6, length_ratio=2.0)
    alignment = Subspace.of(x).low_alignment(x, action)
    pair = analysis.match_removal(x, alignment, lengths, tol)
    assert pair is not None
    i, j = pair.targeted, pair.matched
    assert alignment[i] == np.nanmax(alignment) > 0 and alignment[j] <= np.nanmedian(alignment)
    assert 0 < abs(i - j) == pair.gap <= tol.recency
    cosine = x[i] @ x[j] / np.linalg.norm(x[i]) / np.linalg.norm(x[j])
    assert cosine == pytest.approx(pair.similarity) and cosine >= tol.similarity
    assert max(lengths[i], lengths[j]) / min(lengths[i], lengths[j]) == pytest.approx(pair.length_ratio)
    assert pair.length_ratio <= tol.length_ratio


def test_no_match_when_the_tolerances_cannot_be_met():
    x, action, lengths = replacement_case()
    alignment = Subspace.of(x).low_alignment(x, action)
    assert analysis.match_removal(x, alignment, lengths, Tolerance(similarity=1.1)) is None
    assert analysis.match_removal(x, -np.abs(alignment), lengths) is None


def test_targeted_removal_of_a_nearest_block_lowers_top3():
    x, action, lengths = replacement_case()
    result = analysis.analyse_checkpoint(x, action, lengths, bands=4)
    assert result.m_low == pytest.approx(1.0)
    assert result.replacement.targeted == TARGET and result.replacement.alignment[0] == pytest.approx(1.0)
    assert TARGET in nearest(x, action) and result.replacement.matched not in nearest(x, action)
    deltas = dict(zip(analysis.DELTAS, result.deltas))
    assert deltas["top3"] == pytest.approx(-1 / 3) and deltas["action_projection"] < -0.1
    assert abs(deltas["centroid"]) < 0.01 and abs(deltas["coverage"]) < 0.01


def test_greedy_counts_reach_tau():
    xs = [unit_rows(rank_r(15, 24, 2, 0)), unit_rows(rank_r(10, 24, 5, 1))]
    counts = analysis.greedy_counts(xs, tau=0.99, backend="numpy")
    assert counts.tolist() == [2, 5]


def test_gem_analyze_writes_tables_json_and_figures(tmp_path):
    needs_extra("replay")
    parser = argparse.ArgumentParser(prog="gem")
    analyze_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["analyze", str(FIXTURES), "--encoder", "hash", "--min-blocks", "4",
                              "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--quiet"])
    assert args.func(args) == 0
    summary = json.loads((tmp_path / "out" / "analysis.json").read_text())
    report = (tmp_path / "out" / "analysis.md").read_text()
    assert summary["runs"] > 0 and "Table C.1" in report and "Table 2" in report
    assert (tmp_path / "out" / "figure1.png").stat().st_size > 0 and (tmp_path / "out" / "figure3.png").exists()
    again = tmp_path / "again"
    args.out = str(again)
    assert args.func(args) == 0
    assert json.loads((again / "analysis.json").read_text())["spectral"] == summary["spectral"]
