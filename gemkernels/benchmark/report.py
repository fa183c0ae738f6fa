"""Reports of ``gem bench`` results: ``results.md`` (a table, the issue's targets as ratios, what was left
out and why) and PNG plots (``throughput.png``: blocks/s against n, d and S per backend; ``roofline.png``:
the fraction of the roofline each backend reaches).

Everything is rebuilt from ``results.jsonl``; when a configuration was measured more than once (several
runs into one folder), its latest record wins. matplotlib is imported only to draw.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from gemkernels.benchmark.point import CONTENDERS, VARIANTS
from gemkernels.benchmark.timing import fmt_seconds
from gemkernels.evaluate.plotting import pyplot

KEY = ("mode", "dtype", "sessions", "n", "d", "b", "backend", "device")
ORDER = {name: i for i, name in enumerate(CONTENDERS + VARIANTS)}

#: The issue's targets: (label, the point, metric of the best triton path, goal). Ratios, never pass/fail.
TARGETS = (
    ("S=4096, n=256, d=1024, b=16: best triton / read X once at copy bandwidth",
     {"device": "cuda", "sessions": 4096, "n": 256, "d": 1024, "b": 16, "mode": "fixed"}, "time_over_read_once",
     "<= 2x"),
    ("S=4096, n=256, d=1024, b=16: speed-up of the best triton path over torch",
     {"device": "cuda", "sessions": 4096, "n": 256, "d": 1024, "b": 16, "mode": "fixed"}, "speedup_vs_torch",
     ">= 10x"),
    ("S=256, n=4096, d=384, b=16: best triton / b passes over X at copy bandwidth",
     {"device": "cuda", "sessions": 256, "n": 4096, "d": 384, "b": 16, "mode": "fixed"}, "time_over_b_passes",
     "<= 1.5x"),
)


def load(path: Path) -> list[dict[str, Any]]:
    """Every record of a results.jsonl."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def latest(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Point records, the latest per configuration, in table order; and the distinct notes."""
    points: dict[tuple, dict[str, Any]] = {}
    notes: dict[str, None] = {}
    for rec in records:
        if rec["kind"] == "point":
            points[tuple(rec["config"][k] for k in KEY)] = rec
        else:
            notes[rec["note"]] = None
    ordered = sorted(points.values(), key=lambda r: (
        r["config"]["device"], r["config"]["mode"], r["config"]["dtype"], r["config"]["sessions"], r["config"]["n"],
        r["config"]["d"], ORDER.get(r["config"]["backend"], len(ORDER))))
    return ordered, list(notes)


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def fmt_rate(value: float) -> str:
    """3 significant digits with k/M/G suffixes."""
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def table(points: list[dict[str, Any]]) -> list[str]:
    """Markdown rows of the measured points."""
    lines = ["| device | mode | dtype | S | n | d | backend | median | IQR | sessions/s | blocks/s | GFLOP/s | GB/s | "
             "% copy BW | % matmul | % roofline | / read X once | vs torch | same as torch |",
             "|" + "---|" * 19]
    for rec in points:
        if rec["status"] != "ok":
            continue
        c, t, m = rec["config"], rec["timing"], rec["metrics"]
        same = rec["checks"].get("same_indices_as_torch")
        lines.append(
            f"| {c['device']} | {c['mode']} | {c['dtype']} | {c['sessions']} | {c['n']} | {c['d']} | {c['backend']} | "
            f"{fmt_seconds(t['median_s'])} | {fmt_seconds(t['q1_s'])}-{fmt_seconds(t['q3_s'])} | "
            f"{fmt_rate(m['sessions_per_s'])} | {fmt_rate(m['blocks_per_s'])} | {m['gflop_per_s']:.3g} | "
            f"{m['gb_per_s']:.3g} | {100 * m['bandwidth_fraction']:.3g} | {100 * m['flops_fraction']:.3g} | "
            f"{100 * m['roofline_fraction']:.3g} | {ratio(m['time_over_read_once'])} | "
            f"{ratio(m['speedup_vs_torch'])} | {'-' if same is None else f'{same:.0%}'} |")
    return lines


def target_lines(points: list[dict[str, Any]]) -> list[str]:
    """Each target beside what was measured, per dtype: the best (fastest) triton path's ratio."""
    lines = []
    for label, where, metric, goal in TARGETS:
        best: dict[str, dict[str, Any]] = {}
        for rec in points:
            c = rec["config"]
            if (rec["status"] == "ok" and c["backend"].startswith("triton")
                    and all(c[k] == v for k, v in where.items())):
                if c["dtype"] not in best or rec["timing"]["median_s"] < best[c["dtype"]]["timing"]["median_s"]:
                    best[c["dtype"]] = rec
        if not best:
            lines.append(f"- {label}: not measured in these results (target {goal})")
        for dtype, rec in sorted(best.items()):
            lines.append(f"- {label}, {dtype}: **{ratio(rec['metrics'][metric])}** ({rec['config']['backend']}, "
                         f"{fmt_seconds(rec['timing']['median_s'])}; target {goal})")
    return lines


