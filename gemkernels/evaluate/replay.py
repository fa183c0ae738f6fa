"""``gem replay``: offline checkpoint replay of recorded runs (paper §4.2, appendices C.2 and D).

At every checkpoint (a history of t >= ``min_blocks`` blocks, before the recorded next action,
block t) each selector keeps K blocks and `retention.Targets` measures what the kept subset
retains of the next action, the final block, the goal and the global geometry. The next action
is used only for measuring. Embeddings are computed once per distinct text, in the main process,
through an on-disk cache; checkpoints are replayed in parallel over runs.
"""

from __future__ import annotations

import json
import math
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from gemkernels.compress.blocks import Block, parse_history
from gemkernels.compress.encoders.cache import EmbeddingCache
from gemkernels.compress.evidence import block_features
from gemkernels.compress.gem import serialised_chars
from gemkernels.compress.references import block_lexicon
from gemkernels.compress.representation import MAX_CHARS, block_text
from gemkernels.compress.router import call_signature
from gemkernels.compress.tokens import TokenCache
from gemkernels.evaluate.loaders import Run, final_block, load_runs, skipped_lines
from gemkernels.evaluate.plotting import pyplot
from gemkernels.evaluate.privacy import private_errors, private_runs
from gemkernels.evaluate.retention import METRICS, Targets, action_references, block_words, referenced_blocks
from gemkernels.evaluate.runner import Runner, run_all
from gemkernels.evaluate.selectors import LABELS, SELECTORS, View, natural_budget

DEFAULT_KS = tuple(range(8, 21))
DEFAULT_TAUS = tuple(round(0.85 + 0.01 * i, 2) for i in range(11))
Row = tuple[str, str, float, int, np.ndarray]  # (experiment, selector, K or tau, t, METRICS values)


@dataclass(frozen=True)
class RunJob:
    """One run's replay inputs: blocks (the last one the run's final call without a result, `Run.final`, when it
    has one), checkpoints t (history ``blocks[:t]``, next action ``blocks[t]``), block embeddings (n, d),
    next-action embeddings and task embeddings (c, d; nan rows: no task text), each block's o200k tokens (as GEM
    counts them: its messages serialised; 0 for the final one) and serialised characters (`gem.serialised_chars`),
    the run's format, and at each checkpoint the embedding of the task GEM reads from the request itself (the
    latest user instruction: what ``gem serve`` and the framework hooks see; nan rows: none)."""

    name: str
    blocks: tuple[Block, ...]
    checkpoints: tuple[int, ...]
    embeddings: np.ndarray
    actions: np.ndarray
    goals: np.ndarray
    tokens: tuple[int, ...] = ()
    format: str = ""
    chars: tuple[int, ...] = ()
    tasks: np.ndarray | None = None


@dataclass(frozen=True)
class Plan:
    """What to replay: selectors at each K, GEM's natural budget at each tau (capacity ``k``), the seed."""

    selectors: tuple[str, ...]
    ks: tuple[int, ...]
    taus: tuple[float, ...]
    k: int
    seed: int = 0


def action_text(block: Block, max_chars: int = MAX_CHARS) -> str:
    """The next action's representation: the block's text without its observations (not yet seen)."""
    return block_text(replace(block, observations=()), max_chars)


def request_tasks(run: Run, starts: Sequence[int], checkpoints: Sequence[int]) -> list[str]:
    """The task text GEM reads from the request at each checkpoint (the latest user instruction)."""
    return [parse_history(run.messages[:starts[t]]).task_text() for t in checkpoints]


