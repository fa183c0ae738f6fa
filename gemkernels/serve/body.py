"""A request body as the client sent it: where each element of its top-level ``messages`` (or ``input``) array
lies in the bytes, and the body with some of those elements cut out, every other byte as sent (DESIGN.md §5).

Nothing is re-serialised, so number literals (``1e400``), duplicate keys, key order, escapes and whitespace reach
the upstream exactly as the client wrote them. One scan over the body's strings and structural characters finds
the elements; the body must already have parsed as JSON (the proxy parses it to compress it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

#: A JSON string (escapes included) or one structural character: everything the scan needs to see.
TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]', re.S)
WHITESPACE = b" \t\n\r"


class ArrayLayout(NamedTuple):
    """Where a top-level array lies in a body: its brackets, and each element's ``[start, end)`` byte range."""

    open: int
    close: int
    elements: list[tuple[int, int]]


def array_layout(raw: bytes, key: str) -> ArrayLayout | None:
    """The layout of the array under top-level ``key`` of the JSON object ``raw`` (its last occurrence, the one
    ``json.loads`` keeps), or None when ``raw`` is not an object or ``key`` does not hold an array."""
    depth, expect_key, current = 0, False, False
    found: ArrayLayout | None = None
    inside, open_at, start, elements = False, 0, 0, []
    for token in TOKENS.finditer(raw):
        first = raw[token.start()]
        if first == 0x22:  # a string: at depth 1 where a key is due, it is the key
            if depth == 1 and expect_key:
                current, expect_key = json.loads(token.group()) == key, False
            continue
        if first in b"[{":
            if depth == 0 and first != 0x7B:
                return None
            if depth == 1 and first == 0x5B and current:
                inside, open_at, elements = True, token.start(), []
                start = skip_whitespace(raw, token.end())
            depth += 1
            expect_key = depth == 1
        elif first in b"]}":
            depth -= 1
            if inside and depth == 1:
                end = strip_whitespace(raw, token.start())
                if end > start:
                    elements.append((start, end))
                found, inside = ArrayLayout(open_at, token.start(), elements), False
            if depth == 1:
                current = False
        elif depth == 1:  # a comma between members of the top-level object
            expect_key, current = True, False
        elif inside and depth == 2:  # a comma between elements of the array
            elements.append((start, strip_whitespace(raw, token.start())))
            start = skip_whitespace(raw, token.end())
    return found


def skip_whitespace(raw: bytes, at: int) -> int:
    while at < len(raw) and raw[at] in WHITESPACE:
        at += 1
    return at


def strip_whitespace(raw: bytes, end: int) -> int:
    while end > 0 and raw[end - 1] in WHITESPACE:
        end -= 1
    return end


def without_elements(raw: bytes, layout: ArrayLayout, removed: Sequence[int]) -> bytes:
    """``raw`` without the array elements at the indices ``removed``, each with one separator: a run of removed
    elements goes with the separator after it, a run at the end with the separator before it. Every other byte
    stays as it was."""
    spans, n = layout.elements, len(layout.elements)
    cuts = []
    for first, last in runs(sorted(set(removed))):
        if last + 1 < n:
            cuts.append((spans[first][0], spans[last + 1][0]))
        elif first > 0:
            cuts.append((spans[first - 1][1], spans[last][1]))
        else:
            cuts.append((spans[0][0], spans[last][1]))
    pieces, at = [], 0
    for a, b in cuts:
        pieces.append(raw[at:a])
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


def forwarded_body(raw: bytes, layout: ArrayLayout, original: Sequence[Any], kept: Sequence[Any]) -> bytes | None:
    """The body to forward when compression kept ``kept`` of the ``original`` elements laid out in ``raw`` as
    ``layout``: ``raw`` with the others cut out; None when ``kept`` is not ``original`` minus some of its elements
    or the layout does not hold one element per original (the caller then forwards ``raw``)."""
    removed = removed_positions(original, kept)
    if removed is None or len(layout.elements) != len(original):
        return None
    return without_elements(raw, layout, removed)
