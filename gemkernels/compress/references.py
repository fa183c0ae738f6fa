"""What an action names and what a block holds, lexically (encoder-free): paths, identifiers, literals, numbers.

`references` reads the tokens an action's arguments name; `referenced_blocks` finds the earlier blocks that hold
one of them (the ``referenced`` retention metric, `gemkernels.evaluate.retention`). `Lexicon` is the same
extraction kept compactly per block, as hashes, so that a request can ask which blocks the latest actions still
name (the router's live-reference features, `gemkernels.compress.router`) without keeping the texts.
"""

from __future__ import annotations

import builtins
import json
import keyword
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gemkernels.compress.blocks import Block

EXTENSIONS = ("py|pyi|pyx|ipynb|c|h|cc|cpp|hpp|go|rs|java|kt|js|jsx|ts|tsx|rb|php|sh|json|yaml|yml|toml|cfg|ini|"
              "txt|md|rst|html|css|xml|csv|log|sql|lock|patch|diff")
PATH = re.compile(rf"(?<![\w.:/-])(?:\.{{0,2}}/)?(?:[\w.-]+/)+[\w.-]*\w|(?<![\w./-])[\w-]+\.(?:{EXTENSIONS})\b")
PATH_RUN = re.compile(r"(?<![\w./-])[\w-]*[./]")  # a run of PATH's characters, up to its first '.' or '/'
QUOTED = re.compile(r"'([^'\n]{3,200})'|\"((?:\\.|[^\"\\\n]){3,200})\"")
# IDENTIFIER is \b[A-Za-z_][A-Za-z0-9_]{3,}\b and NUMBER (?<![\w.])\d{3,}(?!\d), each written to start with a character
# class and look behind after it: re then skips to the candidates' first characters in C (3x faster on tool output).
IDENTIFIER = re.compile(r"[A-Za-z_](?<!\w[A-Za-z_])[A-Za-z0-9_]{3,}\b")
NUMBER = re.compile(r"\d(?<![\w.]\d)\d{2,}(?!\d)")
WORD = re.compile(r"\w+")
COMMON = frozenset(w.lower() for w in keyword.kwlist + dir(builtins)) | frozenset("""
    about above after again also always another because been before being below between both cannot change
    check could does doing done down each else even every example file files first found from have here into
    just last like line lines look make more most much must need next none only other output over same should
    since some still such than that their them then there these they thing think this those through true false
    under until very want what when where which while will with without would your
    bash echo grep head tail find xargs sort uniq sed awk python python3 pip pytest cat diff git patch mkdir
    touch chmod tee printf test tests testbed returncode command stdout stderr error errors warning exit null
    self args kwargs value values name names path paths text data result results item items
    """.split())
COMMON_FILES = frozenset({"__init__.py", "setup.py", "setup.cfg", "readme.md", "readme.rst", "conftest.py",
                          "tests.py", "test.py", "pyproject.toml", "reproduce.py"})


@dataclass(frozen=True)
class References:
    """What an action names: whole words (identifiers, numbers) and substrings (path tails, quoted literals)."""

    words: frozenset[str]
    strings: frozenset[str]

    def found_in(self, text: str, words: frozenset[str]) -> bool:
        """Whether a block (its full ``text`` and its `block_words`) shares any of these references."""
        return bool(self.words & words) or any(s in text for s in self.strings)


def block_words(text: str) -> frozenset[str]:
    """The words (runs of letters, digits and ``_``) of a block's text, for whole-word matching."""
    return frozenset(WORD.findall(text))