def prepare(runs: Sequence[Run], cache: EmbeddingCache, min_blocks: int, progress: bool) -> list[RunJob]:
    """Jobs for the runs with at least one checkpoint, every text they need encoded once through ``cache``;
    a run name that several files share is qualified by its path."""
    staged = []
    tokens = TokenCache()
    repeated = {name for name, count in Counter(run.name for run in runs).items() if count > 1}
    for run in runs:
        history = parse_history(run.messages)
        final = final_block(run)
        starts = [span.start for span in history.spans] + ([len(run.messages)] if final else [])
        checkpoints = tuple(range(min_blocks, len(starts)))
        if checkpoints:
            blocks = history.blocks + ((final,) if final else ())
            tasks = request_tasks(run, starts, checkpoints)
            goals = [run.goal] * len(checkpoints) if run.goal is not None else tasks  # the metrics' goal
            name = f"{run.path}:{run.name}" if run.name in repeated else run.name
            sizes = tuple(sum(len(tokens.message(run.messages[p])) for p in span.positions) for span in history.spans)
            chars = tuple(sum(serialised_chars(run.messages[p]) for p in span.positions) for span in history.spans)
            staged.append((name, blocks, checkpoints, [block_text(b) for b in blocks],
                           [action_text(blocks[t]) for t in checkpoints], goals, sizes + (0,) * bool(final),
                           run.format, chars + (0,) * bool(final), tasks))
    cache.fill([text for stage in staged for text in (*stage[3], *stage[4], *stage[5], *stage[9]) if text.strip()],
               progress)
    cache.flush()
    nan = np.full(cache.dim, np.nan, dtype=np.float32)

    def embedded(texts: Sequence[str]) -> np.ndarray:
        return np.stack([cache.encode([t])[0] if t.strip() else nan for t in texts])

    return [RunJob(name, blocks, checkpoints, cache.encode(texts), cache.encode(actions), embedded(goals), sizes,
                   fmt, chars, embedded(tasks))
            for name, blocks, checkpoints, texts, actions, goals, sizes, fmt, chars, tasks in staged]


def replay_run(job: RunJob, plan: Plan) -> tuple[str, list[Row]]:
    """Every selector at every K < t, and GEM's natural budget at every tau, measured at each checkpoint."""
    features = tuple(block_features(b) for b in job.blocks)
    lexicons = tuple(block_lexicon(b, block_text(b)) for b in job.blocks)
    signatures = tuple(call_signature(b) for b in job.blocks)
    texts = [block_text(b, sys.maxsize) for b in job.blocks]
    words = [block_words(t) for t in texts]
    final = job.embeddings[-1]
    rows: list[Row] = []
    for c, t in enumerate(job.checkpoints):
        goal = job.goals[c] if np.isfinite(job.goals[c]).all() else None
        refs = action_references(job.blocks[t])
        x = job.embeddings[:t]
        targets = Targets.build(x, job.actions[c], final, goal, referenced_blocks(refs, texts[:t], words[:t]))
        task = job.tasks[c] if np.isfinite(job.tasks[c]).all() else None
        view = View(x, features[:t], goal, (plan.seed, zlib.crc32(job.name.encode()), t), lexicons[:t],
                    signatures[:t], job.tokens[:t], job.chars[:t], task)
        for k in plan.ks:
            if k < t:
                rows += [("k", name, k, t, targets.measure(SELECTORS[name](view, k))) for name in plan.selectors]
        for tau in plan.taus:
            rows.append(("tau", "gem", tau, t, targets.measure(natural_budget(view, tau, plan.k))))
            rows.append(("tau", "gem_uncapped", tau, t, targets.measure(natural_budget(view, tau, None))))
    return job.name, rows


def replay(jobs: Sequence[RunJob], plan: Plan, runner: Runner, progress: bool) -> dict[str, list[Row]]:
    """Rows per run name (sorted), runs replayed on ``runner`` (`LocalPool`: this machine; `RayPool`: a cluster)."""
    results = dict(run_all(runner, partial(replay_run, plan=plan), jobs, progress, "replaying runs"))
    return {name: results[name] for name in sorted(results)}


# --------------------------------------------------------------------------- aggregation

Index = dict[tuple[str, str, float], list[tuple[str, int, np.ndarray]]]


def index_rows(results: dict[str, list[Row]]) -> Index:
    """Rows grouped by (experiment, selector, parameter) as (run, t, values)."""
    index: Index = {}
    for run, rows in results.items():
        for experiment, selector, param, t, values in rows:
            index.setdefault((experiment, selector, param), []).append((run, t, values))
    return index


