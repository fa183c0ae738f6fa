"""Retention metrics against hand-computed values, and the encoder-free reference metric on hand-built blocks."""

import math

import numpy as np
import pytest

from gemkernels.compress.blocks import Action, Block
from gemkernels.compress.representation import block_text
from gemkernels.evaluate.retention import (
    METRICS,
    Targets,
    argument_strings,
    block_words,
    captured_energy,
    centroid_similarity,
    nearest,
    projected,
    referenced_blocks,
    references,
    retained_fraction,
    span_weights,
)

E = np.eye(4)


def unit(*values):
    v = np.asarray(values, dtype=np.float64)
    return v / np.linalg.norm(v)


def basis(x, kept):
    """Q = X_S^T W: the orthonormal basis `span_weights` describes."""
    return x[kept].T @ span_weights(x[kept] @ x[kept].T)


def test_orthonormal_set():
    kept = np.array([0, 1])
    weights = span_weights(E[kept] @ E[kept].T)
    np.testing.assert_allclose(basis(E, kept).T @ basis(E, kept), np.eye(2), atol=1e-12)
    assert captured_energy(E @ E.T, kept, weights) == pytest.approx(0.5)
    assert centroid_similarity(E @ E.T, kept) == pytest.approx(0.25 / (math.sqrt(0.5) * 0.5))
    assert projected(E[kept] @ unit(1, 0, 1, 0)[:, None], weights)[0] == pytest.approx(0.5)
    assert list(nearest(E, unit(3, 2, 1, 0), 3)) == [0, 1, 2]
    values = dict(zip(METRICS, Targets.build(E, unit(3, 2, 1, 0), E[3], unit(1, 1, 0, 0)).measure(kept)))
    assert values["action_projection"] == pytest.approx(13 / 14)
    assert values["action"] == pytest.approx(13 / 14)  # the whole history spans R^4: P_a([n]) = 1
    assert values["top3"] == pytest.approx(2 / 3)
    assert values["final"] == pytest.approx(0.0) and values["goal"] == pytest.approx(1.0)
    assert values["coverage"] == pytest.approx(0.5) and values["retained"] == pytest.approx(0.5)


def test_duplicate_row_adds_no_direction():
    x = E[[0, 0, 1]]
    gram = x @ x.T
    assert span_weights(gram[:2, :2]).shape == (2, 1)
    assert captured_energy(gram, np.array([0, 1]), span_weights(gram[:2, :2])) == pytest.approx(2 / 3)
    assert captured_energy(gram, np.array([0]), span_weights(gram[:1, :1])) == pytest.approx(2 / 3)
    assert centroid_similarity(gram, np.array([0, 1])) == pytest.approx(2 / math.sqrt(5))
    assert span_weights(np.zeros((2, 2))).shape == (2, 0)
    values = dict(zip(METRICS, Targets.build(x, E[1], E[0], None).measure([0, 1])))
    assert values["action"] == 0.0 and values["final"] == pytest.approx(1.0)
    assert values["coverage"] == pytest.approx(2 / 3)


def test_action_equal_to_a_kept_block():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 5))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    values = dict(zip(METRICS, Targets.build(x, x[2], x[5], None).measure([2, 4])))
    assert values["action_projection"] == pytest.approx(1.0)
    assert values["action"] == pytest.approx(1.0)
    near = set(nearest(x, x[2], 3).tolist())
    assert 2 in near and values["top3"] == pytest.approx(len(near & {2, 4}) / 3)
    assert math.isnan(values["goal"]) and math.isnan(values["referenced"])


def test_ratio_is_undefined_when_the_history_holds_none_of_the_target():
    values = dict(zip(METRICS, Targets.build(E[[0, 1]], E[2], E[3], E[2], referenced=[1]).measure([0])))
    assert math.isnan(values["action"]) and math.isnan(values["final"]) and math.isnan(values["goal"])
    assert values["action_projection"] == 0.0 and values["referenced"] == 0.0


def test_retained_fraction():
    assert retained_fraction([1, 3], [1, 2]) == 0.5
    assert math.isnan(retained_fraction([], [1]))


def test_references_read_paths_identifiers_literals_and_numbers():
    refs = references("cd /testbed && grep -n \"def _cstack\" astropy/modeling/separable.py && "
                      "sed -n '120,130p' /testbed/astropy/modeling/core.py && python reproduce.py "
                      "&& cat setup.py notes.txt && echo separability_matrix 4096 42 self.value")
    assert refs.strings == {"def _cstack", "120,130p", "modeling/separable.py", "modeling/core.py", "notes.txt"}
    # words come from literals too ("120,130p" names lines 120-130); not cd/grep/python/self/value/42
    assert refs.words == {"_cstack", "separability_matrix", "4096", "120", "130"}


def test_argument_strings_reads_json_values_or_raw_text():
    assert argument_strings('{"command": "ls", "opts": {"paths": ["a", "b"]}, "n": 3}') == ["ls", "a", "b"]
    assert argument_strings("ls -la") == ["ls -la"]
    deep = '{"a":' * 100_000 + "1" + "}" * 100_000  # nested past json.loads' depth: raw text, not RecursionError
    assert argument_strings(deep) == [deep]


def block(command: str, output: str) -> Block:
    return Block((0, 1), ("c",), reasoning="", text="", actions=(Action("bash", command),), observations=(output,))


def test_referenced_blocks_on_hand_built_blocks():
    history = [
        block("cat astropy/modeling/separable.py", "def _cstack(left, right):\n    return 1"),
        block("ls", "README.rst\nsetup.py"),
        block("grep -rn separability_matrix .", "docs/index.rst:4096: see separability_matrix"),
        block("python reproduce.py", "Traceback: ValueError"),
    ]
    texts = [block_text(b) for b in history]
    words = [block_words(t) for t in texts]
    found = referenced_blocks(references("sed -n '10,20p' /testbed/astropy/modeling/separable.py"), texts, words)
    assert found == [0]  # the path's last two components match the relative spelling
    assert referenced_blocks(references("sed -n '4096,4100p' docs/other.rst"), texts, words) == [2]
    assert referenced_blocks(references("grep -n _cstack docs/index.rst"), texts, words) == [0, 2]
    assert referenced_blocks(references("python reproduce.py && ls"), texts, words) == []
