"""The encoder protocol, and the base of encoders that wrap another (DESIGN.md §2.3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Encoder(Protocol):
    """Maps texts to L2-normalised float32 rows of width ``dim``."""

    name: str
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


class EncodingDeferred(RuntimeError):
    """An encoder could not answer within its caller's time budget (or could not queue the texts at all); texts it
    queued go on encoding for a later call."""


def normalise_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (all-zero rows stay zero)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(norms == 0, 1, norms)).astype(np.float32)


def stored_name(encoder: Encoder) -> str:
    """The name a cache keeps ``encoder``'s vectors under: its ``name``, with its ``version`` when it has one (an
    encoder whose vectors changed under the same name), so no vector of one version is read as another's."""
    version = getattr(encoder, "version", None)
    return encoder.name if version is None else f"{encoder.name}@{version}"


class WrappedEncoder:
    """Base of the encoders that add something (a cache, batching, a record) around ``encoder``: they take its
    ``name`` and ``dim`` (read when asked, so a remote encoder probes its width only if someone needs it)."""

    def __init__(self, encoder: Encoder):
        self.encoder = encoder

    @property
    def name(self) -> str:
        return self.encoder.name

    @property
    def dim(self) -> int:
        return self.encoder.dim

    @property
    def version(self) -> int | str | None:
        return getattr(self.encoder, "version", None)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.encoder.encode(texts)