def column_means(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column means over the defined (non-nan) entries, and how many were defined."""
    defined = ~np.isnan(values)
    counts = defined.sum(axis=0)
    sums = np.where(defined, values, 0).sum(axis=0)
    return np.divide(sums, counts, out=np.full(values.shape[1], np.nan), where=counts > 0), counts


def run_means(entries: Sequence[tuple[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each run's means over its checkpoints."""
    by_run: dict[str, list[np.ndarray]] = {}
    for run, values in entries:
        by_run.setdefault(run, []).append(values)
    return {run: column_means(np.stack(rows))[0] for run, rows in sorted(by_run.items())}


def named(values: np.ndarray) -> dict[str, float | None]:
    """Metric values by name, JSON-ready (nan as None)."""
    return {m: None if np.isnan(v) else round(float(v), 6) for m, v in zip(METRICS, values)}


def summarise(entries: Sequence[tuple[str, int, np.ndarray]], min_t: int = 0) -> dict[str, object]:
    """Pooled checkpoint means (paper Eq. C.2), how many checkpoints define each metric, and the mean of the
    per-run means, over checkpoints with t > ``min_t``."""
    kept = [(run, values) for run, t, values in entries if t > min_t]
    if not kept:
        return {"checkpoints": 0, "runs": 0}
    pooled, defined = column_means(np.stack([values for _, values in kept]))
    per_run = run_means(kept)
    return {"checkpoints": len(kept), "runs": len(per_run), "pooled": named(pooled),
            "defined": dict(zip(METRICS, map(int, defined))),
            "per_run_mean": named(column_means(np.stack(list(per_run.values())))[0])}


def paired_against(index: Index, selector: str, k: int, runs: set[str], base: str = "recent") -> dict[str, object]:
    """``selector`` against ``base`` at K over the checkpoints of ``runs``: per metric (top3, referenced) the mean
    paired difference, its standard error and how many checkpoints define it."""
    base_rows = {(run, t): v for run, t, v in index.get(("k", base, k), []) if run in runs}
    out: dict[str, object] = {}
    for metric in ("top3", "referenced"):
        m = METRICS.index(metric)
        deltas = np.array([v[m] - base_rows[(run, t)][m] for run, t, v in index.get(("k", selector, k), [])
                           if (run, t) in base_rows and not np.isnan(v[m] - base_rows[(run, t)][m])])
        out[metric] = {"delta": float(deltas.mean()) if deltas.size else None,
                       "se": float(deltas.std(ddof=1) / math.sqrt(deltas.size)) if deltas.size > 1 else None,
                       "n": int(deltas.size)}
    return out


def family_summary(index: Index, plan: Plan, ks: Sequence[int], families: dict[str, str]) -> dict[str, object]:
    """Per agent family (``families``: run name -> family): every selector against Recent-K at each K, paired."""
    out: dict[str, object] = {}
    for family in sorted(set(families.values())):
        runs = {run for run, f in families.items() if f == family}
        out[family] = {s: {str(k): paired_against(index, s, k, runs) for k in ks}
                       for s in plan.selectors if s != "recent"}
    return out


def summary_json(results: dict[str, list[Row]], plan: Plan, sweep_ks: Sequence[int], options: dict[str, object],
                 encoder: str, families: dict[str, str] | None = None) -> dict[str, object]:
    """Everything the report shows: the selectors at ``plan.k`` (checkpoints with t > K), per-run means at
    ``plan.k``, the exact-K sweep over the checkpoints common to every K (t > max K), the tau sweep, and per agent
    family (``families``: run name -> family) each selector against Recent-K at every K, paired by checkpoint."""
    index = index_rows(results)
    checkpoints = {(run, t) for entries in index.values() for run, t, _ in entries}
    same_k = {s: index.get(("k", s, plan.k), []) for s in plan.selectors}
    out: dict[str, object] = {
        "options": options, "encoder": encoder, "metrics": list(METRICS),
        "runs": len({run for run, _ in checkpoints}), "checkpoints": len(checkpoints),
        "same_k": {"k": plan.k, "selectors": {s: summarise(e) for s, e in same_k.items()}},
        "per_run": {s: {run: named(v) for run, v in run_means([(r, v) for r, _, v in e]).items()}
                    for s, e in same_k.items()},
    }
    if sweep_ks:
        out["k_sweep"] = {"ks": list(sweep_ks), "selectors": {
            s: {str(k): summarise(index.get(("k", s, k), []), max(sweep_ks)) for k in sweep_ks}
            for s in plan.selectors}}
    if families and "recent" in plan.selectors:
        out["families"] = {"ks": list(plan.ks), "selectors": family_summary(index, plan, plan.ks, families)}
    if plan.taus:
        out["tau_sweep"] = {"taus": list(plan.taus), "capacity": plan.k, "variants": {
            v: {str(tau): summarise(index.get(("tau", v, tau), [])) for tau in plan.taus}
            for v in ("gem", "gem_uncapped")}}
    return out


# --------------------------------------------------------------------------- report

COLUMNS = (("Action R_a", "action"), ("Final", "final"), ("Goal", "goal"), ("Top-3", "top3"),
           ("Centroid", "centroid"), ("Coverage E", "coverage"), ("P_a", "action_projection"),
           ("Referenced", "referenced"))
TAU_COLUMNS = (("Retained fraction", "gem", "retained"), ("Top-3", "gem", "top3"), ("Action R_a", "gem", "action"),
               ("Coverage E", "gem", "coverage"), ("Referenced", "gem", "referenced"),
               ("Retained, no cap", "gem_uncapped", "retained"), ("Top-3, no cap", "gem_uncapped", "top3"),
               ("Action R_a, no cap", "gem_uncapped", "action"))


def cell(summary: dict[str, object], metric: str, field: str = "pooled") -> str:
    """A summary's mean of ``metric`` with two decimals ('–' where undefined or without checkpoints)."""
    value = summary.get(field, {}).get(metric)
    return "–" if value is None else f"{value:.2f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table, followed by a blank line."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows), ""]


