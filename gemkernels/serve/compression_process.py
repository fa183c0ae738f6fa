"""`ProcessCompressor`: the proxy's `Compressor` in a process of its own (``gem serve --compress-process``), so that
compression's Python never holds the GIL that the proxy's event loop needs: requests that are only forwarded, and
every request's reading and forwarding, run on one core while compressions run on another. `ShardedCompressor`:
N such processes (``--compress-process N``), each session's requests always in the same one (`shard_of`), so that
compression has N cores and the sessions stay in memory (no shared store).

The proxy talks to the process over a socket pair in frames (an 8-byte length, then a pickle): the server config
first, then one frame per compression (its id, the arguments of `Compressor.compress`) and one per answer (the
removed positions and GEM's stats, or None; the metrics the process counted meanwhile). The process answers with
`Compressor.compress` of the same arguments, so a session's decisions are those of the in-process compressor.
Whatever goes wrong sends the request out unchanged, its reason counted: a history that cannot be pickled
(``internal_error``), the process down, stopping or starting (``compressor_down``; the proxy starts a new one, whose
sessions start afresh, at once and then at growing intervals while they keep stopping), no answer within the
encoding budget and `ANSWER_GRACE_S` (``compressor_timeout``). The process exits when its socket closes and, on
Linux, is killed with the proxy's event loop thread (the one that started it), so it never outlives the proxy.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
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

from gemkernels.compress.config import GEMConfig, with_overrides
from gemkernels.compress.gem import PASSTHROUGH, Compressed, prefix_id
from gemkernels.serve.body import removed_positions
from gemkernels.serve.config import ServerConfig
from gemkernels.serve.metrics import Metrics

logger = logging.getLogger("gemkernels.serve")

FRAME_HEADER = struct.Struct(">Q")
#: The metric a frame's events never carry: the proxy counts its own pending compressions.
OWN_METRICS = frozenset({"pending"})
#: Seconds the proxy waits for the process to start (encoder loaded, kernels compiled) before serving without it.
START_TIMEOUT_S = 600.0
#: Seconds between the starts of a process that keeps stopping: a process that served `STEADY_S` or more is restarted
#: at once; one that stopped sooner, or did not start, after the interval, which doubles each time up to its most.
RESTART_INTERVAL_S, MAX_RESTART_INTERVAL_S, STEADY_S = 5.0, 300.0, 60.0
#: Seconds the process has to finish its compressions and exit when the proxy stops, before it is killed.
STOP_TIMEOUT_S = 30.0
#: Seconds past the encoding budget a request waits for its answer before it goes out unchanged (a stopped process).
ANSWER_GRACE_S = 30.0
#: A history whose body is larger than this is pickled off the event loop (the proxy parses such bodies there too).
INLINE_FRAME_BYTES = 256 << 10
#: How the process is started (``-c BOOT FD PROXY_PID PATH...``): ``sys.path`` set to the proxy's before any import,
#: so that both import the same modules (not the working directory's, which ``-c`` puts first).
BOOT = ("import sys; sys.path[:] = sys.argv[3:]; "
        "from gemkernels.serve.compression_process import main; main(sys.argv[1:3])")
#: Consecutive compressions left unanswered past their time after which a live process counts as wedged and is killed
#: (and so replaced).
WEDGED_AFTER = 3


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next frame's object; raises `asyncio.IncompleteReadError` at the end of the stream."""
    (length,) = FRAME_HEADER.unpack(await reader.readexactly(FRAME_HEADER.size))
    return pickle.loads(await reader.readexactly(length))


