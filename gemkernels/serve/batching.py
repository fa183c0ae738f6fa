"""Cross-request micro-batching for the server (DESIGN.md §5).

Compression runs in worker threads, one request per thread. `MicroBatcher` lets those threads
share one call: ``submit(item)`` blocks until a batch holding ``item`` has run and returns its
answer. A single runner thread takes the first waiting item, then gathers more until
``max_batch`` items are held, or ``max_wait`` seconds have passed since it took the first, or
the batch holds ``callers()`` items (when given: how many threads could be submitting now, so a
lone request does not wait at all), and runs them as one batch; batches run one at a time, so
items that arrive during a run form the next batch. A request waits at most ``max_wait`` plus
its own run.

`SelectionBatcher.select` is a drop-in for `gemkernels.select` that runs concurrent
selections as one `gemkernels.select_batch` call (block encoding has its own fair queue:
`gemkernels.serve.embedding_queue`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from gemkernels.select.api import DEFAULT_EPS, DEFAULT_K, DEFAULT_TAU, select, select_batch
from gemkernels.select.result import Selection

T = TypeVar("T")
R = TypeVar("R")

#: Called after every batch with (kind, batch size, seconds the batch ran).
BatchObserver = Callable[[str, int, float], None]


class QueueFullError(RuntimeError):
    """``submit`` found the batcher's bounded queue full (the caller should fall back)."""


class MicroBatcher(Generic[T, R]):
    """Runs ``run_batch(items) -> answers`` (one answer per item, same order) over items submitted
    concurrently. An answer that is an exception is raised in its own submitter only; an exception
    raised by ``run_batch`` itself is raised in every submitter of that batch."""

    def __init__(self, run_batch: Callable[[list[T]], Sequence[R | BaseException]], kind: str, max_batch: int = 64,
                 max_wait: float = 0.002, max_queue: int = 4096, observer: BatchObserver | None = None,
                 callers: Callable[[], int] | None = None):
        if max_batch < 1 or max_wait < 0 or max_queue < 1:
            raise ValueError("max_batch and max_queue must be >= 1 and max_wait >= 0")
        self.run_batch, self.kind = run_batch, kind
        self.max_batch, self.max_wait = max_batch, max_wait
        self.observer, self.callers = observer, callers
        self._queue: queue.Queue[tuple[T, Future[R]] | None] = queue.Queue(max_queue)
        self._thread = threading.Thread(target=self._loop, name=f"gem-{kind}-batcher", daemon=True)
        self._closed = False
        self._thread.start()

    def submit(self, item: T) -> R:
        """Block until ``item``'s batch has run; raises `QueueFullError` when the queue is full."""
        if self._closed:
            raise RuntimeError(f"the {self.kind} batcher is closed")
        future: Future[R] = Future()
        try:
            self._queue.put_nowait((item, future))
        except queue.Full:
            raise QueueFullError(f"the {self.kind} batch queue is full") from None
        return future.result()

    def close(self) -> None:
        """Run what is queued, then stop the runner thread."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.perf_counter() + self.max_wait
            stop = False
            while len(batch) < self.max_batch and (self.callers is None or len(batch) < self.callers()):
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            self._run([item for item, _ in batch], [future for _, future in batch])
            if stop:
                self._drain()
                return

    def _drain(self) -> None:
        rest: list[tuple[T, Future[R]]] = []
        while True:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is not None:
                rest.append(nxt)
        if rest:
            self._run([item for item, _ in rest], [future for _, future in rest])

    def _run(self, items: list[T], futures: list[Future[R]]) -> None:
        started = time.perf_counter()
        try:
            answers = self.run_batch(items)
            if len(answers) != len(items):
                raise RuntimeError(f"{self.kind} batch returned {len(answers)} answers for {len(items)} items")
        except BaseException as err:  # every waiter must wake up
            for future in futures:
                future.set_exception(err)
        else:
            for future, answer in zip(futures, answers):
                if isinstance(answer, BaseException):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
        if self.observer is not None:
            self.observer(self.kind, len(items), time.perf_counter() - started)


@dataclass(frozen=True)
class SelectRequest:
    """One `gemkernels.select` call's arguments."""

    x: np.ndarray
    protected: Any
    eligible: Any
    tau: float
    k: int
    eps: float
    backend: str


class SelectionBatcher:
    """`select` calls from many threads, run as one `select_batch` call per (eps, backend, width) group."""

    def __init__(self, max_batch: int = 64, max_wait: float = 0.002, max_queue: int = 4096,
                 observer: BatchObserver | None = None, callers: Callable[[], int] | None = None):
        self.batcher: MicroBatcher[SelectRequest, Selection] = MicroBatcher(
            run_selections, "select", max_batch, max_wait, max_queue, observer, callers)

    def select(self, x: Any, protected: Any = None, eligible: Any = None, tau: float = DEFAULT_TAU,
               k: int = DEFAULT_K, eps: float = DEFAULT_EPS, backend: str = "auto") -> Selection:
        """Same contract as `gemkernels.select` (numpy results for numpy input)."""
        return self.batcher.submit(SelectRequest(np.asarray(x), protected, eligible, tau, k, eps, backend))

    def close(self) -> None:
        self.batcher.close()


def run_selections(requests: list[SelectRequest]) -> list[Selection | Exception]:
    """One `select_batch` per compatible group; a group that fails is retried one by one, so a
    bad request fails alone (its answer is the exception it raised)."""
    out: list[Selection | Exception] = [ValueError("not run")] * len(requests)
    groups: dict[tuple[float, str, int], list[int]] = {}
    for i, req in enumerate(requests):
        width = int(req.x.shape[1]) if req.x.ndim == 2 else -1
        groups.setdefault((req.eps, req.backend, width), []).append(i)
    for (eps, backend, _), members in groups.items():
        reqs = [requests[i] for i in members]
        try:
            answers: list[Selection | Exception] = list(select_batch(
                [r.x for r in reqs], protected=[r.protected for r in reqs], eligible=[r.eligible for r in reqs],
                tau=[r.tau for r in reqs], k=[r.k for r in reqs], eps=eps, backend=backend))
        except Exception:
            answers = [select_alone(r) for r in reqs]
        for i, answer in zip(members, answers):
            out[i] = answer
    return out


def select_alone(req: SelectRequest) -> Selection | Exception:
    """One request through `gemkernels.select`, or the exception it raised."""
    try:
        return select(req.x, protected=req.protected, eligible=req.eligible, tau=req.tau, k=req.k,
                      eps=req.eps, backend=req.backend)
    except Exception as err:
        return err