def selector_tables(same: dict[str, object]) -> list[str]:
    """D.1: every selector at K, as pooled means and as means of per-run means."""
    selectors = same["selectors"]
    first = next(iter(selectors.values()))
    defined = first.get("defined", {})
    lines = []
    for title, field in (("pooled checkpoint means (Eq. C.2)", "pooled"), ("means of per-run means", "per_run_mean")):
        lines += [f"## Selectors at the same retained count K={same['k']}: {title}", "",
                  f"{first['checkpoints']} checkpoints with more than K blocks, {first['runs']} runs; the goal "
                  f"ratio is defined at {defined.get('goal', 0)}, Referenced (encoder-free) at "
                  f"{defined.get('referenced', 0)}.", ""]
        lines += table(("Selector", *(c for c, _ in COLUMNS)),
                       [(LABELS[s], *(cell(v, m, field) for _, m in COLUMNS))
                        for s, v in selectors.items()])
    return lines


def k_sweep_table(sweep: dict[str, object]) -> list[str]:
    """D.3: Top-3 retention of every selector at every K, over the checkpoints common to all K."""
    by_selector = sweep["selectors"]
    common = next(iter(next(iter(by_selector.values())).values()))
    return ["## Exact retained-count sweep: next-action Top-3 retention", "",
            f"{common['checkpoints']} checkpoints common to every K (more than {max(sweep['ks'])} blocks), "
            f"{common['runs']} runs.", "",
            *table(("K", *(LABELS[s] for s in by_selector)),
                   [(str(k), *(cell(by_selector[s][str(k)], "top3") for s in by_selector)) for k in sweep["ks"]])]


def tau_sweep_table(sweep: dict[str, object]) -> list[str]:
    """D.4: GEM at its natural budget for every tau, with and without the capacity K_t = max(K, |P|)."""
    variants = sweep["variants"]
    return ["## Coverage-threshold sweep: GEM at its natural budget", "",
            f"{next(iter(variants['gem'].values()))['checkpoints']} checkpoints; capacity "
            f"K_t = max({sweep['capacity']}, |P|), and no capacity limit.", "",
            *table(("τ", *(c for c, _, _ in TAU_COLUMNS)),
                   [(f"{tau:.2f}", *(cell(variants[v][str(tau)], m) for _, v, m in TAU_COLUMNS))
                    for tau in sweep["taus"]])]


def family_tables(families: dict[str, object], k: int) -> list[str]:
    """Per family: each selector against Recent-K at ``k``, and the K sweep of the Top-3 difference."""
    ks = families["ks"]
    lines = ["## Per agent family: each selector against Recent-K (paired by checkpoint)", "",
             "Cells: mean difference selector − Recent-K ± its standard error (checkpoints).", ""]
    for family, by_selector in families["selectors"].items():
        lines += [f"**{family}** at K={k}", ""]
        lines += table(("Selector", "Top-3 Δ", "Referenced Δ"),
                       [(LABELS[s], delta_cell(v[str(k)]["top3"]), delta_cell(v[str(k)]["referenced"]))
                        for s, v in by_selector.items()])
        if len(ks) > 1:
            lines += [f"**{family}**: Top-3 Δ against Recent-K at every K", ""]
            lines += table(("K", *(LABELS[s] for s in by_selector)),
                           [(str(kk), *(delta_cell(v[str(kk)]["top3"]) for v in by_selector.values())) for kk in ks])
    return lines


def delta_cell(stats: dict[str, object]) -> str:
    """``+0.041 ± 0.012`` (``–`` where undefined)."""
    if stats["delta"] is None:
        return "–"
    se = "" if stats["se"] is None else f" ± {stats['se']:.3f}"
    return f"{stats['delta']:+.3f}{se}"


