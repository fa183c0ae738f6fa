"""`StaticEncoder`: a static word-piece embedding table distilled from all-MiniLM-L6-v2 (`distill`), shipped in the
package: a text's vector is the normalised sum of the rows of its distinct word pieces; numpy and ``tokenizers``."""

from __future__ import annotations

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

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, encoding in enumerate(self.tokenizer.encode_batch(list(map(tokenizable, texts)),
                                                                            add_special_tokens=False)):
            ids = np.unique(encoding.ids) if encoding.ids else [len(self.table) - 1]
            out[row] = self.table[ids].sum(axis=0)
        return normalise_rows(out)
