"""`StaticEncoder`: a static word-piece embedding table distilled from all-MiniLM-L6-v2 (`distill`), shipped in the
package: a text's vector is the normalised sum of the rows of its distinct word pieces; numpy and ``tokenizers``.

The word pieces of a text are those of its parts between ASCII whitespace and punctuation (BERT's pre-tokenizer
splits there and its normaliser reads one character at a time), so each part is tokenised once per process and
remembered (`PIECE_MEMORY`): a history repeats its identifiers, paths and words."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gemkernels.compress.encoders.base import normalise_rows
from gemkernels.compress.encoders.wordpiece import load_tokenizer, tokenizable

#: The shipped table: ``embeddings.npz`` (``rows``: int8, one per vocabulary piece plus the empty text's, weights
#: folded in; ``scales``: float32, one per row), ``tokenizer.json``, ``NOTICE`` and the licence of the weights it
#: derives from (Apache-2.0); rebuilt by ``python -m gemkernels.compress.encoders.distill``.
STATIC_DIR = Path(__file__).resolve().parent / "minilm_static"
TABLE_FILE = "embeddings.npz"
#: A text's parts: the runs between ASCII whitespace and punctuation, and each ASCII punctuation character in it.
WORDS = re.compile(r"[^\t\n\r !-/:-@\[-`{-~]+")
#: Parts remembered with their word pieces, at most this many (then the memory starts again), each of at most
#: `PIECE_MEMORY_CHARS` characters: some 16 MB.
PIECE_MEMORY, PIECE_MEMORY_CHARS = 1 << 16, 48


class StaticEncoder:
    """Static embeddings of all-MiniLM-L6-v2's word pieces (``folder``: a `STATIC_DIR`-like folder): deterministic,
    no model forward, no torch. Each distinct piece counts once (repeated lines of an observation do not swamp the
    rest); a text with no word piece gets the table's last row (the empty text's vector)."""

    def __init__(self, folder: str | Path = STATIC_DIR, name: str = "all-MiniLM-L6-v2-static"):
        folder = Path(folder)
        if not (folder / TABLE_FILE).is_file():
            raise FileNotFoundError(f"no static embedding table at {folder / TABLE_FILE}; rebuild it with "
                                    "python -m gemkernels.compress.encoders.distill (needs gemkernels[minilm])")
        with np.load(folder / TABLE_FILE) as data:
            self.table = data["rows"] * data["scales"][:, None]
        self.tokenizer = load_tokenizer(folder / "tokenizer.json", "embed")
        self.dim = self.table.shape[1]
        self.name = f"{name}-{self.dim}"
        self.remembered: dict[str, tuple[int, ...]] = {}  # part -> its word-piece ids

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        parts = [text_parts(tokenizable(text)) for text in texts]
        remembered, known, unknown = self.remembered, {}, []
        for part in set().union(*parts):
            ids = remembered.get(part)
            if ids is None:
                unknown.append(part)
            else:
                known[part] = ids
        if unknown:
            found = self.part_ids(unknown)
            known.update(found)
            kept = [(part, ids) for part, ids in found.items() if len(part) <= PIECE_MEMORY_CHARS][:PIECE_MEMORY]
            if len(remembered) + len(kept) > PIECE_MEMORY:
                remembered.clear()
            remembered.update(kept)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, held in enumerate(parts):
            ids = set().union(*map(known.__getitem__, held))
            rows = np.sort(np.fromiter(ids, np.intp, len(ids))) if ids else [len(self.table) - 1]
            out[row] = self.table[rows].sum(axis=0)
        return normalise_rows(out)

    def part_ids(self, parts: Sequence[str]) -> dict[str, tuple[int, ...]]:
        """Each part's word-piece ids, from one tokenizer call over the parts joined by spaces (their tokens' offsets
        say whose they are)."""
        encoding = self.tokenizer.encode_batch([" ".join(parts)], add_special_tokens=False)[0]
        starts = np.cumsum([0] + [len(part) + 1 for part in parts[:-1]])
        token_starts = np.fromiter((start for start, _ in encoding.offsets), np.intp, len(encoding.ids))
        owners = np.searchsorted(starts, token_starts, side="right") - 1
        bounds = np.searchsorted(owners, np.arange(len(parts) + 1)).tolist()
        ids = encoding.ids
        return {part: tuple(ids[bounds[i]:bounds[i + 1]]) for i, part in enumerate(parts)}


def text_parts(text: str) -> set[str]:
    """The distinct parts of ``text`` whose word pieces together are the text's: its runs between ASCII whitespace
    and punctuation, and the punctuation characters it holds."""
    return set(WORDS.findall(text)).union([mark for mark in string.punctuation if mark in text])
