"""`ServerConfig`: everything ``gem serve`` needs to build the proxy."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from gemkernels.serve.formats import ANTHROPIC_UPSTREAM, OPENAI_UPSTREAM


def default_threads() -> int:
    """Compression threads a worker starts by default: the cores this process may run on, at least 2 (a long request
    never holds up every other) and at most 8. Threads overlap waits (the GPU selection batcher, Redis, a remote
    encoder); past the cores they only add GIL hand-offs to CPU-bound compression: on 2 cores, 8 threads took 6.6-6.9
    ms of CPU a request and added a p99 of 610-810 ms at 100 sessions, 2 threads 5.5-6.0 ms and 360-420 ms
    (bench/RESULTS.md)."""
    return max(2, min(8, usable_cores()))


def usable_cores() -> int:
    """The cores this process may run on, within its container's CPU limit (`cgroup_cpus`) where it has one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = cgroup_cpus()
    return cores if limit is None else max(1, min(cores, math.floor(limit)))


def cgroup_cpus(root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPUs a cgroup quota allows this process (Docker's ``--cpus``, a Kubernetes CPU limit), the least of: cgroup
    v2's ``cpu.max`` at ``root`` (a container's own cgroup) and in this process's cgroup (``membership``'s ``0::``
    line), and v1's ``cpu/cpu.cfs_quota_us`` over its period; None without a quota."""
    own = next((line[3:].strip() for line in read_text(membership).splitlines() if line.startswith("0::")), "/")
    pairs = [read_text(folder / "cpu.max").split() for folder in {root, root / own.lstrip("/")}]  # "QUOTA PERIOD"
    v1 = root / "cpu"
    pairs.append(f"{read_text(v1 / 'cpu.cfs_quota_us')} {read_text(v1 / 'cpu.cfs_period_us')}".split())
    found = [cpus for pair in pairs if len(pair) == 2 and (cpus := quota_cpus(*pair)) is not None]
    return min(found) if found else None


def read_text(path: Path) -> str:
    """``path``'s text; empty when it cannot be read."""
    try:
        return path.read_text()
    except OSError:
        return ""


def quota_cpus(quota: str, period: str) -> float | None:
    """CPUs from a cgroup quota and period in microseconds; None for no quota (``max``, -1) or what is no number."""
    try:
        quota_us, period_us = float(quota), float(period)
    except ValueError:
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


#: The most compression processes ``gem serve`` starts for a worker by default: one event loop spends about 2 ms of
#: CPU on a compressed request and a compression process about 3 (bench/RESULTS.md), so past a few they wait on it.
MAX_DEFAULT_COMPRESS_PROCESSES = 4


def default_compress_processes(workers: int = 1) -> int:
    """Compression processes a worker starts by default (``--compress-process auto``): its share of the cores, at
    most `MAX_DEFAULT_COMPRESS_PROCESSES`; none where that share is under two cores (another process would only add
    the hand-over's CPU) or off POSIX (the processes need ``pass_fds`` and ``os.nice``). On 2 cores, two processes
    added 10-24 / 33-101 ms (p50 / p99; medians 14.8 / 45.1 over seven rounds) at 100 sessions against 23-179 /
    101-292 in the proxy's process (bench/RESULTS.md, "Compression processes by default")."""
    share = usable_cores() // max(1, workers)
    return 0 if share < 2 or os.name != "posix" else min(MAX_DEFAULT_COMPRESS_PROCESSES, share)


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``gem serve`` needs; ``upstream`` is the OpenAI-format API root (``http://host:port`` or
    ``.../v1``), ``anthropic_upstream`` the Anthropic-format one (None: ``upstream`` serves both);
    ``overrides`` are ``field=value`` items applied to the preset (`config.with_overrides`); ``max_body_bytes``
    bounds a request body (413 past it), ``max_message_bytes`` a relayed WebSocket message either way (close 1009
    past it: `gemkernels.serve.websocket_relay`), ``max_session_bytes`` what the sessions hold in all;
    ``compress_endpoint`` serves ``POST /v1/gem/compress``, and with ``compress_token`` only to callers that send
    it as ``X-GEM-Token``; a proxied request waits for its blocks' embeddings and analysis ``encode_budget``
    seconds at most (None: no limit), and ``encode_cache_bytes`` of embeddings are kept for the requests that gave
    up waiting;
    a request body with no byte for ``body_timeout`` seconds gets a 408 (`gemkernels.serve.connections`);
    ``count_compressed``: ``POST /v1/messages/count_tokens`` counts the request as it would be forwarded;
    ``observe``: forward every request as sent and record what compression would have done
    (`gemkernels.serve.observe`), with ``report`` printing it when the server stops; ``store``: where sessions
    live, ``memory`` (this process) or a ``redis://`` URL shared by replicas (`gemkernels.compress.redis_store`),
    kept ``store_ttl`` seconds after their last request, with embeddings shared as ``embedding_dtype``;
    ``compress_process``: compress in this many processes of the proxy's own, 0 in its own process
    (`gemkernels.serve.compression_process`; ``gem serve``'s default is `default_compress_processes`), each
    ``compress_niceness`` nicer than the proxy (``os.nice``), so that the event loop forwarding every request gets
    a core before they do."""

    upstream: str
    preset: str = "paper"
    overrides: tuple[str, ...] = ()
    encoder: str = "minilm"
    max_wait: float = 0.002
    max_batch: int = 64
    threads: int = field(default_factory=default_threads)
    max_pending: int = 1024
    max_sessions: int = 10_000
    max_session_bytes: int = 1 << 30
    timeout: float = 600.0
    max_body_bytes: int = 64 << 20
    max_message_bytes: int = 64 << 20
    compress_endpoint: bool = True
    compress_token: str | None = None
    encode_budget: float | None = 0.2
    encode_cache_bytes: int = 128 << 20
    body_timeout: float = 30.0
    anthropic_upstream: str | None = None
    count_compressed: bool = False
    observe: bool = False
    report: bool = False
    store: str = "memory"
    store_ttl: float = 3600.0
    embedding_dtype: str = "float32"
    compress_process: int = 0
    compress_niceness: int = 10

    def upstream_roots(self) -> dict[str, str]:
        """Format -> API root (`gemkernels.serve.formats`)."""
        return {OPENAI_UPSTREAM: self.upstream, ANTHROPIC_UPSTREAM: self.anthropic_upstream or self.upstream}