def runs(records: list[dict[str, Any]]) -> list[str]:
    """One line per distinct run (date): machine and the ceilings it measured."""
    seen: dict[str, str] = {}
    for rec in records:
        if "env" not in rec or rec["env"]["date"] in seen:
            continue
        env, ceil = rec["env"], rec["ceilings"]
        where = env["gpu"] or f"{env['cpu']} ({env['cpu_count']} cores)"
        matmul = ", ".join(f"{k} {v / 1e12:.3g}" for k, v in ceil["matmul_flop_per_s"].items())
        nvml = (env.get("gpu_info") or {}).get("nvml")
        extra = ""
        if isinstance(nvml, dict):
            extra = (f"; driver {nvml.get('driver')}, SM clock max {nvml.get('sm_clock_max_mhz')} MHz, "
                     f"power limit {nvml.get('power_limit_w')} W")
        seen[env["date"]] = (f"- {env['date']}: {where}, commit {(env['git_commit'] or 'unknown')[:12]}"
                             f"{' (dirty)' if env['git_dirty'] else ''}, torch {env['torch']}, triton {env['triton']}"
                             f"{extra}. Ceilings: copy {ceil['copy_bytes_per_s'] / 1e9:.1f} GB/s (read + write), "
                             f"matmul TFLOP/s {matmul}")
    return list(seen.values())


def markdown(records: list[dict[str, Any]]) -> str:
    """The whole report as markdown."""
    points, notes = latest(records)
    missing = [f"- {r['config']['device']} {r['config']['mode']} {r['config']['dtype']} S={r['config']['sessions']} "
               f"n={r['config']['n']} d={r['config']['d']} {r['config']['backend']}: {r['status']}: {r['note']}"
               for r in points if r["status"] != "ok"]
    parts = ["# gem bench results", "", "## Runs", "", *runs(records), "", "## Targets (ratios, not pass/fail)", "",
             *target_lines(points), "", "## Measurements", "", *table(points)]
    if missing or notes:
        parts += ["", "## Not measured", "", *missing, *(f"- {note}" for note in notes)]
    return "\n".join(parts) + "\n"


def best_slice(points: list[dict[str, Any]], axis: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The values of the other axes that give ``axis`` the most distinct values, and those records."""
    others = [k for k in ("sessions", "n", "d") if k != axis]
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for rec in points:
        groups[tuple(rec["config"][k] for k in others)].append(rec)
    key = max(groups, key=lambda k: (len({r["config"][axis] for r in groups[k]}), k))
    return dict(zip(others, key)), groups[key]


def plot_throughput(points: list[dict[str, Any]], path: Path) -> None:
    """Rows: blocks/s against n, d and S; columns: (dtype, mode); one line per backend."""
    plt = pyplot("bench")
    panels = sorted({(r["config"]["dtype"], r["config"]["mode"]) for r in points})
    fig, axes = plt.subplots(3, len(panels), figsize=(4.5 * len(panels), 10), squeeze=False)
    for col, (dtype, mode) in enumerate(panels):
        subset = [r for r in points if (r["config"]["dtype"], r["config"]["mode"]) == (dtype, mode)]
        for row, axis in enumerate(("n", "d", "sessions")):
            ax = axes[row][col]
            fixed, recs = best_slice(subset, axis)
            for backend in sorted({r["config"]["backend"] for r in recs}, key=lambda b: ORDER.get(b, len(ORDER))):
                line = sorted((r["config"][axis], r["metrics"]["blocks_per_s"]) for r in recs
                              if r["config"]["backend"] == backend)
                ax.plot(*zip(*line), marker="o", label=backend,  # dashed: the greedy state in global memory
                        linestyle="--" if backend.endswith("-global") else "-")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("S" if axis == "sessions" else axis)
            ax.set_ylabel("blocks/s")
            ax.set_title(f"{dtype} {mode}; " + ", ".join(f"{'S' if k == 'sessions' else k}={v}"
                                                         for k, v in fixed.items()), fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_roofline(points: list[dict[str, Any]], path: Path) -> None:
    """Fraction of the roofline (max of read-X-once and work at the matmul rate, over the median) against
    the size of X, per backend; marker by dtype."""
    plt = pyplot("bench")
    markers = {"fp32": "o", "fp16": "s", "bf16": "^"}
    fig, ax = plt.subplots(figsize=(8, 5))
    for backend in sorted({r["config"]["backend"] for r in points}, key=lambda b: ORDER.get(b, len(ORDER))):
        color = None
        for dtype, marker in markers.items():
            recs = [r for r in points if r["config"]["backend"] == backend and r["config"]["dtype"] == dtype]
            if recs:
                handle = ax.scatter([r["metrics"]["x_bytes"] for r in recs],
                                    [r["metrics"]["roofline_fraction"] for r in recs], marker=marker, color=color,
                                    label=f"{backend} {dtype}", alpha=0.8)
                color = handle.get_facecolor()[0]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("bytes of X")
    ax.set_ylabel("fraction of the roofline")
    ax.set_title("roofline time / measured time (1 = at the measured ceiling)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(out: Path, plots: bool = True) -> list[Path]:
    """Rebuild ``results.md`` (and, with ``plots``, the PNGs, when any point was measured) from
    ``out/results.jsonl``; returns the paths written."""
    source = out / "results.jsonl"
    if not source.exists():
        raise SystemExit(f"no results to report: {source} does not exist")
    records = load(source)
    (out / "results.md").write_text(markdown(records))
    written = [out / "results.md"]
    measured = [r for r in latest(records)[0] if r["status"] == "ok"]
    if plots and measured:
        try:
            plot_throughput(measured, out / "throughput.png")
            plot_roofline(measured, out / "roofline.png")
        except ImportError as err:
            raise SystemExit(f"{err}, or pass --no-plots") from err
        written += [out / "throughput.png", out / "roofline.png"]
    return written
