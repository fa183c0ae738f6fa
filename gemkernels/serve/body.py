"""A request body as the client sent it: where each element of its top-level ``messages`` (or ``input``) array
lies in the bytes, and the body with some of those elements cut out, every other byte as sent (DESIGN.md §5).

Nothing is re-serialised, so number literals (``1e400``), duplicate keys, key order, escapes and whitespace reach
the upstream exactly as the client wrote them. One scan over the body's strings and structural characters finds
the elements; the body must already have parsed as JSON (the proxy parses it to compress it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

DECODER = json.JSONDecoder()
WHITESPACE = re.compile(r"[ \t\n\r]*")
WHITESPACE_CHARS = " \t\n\r"


class ArrayLayout(NamedTuple):
    """Where a top-level array lies in a body: its brackets, and each element's ``[start, end)`` byte range."""

    open: int
    close: int
    elements: list[tuple[int, int]]


def parse_body(raw: bytes, key: str) -> tuple[dict[str, Any], ArrayLayout | None] | None:
    """``raw`` parsed as ``json.loads`` parses it, when it is a UTF-8 JSON object, with the layout of the array
    under its top-level ``key`` (the last occurrence, the one the parsed object keeps; None when that is not an
    array); None when ``raw`` is not such an object (nested past the parser's depth included).

    One pass: members and elements are decoded by the C decoder ``json.loads`` uses (``raw_decode``), so laying
    the body out costs about one parse; character offsets become byte offsets by encoding the text between them."""
    try:
        if json.detect_encoding(raw) != "utf-8":
            return None
        text = raw.decode("utf-8", "surrogatepass")  # as json.loads decodes bytes
        body, layout = parse_object(text, key)
    except (ValueError, IndexError, RecursionError):
        return None
    if layout is not None and len(text) != len(raw):  # not ASCII: character offsets to byte offsets
        layout = in_bytes(text, layout)
    return body, layout


def parse_object(text: str, key: str) -> tuple[dict[str, Any], ArrayLayout | None]:
    """`parse_body` in character offsets of ``text``; ValueError or IndexError on what is not one JSON object."""
    at = skip(text, 0)
    if text[at] != "{":
        raise ValueError("not an object")
    at = skip(text, at + 1)
    body: dict[str, Any] = {}
    found = None
    while text[at] != "}":
        if text[at] != '"':
            raise ValueError("a member name must be a string")
        name, at = json.decoder.scanstring(text, at + 1)
        at = skip(text, at)
        if text[at] != ":":
            raise ValueError("':' expected")
        at = skip(text, at + 1)
        if name == key and text[at] == "[":
            body[name], found, at = parse_array(text, at)
        else:
            body[name], at = DECODER.raw_decode(text, at)
            found = None if name == key else found
        at = skip(text, at)
        if text[at] == ",":
            at = skip(text, at + 1)
            if text[at] == "}":
                raise ValueError("a trailing ','")
        elif text[at] != "}":
            raise ValueError("',' or '}' expected")
    if skip(text, at + 1) != len(text):
        raise ValueError("extra data after the object")
    return body, found


def parse_array(text: str, open_at: int) -> tuple[list[Any], ArrayLayout, int]:
    """The elements of the array whose ``[`` is at ``open_at``, its layout, and the offset after its ``]``."""
    values, spans = [], []
    scan, space = DECODER.scan_once, WHITESPACE.match  # the loop runs once per message: no lookups in it
    at = space(text, open_at + 1).end()
    while text[at] != "]":
        try:
            value, end = scan(text, at)
        except StopIteration:
            raise ValueError("a value expected") from None
        values.append(value)
        spans.append((at, end))
        at = end if text[end] in ",]" else space(text, end).end()
        if text[at] == ",":
            at += 1
            if text[at] in WHITESPACE_CHARS:
                at = space(text, at).end()
            if text[at] == "]":
                raise ValueError("a trailing ','")
        elif text[at] != "]":
            raise ValueError("',' or ']' expected")
    return values, ArrayLayout(open_at, at, spans), at + 1


def skip(text: str, at: int) -> int:
    """The offset of the first non-whitespace character at or after ``at``."""
    return WHITESPACE.match(text, at).end()


