"""`Router`: the learned keep/ready model (the StateComp idea): from the signals of a request's blocks
(`features.FEATURES`), how likely the coming action needs each of them, one listwise head per target; numpy
inference, a small JSON file.

Heads: ``top3`` (the block is among the three most similar to the next action) and ``referenced`` (the next
action names something it holds); each is a softmax over the request's blocks (which block carries the label).
A block's score is the sum of the heads' shares. The file is written by
``gem train-router`` (`gemkernels.evaluate.router_training`); the package ships one trained on the public
development runs (`default_router`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from gemkernels.compress.router.features import FEATURES

FORMAT_VERSION = 1
DEFAULT_PATH = Path(__file__).with_name("router.json")


@dataclass(frozen=True)
class Router:
    """Listwise heads over one request's signals F (n, len(features)): softmax(F @ w) over its n blocks per head."""

    heads: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)
    features: tuple[str, ...] = FEATURES

    def shares(self, signals: np.ndarray) -> dict[str, np.ndarray]:
        """Each head's softmax over the rows of ``signals`` (one request's blocks): each sums to 1."""
        x = np.asarray(signals, dtype=np.float64)
        out = {}
        for name, w in self.heads.items():
            z = x @ w
            p = np.exp(z - z.max())
            out[name] = p / p.sum()
        return out

    def scores(self, signals: np.ndarray) -> np.ndarray:
        """The keep score of every block of one request: the sum of the heads' shares."""
        return np.sum(list(self.shares(signals).values()), axis=0)

    def to_json(self) -> dict[str, Any]:
        """The file's content: format, signal names, how it was trained, each head's weights (8 decimals)."""
        return {"format": FORMAT_VERSION, "features": list(self.features), "meta": self.meta,
                "heads": {name: [round(float(v), 8) for v in w] for name, w in self.heads.items()}}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write `to_json` with one line per entry (lists of numbers on one line each, readable in a diff)."""
        data = self.to_json()
        lines = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in data.items() if key != "heads"]
        lines.append(' "heads": {' + ",".join(f"\n  {json.dumps(name)}: {json.dumps(head)}"
                                              for name, head in data["heads"].items()) + "\n }")
        Path(path).write_text("{\n" + ",\n".join(lines) + "\n}\n")

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "router file") -> Router:
        """A router from `to_json`'s data; ``ValueError`` naming ``source`` when it was written for other signals."""
        if data.get("format") != FORMAT_VERSION or tuple(data.get("features", ())) != FEATURES:
            raise ValueError(f"{source} was written for other router signals (format {data.get('format')}); "
                             "train one for this version with `gem train-router RUNS... --out FILE`")
        heads = {name: np.asarray(w, dtype=np.float64) for name, w in data.get("heads", {}).items()}
        if not heads or any(w.shape != (len(FEATURES),) for w in heads.values()):
            raise ValueError(f"{source}: every head needs {len(FEATURES)} weights, one per signal; train one with "
                             "`gem train-router RUNS... --out FILE`")
        return cls(heads, data.get("meta", {}))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Router:
        return cls.from_json(json.loads(Path(path).read_text()), str(path))


@cache
def default_router() -> Router:
    """The router shipped in the package (trained on the public development runs; its ``meta`` says how)."""
    return Router.load(DEFAULT_PATH)


def load_router(path: str | None) -> Router:
    """``path``'s router, or the shipped one for None or ``""``; ``ValueError`` naming the file when it cannot be
    read or was written for other signals."""
    return default_router() if not path else cached_router(str(path))


@cache
def cached_router(path: str) -> Router:
    try:
        return Router.load(path)
    except OSError as err:
        raise ValueError(f"router file {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"router file {path} is not JSON: {err}") from None
