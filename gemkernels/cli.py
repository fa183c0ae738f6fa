"""``gem``: the command line.

``gem select FILE``: split a chat history into interaction blocks, embed them, protect the
most recent ones and show which blocks GEM's residual selection keeps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .api import DEFAULT_K, DEFAULT_TAU, select
from .arrays import to_numpy
from .blocks import BlockStructureError, parse_history
from .encoders import make_encoder
from .representation import block_text


def load_messages(path: Path) -> list[dict[str, Any]]:
    """A JSON file holding an OpenAI ``messages`` list, or an object with a ``messages`` key."""
    data = json.loads(path.read_text())
    messages = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(messages, list):
        raise ValueError(f"{path}: expected a list of messages or an object with 'messages'")
    return messages


def run_select(args: argparse.Namespace) -> int:
    messages = load_messages(args.file)
    try:
        blocks = parse_history(messages).blocks
    except BlockStructureError as err:
        print(f"{args.file}: history forwarded unchanged: {err}", file=sys.stderr)
        return 1
    if not blocks:
        print(f"{args.file}: no tool-call blocks to select from", file=sys.stderr)
        return 1
    texts = [block_text(block) for block in blocks]
    started = time.perf_counter()
    encoder = make_encoder(args.encoder)
    embeddings = encoder.encode(texts)
    encoded = time.perf_counter()
    recent = list(range(max(0, len(blocks) - args.recent), len(blocks)))
    sel = select(embeddings, protected=recent, tau=args.tau, k=args.k, backend=args.backend)
    selected = time.perf_counter()

    indices = to_numpy(sel.indices).tolist()
    residuals = to_numpy(sel.residuals)
    sizes = [sum(len(json.dumps(messages[p])) for p in block.positions) for block in blocks]
    kept_chars = sum(sizes[i] for i in indices)
    summary = {
        "file": str(args.file), "encoder": encoder.name, "blocks": len(blocks), "kept": len(indices),
        "protected": sel.num_protected, "coverage": round(sel.coverage, 4), "stop": sel.stop,
        "block_chars": sum(sizes), "kept_chars": kept_chars,
        "encode_s": round(encoded - started, 3), "select_s": round(selected - encoded, 4),
        "selection_order": indices,
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{len(blocks)} blocks in {args.file} ({encoder.name}, {embeddings.shape[1]}-d, "
          f"encoded in {summary['encode_s']} s)")
    print("| block | message | chars | kept | why | residual after |")
    print("|---:|---:|---:|---:|---|---:|")
    rank = {i: r for r, i in enumerate(indices)}
    for i, block in enumerate(blocks):
        why = "recent" if i in recent else ("residual" if i in rank else "")
        kept = str(rank[i] + 1) if i in rank else ""
        print(f"| {i} | {block.start} | {sizes[i]} | {kept} | {why} | {residuals[i]:.3f} |")
    print(f"kept {len(indices)}/{len(blocks)} blocks ({kept_chars}/{sum(sizes)} chars of blocks), "
          f"coverage E = {sel.coverage:.3f}, stopped on {sel.stop} (tau = {args.tau}, k = {args.k})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gem", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sel = commands.add_parser("select", help="show which blocks of a chat history GEM's selection keeps")
    sel.add_argument("file", type=Path, help="JSON: OpenAI messages, or an object with 'messages'")
    sel.add_argument("--encoder", default="minilm", help="minilm (default), hash or hash-<dim>")
    sel.add_argument("--k", type=int, default=DEFAULT_K, help="core capacity K (default %(default)s)")
    sel.add_argument("--tau", type=float, default=DEFAULT_TAU, help="coverage target (default %(default)s)")
    sel.add_argument("--recent", type=int, default=4, help="most recent blocks to protect (default %(default)s)")
    sel.add_argument("--backend", default="auto", help="auto, numpy, torch or triton")
    sel.add_argument("--json", action="store_true", help="print one JSON summary instead of a table")
    args = parser.parse_args(argv)
    return run_select(args)


if __name__ == "__main__":
    sys.exit(main())
