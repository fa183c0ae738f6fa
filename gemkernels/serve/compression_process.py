"""`ProcessCompressor`: the proxy's `Compressor` in a process of its own (``gem serve --compress-process``), so that
compression's Python never holds the GIL that the proxy's event loop needs: requests that are only forwarded, and
every request's reading and forwarding, run on one core while compressions run on another.

The proxy talks to the process over a socket pair in frames (a 4-byte length, then a pickle): the server config
first, then one frame per compression (its id, the arguments of `Compressor.compress`) and one per answer (the
removed positions and GEM's stats, or None; the metrics the process counted meanwhile). The process answers with
`Compressor.compress` of the same arguments, so a session's decisions are those of the in-process compressor. When
the process dies, every compression waiting on it and every request until a new one has started goes out unchanged
(``compressor_down``); the proxy starts a new one, whose sessions start afresh. The process exits when the socket
closes, so it never outlives the proxy.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from gemkernels.compress.config import GEMConfig
from gemkernels.compress.gem import PASSTHROUGH, Compressed
from gemkernels.serve.body import removed_positions
from gemkernels.serve.config import ServerConfig
from gemkernels.serve.metrics import Metrics

logger = logging.getLogger("gemkernels.serve")

FRAME_HEADER = struct.Struct(">I")
#: The metric a frame's events never carry: the proxy counts its own pending compressions.
OWN_METRICS = frozenset({"pending"})
#: Seconds the proxy waits for the process to start (encoder loaded, kernels compiled) before serving without it.
START_TIMEOUT_S = 600.0
#: The least seconds between two starts of the process after it stopped.
RESTART_INTERVAL_S = 5.0
#: Seconds the process has to finish its compressions and exit when the proxy stops, before it is killed.
STOP_TIMEOUT_S = 30.0


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next frame's object; raises `asyncio.IncompleteReadError` at the end of the stream."""
    (length,) = FRAME_HEADER.unpack(await reader.readexactly(FRAME_HEADER.size))
    return pickle.loads(await reader.readexactly(length))