def argument_strings(arguments: str) -> list[str]:
    """The string values of a tool call's JSON arguments (nested too), or the raw arguments when not JSON."""
    try:
        stack = [json.loads(arguments)]
    except (ValueError, TypeError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return [arguments]
    out: list[str] = []
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return out


def split_paths(text: str) -> tuple[list[str], str]:
    """The paths in ``text`` and the text with each replaced by a space (``PATH.finditer``, ``PATH.sub(" ", text)``).

    A path lies in a run of word characters, dots, slashes and dashes and can start only where a run does
    (``PATH``'s look-behinds), so ``PATH`` is tried only at the runs that hold a ``.`` or a ``/`` (`PATH_RUN`)."""
    paths, pieces, at = [], [], 0
    match_at = PATH.match
    for run in PATH_RUN.finditer(text):
        match = match_at(text, run.start())  # the look-behinds still see the character before the run
        if match is not None:
            paths.append(match.group(0))
            pieces.append(text[at:match.start()])
            at = match.end()
    pieces.append(text[at:])
    return paths, " ".join(pieces)


def references(text: str) -> References:
    """The reference tokens of an action's argument text.

    Paths (``a/b/c.py``, ``./x/y``, ``name.ext`` with a known extension) count by their last two
    components, so absolute and relative spellings match; a bare file name counts unless it is a
    common one (``__init__.py``). Quoted literals of 3-200 characters count as substrings.
    Identifiers of >= 4 characters that are not keywords, builtins, shell commands or common words,
    and numbers of >= 3 digits, count as whole words; they are read from the text outside paths.
    """
    strings = {match.group(1) or match.group(2) for match in QUOTED.finditer(text)}
    paths, rest = split_paths(text)
    for path in paths:
        parts = [p for p in path.split("/") if p not in ("", ".", "..")]
        tail = "/".join(parts[-2:])
        if len(parts) > 1 or tail.lower() not in COMMON_FILES:
            strings.add(tail)
    words = {w for w in set(IDENTIFIER.findall(rest)) if w.lower() not in COMMON} | set(NUMBER.findall(rest))
    return References(frozenset(words), frozenset(strings))


def action_references(action: Block) -> References:
    """The reference tokens of every argument string of an action block's tool calls."""
    return references("\n".join(s for call in action.actions for s in argument_strings(call.arguments)))


def referenced_blocks(refs: References, texts: Sequence[str], words: Sequence[frozenset[str]]) -> list[int]:
    """Indices of the blocks (full ``texts`` and their `block_words`) that share a reference with the action."""
    return [i for i, (text, w) in enumerate(zip(texts, words)) if refs.found_in(text, w)]


# --------------------------------------------------------------------------- per-block lexicons

EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Lexicon:
    """A block's reference tokens as sorted unique hashes (this process's ``hash``; compared only within it):
    ``holds``, what its text contains (identifiers, numbers, path tails, quoted literals), and ``names``, what its
    actions' arguments name (`action_references`)."""

    holds: np.ndarray
    names: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.holds.nbytes + self.names.nbytes)


def hashed(tokens: set[str] | frozenset[str]) -> np.ndarray:
    """Sorted unique int64 hashes of ``tokens`` (a sort and a neighbour test: numpy's hash-table `np.unique` costs
    twice as much at a block's few hundred tokens)."""
    if not tokens:
        return EMPTY
    values = np.fromiter(map(hash, tokens), dtype=np.int64, count=len(tokens))
    values.sort()
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) > 1 else values


@dataclass(frozen=True)
class HeldIndex:
    """Every block's `Lexicon.holds` in one sorted column: ``values`` ascending and, within a value, ``owners`` (the
    block indices, int32) ascending; a session's grows by a merge as its blocks do, instead of a sort per request."""

    values: np.ndarray
    owners: np.ndarray
    blocks: int

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.owners.nbytes)

    @classmethod
    def of(cls, lexicons: Sequence[Lexicon], first: int = 0) -> HeldIndex:
        """The index of ``lexicons``, the first of them block ``first``."""
        values = np.concatenate([EMPTY, *(lex.holds for lex in lexicons)])
        blocks = np.arange(first, first + len(lexicons), dtype=np.int32)
        owners = np.repeat(blocks, [len(lex.holds) for lex in lexicons])
        order = np.argsort(values, kind="stable")  # owners ascend already: stable keeps them so within a value
        return cls(values[order], owners[order], first + len(lexicons))

    def extended(self, lexicons: Sequence[Lexicon]) -> HeldIndex:
        """This index with ``lexicons`` as the blocks after its last (whose owners are all larger: each new entry
        goes after the equal values already here)."""
        new = HeldIndex.of(lexicons, first=self.blocks)
        at = np.searchsorted(self.values, new.values, side="right")
        return HeldIndex(np.insert(self.values, at, new.values), np.insert(self.owners, at, new.owners), new.blocks)

    def holders(self, names: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(owners, values) of the entries whose value is one of ``names`` (sorted unique), by value, then owner:
        what ``np.isin`` over the blocks' holds in block order picks, and each owner's values in the same order."""
        lo = np.searchsorted(self.values, names, side="left")
        hi = np.searchsorted(self.values, names, side="right")
        counts = hi - lo
        total = int(counts.sum())
        if not total:
            return EMPTY, EMPTY
        at = np.repeat(hi - counts.cumsum(), counts) + np.arange(total)
        return self.owners[at], self.values[at]


def held_tokens(text: str) -> set[str]:
    """The tokens a reference can match in ``text``: identifiers and numbers (as `references` reads them), each
    path's last component and last two, and quoted literals."""
    tokens = {match.group(1) or match.group(2) for match in QUOTED.finditer(text)}
    paths, rest = split_paths(text)
    for path in paths:
        parts = [p for p in path.split("/") if p not in ("", ".", "..")]
        tokens.update(("/".join(parts[-2:]), parts[-1]) if parts else ())
    tokens.update(w for w in set(IDENTIFIER.findall(rest)) if w.lower() not in COMMON)
    tokens.update(NUMBER.findall(rest))
    return tokens


def block_lexicon(block: Block, text: str) -> Lexicon:
    """The `Lexicon` of ``block`` whose representation text is ``text``."""
    named = action_references(block)
    return Lexicon(hashed(held_tokens(text)), hashed(named.words | named.strings))
