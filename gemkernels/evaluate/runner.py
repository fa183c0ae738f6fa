"""Where replay work runs: a `Runner` maps a function over runs and builds the encoders that work uses.

`LocalPool` (this machine's processes, the default) and `gemkernels.evaluate.ray_pool.RayPool` (a Ray cluster)
implement it; `run_all` is the one place that puts the results back in input order and draws the progress bar
over completed runs, so ``gem replay``, ``gem online`` and ``gem analyze`` report and order alike on either.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from gemkernels.compress.encoders import Encoder, make_encoder
from gemkernels.compress.encoders.cache import EmbeddingCache

Item = TypeVar("Item")
Result = TypeVar("Result")


class Runner(Protocol):
    """Runs a function over items somewhere (``completed``) and says which encoders that work uses; a context
    manager: what it started stops at exit."""

    @property
    def encoder(self) -> Callable[[str], Encoder]:
        """Builds the encoder of a name (`make_encoder`'s names) for work on this runner: picklable, and equal
        across copies, so a task builds one per process wherever it runs."""

    def completed(self, function: Callable[[Item], Result], items: Sequence[Item]) -> Iterator[tuple[int, Result]]:
        """``(position in items, function(item))`` for every item, in the order they complete."""

    def embedding_cache(self, name: str, folder: str | os.PathLike[str]) -> EmbeddingCache:
        """The on-disk embedding cache the driver encodes runs through, fed the way this runner encodes best."""

    def __enter__(self) -> Runner: ...

    def __exit__(self, *exc: object) -> None: ...


@dataclass(frozen=True)
class LocalPool:
    """``workers`` processes of this machine (1: this process, no pool); every process builds its own encoders."""

    workers: int = 1

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")

    @property
    def encoder(self) -> Callable[[str], Encoder]:
        return make_encoder

    def completed(self, function: Callable[[Item], Result], items: Sequence[Item]) -> Iterator[tuple[int, Result]]:
        if self.workers == 1:
            yield from ((i, function(item)) for i, item in enumerate(items))
            return
        with ProcessPoolExecutor(self.workers) as pool:
            futures = {pool.submit(function, item): i for i, item in enumerate(items)}
            yield from ((futures[future], future.result()) for future in as_completed(futures))

    def embedding_cache(self, name: str, folder: str | os.PathLike[str]) -> EmbeddingCache:
        return EmbeddingCache(make_encoder(name), folder)

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def run_all(runner: Runner, function: Callable[[Item], Result], items: Sequence[Item], progress: bool = True,
            desc: str | None = None) -> list[Result]:
    """``function(item)`` for every item on ``runner``, in input order, with `progress_bar` over completed runs."""
    results: list[Any] = [None] * len(items)
    for position, result in progress_bar(runner.completed(function, items), len(items), progress, desc):
        results[position] = result
    return results


def progress_bar(items: Iterable[Any], total: int, enabled: bool, desc: str | None = None) -> Iterable[Any]:
    """A tqdm bar over runs on a terminal when ``enabled`` and tqdm is installed; the items unchanged otherwise."""
    if enabled:
        try:
            from tqdm import tqdm
        except ImportError:
            return items
        return tqdm(items, total=total, desc=desc, unit="run", disable=None)
    return items