def markdown(summary: dict[str, object]) -> str:
    """The report's tables in the paper's shapes: D.1 (pooled and per-run means), D.3 and D.4."""
    options = summary["options"]
    lines = [f"# Checkpoint replay ({summary['encoder']})", "",
             f"{summary['runs']} runs, {summary['checkpoints']} checkpoints (histories of at least "
             f"{options['min_blocks']} blocks before a recorded next action); seed {options['seed']}.", "",
             *selector_tables(summary["same_k"])]
    if "k_sweep" in summary:
        lines += k_sweep_table(summary["k_sweep"])
    if "tau_sweep" in summary:
        lines += tau_sweep_table(summary["tau_sweep"])
    if "families" in summary:
        lines += family_tables(summary["families"], summary["same_k"]["k"])
    return "\n".join(lines)


def plot(summary: dict[str, object], out: Path) -> list[Path]:
    """Figure 5 of the paper: (a) Top-3 retention at exact K, (b) Top-3 and retained fraction against tau."""
    plt = pyplot()

    written = []
    if "k_sweep" in summary:
        sweep = summary["k_sweep"]
        fig, ax = plt.subplots(figsize=(6, 4))
        for s, by_k in sweep["selectors"].items():
            style = {"color": "black", "linewidth": 2.5, "zorder": 3} if s == "gem" else {"linewidth": 1}
            ax.plot(sweep["ks"], [by_k[str(k)].get("pooled", {}).get("top3") for k in sweep["ks"]],
                    marker="o", markersize=3, label=LABELS[s], **style)
        ax.set(xlabel="retained blocks K", ylabel="next-action Top-3 retention", title="(a) exact retained count")
        ax.legend(fontsize=7)
        written.append(save(fig, out / "k_sweep.png"))
    if "tau_sweep" in summary:
        sweep = summary["tau_sweep"]
        fig, ax = plt.subplots(figsize=(6, 4))
        for variant, style in (("gem", "-"), ("gem_uncapped", "--")):
            rows = sweep["variants"][variant]
            for metric, label, color in (("top3", "Top-3 retention", "C0"), ("retained", "retained fraction", "C1")):
                ax.plot(sweep["taus"], [rows[str(t)]["pooled"][metric] for t in sweep["taus"]], style, marker="o",
                        color=color, label=f"{label} ({'K_t cap' if variant == 'gem' else 'no cap'})")
        ax.set(xlabel="coverage threshold τ", title="(b) coverage threshold")
        ax.legend(fontsize=7)
        written.append(save(fig, out / "tau_sweep.png"))
    return written


def save(fig: Any, path: Path) -> Path:
    """Write a figure as PNG and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path


# --------------------------------------------------------------------------- command line



def write_report(out: Path, stem: str, summary: dict, report: str, plot: Callable[[dict, Path], list[Path]]) -> None:
    """Write ``<stem>.json`` (strict JSON: nan and inf as null), ``<stem>.md`` and the plots into ``out``; print the
    report, and what was written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(finite(summary), indent=1, allow_nan=False))
    (out / f"{stem}.md").write_text(report + "\n")
    written = [out / f"{stem}.json", out / f"{stem}.md", *plot(summary, out)]
    print(report)
    print("wrote " + ", ".join(map(str, written)), file=sys.stderr)


def finite(value: Any) -> Any:
    """``value`` with every nan or infinite float (nested in dicts, lists, tuples) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def report_reading(command: str, runs: Sequence[Run], errors: Sequence[tuple[str, str]]) -> None:
    """On stderr: the files that could not be read, and the unreadable lines skipped in the others."""
    for path, error in errors:
        print(f"gem {command}: skipped {path}: {error}", file=sys.stderr)
    for path, lines in skipped_lines(runs).items():
        print(f"gem {command}: {path}: skipped {lines} unreadable line{'s' * (lines != 1)}", file=sys.stderr)


def load_long_runs(paths: Sequence[str], min_blocks: int, command: str, subagents: str = "include",
                   show_paths: bool = False) -> list[Run]:
    """The runs with more than ``min_blocks`` blocks (sub-agents' per ``subagents``, `load_runs`), named by their
    pseudonyms unless ``show_paths`` (`privacy`); bad files and an empty result are reported on stderr."""
    runs, errors = load_runs(paths, subagents)
    runs = private_runs(runs, show_paths)
    report_reading(command, runs, private_errors(errors, show_paths, paths))
    runs = [r for r in runs if len(parse_history(r.messages).spans) > min_blocks]
    if not runs:
        print(f"gem {command}: no run has more than {min_blocks} blocks", file=sys.stderr)
    return runs


