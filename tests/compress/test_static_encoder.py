"""The default encoder (``minilm`` = ``minilm-static``): the shipped static table distilled from all-MiniLM-L6-v2
loads with no torch and no network, is deterministic across processes, and agrees with the full model's geometry on
real blocks (the reference vectors of the bundled example) better than the hash encoder does; the distillation's
table is what its docstring says."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import EXAMPLE, FIXTURES
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gemkernels.compress.encoders import HashEncoder, make_encoder, normalise_rows
from gemkernels.compress.encoders.distill import static_table
from gemkernels.compress.encoders.static import STATIC_DIR, TABLE_FILE
from gemkernels.compress.encoders.wordpiece import tokenizable

pytest.importorskip("tokenizers")
sys.path.insert(0, str(FIXTURES))
from make_minilm_reference import example_texts  # noqa: E402
from test_minilm_numpy import NO_TORCH_NO_NETWORK, reference  # noqa: E402


def pairwise_agreement(vectors: np.ndarray, reference_vectors: np.ndarray) -> float:
    """Pearson correlation of the two encoders' cosines over every pair of blocks."""
    upper = np.triu_indices(len(vectors), 1)
    return float(np.corrcoef((vectors @ vectors.T)[upper], (reference_vectors @ reference_vectors.T)[upper])[0, 1])


def test_minilm_is_the_static_encoder_shipped_in_the_package():
    enc = make_encoder("minilm")
    assert enc.encoder.__class__.__name__ == "StaticEncoder" and enc.name == make_encoder("minilm-static").name
    texts = example_texts()
    x = enc.encode(texts + [""])
    assert x.shape == (len(texts) + 1, enc.dim) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-5)
    with np.load(STATIC_DIR / TABLE_FILE) as data:
        rows = data["rows"]
    vocabulary = json.loads((STATIC_DIR / "tokenizer.json").read_text())["model"]["vocab"]
    assert rows.dtype == np.int8 and rows.shape == (len(vocabulary) + 1, enc.dim)
    notice = (STATIC_DIR / "NOTICE").read_text()
    assert "all-MiniLM-L6-v2" in notice and "Apache License, Version 2.0" in notice
    assert "Apache License" in (STATIC_DIR / "LICENSE-APACHE-2.0").read_text()


def test_agrees_with_the_full_model_on_real_blocks_better_than_hashing():
    texts, vectors = reference()
    static = pairwise_agreement(make_encoder("minilm", cached=False).encode(texts), vectors)
    hashed = pairwise_agreement(HashEncoder(256).encode(texts), vectors)
    assert static >= 0.75 and static > hashed + 0.05, (static, hashed)


def test_each_distinct_piece_counts_once():
    enc = make_encoder("minilm", cached=False)
    once, repeated, other = enc.encode(["pytest tests/test_models.py", "pytest tests/test_models.py " * 20,
                                        "git diff setup.cfg"])
    assert once @ repeated == pytest.approx(1.0, abs=1e-6) and once @ other < 0.9


def test_loads_without_torch_or_network_and_encodes_as_here(tmp_path):
    """The same vectors, bit for bit, in a process where torch and sentence-transformers cannot be imported and
    no socket opens; and ``gem compress`` runs there with the default encoder."""
    texts = example_texts()
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    code = NO_TORCH_NO_NETWORK + f"""
import json, runpy, numpy as np
from gemkernels.compress.encoders import make_encoder
texts = json.load(open({str(tmp_path / "texts.json")!r}))
np.save({str(tmp_path / "out.npy")!r}, make_encoder("minilm").encode(texts))
sys.argv = ["gem", "compress", {str(EXAMPLE)!r}, "-o", {str(tmp_path / "forwarded.json")!r}]
runpy.run_module("gemkernels", run_name="__main__")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    here = make_encoder("minilm", cached=False).encode(texts)
    assert hashlib.sha256(np.load(tmp_path / "out.npy").tobytes()).digest() == hashlib.sha256(here.tobytes()).digest()
    forwarded = json.loads((tmp_path / "forwarded.json").read_text())
    assert 0 < len(forwarded["messages"] if isinstance(forwarded, dict) else forwarded) < \
        len(json.loads(EXAMPLE.read_text())["messages"])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 3), st.integers(1, 4))
def test_static_table_keeps_the_principal_axes_after_the_dropped_ones(seed, drop, dims):
    """Without weighting (a huge ``sif``), the table's Gram matrix is that of the centred rows projected on the
    principal axes drop .. drop + dims (found here by an eigendecomposition of the covariance), up to int8."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((40, 8)) * np.geomspace(8, 1, 8)  # distinct variances: unique axes
    rows, scales = static_table(vectors, drop, dims, sif=1e12)
    table = rows * scales[:, None]
    centred = vectors - vectors[:-1].mean(axis=0)
    _, axes = np.linalg.eigh(centred[:-1].T @ centred[:-1])
    kept = axes[:, ::-1][:, drop:drop + dims]
    expected = centred @ kept
    np.testing.assert_allclose(table @ table.T, expected @ expected.T, atol=0.05 * np.abs(expected).max() ** 2)
    signs = np.sign(np.sum(table * expected, axis=0))  # an axis is defined up to its sign
    assert np.all(np.abs(table - expected * signs) <= scales[:, None] / 2 + 1e-9)
    rows_negated, scales_negated = static_table(-vectors, drop, dims, sif=1e12)
    np.testing.assert_array_equal(rows_negated, -rows)  # the sign convention does not depend on LAPACK's
    np.testing.assert_array_equal(scales_negated, scales)


