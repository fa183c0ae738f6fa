"""Compressed request bodies: each coding round-trips, and corrupt, cut or oversized ones are refused."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemkernels.serve.content_coding import UndecodableBody, decoded

zstandard = pytest.importorskip("zstandard")

CODERS = {"gzip": gzip.compress, "deflate": zlib.compress, "zstd": lambda raw: zstandard.ZstdCompressor().compress(raw)}


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=5000), st.sampled_from(sorted(CODERS)))
def test_each_coding_round_trips(raw, coding):
    assert decoded(CODERS[coding](raw), coding.upper(), limit=len(raw)) == raw
    assert decoded(raw, "identity", limit=0) == raw and decoded(raw, "", limit=0) == raw


@pytest.mark.parametrize("coding", sorted(CODERS))
def test_bad_bodies_are_refused_without_decoding_past_the_limit(coding):
    bomb = CODERS[coding](b"\0" * (50 << 20))  # 50 MiB of zeros in a few KB
    with pytest.raises(UndecodableBody, match="more than 1024 bytes"):
        decoded(bomb, coding, limit=1024)
    packed = CODERS[coding](b'{"messages": []}' * 100)
    with pytest.raises(UndecodableBody):
        decoded(packed[: len(packed) // 2], coding, limit=1 << 20)
    with pytest.raises(UndecodableBody):
        decoded(b"not compressed at all", coding, limit=1 << 20)


def test_unknown_codings_are_named():
    with pytest.raises(UndecodableBody, match="'br' is not one"):
        decoded(b"x", "br", limit=10)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_data_after_the_compressed_stream_is_refused_not_dropped(coding):
    """Junk or a second gzip member after the stream made the body decode to its first stream alone, so the proxy
    forwarded a body the client never sent (``{...}{"x": 1}`` became a valid ``{...}``)."""
    packed = CODERS[coding](b'{"messages": []}')
    for tail in (b"JUNK", CODERS[coding](b'{"x": 1}')):
        with pytest.raises(UndecodableBody, match="after the end"):
            decoded(packed + tail, coding, limit=1 << 20)
