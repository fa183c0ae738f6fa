"""The router on agent families it was not trained on, where it is used: the cache-aware preset's rewrites.

    python -m bench.router_families PATH... [--encoder minilm] [--cache-dir DIR]

For each agent family: a router trained (`gem train-router`'s fit, same signals and seed) on the checkpoints of
every other family, written to a temporary file, drives ``gem-cache-aware`` on that family's runs in the online
replay (`gemkernels.evaluate.online_replay`); beside it the shipped router (trained on all the development runs,
so in-sample there) and the paper's selection on the same schedule (``cache-aware-geometry``). Rows: rewrites, the
paired difference kept − newest of the same tokens at each rewrite (Top-3 of the next action, blocks it
references; mean ± standard error), input tokens and price relative to the full history. ``--encoder`` both
chooses (GEM's encoder, the held-out routers' training) and measures (Top-3's geometry). GEM reads the task from
each request, as ``gem serve`` does.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from gemkernels.compress.encoders import make_encoder
from gemkernels.compress.encoders.cache import DEFAULT_CACHE_DIR, EmbeddingCache
from gemkernels.evaluate.loaders import load_runs
from gemkernels.evaluate.online_policies import PolicyOptions
from gemkernels.evaluate.online_replay import evidence_means, pooled, relative, replay_runs
from gemkernels.evaluate.replay import load_long_runs, prepare
from gemkernels.evaluate.router_training import run_samples, train

MIN_BLOCKS = 16


def row(label: str, family: str, rows: list, totals: dict, policy: str, options: PolicyOptions) -> str:
    """One markdown row of a policy's evidence at rewrites and its cost."""
    m = evidence_means(rows)
    rel = relative(totals, options.prices)[policy]
    return (f"| {family} | {label} | {m['rewrites']} | {m['top3_delta']:+.3f} ± {m['top3_delta_se']:.3f} "
            f"| {m['referenced_delta']:+.3f} ± {m['referenced_delta_se']:.3f} | {rel['tokens']:.3f} "
            f"| {rel['price']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--encoder", default="minilm", help="GEM's encoder and the metrics' (default minilm)")
    parser.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR))
    args = parser.parse_args()
    long_runs = load_long_runs(args.paths, MIN_BLOCKS, "bench.router_families")
    jobs = prepare(long_runs, EmbeddingCache(make_encoder(args.encoder), args.cache_dir), MIN_BLOCKS, False)
    samples = [s for job in jobs for s in run_samples(job)]
    runs, _ = load_runs(args.paths)
    options = PolicyOptions(encoder=args.encoder)
    print(f"Encoder {args.encoder}; {len(jobs)} runs with checkpoints; cells: kept − newest of the same tokens at "
          "rewrites, mean ± standard error; tokens and price vs the full history.\n")
    print("| family | selection | rewrites | Top-3 Δ | referenced Δ | tokens | price |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for family in sorted({s.family for s in samples}):
            held_out = Path(folder) / f"router-without-{family}.json"
            train([s for s in samples if s.family != family]).save(held_out)
            unseen = f"gem-cache-aware:router={held_out}"
            policies = ["full", "gem-cache-aware-geometry", "gem-cache-aware", unseen]
            replays, errors = replay_runs([r for r in runs if r.format == family], policies, options,
                                          progress=False, evidence=policies[1:])
            if errors:
                raise SystemExit(f"{family}: {errors[:3]}")
            totals = pooled(replays)["all"]
            evidence: dict[str, list] = {}
            for replay in replays:
                for policy, rows in replay.evidence.items():
                    evidence.setdefault(policy, []).extend(rows)
            for label, policy in (("paper's selection (cache-aware-geometry)", policies[1]),
                                  ("shipped router (in-sample)", policies[2]),
                                  ("router trained without this family", unseen)):
                print(row(label, family, evidence[policy], totals, policy, options))


if __name__ == "__main__":
    main()