def frame(obj: Any) -> bytes:
    """``obj`` as a frame."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return FRAME_HEADER.pack(len(data)) + data


class ProcessCompressor:
    """`Compressor`'s interface (``compress``, ``start``, ``aclose``, ``encoder_name``, ``gem_config``) over a
    compression process (module doc)."""

    def __init__(self, config: ServerConfig, metrics: Metrics):
        self.config, self.metrics = config, metrics
        self.ids = itertools.count()
        self.waiting: dict[int, tuple[Sequence[Any], asyncio.Future]] = {}
        self.child: Child | None = None
        self.starting: asyncio.Task | None = None
        self.started_at = -RESTART_INTERVAL_S
        self.encoder_name, self.gem_config = config.encoder, GEMConfig()

    async def start(self) -> None:
        """Start the process and wait until it serves (its encoder loaded, its kernels compiled); RuntimeError when
        it does not (its own error is on the proxy's stderr)."""
        self.started_at = time.monotonic()
        self.starting = asyncio.ensure_future(self._start())
        await self.starting
        if self.child is None:
            raise RuntimeError("the compression process did not start (--compress-process); its error is above")

    async def _start(self) -> None:
        child = None
        try:
            child = await Child.launch(self.config)
            ready = await asyncio.wait_for(read_frame(child.reader), START_TIMEOUT_S)
        except Exception:
            logger.exception("gemkernels: the compression process did not start; forwarding requests unchanged")
            if child is not None:
                child.close()
            return
        self.encoder_name, self.gem_config = ready["encoder"], ready["config"]
        self.child = child
        child.answers = asyncio.ensure_future(self._read_answers(child))

    async def compress(self, route: str, messages: Any, session_id: str | None, goal: str | None = None,
                       message_sizes: Sequence[int] | None = None, tenant: str | None = None,
                       wait_for_encoding: bool = False, save: bool = True,
                       message_bytes: tuple[bytes, Sequence[tuple[int, int]]] | None = None) -> Compressed | None:
        """`Compressor.compress` in the compression process; None (the request goes out unchanged) while it is down
        or too many compressions wait."""
        child = self.child
        if child is None or child.answers.done():
            self._restart()
            return self._unchanged(route, "compressor_down")
        if len(self.waiting) >= self.config.max_pending:
            return self._unchanged(route, "queue_full")
        key = next(self.ids)
        answer = asyncio.get_running_loop().create_future()
        self.waiting[key] = (messages, answer)
        self.metrics.pending.inc()
        try:
            child.writer.write(frame((key, (route, messages, session_id, goal, message_sizes, tenant,
                                            wait_for_encoding, save, message_bytes))))
            await child.writer.drain()
            result = await answer
        except (ConnectionError, OSError):
            result = ProcessDown
        finally:
            self.waiting.pop(key, None)
            self.metrics.pending.dec()
        if result is None or result is ProcessDown:
            if result is ProcessDown or child.answers.done():
                return self._unchanged(route, "compressor_down")
            return None  # the process counted why
        self.metrics.observe_compression(route, result)
        return result

    def _unchanged(self, route: str, reason: str) -> None:
        self.metrics.requests.labels(route, PASSTHROUGH).inc()
        self.metrics.passthroughs.labels(reason).inc()

    def _restart(self) -> None:
        """Start a new process in the background, unless one is starting or the last start was under
        `RESTART_INTERVAL_S` ago."""
        now = time.monotonic()
        if (self.starting is None or self.starting.done()) and now - self.started_at >= RESTART_INTERVAL_S:
            self.started_at = now
            self.starting = asyncio.ensure_future(self._start())

    async def _read_answers(self, child: Child) -> None:
        """Resolve each compression's future with its answer until the process's socket closes; then with
        `ProcessDown`."""
        try:
            while True:
                key, removed, stats, events = await read_frame(child.reader)
                apply_events(self.metrics, events)
                entry = self.waiting.get(key)
                if entry is None or entry[1].done():
                    continue
                messages, future = entry
                if stats is None:
                    future.set_result(None)
                else:
                    gone = set(removed)
                    future.set_result(Compressed([m for p, m in enumerate(messages) if p not in gone], stats))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except Exception:
            logger.exception("gemkernels: unreadable answer from the compression process")
        if not child.stopping:
            logger.warning("gemkernels: the compression process stopped (exit %s); requests go out unchanged until "
                           "a new one has started", child.process.poll())
        child.close()
        for _, future in list(self.waiting.values()):
            if not future.done():
                future.set_result(ProcessDown)

    async def aclose(self) -> None:
        """Let the process finish its compressions and exit (killed after `STOP_TIMEOUT_S`)."""
        if self.starting is not None:
            await asyncio.gather(self.starting, return_exceptions=True)
        child = self.child
        if child is None:
            return
        if child.answers.done():
            return
        child.stopping = True
        child.writer.write_eof()  # the process finishes what it started, answers it, then exits
        try:
            await asyncio.wait_for(asyncio.to_thread(child.process.wait), STOP_TIMEOUT_S)
        except asyncio.TimeoutError:
            child.process.kill()
        await asyncio.gather(child.answers, return_exceptions=True)


class ProcessDown:
    """The answer of a compression whose process stopped before answering."""


class Child:
    """A running compression process and the proxy's end of its socket."""

    def __init__(self, process: subprocess.Popen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.process, self.reader, self.writer = process, reader, writer
        self.stopping = False  # the proxy asked it to exit
        self.answers: asyncio.Future = asyncio.get_running_loop().create_future()  # then `_read_answers`

    @classmethod
    async def launch(cls, config: ServerConfig) -> Child:
        """``python -m gemkernels.serve.compression_process FD``, sent ``config``."""
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())],
                                       pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        reader, writer = await asyncio.open_connection(sock=ours, limit=1 << 20)
        writer.write(frame((config, logger.getEffectiveLevel())))
        await writer.drain()
        return cls(process, reader, writer)

    def close(self) -> None:
        self.writer.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


# --------------------------------------------------------------------------- the compression process