def frame(obj: Any) -> list[bytes]:
    """``obj`` as a frame: its header and its pickle (`send`: written one after the other, not joined first)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return [FRAME_HEADER.pack(len(data)), data]


def send(writer: asyncio.StreamWriter, data: list[bytes]) -> None:
    """Write a `frame` (``writelines`` would join its pieces into one more copy)."""
    for piece in data:
        writer.write(piece)


class ProcessCompressor:
    """`Compressor`'s interface (``compress``, ``start``, ``aclose``, ``encoder_name``, ``gem_config``) over a
    compression process (module doc)."""

    def __init__(self, config: ServerConfig, metrics: Metrics):
        self.config, self.metrics = config, metrics
        self.ids = itertools.count()
        self.waiting: dict[int, tuple[Sequence[Any], asyncio.Future]] = {}
        self.child: Child | None = None
        self.starting: asyncio.Task | None = None
        self.next_start, self.restart_interval = 0.0, RESTART_INTERVAL_S
        self.closing = False  # aclose began: no new compression, no new process
        self.unanswered = 0  # compressions in a row whose answer did not come in time
        self.encoder_name, self.gem_config = config.encoder, with_overrides(config.preset, config.overrides)

    async def start(self) -> None:
        """Start the process and wait until it serves (its encoder loaded, its kernels compiled); RuntimeError when
        it does not (its own error is on the proxy's stderr)."""
        self.starting = asyncio.ensure_future(self._start())
        await self.starting
        if self.child is None:
            raise RuntimeError("the compression process did not start (--compress-process); its error is above")

    async def _start(self) -> None:
        child = None
        try:
            child = await Child.launch(self.config)
            ready = await asyncio.wait_for(read_frame(child.reader), START_TIMEOUT_S)
        except BaseException as err:  # cancelled by aclose too: the process goes with it
            if child is not None:
                await child.close()
            if not isinstance(err, Exception):
                raise
            logger.exception("gemkernels: the compression process did not start; forwarding requests unchanged")
            self._back_off()
            return
        self.encoder_name = ready["encoder"]
        self.child, child.started_at, self.unanswered = child, time.monotonic(), 0
        child.answers = asyncio.ensure_future(self._read_answers(child))

    def _back_off(self) -> None:
        """The next start no sooner than the restart interval from now, which doubles up to its most."""
        self.next_start = time.monotonic() + self.restart_interval
        self.restart_interval = min(2 * self.restart_interval, MAX_RESTART_INTERVAL_S)

    async def compress(self, route: str, messages: Any, session_id: str | None, goal: str | None = None,
                       message_sizes: Sequence[int] | None = None, tenant: str | None = None,
                       wait_for_encoding: bool = False, save: bool = True,
                       message_bytes: tuple[bytes, Sequence[tuple[int, int]]] | None = None,
                       thinking: str = "content") -> Compressed | None:
        """`Compressor.compress` in the compression process (its encoding budget counted from now); None (the request
        goes out unchanged, the reason counted) while it is down or stopping, when too many compressions wait, when
        the request cannot be sent to it, or when its answer takes the budget and `ANSWER_GRACE_S` more."""
        started = time.monotonic()
        child = self.child
        if self.closing or child is None or child.answers.done() or child.stopping:
            self._restart()
            return self._unchanged(route, "compressor_down")
        if len(self.waiting) >= self.config.max_pending:
            return self._unchanged(route, "queue_full")
        arguments = (route, messages, session_id, goal, message_sizes, tenant, wait_for_encoding, save, message_bytes,
                     started, thinking)
        key = next(self.ids)
        try:  # large or unmeasured histories (`POST /v1/gem/compress` has no body bytes) are pickled off the loop
            inline = message_bytes is not None and len(message_bytes[0]) <= INLINE_FRAME_BYTES
            data = frame((key, arguments)) if inline else await asyncio.to_thread(frame, (key, arguments))
        except Exception:  # what cannot be pickled (JSON nested past the recursion limit) goes out as it came
            logger.warning("gemkernels: could not send a compression to its process; forwarding it unchanged",
                           exc_info=True)
            return self._unchanged(route, "internal_error")
        answer = asyncio.get_running_loop().create_future()

        async def exchange() -> Any:
            send(child.writer, data)
            async with child.draining:  # Python 3.10 before 3.10.8 lets one task at a time wait in drain()
                await child.writer.drain()
            return await answer

        self.waiting[key] = (messages, answer)
        self.metrics.pending.inc()
        budget = self.config.encode_budget
        limit = START_TIMEOUT_S if wait_for_encoding or budget is None else budget + ANSWER_GRACE_S
        try:  # one deadline over sending (a process that stopped reading) and answering
            result = await asyncio.wait_for(exchange(), limit)
        except asyncio.TimeoutError:
            result = TimedOut
        except Exception:  # the process went away (or is stopping) while this was sent
            result = ProcessDown
        finally:
            self.waiting.pop(key, None)
            self.metrics.pending.dec()
        if result is TimedOut:
            self.unanswered += 1
            if self.unanswered >= WEDGED_AFTER and child.process.poll() is None:
                logger.warning("gemkernels: the compression process left %d compressions in a row unanswered; "
                               "replacing it", self.unanswered)
                child.process.kill()  # its reader sees the socket close and counts it stopped
            return self._unchanged(route, "compressor_timeout")
        if result is ProcessDown:
            return self._unchanged(route, "compressor_down")
        self.unanswered = 0
        if result is None:
            return None  # the process counted why
        self.metrics.observe_compression(route, result)
        return result

    def _unchanged(self, route: str, reason: str) -> None:
        self.metrics.requests.labels(route, PASSTHROUGH).inc()
        self.metrics.passthroughs.labels(reason).inc()

    def _restart(self) -> None:
        """Start a new process in the background, unless the proxy is stopping, one is starting, or the last one
        stopped too recently (`RESTART_INTERVAL_S`, doubling while they keep stopping)."""
        if self.closing or (self.starting is not None and not self.starting.done()):
            return
        if time.monotonic() >= self.next_start:
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
        status = await child.close(wait_s=STOP_TIMEOUT_S if child.stopping else 0.0)
        if not child.stopping:
            logger.warning("gemkernels: the compression process stopped (exit status %s); requests go out unchanged "
                           "until a new one has started", status)
            if time.monotonic() - child.started_at >= STEADY_S:
                self.next_start, self.restart_interval = 0.0, RESTART_INTERVAL_S
            else:
                self._back_off()
        self.metrics.sessions.set(0)  # its sessions went with it
        for _, future in list(self.waiting.values()):
            if not future.done():
                future.set_result(ProcessDown)

    async def aclose(self) -> None:
        """Let the process finish its compressions and exit (killed after `STOP_TIMEOUT_S`); a process still starting
        is stopped at once."""
        self.closing = True
        if self.starting is not None and not self.starting.done():
            self.starting.cancel()
            await asyncio.gather(self.starting, return_exceptions=True)
        child = self.child
        if child is None or child.answers.done():
            return
        child.stopping = True
        try:
            child.writer.write_eof()  # the process finishes what it started, answers it, then exits
            await asyncio.wait_for(asyncio.shield(child.answers), STOP_TIMEOUT_S)
        except (asyncio.TimeoutError, RuntimeError, OSError):  # a compression that does not end, or a socket that
            child.process.kill()  # closed (uvloop raises on it): the reader then sees the end and reaps it
        try:
            await asyncio.wait_for(child.answers, STOP_TIMEOUT_S)
        except Exception:
            logger.warning("gemkernels: the compression process did not end; leaving it", exc_info=True)


class ShardedCompressor:
    """`Compressor`'s interface over ``config.compress_process`` compression processes (`ProcessCompressor`s): every
    request of a session goes to the same one (`shard_of`), and each holds its share of the sessions, their bytes,
    the pending compressions and the embedding cache (``max_sessions`` ... ``encode_cache_bytes`` divided), so the
    proxy's bounds stay what they were; ``/metrics`` counts them all (``gem_sessions`` summed)."""

    def __init__(self, config: ServerConfig, metrics: Metrics):
        n = config.compress_process
        if n < 1:
            raise ValueError(f"compress_process must be a number of processes, 1 or more here; got {n}")
        share = dataclasses.replace(
            config, max_sessions=-(-config.max_sessions // n), max_session_bytes=-(-config.max_session_bytes // n),
            max_pending=-(-config.max_pending // n), encode_cache_bytes=config.encode_cache_bytes // n)
        held = [0.0] * n
        self.shards = [ProcessCompressor(share, ShardMetrics(metrics, held, i)) for i in range(n)]

    @property
    def encoder_name(self) -> str:
        """The processes' encoder (the same in each)."""
        return self.shards[0].encoder_name

    @property
    def gem_config(self) -> GEMConfig:
        """GEM's resolved config (the same in each)."""
        return self.shards[0].gem_config

    async def start(self) -> None:
        """Start every process; RuntimeError when one does not (`ProcessCompressor.start`), the others stopped."""
        try:
            await asyncio.gather(*(shard.start() for shard in self.shards))
        except BaseException:
            await self.aclose()
            raise

    async def compress(self, route: str, messages: Any, session_id: str | None, goal: str | None = None,
                       message_sizes: Sequence[int] | None = None, tenant: str | None = None,
                       wait_for_encoding: bool = False, save: bool = True,
                       message_bytes: tuple[bytes, Sequence[tuple[int, int]]] | None = None,
                       thinking: str = "content") -> Compressed | None:
        """`ProcessCompressor.compress` in the session's process."""
        shard = self.shards[shard_of(tenant, session_id, messages, len(self.shards))]
        return await shard.compress(route, messages, session_id, goal, message_sizes, tenant, wait_for_encoding,
                                    save, message_bytes, thinking)

    async def aclose(self) -> None:
        """Stop every process (`ProcessCompressor.aclose`)."""
        await asyncio.gather(*(shard.aclose() for shard in self.shards))


def shard_of(tenant: str | None, session_id: str | None, messages: Any, shards: int) -> int:
    """The process (of ``shards``) that compresses a request: by its tenant and session name; for an unnamed session
    (GEM names it by its messages before the first block, `prefix_session_id`) also by `leading_messages`, which
    every request of an agent's run starts with."""
    key = hashlib.blake2b(digest_size=8)
    for part in (tenant or "", "\x00", session_id or ""):
        key.update(part.encode("utf-8", "surrogatepass"))
    if session_id is None:
        key.update(prefix_id(leading_messages(messages)).encode())
    return int.from_bytes(key.digest(), "big") % shards


def leading_messages(messages: Any) -> list[Any]:
    """The first two messages, or fewer where a message that is no system, developer or user message comes first
    (the history's first block): the system prompt and the task, as in every request of the run."""
    leading = []
    for message in messages[:2] if isinstance(messages, (list, tuple)) else ():
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer", "user"):
            break
        leading.append(message)
    return leading


class ShardMetrics:
    """The proxy's `Metrics` as one of several compression processes updates them: its ``sessions`` gauge is its own
    share of the total the proxy reports (`HeldSessions`)."""

    def __init__(self, metrics: Metrics, held: list[float], index: int):
        self.metrics, self.sessions = metrics, HeldSessions(metrics, held, index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.metrics, name)


class HeldSessions:
    """One compression process's sessions: setting them sets ``gem_sessions`` to the sum over the processes."""

    def __init__(self, metrics: Metrics, held: list[float], index: int):
        self.metrics, self.held, self.index = metrics, held, index

    def set(self, value: float) -> None:
        self.held[self.index] = value
        self.metrics.sessions.set(sum(self.held))


class ProcessDown:
    """The answer of a compression whose process stopped before answering."""


class TimedOut:
    """The answer of a compression whose process did not answer in time."""


class Child:
    """A running compression process and the proxy's end of its socket."""

    def __init__(self, process: subprocess.Popen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.process, self.reader, self.writer = process, reader, writer
        self.stopping = False  # the proxy asked it to exit
        self.started_at = time.monotonic()
        self.draining = asyncio.Lock()
        self.answers: asyncio.Future = asyncio.get_running_loop().create_future()  # then `_read_answers`

    @classmethod
    async def launch(cls, config: ServerConfig) -> Child:
        """The process (`BOOT`) on one end of a socket pair, sent ``config`` and the proxy's log level. It has a
        session of its own (a Ctrl-C to the proxy stops it through the proxy, in order) and dies with the proxy
        (`die_with_parent`); cancelled or failed here, it is killed and reaped."""
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen([sys.executable, "-c", BOOT, str(theirs.fileno()), str(os.getpid()),
                                        *sys.path], pass_fds=(theirs.fileno(),), start_new_session=True)
        finally:
            theirs.close()
        try:
            reader, writer = await asyncio.open_connection(sock=ours, limit=1 << 20)
            send(writer, frame((config, logging.getLogger("gemkernels").getEffectiveLevel())))
            return cls(process, reader, writer)
        except BaseException:
            ours.close()
            process.kill()
            await asyncio.shield(asyncio.to_thread(process.wait))
            raise

    async def close(self, wait_s: float = 0.0) -> int | None:
        """Close the socket; wait up to ``wait_s`` for the process to exit, then kill it; reaped off the event loop.
        Returns its exit status."""
        self.writer.close()
        if wait_s:
            try:
                await asyncio.wait_for(asyncio.to_thread(self.process.wait), wait_s)
            except asyncio.TimeoutError:
                pass
        if self.process.poll() is None:
            self.process.kill()
            await asyncio.to_thread(self.process.wait)
        return self.process.returncode


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
    from gemkernels.serve.compressor import Compressor

    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
    config, level = await read_frame(reader)
    logging.getLogger("gemkernels").setLevel(level)  # the proxy's: its lines read as if the proxy wrote them
    os.nice(config.compress_niceness)  # the proxy's event loop, forwarding every request, gets a core first
    metrics = RecordedMetrics()
    compressor = Compressor(config, metrics)
    await compressor.start()
    send(writer, frame({"encoder": compressor.encoder_name}))
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
        send(writer, answered)

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
    """The compression process (`BOOT`; ``argv``: the socket's file descriptor and the proxy's pid): dies with the
    proxy (`die_with_parent`), then serves it on the socket."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # as the proxy prints them
    fd, proxy = int(argv[0]), int(argv[1])
    die_with_parent(proxy)
    os.set_inheritable(fd, False)  # a process it starts must not hold the proxy's socket open
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    asyncio.run(serve(socket.socket(fileno=fd)))


def die_with_parent(proxy: int) -> None:
    """Exit now if the parent is no longer ``proxy`` (it died while this process started); on Linux, have the kernel
    kill this process when the proxy's thread that started it ends (``PR_SET_PDEATHSIG``); elsewhere the process
    exits when its socket closes."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != proxy:
        os._exit(1)
