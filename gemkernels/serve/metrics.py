"""The proxy's Prometheus metrics (``GET /metrics``): requests and passthroughs by reason, characters and tokens
before and after, stage latencies, batch sizes, sessions, pending compressions, round trips to the session store,
relayed WebSockets (connections by how their handshake ended, open ones, messages each way).

One process reports its own; the workers of ``gem serve --workers N`` write theirs to a directory of
prometheus_client's multiprocess mode (`multiprocess_metrics`), and each reports every worker's summed, a dead
worker's counts included and its gauges dropped."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from gemkernels.compress.gem import ANALYSIS_DEFERRED, DEFERRED, ENCODING_DEFERRED, PASSTHROUGH, UNSAVED, Compressed

LATENCY_BUCKETS = (.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1)
#: The variable naming the multiprocess directory; prometheus_client reads it when it is imported.
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"


@contextlib.contextmanager
def multiprocess_metrics() -> Iterator[str]:
    """A fresh multiprocess directory, named in the environment that the processes started inside inherit (so
    their metrics go there), removed at the end."""
    directory = tempfile.mkdtemp(prefix="gem-serve-metrics-")
    previous = os.environ.get(MULTIPROCESS_DIR)
    os.environ[MULTIPROCESS_DIR] = directory
    try:
        yield directory
    finally:
        if previous is None:
            del os.environ[MULTIPROCESS_DIR]
        else:
            os.environ[MULTIPROCESS_DIR] = previous
        shutil.rmtree(directory, ignore_errors=True)


class Metrics:
    """The proxy's Prometheus metrics: in their own registry (one per app), or, in a process started with
    ``PROMETHEUS_MULTIPROC_DIR`` set, in that directory with every worker's (module doc)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.directory = os.environ.get(MULTIPROCESS_DIR)
        r = self.registry
        self.requests = Counter("gem_requests", "Requests by route and GEM action", ["route", "action"], registry=r)
        self.passthroughs = Counter("gem_passthroughs", "Requests forwarded unchanged by reason", ["reason"],
                                    registry=r)
        self.chars = Counter("gem_chars", "Serialised message characters", ["stage"], registry=r)
        self.tokens = Counter("gem_tokens", "o200k message tokens (when counted)", ["stage"], registry=r)
        self.upstream_errors = Counter("gem_upstream_errors", "Upstream failures by kind", ["kind"], registry=r)
        self.stage_seconds = Histogram("gem_stage_seconds", "GEM stage latency (queued: waiting for a compression "
                                       "thread and the session's earlier request; encode, select, total: in GEM)",
                                       ["stage"], registry=r, buckets=LATENCY_BUCKETS + (2, 5))
        self.batch_size = Histogram("gem_batch_size", "Requests per batched call", ["kind"], registry=r,
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        self.batch_seconds = Histogram("gem_batch_seconds", "Seconds per batched call", ["kind"], registry=r,
                                       buckets=LATENCY_BUCKETS)
        self.deferred = Counter("gem_encoding_deferred", "Requests sent on before their blocks were encoded or "
                                "analysed", registry=r)
        self.sessions = Gauge("gem_sessions", "Sessions held in GEM's store (summed over workers)",
                              registry=r, multiprocess_mode="livesum")
        self.pending = Gauge("gem_pending_compressions", "Compressions queued or running", registry=r,
                             multiprocess_mode="livesum")
        self.store_unsaved = Counter("gem_store_unsaved", "Compressed requests forwarded whose session state the "
                                     "shared store did not confirm saving", registry=r)
        self.store_round_trips = Counter("gem_store_round_trips", "Round trips to the shared session store "
                                         "(sessions and embeddings; 0 with the in-memory store)", registry=r)
        self.websocket_connections = Counter("gem_websocket_connections", "WebSocket upgrades by result: relayed "
                                             "(both sides open), refused (the upstream answered without upgrading), "
                                             "unreachable", ["result"], registry=r)
        self.websocket_open = Gauge("gem_websocket_open", "Relayed WebSockets open now", registry=r,
                                    multiprocess_mode="livesum")
        self.websocket_messages = Counter("gem_websocket_messages", "WebSocket messages relayed, by direction",
                                          ["direction"], registry=r)

    def exposition(self) -> bytes:
        """The Prometheus text of ``GET /metrics``: this app's metrics, or every worker's summed (module doc)."""
        if self.directory is None:
            return generate_latest(self.registry)
        workers = CollectorRegistry()
        MultiProcessCollector(workers, path=self.directory)
        return generate_latest(workers)

    def observe_batch(self, kind: str, size: int, seconds: float) -> None:
        self.batch_size.labels(kind).observe(size)
        self.batch_seconds.labels(kind).observe(seconds)

    def observe_compression(self, route: str, result: Compressed) -> None:
        stats = result.stats
        self.requests.labels(route, stats.action).inc()
        if stats.action == PASSTHROUGH:
            self.passthroughs.labels(passthrough_reason(stats.reason)).inc()
        if stats.reason.startswith(DEFERRED):
            self.deferred.inc()
        if stats.action != PASSTHROUGH and UNSAVED in stats.reason:  # a passthrough's reason may quote a client
            self.store_unsaved.inc()
        if stats.chars_before:
            self.chars.labels("before").inc(stats.chars_before)
            self.chars.labels("after").inc(stats.chars_after)
        if stats.tokens_before is not None and stats.tokens_after is not None:
            self.tokens.labels("before").inc(stats.tokens_before)
            self.tokens.labels("after").inc(stats.tokens_after)
        for stage, seconds in stats.seconds.items():
            self.stage_seconds.labels(stage).observe(seconds)


def passthrough_reason(reason: str) -> str:
    """A GEM passthrough reason as a low-cardinality label."""
    if reason.startswith("invalid structure"):
        return "invalid_structure"
    if reason.startswith(ENCODING_DEFERRED):
        return "encoding_deferred"
    if reason.startswith(ANALYSIS_DEFERRED):
        return "analysis_deferred"
    if reason.startswith("QueueFullError"):
        return "queue_full"
    if reason.startswith("StoreUnavailable"):
        return "store_unavailable"
    if reason.startswith("SessionConflict"):
        return "session_conflict"
    return "compression_error"
