"""Request bodies the client compressed (``Content-Encoding: gzip``, ``deflate`` or ``zstd``, as Codex can send):
decoded for reading, never past the body limit."""

from __future__ import annotations

import zlib
from collections.abc import Callable

#: zlib ``wbits`` per coding: gzip framing, or zlib framing (``deflate`` per RFC 9110).
ZLIB_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class UndecodableBody(ValueError):
    """The body cannot be read: an unknown or unavailable coding, corrupt data, or more than the limit decoded."""


def decoded(raw: bytes, coding: str, limit: int) -> bytes:
    """``raw`` decoded from ``coding`` (one coding; ``identity`` or '' returns it as is); raises `UndecodableBody`."""
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return raw
    if coding in ZLIB_WBITS:
        return zlib_decoded(raw, ZLIB_WBITS[coding], limit)
    if coding == "zstd":
        return zstd_decoder()(raw, limit)
    raise UndecodableBody(f"content coding {coding!r} is not one the proxy reads (gzip, deflate, zstd)")


def zlib_decoded(raw: bytes, wbits: int, limit: int) -> bytes:
    """``raw`` decoded; anything after the end of its stream (junk, or a second gzip member) is refused: decoding
    would drop it, and the upstream would read the body the client sent otherwise."""
    decoder = zlib.decompressobj(wbits)
    try:
        out = decoder.decompress(raw, limit + 1)
    except zlib.error as err:
        raise UndecodableBody(f"the body is not valid compressed data ({err})") from None
    if len(out) > limit or decoder.unconsumed_tail:
        raise UndecodableBody(f"the body decodes to more than {limit} bytes")
    if not decoder.eof:
        raise UndecodableBody("the compressed body is cut short")
    if decoder.unused_data:
        raise UndecodableBody("the body holds data after the end of its compressed stream")
    return out


def zstd_decoder() -> Callable[[bytes, int], bytes]:
    """A bounded zstd decoder from the ``zstandard`` package; raises `UndecodableBody` without it."""
    try:
        import zstandard
    except ImportError:
        raise UndecodableBody("a zstd body needs the zstandard package (pip install 'gemkernels[serve]')") from None

    def decode(raw: bytes, limit: int) -> bytes:
        chunks, size = [], 0
        try:
            with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as reader:
                while chunk := reader.read(1 << 20):
                    size += len(chunk)
                    if size > limit:
                        raise UndecodableBody(f"the body decodes to more than {limit} bytes")
                    chunks.append(chunk)
            complete = zstandard.ZstdDecompressor().decompressobj()  # the reader does not tell a cut frame:
            complete.decompress(raw)  # decoding again is bounded now that the output is known to fit
        except zstandard.ZstdError as err:
            raise UndecodableBody(f"the body is not valid zstd data ({err})") from None
        if not complete.eof:
            raise UndecodableBody("the compressed body is cut short")
        return b"".join(chunks)

    return decode
