"""``gem serve``'s processes: one server, or ``--workers N`` of them on one listening socket, supervised.

Each worker is a whole proxy (its own event loop, compression threads and encoder) built from the same
`ServerConfig`; with more than one, they share their sessions through the config's ``redis://`` store, so they
behave like one process. The supervisor binds the socket once and hands it to every worker (the kernel spreads
the connections), restarts a worker that dies (one that cannot start stops the server, status 3, as one process
would), and on SIGINT / SIGTERM asks every worker to drain and stop; a worker whose supervisor is gone stops too. The
workers keep their metrics in one multiprocess directory, so each one's ``/metrics`` reports them all
(`gemkernels.serve.metrics`).
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client.multiprocess import mark_process_dead

from gemkernels.serve.config import ServerConfig
from gemkernels.serve.metrics import multiprocess_metrics

logger = logging.getLogger("gemkernels.serve")

#: How long a stopping worker may drain its requests before it is killed.
GRACEFUL_SHUTDOWN_S = 60
#: uvicorn's exit status when the app fails to start (a bad setting): the supervisor stops rather than restart.
STARTUP_FAILURE = 3


@dataclass(frozen=True)
class Listener:
    """Where to listen, and the connection deadlines (`gemkernels.serve.connections`)."""

    host: str
    port: int
    header_timeout: float
    keep_alive_timeout: float


def install_log_filters() -> None:
    """On uvicorn's loggers: credentials out of the access log and of its WebSocket lines (which carry the query),
    and no error for an upstream's refusal relayed as a WebSocket handshake's answer."""
    from gemkernels.serve.redact import QueryCredentialFilter
    from gemkernels.serve.websocket_relay import DeniedHandshakeFilter

    for name in ("uvicorn.access", "uvicorn.error"):  # uvicorn logs WebSocket handshakes, query included, on the latter
        logger = logging.getLogger(name)
        if not any(isinstance(f, QueryCredentialFilter) for f in logger.filters):
            logger.addFilter(QueryCredentialFilter())
    error = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, DeniedHandshakeFilter) for f in error.filters):
        error.addFilter(DeniedHandshakeFilter())


def uvicorn_config(config: ServerConfig, listener: Listener) -> Any:
    """The ``uvicorn.Config`` of one worker: the app, the deadlines, the WebSocket message limit, graceful shutdown,
    info logging without credentials in the access log or uvicorn's WebSocket lines."""
    import uvicorn

    from gemkernels.serve.app import create_app
    from gemkernels.serve.connections import uvicorn_options
    logging.getLogger("gemkernels").setLevel(logging.INFO)
    install_log_filters()
    return uvicorn.Config(create_app(config), host=listener.host, port=listener.port,
                          timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, log_level="info",
                          **uvicorn_options(listener.header_timeout, listener.keep_alive_timeout,
                                            config.max_message_bytes))


def serve(config: ServerConfig, listener: Listener) -> None:
    """Serve in this process until SIGINT / SIGTERM."""
    import uvicorn

    uvicorn.Server(uvicorn_config(config, listener)).run()


def worker_main(config: ServerConfig, listener: Listener, sock: socket.socket) -> None:
    """One worker process: serve on the supervisor's socket until told to stop or the supervisor is gone."""
    import uvicorn

    threading.Thread(target=stop_with_supervisor, name="gem-supervisor-watch", daemon=True).start()
    uvicorn.Server(uvicorn_config(config, listener)).run(sockets=[sock])


def stop_with_supervisor() -> None:
    """Wait for the supervisor to end (a SIGKILL gives it no time to stop its workers), then SIGTERM this worker:
    it drains and exits instead of holding the port."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        multiprocessing.connection.wait([parent.sentinel])
        os.kill(os.getpid(), signal.SIGTERM)


def serve_workers(config: ServerConfig, listener: Listener, workers: int) -> int:
    """Run ``workers`` worker processes on one socket until SIGINT / SIGTERM (module doc); the exit status."""
    logging.getLogger("gemkernels").setLevel(logging.INFO)  # the supervisor's lines, as a worker's
    with multiprocess_metrics() as metrics_dir:  # before the first worker imports prometheus_client
        return supervise(config, listener, workers, metrics_dir)


def supervise(config: ServerConfig, listener: Listener, workers: int, metrics_dir: str) -> int:
    """`serve_workers` with the workers' metrics in ``metrics_dir``."""
    sock = socket.create_server((listener.host, listener.port), reuse_port=False, backlog=2048)
    sock.set_inheritable(True)
    context = multiprocessing.get_context("spawn")
    stopping = False
    status = 0

    def start(number: int) -> multiprocessing.process.BaseProcess:
        process = context.Process(target=worker_main, args=(config, listener, sock), name=f"gem-serve-{number}")
        process.start()
        return process

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    processes = [start(i) for i in range(workers)]
    logger.info("gem serve: %d workers on http://%s:%d", workers, listener.host, listener.port)
    try:
        while not stopping:
            for i, process in enumerate(processes):
                if not process.is_alive() and not stopping and process.exitcode == STARTUP_FAILURE:
                    logger.error("gem serve: worker %d could not start; stopping", i)
                    stopping, status = True, STARTUP_FAILURE
                elif not process.is_alive() and not stopping:
                    logger.warning("gem serve: worker %d (pid %s) exited with %s; starting another", i,
                                   process.pid, process.exitcode)
                    mark_process_dead(process.pid, metrics_dir)  # its gauges go; its counts stay in the sums
                    processes[i] = start(i)
            time.sleep(0.2)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: uvicorn drains, then exits
        deadline = time.monotonic() + GRACEFUL_SHUTDOWN_S + 5
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
        sock.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return status
