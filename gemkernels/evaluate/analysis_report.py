"""``gem analyze``: geometry against evidence on recorded runs (paper §4.1-4.3, appendix C.1 and C.3).

Loads runs, embeds their blocks and next actions through the on-disk cache of `gem replay`, and
writes ``analysis.json``, ``analysis.md`` (tables in the shapes of Table C.1 and Table 2) and
``figure1.png`` / ``figure3.png`` to ``--out``. Runs are the statistical units: tests compare
per-run values (spectra) or per-run checkpoint means (replacement deltas).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np

from gemkernels.compress.representation import block_text
from gemkernels.evaluate import analysis
from gemkernels.evaluate.analysis import CONDITIONS, DELTAS, RHO, STATS, CheckpointResult, Tolerance
from gemkernels.evaluate.plotting import pyplot
from gemkernels.evaluate.replay import RunJob, column_means, save, table
from gemkernels.evaluate.runner import LocalPool, Runner, run_all

LABELS = {"real": "Real", "feature_shift": "Feature-shift", "gaussian": "Gaussian",
          "effective_rank": "Effective rank", "r_rho": "r90", "r_rho_over_n": "r90/n",
          "action_projection": "Action projection", "top3": "Next-action Top-3",
          "centroid": "Centroid similarity", "coverage": "Captured energy"}
GROUPS = {"action_projection": "Task information", "top3": "Task information", "centroid": "Global geometry",
          "coverage": "Global geometry"}  # Table 2's row groups


def rounded(value: float, digits: int = 6) -> float | None:
    """A JSON-ready float (nan as None)."""
    return None if value is None or not np.isfinite(value) else round(float(value), digits)


# --------------------------------------------------------------------------- summaries

def spectral_summary(names: Sequence[str], values: np.ndarray, seed: int) -> dict[str, object]:
    """Per-run `STATS` for each condition, their medians and the one-sided signed-rank tests (real <
    control, with the share of runs below) for effective rank and r_rho/n, Holm-adjusted across all four."""
    comparisons = [(stat, control) for control in CONDITIONS[1:] for stat in ("effective_rank", "r_rho_over_n")]
    diffs = [values[:, 0, STATS.index(s)] - values[:, CONDITIONS.index(c), STATS.index(s)] for s, c in comparisons]
    tests = analysis.paired_tests([f"{s}: real < {c}" for s, c in comparisons], diffs, "less")
    for test, d in zip(tests, diffs):
        test["share_below"] = rounded(np.mean(d < 0))
    return {
        "rho": RHO, "seed": seed,
        "medians": {c: {s: rounded(np.nanmedian(values[:, i, j])) for j, s in enumerate(STATS)}
                    for i, c in enumerate(CONDITIONS)},
        "tests": tests,
        "per_run": {name: {c: {s: rounded(values[r, i, j]) for j, s in enumerate(STATS)}
                           for i, c in enumerate(CONDITIONS)} for r, name in enumerate(names)},
    }


def coverage_summary(names: Sequence[str], counts: np.ndarray, lengths: np.ndarray, tau: float) -> dict[str, object]:
    """Greedy uncentred coverage counts per run, with medians of the count and of the retained fraction."""
    return {"tau": tau, "median_count": rounded(np.median(counts)),
            "median_fraction": rounded(np.median(counts / lengths)),
            "per_run": {name: {"blocks": int(n), "count": int(c)} for name, n, c in zip(names, lengths, counts)}}


def checkpoint_summary(results: dict[str, list[CheckpointResult]], tolerance: Tolerance) -> dict[str, object]:
    """m_low and band shares pooled over checkpoints; replacement deltas pooled (Eq. C.2) and as per-run
    means, with two-sided signed-rank tests of the per-run means against zero, Holm-adjusted."""
    pooled = [r for rs in results.values() for r in rs]
    matched = {run: np.stack([r.deltas for r in rs if r.deltas is not None])
               for run, rs in results.items() if any(r.deltas is not None for r in rs)}
    empty = np.zeros((0, len(DELTAS)))
    run_means = np.stack([d.mean(axis=0) for d in matched.values()]) if matched else empty
    all_deltas = np.concatenate(list(matched.values())) if matched else empty
    run_median = np.median(run_means, axis=0) if matched else np.full(len(DELTAS), np.nan)
    m_low = np.array([r.m_low for r in pooled])
    return {
        "checkpoints": len(pooled), "runs": len(results),
        "m_low": {"mean": rounded(np.nanmean(m_low)), "median": rounded(np.nanmedian(m_low)),
                  "median_of_run_means": rounded(np.nanmedian([np.nanmean([r.m_low for r in rs])
                                                                for rs in results.values()]))},
        "bands": {"action": [rounded(v) for v in column_means(np.stack([r.action_bands for r in pooled]))[0]],
                  "history": [rounded(v) for v in column_means(np.stack([r.history_bands for r in pooled]))[0]]},
        "replacement": {
            "tolerance": vars(tolerance), "matched_checkpoints": len(all_deltas), "runs": len(matched),
            "pooled_delta": {m: rounded(v) for m, v in zip(DELTAS, column_means(all_deltas)[0])},
            "median_run_delta": {m: rounded(v) for m, v in zip(DELTAS, run_median)},
            "tests": analysis.paired_tests(list(DELTAS), list(run_means.T), "two-sided"),
            "pairs": {run: [{"t": r.t, **vars(r.replacement)} for r in rs if r.replacement is not None]
                      for run, rs in results.items()},
        },
    }


def run_checkpoints(job: RunJob, bands: int, tolerance: Tolerance) -> list[CheckpointResult]:
    """`analysis.analyse_checkpoint` at each checkpoint of one run, in order."""
    chars = np.array([len(block_text(b, sys.maxsize)) for b in job.blocks], dtype=np.float64)
    return [analysis.analyse_checkpoint(job.embeddings[:t], job.actions[c], chars[:t], bands, tolerance)
            for c, t in enumerate(job.checkpoints)]


def analyse(jobs: Sequence[RunJob], seed: int, bands: int, tau: float, tolerance: Tolerance,
            progress: bool, runner: Runner = LocalPool()) -> dict[str, object]:
    """Spectra with controls and greedy coverage counts (whole runs, here), and the checkpoint analyses of each run
    on ``runner`` (default: in this process)."""
    names = [job.name for job in jobs]
    matrices = [np.asarray(job.embeddings, dtype=np.float64) for job in jobs]
    lengths = np.array([len(x) for x in matrices])
    per_run = run_all(runner, partial(run_checkpoints, bands=bands, tolerance=tolerance), jobs, progress,
                      "checkpoints")
    checkpoints = dict(zip(names, per_run))
    return {"runs": len(jobs), "blocks": int(lengths.sum()),
            "spectral": spectral_summary(names, analysis.spectral_comparison(matrices, seed), seed),
            "coverage": coverage_summary(names, analysis.greedy_counts(matrices, tau), lengths, tau),
            "checkpoints": checkpoint_summary(checkpoints, tolerance)}


# --------------------------------------------------------------------------- report

def fmt(value: float | None, digits: int = 2) -> str:
    """A number with ``digits`` decimals, '–' when undefined."""
    return "–" if value is None else f"{value:.{digits}f}"


def pvalue(value: float | None) -> str:
    """A p-value in scientific notation, '–' when undefined."""
    return "–" if value is None or not np.isfinite(value) else f"{value:.2e}"


def markdown(summary: dict[str, object]) -> str:
    """Table C.1 (trajectory medians, real against the controls), its tests, the coverage counts, m_low and
    the band shares (Figure 3), and Table 2 (targeted minus matched removal)."""
    spectral, coverage, cp = summary["spectral"], summary["coverage"], summary["checkpoints"]
    rep, med = cp["replacement"], spectral["medians"]
    lines = [f"# Geometry against evidence ({summary['encoder']})", "",
             f"{summary['runs']} runs, {summary['blocks']} blocks, {cp['checkpoints']} checkpoints; "
             f"rho = {spectral['rho']}, seed {spectral['seed']}.", "",
             "## Table C.1: centred spectral statistics (trajectory medians)", "",
             *table(("Metric", *(LABELS[c] for c in CONDITIONS)),
                    [(LABELS[s], *(fmt(med[c][s]) for c in CONDITIONS)) for s in STATS]),
             "One-sided Wilcoxon signed-rank tests over runs (real below control), Holm-adjusted across the four:", "",
             *table(("Comparison", "Share of runs below", "Runs", "p", "p (Holm)"),
                    [(t["comparison"], fmt(t["share_below"]),
                      str(t["runs"]), pvalue(t["p"]), pvalue(t["p_holm"])) for t in spectral["tests"]]),
             f"Greedy uncentred coverage (tau = {coverage['tau']}): median {fmt(coverage['median_count'], 1)} "
             f"blocks per run, median retained fraction {fmt(coverage['median_fraction'])}.", "",
             "## Next-action energy outside the dominant subspace (Eq. 5, Figure 3)", "",
             f"m_low(a): mean {fmt(cp['m_low']['mean'])}, median {fmt(cp['m_low']['median'])} over checkpoints; "
             f"median of per-run means {fmt(cp['m_low']['median_of_run_means'])}.", "",
             *table(("Rank band", *(f"{i + 1}" for i in range(len(cp["bands"]["action"])))),
                    [("Next action", *map(fmt, cp["bands"]["action"])),
                     ("History energy", *map(fmt, cp["bands"]["history"]))]),
             "## Table 2: targeted minus matched single-block removal", "",
             f"{rep['matched_checkpoints']} of {cp['checkpoints']} checkpoints had a matched removal "
             f"({rep['runs']} runs); tolerance {rep['tolerance']}. Two-sided signed-rank tests of per-run means, "
             "Holm-adjusted:", "",
             *table(("Group", "Metric", "Δ (pooled)", "Δ (median run)", "p (Holm)"),
                    [(GROUPS[m], LABELS[m], fmt(rep["pooled_delta"][m], 3), fmt(rep["median_run_delta"][m], 3),
                      pvalue(p_holm)) for m, p_holm in ((t["comparison"], t["p_holm"]) for t in rep["tests"])])]
    return "\n".join(lines)


def plot(summary: dict[str, object], out: Path) -> list[Path]:
    """Figure 1 (effective rank and r90/n per condition, runs joined) and Figure 3 (band shares)."""
    plt = pyplot()

    per_run = summary["spectral"]["per_run"].values()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, stat in zip(axes, ("effective_rank", "r_rho_over_n")):
        values = np.array([[np.nan if r[c][stat] is None else r[c][stat] for c in CONDITIONS] for r in per_run])
        ax.plot(np.arange(len(CONDITIONS)), values.T, color="grey", alpha=0.25, linewidth=0.6)
        ax.boxplot([v[~np.isnan(v)] for v in values.T], positions=np.arange(len(CONDITIONS)), widths=0.4,
                   showfliers=False)
        ax.set_xticks(np.arange(len(CONDITIONS)), [LABELS[c] for c in CONDITIONS])
        ax.set_title(LABELS[stat])
    fig.suptitle(f"Structured redundancy ({summary['encoder']})", fontsize=10)
    written = [save(fig, out / "figure1.png")]

    bands = summary["checkpoints"]["bands"]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    positions = np.arange(len(bands["action"]))
    ax.bar(positions - 0.2, [v or 0 for v in bands["history"]], 0.4, label="centred history energy")
    ax.bar(positions + 0.2, [v or 0 for v in bands["action"]], 0.4, label="next-action energy")
    ax.set_xticks(positions, [f"{i + 1}" for i in positions])
    ax.set(xlabel="ordered rank band (leading to trailing directions)", ylabel="mean share")
    ax.legend(fontsize=8)
    written.append(save(fig, out / "figure3.png"))
    return written


# --------------------------------------------------------------------------- command line