class RecordedMetric:
    """Stands in for one of `Metrics`'s metrics in the compression process: each update becomes an event (name,
    labels, method, value) for the proxy to apply."""

    def __init__(self, name: str, events: collections.deque, labels: tuple[str, ...] = ()):
        self.name, self.events, self.label_values = name, events, labels

    def labels(self, *values: str) -> RecordedMetric:
        return RecordedMetric(self.name, self.events, values)

    def inc(self, value: float = 1) -> None:
        self.events.append((self.name, self.label_values, "inc", value))

    def dec(self, value: float = 1) -> None:
        self.events.append((self.name, self.label_values, "dec", value))

    def set(self, value: float) -> None:
        self.events.append((self.name, self.label_values, "set", value))

    def observe(self, value: float) -> None:
        self.events.append((self.name, self.label_values, "observe", value))


class RecordedMetrics:
    """`Metrics` for the `Compressor` of the compression process: what it counts is recorded (`RecordedMetric`),
    except its compressions' results, which the proxy counts from the answers."""

    def __init__(self) -> None:
        self.events: collections.deque[tuple[str, tuple[str, ...], str, float]] = collections.deque()

    def __getattr__(self, name: str) -> RecordedMetric:
        return RecordedMetric(name, self.events)

    def observe_batch(self, kind: str, size: int, seconds: float) -> None:
        self.batch_size.labels(kind).observe(size)
        self.batch_seconds.labels(kind).observe(seconds)

    def observe_compression(self, route: str, result: Compressed) -> None:
        """Counted by the proxy."""

    def drain(self) -> list[tuple[str, tuple[str, ...], str, float]]:
        """The events recorded since the last drain (the batchers' threads record too: each taken exactly once)."""
        return [self.events.popleft() for _ in range(len(self.events))]


def apply_events(metrics: Metrics, events: list[tuple[str, tuple[str, ...], str, float]]) -> None:
    """The compression process's metric updates, on the proxy's metrics."""
    for name, labels, method, value in events:
        if name in OWN_METRICS:
            continue
        metric = getattr(metrics, name)
        getattr(metric.labels(*labels) if labels else metric, method)(value)


async def serve(sock: socket.socket) -> None:
    """The compression process: reads the config, builds the `Compressor`, says it is ready, then answers each
    compression frame as it finishes until the socket closes; then finishes what it started and returns."""
    from gemkernels.serve.compressor import Compressor, warm_up_kernels

    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
    config, level = await read_frame(reader)
    logger.setLevel(level)  # the proxy's: its start-up and error lines read as if it wrote them
    metrics = RecordedMetrics()
    compressor = Compressor(config, metrics)
    await asyncio.to_thread(warm_up_kernels, compressor)
    writer.write(frame({"encoder": compressor.encoder_name, "config": compressor.gem_config}))
    running: set[asyncio.Task] = set()

    async def answer(key: int, arguments: tuple) -> None:
        """Every frame is answered: a failure here sends the request out unchanged, counted as an internal error."""
        route, messages, *rest = arguments
        removed, stats = None, None
        try:
            result = await compressor.compress(route, messages, *rest)
            if result is not None:
                removed, stats = removed_positions(messages, result.messages), result.stats
                if removed is None:
                    raise ValueError("GEM's messages are not the request's with some left out")
            answered = frame((key, removed, stats, metrics.drain()))
        except Exception:
            logger.exception("gemkernels: compression crashed; forwarding the original request")
            metrics.requests.labels(route, PASSTHROUGH).inc()
            metrics.passthroughs.labels("internal_error").inc()
            answered = frame((key, None, None, metrics.drain()))
        writer.write(answered)

    try:
        while True:
            try:
                key, arguments = await read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            task = asyncio.ensure_future(answer(key, arguments))
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.gather(*running, return_exceptions=True)
    finally:
        await asyncio.to_thread(compressor.close)
        writer.close()


def main(argv: Sequence[str]) -> None:
    """``python -m gemkernels.serve.compression_process FD``: serve the proxy on the socket ``FD``."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # as the proxy prints them
    sock = socket.socket(fileno=int(argv[0]))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    asyncio.run(serve(sock))


if __name__ == "__main__":
    main(sys.argv[1:])
