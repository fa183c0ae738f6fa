"""The proxy's Prometheus metrics (``GET /metrics``): requests and passthroughs by reason, characters and tokens
before and after, stage latencies, batch sizes, sessions, pending compressions."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gemkernels.compress.gem import PASSTHROUGH, Compressed

LATENCY_BUCKETS = (.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1)


class Metrics:
    """The proxy's Prometheus metrics, in their own registry (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("gem_requests", "Requests by route and GEM action", ["route", "action"], registry=r)
        self.passthroughs = Counter("gem_passthroughs", "Requests forwarded unchanged by reason", ["reason"],
                                    registry=r)
        self.chars = Counter("gem_chars", "Serialised message characters", ["stage"], registry=r)
        self.tokens = Counter("gem_tokens", "o200k message tokens (when counted)", ["stage"], registry=r)
        self.upstream_errors = Counter("gem_upstream_errors", "Upstream failures by kind", ["kind"], registry=r)
        self.stage_seconds = Histogram("gem_stage_seconds", "GEM stage latency (encode, select, total)", ["stage"],
                                       registry=r, buckets=LATENCY_BUCKETS + (2, 5))
        self.batch_size = Histogram("gem_batch_size", "Requests per batched call", ["kind"], registry=r,
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        self.batch_seconds = Histogram("gem_batch_seconds", "Seconds per batched call", ["kind"], registry=r,
                                       buckets=LATENCY_BUCKETS)
        self.deferred = Counter("gem_encoding_deferred", "Requests sent on before their blocks were encoded",
                                registry=r)
        self.sessions = Gauge("gem_sessions", "Sessions held in GEM's store", registry=r)
        self.pending = Gauge("gem_pending_compressions", "Compressions queued or running", registry=r)
        self.store_round_trips = Gauge("gem_store_round_trips", "Round trips to the shared session store so far "
                                       "(sessions and embeddings; 0 with the in-memory store)", registry=r)

    def observe_batch(self, kind: str, size: int, seconds: float) -> None:
        self.batch_size.labels(kind).observe(size)
        self.batch_seconds.labels(kind).observe(seconds)

    def observe_compression(self, route: str, result: Compressed) -> None:
        stats = result.stats
        self.requests.labels(route, stats.action).inc()
        if stats.action == PASSTHROUGH:
            self.passthroughs.labels(passthrough_reason(stats.reason)).inc()
        if stats.reason.startswith("encoding deferred"):
            self.deferred.inc()
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
    if reason.startswith("encoding deferred"):
        return "encoding_deferred"
    if reason.startswith("QueueFullError"):
        return "queue_full"
    if reason.startswith("StoreUnavailable"):
        return "store_unavailable"
    if reason.startswith("SessionConflict"):
        return "session_conflict"
    return "compression_error"