def test_a_lone_surrogate_encodes_as_the_replacement_character_it_stands_for():
    """``tokenizers`` refuses a batch holding a lone surrogate (what a proxy decodes from a ``"\\ud800"`` escape),
    which made every request of the session that carried such a block go out uncompressed; it is read as U+FFFD,
    which BERT's normaliser drops, and a surrogate pair as its character."""
    enc = make_encoder("minilm-static", cached=False)
    got = enc.encode(["ls \ud800 src/", "ls \ufffd src/", "ls  src/", "x\ud83d\ude00y", "x😀y"])
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], got[2])
    np.testing.assert_array_equal(got[3], got[4])


def test_a_session_whose_block_holds_a_lone_surrogate_is_compressed_with_the_default_encoder():
    from gemkernels import GEM

    messages = json.loads(EXAMPLE.read_text())["messages"]
    messages[5] = {**messages[5], "content": "before \ud800 after " + str(messages[5]["content"])}
    result = GEM("paper", encoder="minilm", token_counter=None).compress(messages, session_id="s")
    assert result.stats.action == "reselected" and result.stats.removed_blocks, result.stats.reason


def encoded_by_definition(encoder, texts: list[str]) -> np.ndarray:
    """The static encoder read literally: the tokenizer over each whole text, the rows of its distinct word pieces
    summed in id order, normalised (the encoder tokenises the texts' parts and remembers them)."""
    rows = []
    for encoding in encoder.tokenizer.encode_batch([tokenizable(t) for t in texts], add_special_tokens=False):
        ids = np.unique(encoding.ids) if encoding.ids else [len(encoder.table) - 1]
        rows.append(encoder.table[ids].sum(axis=0))
    return normalise_rows(np.array(rows, dtype=np.float32))


#: Characters where BERT's normaliser or pre-tokenizer could treat a cut text differently from the whole: whitespace
#: of every kind, control and format characters it drops, combining marks (reordered, stripped), characters whose
#: lower case is two, CJK (padded with spaces), emoji, U+FFFD, a lone surrogate, digits of other scripts, words.
ADVERSARIAL = (list("aZ09 _-./(){}\"'\t\n\r") +
               ["\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2028", "\u3000", "\x00", "\x1b", "\x7f", "\u200b",
                "\ufeff", "\u0301", "\u0316", "\u0903", "É", "ß", "İ", "Σ", "中", "😀", "\ufffd", "\ud800", "٣", "ञ",
                "xyz", "tokenization", "Straße"])
STATIC = make_encoder("minilm-static", cached=False)


@settings(max_examples=200, deadline=None)
@example(texts=["a\u200bb", "xyz\ufefftokenization", "ab\x00cd \x1b[0m", "Straße\u0301. 中文"])  # dropped inside a word
@given(texts=st.lists(st.lists(st.sampled_from(ADVERSARIAL), max_size=60).map("".join), min_size=1, max_size=5))
def test_encodes_as_the_tokenizer_over_each_whole_text(texts):
    """One encoder across the examples, so parts come both newly tokenised and remembered."""
    np.testing.assert_array_equal(STATIC.encode(texts), encoded_by_definition(STATIC, texts))


def test_long_parts_and_a_full_memory_encode_as_the_definition(monkeypatch):
    """Parts past `PIECE_MEMORY_CHARS` (words past the tokenizer's 100 characters are [UNK]) are tokenised every
    time, not remembered; past `PIECE_MEMORY` parts the memory starts again. Real blocks too."""
    from gemkernels.compress.encoders import static

    monkeypatch.setattr(static, "PIECE_MEMORY", 40)
    encoder = static.StaticEncoder()
    texts = ["x" * 47 + " " + "y" * 49 + " " + "z" * 130 + " short words here", *example_texts()[:12]]
    for _ in range(2):
        np.testing.assert_array_equal(encoder.encode(texts), encoded_by_definition(encoder, texts))
        assert len(encoder.remembered) <= 40
        assert all(len(part) <= static.PIECE_MEMORY_CHARS for part in encoder.remembered)
