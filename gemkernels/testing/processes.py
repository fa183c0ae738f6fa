"""Servers in processes of their own, for tests and benchmarks: `RedisServer`, a throwaway ``redis-server`` on a
free port of 127.0.0.1, and `GemServeProcess`, a ``gem serve`` replica.

    with RedisServer() as server:   # RedisServerMissing when there is no redis-server binary
        url = server.url             # redis://127.0.0.1:PORT/0
        server.stop(); server.start()  # the same port again: a Redis outage and its return
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from types import TracebackType


class RedisServerMissing(RuntimeError):
    """No ``redis-server`` on PATH (Debian: apt-get install redis-server)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_ready(process: subprocess.Popen[bytes], ready: Callable[[], bool], timeout: float, what: str) -> bool:
    """Poll ``ready`` until it holds (True) or ``timeout`` seconds pass (False); RuntimeError if ``process`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        if ready():
            return True
        time.sleep(0.05)
    return False


class RedisServer:
    """A ``redis-server`` with no persistence on ``port`` (default a free one), started by `start` or ``with``."""

    def __init__(self, port: int | None = None, maxmemory_mb: int = 256):
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RedisServerMissing("no redis-server on PATH (Debian: apt-get install redis-server)")
        self.port = port if port is not None else free_port()
        self.maxmemory_mb = maxmemory_mb
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING (killed if it does not within ``timeout``)."""
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--maxmemory", f"{self.maxmemory_mb}mb", "--maxmemory-policy", "volatile-lru"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_until_ready(self.process, self.answers_ping, timeout, f"redis-server on port {self.port}"):
            self.stop()
            raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout} s")

    def answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Kill the server (no shutdown save: it has no persistence)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class GemServeProcess:
    """``python -m gemkernels serve ARGS --port P`` in a process of its own (its log in ``log_path``), started by
    ``with`` and waited for until ``/healthz`` answers; `kill` is a SIGKILL, the exit a SIGTERM."""

    def __init__(self, *args: str, log_path: str | None = None, timeout: float = 60.0):
        import sys

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "gemkernels", "serve", *args, "--port", str(self.port)]
        self.log_path, self.timeout = log_path, timeout
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GemServeProcess:
        import httpx

        log = open(self.log_path or os.devnull, "wb")  # noqa: SIM115 - the child holds it; closed with the process
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        def healthy() -> bool:
            try:
                return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        if not wait_until_ready(self.process, healthy, self.timeout, f"gem serve (log: {self.log_path})"):
            self.kill()
            raise RuntimeError(f"gem serve did not answer /healthz within {self.timeout} s (log: {self.log_path})")
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
