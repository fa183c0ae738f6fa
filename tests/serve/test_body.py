"""Byte-exact forwarding: the body sent upstream is the client's bytes with whole elements of ``messages`` cut
out, for any valid JSON body (hypothesis), and every other byte as the client sent it."""

from __future__ import annotations

import json
import re

import pytest
from helpers import array_layout

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gemkernels.serve.body import element_sizes, forwarded_body, parse_body, removed_positions, without_elements  # noqa: E402

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)) | st.sampled_from('"\\[]{},:\n\t/'),
               max_size=12)
SCALARS = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False,
                                                                               allow_infinity=False) | TEXT
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                      max_leaves=12)
FORMATS = st.fixed_dictionaries({"indent": st.sampled_from([None, 0, 1, 2]),
                                 "separators": st.sampled_from([(",", ":"), (", ", ": "), (" , ", " : "),
                                                                (",\n", ":\t")]),
                                 "ensure_ascii": st.booleans()})


@st.composite
def bodies(draw):
    """(raw bytes, the messages json.loads sees, removed positions): a request with other fields before and after
    ``messages``, any formatting, and sometimes an earlier duplicate ``messages`` key that json.loads overrides."""
    messages = draw(st.lists(VALUES, max_size=8))
    before = draw(st.dictionaries(TEXT.filter(lambda k: k != "messages"), VALUES, max_size=3))
    after = draw(st.dictionaries(TEXT.filter(lambda k: k != "messages" and k not in before), VALUES, max_size=3))
    fmt = draw(FORMATS)
    raw = json.dumps({**before, "messages": messages, **after}, **fmt)
    if draw(st.booleans()):
        decoy = json.dumps(draw(st.lists(VALUES, max_size=3)), **fmt)
        raw = raw[0] + f'"messages": {decoy}' + ("," if len(raw) > 2 else "") + raw[1:]
    removed = sorted(draw(st.sets(st.integers(0, max(len(messages) - 1, 0)), max_size=len(messages))))
    return raw.encode(), json.loads(raw)["messages"], [i for i in removed if i < len(messages)]


@settings(max_examples=400, deadline=None, derandomize=True)
@given(bodies())
def test_cut_bodies_parse_lose_only_the_removed_elements_and_keep_every_other_byte(case):
    raw, messages, removed = case
    parsed_body = parse_body(raw, "messages")
    assert parsed_body is not None and parsed_body[0] == json.loads(raw)  # the one parse is json.loads
    layout = parsed_body[1]
    assert layout is not None and len(layout.elements) == len(messages)
    assert [json.loads(raw[a:b]) for a, b in layout.elements] == messages
    out = without_elements(raw, layout, removed)
    parsed, original = json.loads(out), json.loads(raw)
    assert parsed["messages"] == [m for i, m in enumerate(messages) if i not in removed]
    assert {k: v for k, v in parsed.items() if k != "messages"} == {k: v for k, v in original.items()
                                                                    if k != "messages"}
    # the bytes: everything up to the array and after it as sent, the kept elements as sent, and between them
    # only the client's own separators (whitespace and one comma)
    assert out[:layout.open + 1] == raw[:layout.open + 1] and out.endswith(raw[layout.close:])
    inner = out[layout.open + 1:len(out) - len(raw[layout.close:])]
    kept = [raw[a:b] for i, (a, b) in enumerate(layout.elements) if i not in removed]
    at, gaps = 0, []
    for piece in kept:
        found = inner.index(piece, at)
        gaps.append(inner[at:found])
        at = found + len(piece)
    gaps.append(inner[at:])
    assert all(re.fullmatch(rb"[ \t\n\r]*", gap) for gap in (gaps[0], gaps[-1]))
    assert all(re.fullmatch(rb"[ \t\n\r]*,[ \t\n\r]*", gap) for gap in gaps[1:-1])


def test_literals_duplicate_keys_escapes_and_whitespace_reach_the_upstream_as_sent():
    """What re-serialising changed: ``1e400`` became ``Infinity`` (not JSON), a duplicate key collapsed, escapes
    and spacing were rewritten."""
    raw = (b'{"model": "m",  "temperature": 1e400, "temperature": 0.50, "note": "caf\\u00e9 \\/ \xc3\xa9",\n'
           b' "messages": [\n  {"role": "user", "content": "a"},\n  {"role": "assistant", "content": "b"},\n'
           b'  {"role": "user", "content": "c"}\n ], "tail":[1,2]}')
    messages = json.loads(raw)["messages"]
    out = forwarded_body(raw, array_layout(raw, "messages"), messages, [messages[0], messages[2]])
    assert out == raw.replace(b'  {"role": "assistant", "content": "b"},\n', b"")


def test_bodies_that_do_not_line_up_are_not_cut():
    raw = b'{"messages": [1, 2, 3]}'
    messages, layout = json.loads(raw)["messages"], array_layout(raw, "messages")
    assert forwarded_body(raw, layout, messages, [messages[1], messages[0]]) is None  # reordered
    assert forwarded_body(raw, layout, messages, [messages[0], {"role": "x"}]) is None  # not the caller's
    assert forwarded_body(raw, layout, messages[:2], messages[:1]) is None  # another list's length
    assert array_layout(b'[1, 2]', "messages") is None and array_layout(b'{"messages": 1}', "messages") is None
    assert removed_positions(messages, messages[1:]) == [0] and removed_positions(messages, []) == [0, 1, 2]


def test_what_json_cannot_read_has_no_layout():
    """Nested past the parser's depth, not UTF-8, not an object, not closed: no layout (the proxy then forwards
    the body as sent)."""
    deep = b'{"messages": [' + b"[" * 5000 + b"]" * 5000 + b"]}"
    assert array_layout(deep, "messages") is None
    assert array_layout('{"messages": [1]}'.encode("utf-16"), "messages") is None
    assert array_layout(b'{"messages": [1, 2', "messages") is None and array_layout(b"", "messages") is None
    assert array_layout(b'{"messages": [1] "x": 2}', "messages") is None


@settings(max_examples=200, deadline=None, derandomize=True)
@given(bodies())
def test_element_sizes_are_what_cutting_each_element_alone_removes(case):
    raw, messages, _ = case
    layout = array_layout(raw, "messages")
    sizes = element_sizes(layout)
    assert len(sizes) == len(messages)
    for i, size in enumerate(sizes):
        assert len(raw) - len(without_elements(raw, layout, [i])) == size