def in_bytes(text: str, layout: ArrayLayout) -> ArrayLayout:
    """``layout`` with its character offsets into ``text`` turned into byte offsets into its UTF-8 encoding."""
    offsets = sorted({layout.open, layout.close, *(i for span in layout.elements for i in span)})
    position, previous, to_bytes = 0, 0, {}
    for offset in offsets:
        position += len(text[previous:offset].encode("utf-8", "surrogatepass"))
        to_bytes[offset], previous = position, offset
    return ArrayLayout(to_bytes[layout.open], to_bytes[layout.close],
                       [(to_bytes[a], to_bytes[b]) for a, b in layout.elements])


def without_elements(raw: bytes, layout: ArrayLayout, removed: Sequence[int],
                     replaced: Mapping[int, bytes] | None = None) -> bytes:
    """``raw`` without the array elements at the indices ``removed``, each with one separator: a run of removed
    elements goes with the separator after it, a run at the end with the separator before it; the kept elements in
    ``replaced`` (index -> bytes) are written as given. Every other byte stays as it was."""
    spans, n = layout.elements, len(layout.elements)
    cuts = []
    for first, last in runs(sorted(set(removed))):
        if last + 1 < n:
            cuts.append((spans[first][0], spans[last + 1][0]))
        elif first > 0:
            cuts.append((spans[first - 1][1], spans[last][1]))
        else:
            cuts.append((spans[0][0], spans[last][1]))
    edits = sorted([(a, b, b"") for a, b in cuts] + [(*spans[i], new) for i, new in (replaced or {}).items()])
    pieces, at = [], 0
    for a, b, new in edits:  # cuts and replacements never overlap: a cut ends or starts where an element does
        pieces += [raw[at:a], new]
        at = b
    pieces.append(raw[at:])
    return b"".join(pieces)


def runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted distinct indices as maximal runs of consecutive values ``(first, last)``."""
    out: list[tuple[int, int]] = []
    for i in indices:
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def removed_positions(original: Sequence[Any], kept: Sequence[Any]) -> list[int] | None:
    """The positions of ``original`` missing from ``kept``, when ``kept`` is ``original`` with some elements left
    out (the same objects, in order); None when it is anything else."""
    removed, at = [], 0
    for item in kept:
        while at < len(original) and original[at] is not item:
            removed.append(at)
            at += 1
        if at == len(original):
            return None
        at += 1
    return removed + list(range(at, len(original)))


def element_sizes(layout: ArrayLayout) -> list[int]:
    """The bytes each element takes in the body with its share of the separators: what cutting it alone removes
    (an element with the separator after it; the last one with the separator before it)."""
    spans = layout.elements
    sizes = [after[0] - span[0] for span, after in zip(spans, spans[1:])]
    if len(spans) > 1:
        sizes.append(spans[-1][1] - spans[-2][1])
    elif spans:
        sizes.append(spans[0][1] - spans[0][0])
    return sizes


def forwarded_body(raw: bytes, layout: ArrayLayout, original: Sequence[Any], kept: Sequence[Any],
                   replaced: Mapping[int, bytes] | None = None) -> bytes | None:
    """The body to forward when compression kept ``kept`` of the ``original`` elements laid out in ``raw`` as
    ``layout``: `cut_body` with the positions ``kept`` leaves out; None when ``kept`` is not ``original`` minus some
    of its elements."""
    return cut_body(raw, layout, len(original), removed_positions(original, kept), replaced)


def json_bytes(value: Any) -> bytes | None:
    """``value`` as JSON in UTF-8, or escaped to ASCII when it holds a lone surrogate (which UTF-8 cannot carry);
    None when JSON cannot write it (a number the client wrote as ``1e400`` reads as inf)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return None
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(value).encode("ascii")


def cut_body(raw: bytes, layout: ArrayLayout, count: int, removed: Sequence[int] | None,
             replaced: Mapping[int, bytes] | None = None) -> bytes | None:
    """``raw`` with the elements at ``removed`` cut out (and the kept ones in ``replaced`` rewritten); None when
    ``removed`` is None, the layout does not hold ``count`` elements, or an element is both cut and rewritten (the
    caller then forwards ``raw``)."""
    if removed is None or len(layout.elements) != count or set(replaced or ()) & set(removed):
        return None
    return without_elements(raw, layout, removed, replaced)
