"""Online cost replay: every model call of every recorded run, under each forwarding policy.

At each recorded model call of a run (`Run.calls`; the request is the history before it, from the agent's own
latest compaction on, `Run.request`, so that a compaction is a rewrite of every policy) every
policy of `online_policies` forwards its request; `costs` counts its o200k input tokens,
the part a provider's prompt cache would serve (common prefix with the same policy's
previous request, `gemkernels.compress.prompt_cache`: the rule ``gem serve --observe`` prices with too), and
the embedding tokens the policy caused. Totals per run and pooled
(over all runs, per run format, and over the runs with at least N calls for each N of
``long_runs``) are reported relative to the full history, as a markdown table, JSON and a
PNG (tokens against price per policy).

Evidence at rewrites: for the policies named in ``evidence`` (default amortized forgetting and
GEM's cache-aware preset), at every call whose request rewrites the previous one (a prefix
break), the blocks kept are measured against the newest blocks of the same total o200k size:
what each retains of the next recorded action's three most similar blocks (Top-3) and of the
blocks it names (lexical references, `retention.referenced_blocks`); means, and the paired
difference kept − recent per rewrite with its standard error and the rewrites where it is
better or worse.

    gem online PATH... [--policies full,masking,window,gem-paper,...] [--price-cached 0.1] [--price-uncached 1]
        [--window 10] [--mask-after 5] [--amortized-budget 40 --amortized-keep 20] [--encoder minilm|hash]
        [--evidence-policies amortized,gem-cache-aware] [--long-runs 40,60] [--out DIR] [--workers N | --ray [ADDRESS]]
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

from gemkernels.compress.blocks import History, parse_history
from gemkernels.compress.encoders import Encoder, is_hash_encoder, make_encoder
from gemkernels.compress.encoders.cache import DEFAULT_CACHE_DIR, EmbeddingCache
from gemkernels.compress.prompt_cache import CallCost, call_cost
from gemkernels.compress.representation import block_text
from gemkernels.compress.tokens import Encode, Prices, TokenCache
from gemkernels.evaluate.costs import Totals
from gemkernels.evaluate.loaders import Run
from gemkernels.evaluate.online_policies import PolicyOptions, policy_builder, policy_label
from gemkernels.evaluate.plotting import pyplot
from gemkernels.evaluate.replay import action_text, save
from gemkernels.evaluate.retention import action_references, block_words, nearest, referenced_blocks, retained_fraction
from gemkernels.evaluate.runner import LocalPool, Runner, run_all

BASELINE = "full"
DEFAULT_POLICIES = ("full", "masking", "window", "amortized", "gem-paper", "gem-balanced", "gem-core",
                    "gem-cache-aware")
EVIDENCE_POLICIES = ("amortized", "gem-cache-aware")
LONG_RUNS = (40, 60)
POLICY_COLOURS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9", "black")  # no grey: the group markers
ALL_RUNS = "all"


@dataclass(frozen=True)
class RewriteEvidence:
    """At one rewrite (call index ``call``, ``blocks`` blocks in the request): the kept blocks against the newest
    blocks of the same total tokens (at most the kept tokens), and what each retains of the next action's
    Top-3 blocks and of the blocks it references (None: the action references no earlier block)."""

    call: int
    blocks: int
    kept_blocks: int
    recent_blocks: int
    kept_tokens: int
    top3_kept: float
    top3_recent: float
    referenced_kept: float | None
    referenced_recent: float | None


EVIDENCE_FIELDS = ("top3_kept", "top3_recent", "referenced_kept", "referenced_recent")


@dataclass(frozen=True)
class RunReplay:
    """One run replayed: per policy, the cost of each call in order."""

    name: str
    format: str
    path: str
    calls: dict[str, list[CallCost]]
    evidence: dict[str, list[RewriteEvidence]]

    def totals(self) -> dict[str, Totals]:
        return {policy: Totals.of(costs) for policy, costs in self.calls.items()}

    def groups(self, long_runs: Sequence[int] = ()) -> list[str]:
        """The groups this run is pooled into: all runs, its format, and ``N+ calls`` for each N it reaches."""
        calls = len(next(iter(self.calls.values()), ()))
        return [ALL_RUNS, self.format] + [long_group(n) for n in long_runs if calls >= n]


def long_group(calls: int) -> str:
    """The name of the group of runs with at least ``calls`` model calls."""
    return f"{calls}+ calls"


def group_order(groups: Iterable[str]) -> list[str]:
    """All runs first, then run formats by name, then run-length groups by length."""
    def key(group: str) -> tuple[int, int, str]:
        if group == ALL_RUNS:
            return 0, 0, group
        if group.endswith("+ calls"):
            return 2, int(group.split("+")[0]), group
        return 1, 0, group
    return sorted(groups, key=key)


@cache
def shared_encoder(name: str, make: Callable[[str], Encoder] = make_encoder) -> Encoder:
    """One encoder per name, builder and process, so each distinct block text is embedded once for all presets and
    runs; ``make`` builds it (`Runner.encoder`: in this process, or a client of Ray actors); a model encoder (not
    ``hash``) also reads and fills the on-disk cache of `gem replay` (``DEFAULT_CACHE_DIR``)."""
    encoder = make(name)
    return encoder if is_hash_encoder(name) else EmbeddingCache(encoder, DEFAULT_CACHE_DIR)


def replay_run(run: Run, policies: Sequence[str], options: PolicyOptions,
               encoder: Callable[[str], Encoder] = shared_encoder, encode: Encode | None = None,
               evidence: Sequence[str] = EVIDENCE_POLICIES) -> RunReplay:
    """Replay ``run`` call by call under each named policy (fresh policy objects, one token cache).

    ``encoder`` maps an encoder name to the encoder GEM policies and the evidence metrics use; ``encode`` is the
    tokenizer (default o200k); the policies in ``evidence`` (those replayed) get `RewriteEvidence` at each rewrite.
    """
    live = {name: policy_builder(name)(run, options, encoder) for name in policies}  # ValueError naming a bad one
    tokens = TokenCache(encode)
    previous: dict[str, list[tuple[int, ...]] | None] = dict.fromkeys(policies)
    calls: dict[str, list[CallCost]] = {name: [] for name in policies}
    measured = [name for name in policies if name in evidence]
    found: dict[str, list[RewriteEvidence]] = {name: [] for name in measured}
    whole = parse_history(run.messages) if measured else None
    for call, position in enumerate(c.position for c in run.calls):
        request = run.request(position)  # after the agent's own compaction, what it sent then: a rewrite
        for name, policy in live.items():
            forwarded = policy(request)
            current = tokens.request(forwarded.messages)
            embedding = sum(len(tokens.text(text)) for text in forwarded.embedded)
            cost = call_cost(previous[name], current, embedding)
            calls[name].append(cost)
            previous[name] = current
            if name in found and cost.prefix_broken and len(request) == position:
                rewrite = rewrite_evidence(call, whole, request, forwarded.messages, tokens, encoder(options.encoder))
                if rewrite is not None:
                    found[name].append(rewrite)
    model = encoder(options.encoder)
    if isinstance(model, EmbeddingCache):
        model.flush()  # one shard per run, not one per call
    return RunReplay(run.name, run.format, run.path, calls, found)


def rewrite_evidence(call: int, whole: History, request: Sequence[dict[str, Any]],
                     forwarded: Sequence[dict[str, Any]], tokens: TokenCache,
                     encoder: Encoder) -> RewriteEvidence | None:
    """`RewriteEvidence` for the blocks of ``request`` that ``forwarded`` keeps (the caller's message objects);
    None when the recorded next turn (the message at ``len(request)`` of the whole run) is not a block."""
    history = parse_history(request)
    n = len(history.spans)
    if n >= len(whole.spans) or whole.spans[n].start != len(request) or n == 0:
        return None
    sent = {id(m) for m in forwarded}
    kept = [b for b, span in enumerate(history.spans) if any(id(request[p]) in sent for p in span.positions)]
    sizes = [sum(len(tokens.message(request[p])) for p in span.positions) for span in history.spans]
    kept_tokens = sum(sizes[b] for b in kept)
    recent: list[int] = []
    recent_tokens = 0
    for b in range(n - 1, -1, -1):
        recent_tokens += sizes[b]
        if recent_tokens > kept_tokens:
            break
        recent.append(b)
    blocks, action = history.blocks, whole.blocks[n]
    x = encoder.encode([block_text(block) for block in blocks])
    near = nearest(x, encoder.encode([action_text(action)])[0], 3).tolist()
    texts = [block_text(block, sys.maxsize) for block in blocks]
    named = referenced_blocks(action_references(action), texts, [block_words(t) for t in texts])
    return RewriteEvidence(call, n, len(kept), len(recent), kept_tokens,
                           retained_fraction(near, kept), retained_fraction(near, recent),
                           retained_fraction(named, kept) if named else None,
                           retained_fraction(named, recent) if named else None)


def evidence_means(rows: Sequence[RewriteEvidence]) -> dict[str, float]:
    """Means over rewrites of each `EVIDENCE_FIELDS` entry (None entries skipped; nan if none), ``rewrites``, and
    per metric (``top3``, ``referenced``) the paired difference kept − recent: ``_delta`` (mean), ``_delta_se``
    (its standard error; nan below 2 rewrites), ``_better`` and ``_worse`` (rewrites where kept retains more, less)."""
    out: dict[str, float] = {"rewrites": len(rows)}
    for field in EVIDENCE_FIELDS:
        values = [getattr(r, field) for r in rows if getattr(r, field) is not None]
        out[field] = sum(values) / len(values) if values else math.nan
    for metric in ("top3", "referenced"):
        deltas = [getattr(r, f"{metric}_kept") - getattr(r, f"{metric}_recent") for r in rows
                  if getattr(r, f"{metric}_kept") is not None]
        mean = sum(deltas) / len(deltas) if deltas else math.nan
        spread = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (len(deltas) - 1)) if len(deltas) > 1 else math.nan
        error = spread / math.sqrt(len(deltas)) if deltas else math.nan
        out.update({f"{metric}_delta": mean, f"{metric}_delta_se": error,
                    f"{metric}_better": sum(d > 0 for d in deltas), f"{metric}_worse": sum(d < 0 for d in deltas)})
    return out


def check_policies(names: Iterable[str]) -> None:
    """``ValueError`` naming the first policy name that `policy_builder` cannot resolve."""
    for name in names:
        policy_builder(name)


def replay_or_error(run: Run, policies: Sequence[str], options: PolicyOptions,
                    evidence: Sequence[str] = EVIDENCE_POLICIES,
                    encoder: Callable[[str], Encoder] = shared_encoder) -> RunReplay | tuple[str, str]:
    """`replay_run`, or (run name, error) so that one failing run does not stop the others."""
    try:
        return replay_run(run, policies, options, encoder, evidence=evidence)
    except Exception as err:  # reported with the run's name instead of ending the whole replay
        return run.name, f"{type(err).__name__}: {err}"


def replay_runs(runs: Sequence[Run], policies: Sequence[str], options: PolicyOptions,
                runner: Runner = LocalPool(), progress: bool = True, evidence: Sequence[str] = EVIDENCE_POLICIES
                ) -> tuple[list[RunReplay], list[tuple[str, str]]]:
    """Every run replayed on ``runner`` (default: in this process), in input order, with the encoders it builds
    (`shared_encoder`); failures as (name, error)."""
    check_policies(policies)
    job = partial(replay_or_error, policies=policies, options=options, evidence=evidence,
                  encoder=partial(shared_encoder, make=runner.encoder))
    replays: list[RunReplay] = []
    errors: list[tuple[str, str]] = []
    for result in run_all(runner, job, runs, progress):
        (replays if isinstance(result, RunReplay) else errors).append(result)
    return replays, errors


def pooled(replays: Iterable[RunReplay], long_runs: Sequence[int] = ()) -> dict[str, dict[str, Totals]]:
    """Totals per group (`RunReplay.groups`, in `group_order`) and policy."""
    return pool_by_group(replays, long_runs, RunReplay.totals, Totals)


def pooled_evidence(replays: Iterable[RunReplay], long_runs: Sequence[int] = ()
                    ) -> dict[str, dict[str, list[RewriteEvidence]]]:
    """Rewrite evidence per group (`RunReplay.groups`, in `group_order`) and measured policy."""
    return pool_by_group(replays, long_runs, lambda replay: replay.evidence, list)


def pool_by_group(replays: Iterable[RunReplay], long_runs: Sequence[int], per_policy: Callable[[RunReplay], dict],
                  empty: Callable[[], Any]) -> dict[str, dict[str, Any]]:
    """Sum (``+``) each run's ``per_policy`` values into every group the run belongs to, groups in `group_order`."""
    groups: dict[str, dict[str, Any]] = {}
    for replay in replays:
        for group in replay.groups(long_runs):
            into = groups.setdefault(group, {})
            for policy, value in per_policy(replay).items():
                if policy not in into:
                    into[policy] = empty()
                into[policy] += value  # lists grow in place; Totals add up to a new one
    return {group: groups[group] for group in group_order(groups)}


def evidence_markdown(groups: dict[str, dict[str, list[RewriteEvidence]]], options: PolicyOptions) -> str:
    """One table per group: mean evidence retained at rewrites, kept blocks vs the newest of the same tokens."""
    lines = ["Evidence at rewrites: the kept blocks vs the newest blocks of the same total tokens (means over "
             "rewrites; referenced: over rewrites whose next action names an earlier block). Δ: kept − recent per "
             "rewrite, mean ± standard error (rewrites better / worse).", ""]
    for group, by_policy in groups.items():
        lines += [f"**{group}**", "", "| policy | rewrites | Top-3 kept | Top-3 recent | Top-3 Δ | referenced kept "
                  "| referenced recent | referenced Δ |", "|---|---|---|---|---|---|---|---|"]
        for policy, rows in by_policy.items():
            m = evidence_means(rows)
            lines.append(f"| {policy_label(policy, options)} | {len(rows)} | {mean_cell(m['top3_kept'])} "
                         f"| {mean_cell(m['top3_recent'])} | {paired(m, 'top3')} | {mean_cell(m['referenced_kept'])} "
                         f"| {mean_cell(m['referenced_recent'])} | {paired(m, 'referenced')} |")
        lines.append("")
    return "\n".join(lines)


def mean_cell(value: float) -> str:
    """``0.612``, or ``–`` for a mean over no rewrites (NaN)."""
    return "–" if math.isnan(value) else f"{value:.3f}"


def paired(means: dict[str, float], metric: str) -> str:
    """``+0.026 ± 0.044 (18 / 17)``: the paired difference of `evidence_means` for ``metric`` (``–`` over no
    rewrites, no ``±`` over one)."""
    delta, se = means[f"{metric}_delta"], means[f"{metric}_delta_se"]
    if math.isnan(delta):
        return "–"
    spread = "" if math.isnan(se) else f" ± {se:.3f}"
    return f"{delta:+.3f}{spread} ({means[f'{metric}_better']} / {means[f'{metric}_worse']})"


def relative(totals: dict[str, Totals], prices: Prices) -> dict[str, dict[str, float]]:
    """Per policy: input tokens, price and tokens + embedding relative to the full history; the cached share."""
    base = totals[BASELINE]
    out = {}
    for policy, t in totals.items():
        out[policy] = {
            "tokens": t.input / base.input if base.input else 1.0,
            "price": t.price(prices) / base.price(prices) if base.input else 1.0,
            "cached_fraction": t.cached / t.input if t.input else 0.0,
            "embedding": t.embedding / base.input if base.input else 0.0,
            "combined": (t.input + t.embedding) / base.input if base.input else 1.0,
        }
    return out


def markdown(groups: dict[str, dict[str, Totals]], runs_per_group: dict[str, int], options: PolicyOptions) -> str:
    """One table per group: tokens and price vs the full history, cached and uncached tokens, prefix breaks, and
    embedding tokens."""
    lines = [f"Cached input priced at {options.prices.cached:g}, uncached at {options.prices.uncached:g}; ratios are "
             "pooled sums over runs.", ""]
    for group, totals in groups.items():
        rel = relative(totals, options.prices)
        lines += [f"**{group}** ({runs_per_group[group]} runs, {totals[BASELINE].calls} calls)", "",
                  "| policy | input tokens | tokens vs full | price vs full | cached tokens | uncached tokens "
                  "| prefix breaks / call | embedding tokens | tokens + embedding vs full |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for policy, t in totals.items():
            r = rel[policy]
            lines.append(f"| {policy_label(policy, options)} | {t.input:,} | {r['tokens']:.3f} | {r['price']:.3f} "
                         f"| {t.cached:,} | {t.uncached:,} | {t.prefix_breaks / max(t.calls, 1):.3f} "
                         f"| {t.embedding:,} | {r['combined']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def report(replays: Sequence[RunReplay], options: PolicyOptions, long_runs: Sequence[int] = ()) -> dict[str, Any]:
    """Everything as JSON-ready data: options, per-run totals and per-call costs, pooled totals and ratios."""
    pooled_out: dict[str, dict[str, Any]] = {}
    for group, totals in pooled(replays, long_runs).items():
        rel = relative(totals, options.prices)
        pooled_out[group] = {policy: {**asdict(t), "price": t.price(options.prices), "relative": rel[policy]}
                             for policy, t in totals.items()}
    return {
        "options": asdict(options), "long_runs": list(long_runs), "pooled": pooled_out,
        "evidence": {group: {policy: evidence_means(rows) for policy, rows in by_policy.items()}
                     for group, by_policy in pooled_evidence(replays, long_runs).items()},
        "runs": [{"name": r.name, "format": r.format, "path": r.path,
                  "totals": {policy: asdict(t) for policy, t in r.totals().items()},
                  "calls": {policy: [[c.input, c.cached, c.embedding, int(c.prefix_broken)] for c in costs]
                            for policy, costs in r.calls.items()},
                  "evidence": {policy: [asdict(e) for e in rows] for policy, rows in r.evidence.items()}}
                 for r in replays],
    }


def plot(groups: dict[str, dict[str, Totals]], options: PolicyOptions, path: Path) -> Path:
    """Tokens vs price relative to the full history: one colour per policy, one marker per group."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 5))
    markers = dict(zip(groups, itertools.cycle("o^sDvP*X")))
    colours = policy_colours(groups[ALL_RUNS])
    for group, totals in groups.items():
        for policy, r in relative(totals, options.prices).items():
            main = group == ALL_RUNS
            ax.scatter(r["tokens"], r["price"], color=colours[policy], marker=markers[group], s=70 if main else 35,
                       label=policy_label(policy, options) if main else None)
    for group, marker in markers.items():
        ax.scatter([], [], facecolors="none", edgecolors="black", marker=marker, label=group)
    ax.axhline(1, color="grey", lw=0.5)
    ax.axvline(1, color="grey", lw=0.5)
    ax.set_xlabel("input tokens vs full history")
    prices = options.prices
    ax.set_ylabel(f"price vs full history (cached at {prices.cached:g}, uncached at {prices.uncached:g})")
    ax.set_title("Online replay: tokens and price per forwarding policy")
    ax.legend(fontsize=8)
    return save(fig, path)


def plot_by_length(replays: Sequence[RunReplay], options: PolicyOptions, path: Path) -> Path:
    """Each run's tokens and price relative to its full history against its number of calls, per policy."""
    plt = pyplot()

    policies = [p for p in replays[0].calls if p != BASELINE]
    colours = policy_colours(replays[0].calls)
    calls = [len(replay.calls[BASELINE]) for replay in replays]
    rel = [relative(replay.totals(), options.prices) for replay in replays]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharex=True)
    for ax, measure, label in zip(axes, ("tokens", "price"), ("input tokens", "price")):
        for policy in policies:
            ax.scatter(calls, [r[policy][measure] for r in rel], color=colours[policy], s=10, alpha=0.6,
                       label=policy_label(policy, options))
        ax.axhline(1, color="grey", lw=0.5)
        ax.set_xlabel("model calls in the run")
        ax.set_ylabel(f"{label} vs full history")
    axes[1].legend(fontsize=8)
    prices = options.prices
    fig.suptitle(f"Online replay per run (cached at {prices.cached:g}, uncached at {prices.uncached:g})")
    return save(fig, path)


def policy_colours(policies: Iterable[str]) -> dict[str, str]:
    """One colour per policy, in order, the same in every plot of a report."""
    return {policy: POLICY_COLOURS[i % len(POLICY_COLOURS)] for i, policy in enumerate(policies)}




def plot_evidence(replays: Sequence[RunReplay], options: PolicyOptions, path: Path) -> Path:
    """Evidence against tokens: per group (all runs, each run format) and measured policy, the paired difference
    kept − newest of the same tokens at rewrites (Top-3 and referenced, mean ± standard error) against the policy's
    input tokens relative to the full history."""
    plt = pyplot()

    evidence, totals = pooled_evidence(replays), pooled(replays)
    policies = list(next(iter(evidence.values()), {}))
    colours = policy_colours(policies)
    markers = dict(zip(evidence, itertools.cycle("o^sDvP*Xhp<>")))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharex=True)
    for ax, metric in zip(axes, ("top3", "referenced")):
        for group, by_policy in evidence.items():
            rel = relative(totals[group], options.prices)
            for policy, rows in by_policy.items():
                m = evidence_means(rows)
                if math.isnan(m[f"{metric}_delta"]):
                    continue
                main = group == ALL_RUNS
                ax.errorbar(rel[policy]["tokens"], m[f"{metric}_delta"], yerr=m[f"{metric}_delta_se"],
                            color=colours[policy], marker=markers[group], markersize=8 if main else 5,
                            linestyle="none", capsize=2, label=policy_label(policy, options) if main else None)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("input tokens vs full history")
        ax.set_ylabel(f"{'Top-3' if metric == 'top3' else 'referenced'}: kept − newest of the same tokens")
    for group, marker in markers.items():
        axes[1].scatter([], [], facecolors="none", edgecolors="black", marker=marker, label=group)
    axes[1].legend(fontsize=7)
    fig.suptitle("Evidence at rewrites against tokens (mean ± standard error over rewrites)")
    return save(fig, path)
