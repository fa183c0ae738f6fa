"""``gem serve --upstream URL``: the compressing OpenAI- and Anthropic-compatible proxy (`gemkernels.serve`).

Connections are bounded in time (defaults and their reasons: `gemkernels.serve.connections`): request headers must
be complete ``--header-timeout`` s after a connection opens or a new request starts, an idle connection closes
``--keep-alive-timeout`` s after its last response, and a body with no byte for ``--body-timeout`` s gets a 408.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any
from urllib.parse import urlsplit

from gemkernels.cli.extras import encoder_extras, require
from gemkernels.cli.help_text import description
from gemkernels.cli.settings import FALSE, TRUE, SettingsError, defer_defaults, resolve
from gemkernels.compress.config import OVERRIDE_HELP, PRESETS
from gemkernels.compress.encoders import ENCODER_HELP, check_encoder_name
from gemkernels.serve.config import ServerConfig, default_compress_processes, default_threads
from gemkernels.serve.connections import DEFAULT_HEADER_TIMEOUT, DEFAULT_KEEP_ALIVE_TIMEOUT

#: ``--compress-process``'s default: as many processes as `default_compress_processes` gives this host.
AUTO = "auto"


def seconds(text: str) -> float:
    """An argparse type: a positive number of seconds."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def processes(text: str) -> int | str:
    """An argparse type: a number of processes, 0 or more, or ``auto`` (`default_compress_processes`; ``true`` /
    ``false``, the flag's older form: 1 / 0)."""
    word = text.strip().lower()
    if word in TRUE + FALSE:
        return int(word in TRUE)
    if word == AUTO:
        return AUTO
    if not word.isdigit():
        raise argparse.ArgumentTypeError(f"must be a number of processes (0 or more) or {AUTO}, got {text}")
    return int(word)


def add_parser(subparsers: Any) -> None:
    """Register ``gem serve``."""
    p = subparsers.add_parser("serve", help="run the compressing OpenAI/Anthropic-compatible proxy",
                              description=description(__doc__))
    p.add_argument("--upstream", required=True, metavar="URL",
                   help="the OpenAI-format API (chat completions, responses), and the Anthropic-format one unless "
                        "--anthropic-upstream is given, e.g. https://api.openai.com/v1")
    p.add_argument("--anthropic-upstream", metavar="URL",
                   help="the Anthropic-format API for /v1/messages, e.g. https://api.anthropic.com, so one proxy "
                        "serves Codex and Claude Code at once (default: --upstream)")
    p.add_argument("--host", default="127.0.0.1", help="default %(default)s")
    p.add_argument("--port", type=int, default=8088, help="default %(default)s")
    p.add_argument("--preset", default="paper", choices=sorted(PRESETS), help="default %(default)s")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help=OVERRIDE_HELP)
    p.add_argument("--encoder", default="minilm", help=ENCODER_HELP)
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="batching wait (default %(default)s ms)")
    p.add_argument("--max-batch", type=int, default=64, help="default %(default)s")
    p.add_argument("--threads", type=int, default=default_threads(),
                   help="compression threads per worker (default: this machine's cores, 2 to 8: %(default)s)")
    p.add_argument("--workers", type=int, default=1,
                   help="server processes on the one port; more than one needs a shared --store (default "
                        "%(default)s)")
    p.add_argument("--store", default="memory", metavar="memory|redis://HOST:PORT/DB",
                   help="where sessions live: this process's memory, or a Redis shared by every worker and replica "
                        "(gemkernels[redis]; default %(default)s)")
    p.add_argument("--store-ttl", type=seconds, default=ServerConfig.store_ttl,
                   help="seconds a session is kept after its last request (default %(default)s)")
    p.add_argument("--store-embeddings", choices=("float32", "float16"), default=ServerConfig.embedding_dtype,
                   help="how the shared store keeps block embeddings: float32 exact, float16 half the memory "
                        "(default %(default)s)")
    p.add_argument("--max-pending", type=int, default=1024,
                   help="compressions queued or running before requests go out uncompressed (default %(default)s)")
    p.add_argument("--max-sessions", type=int, default=10_000, help="default %(default)s")
    p.add_argument("--timeout", type=float, default=600.0, help="upstream timeout in seconds (default %(default)s)")
    p.add_argument("--max-body-mb", type=float, default=64, help="largest request body, in MiB; larger ones get a 413 "
                                                                 "(default %(default)s)")
    p.add_argument("--max-message-mb", type=float, default=64,
                   help="largest relayed WebSocket message either way, in MiB; a larger one closes the connection "
                        "with 1009 (default %(default)s)")
    p.add_argument("--max-session-mb", type=float, default=1024,
                   help="what all sessions may hold (block embeddings and keys; apart, observe mode's token ids), in "
                        "MiB; the least recently used go first (default %(default)s)")
    p.add_argument("--header-timeout", type=seconds, default=DEFAULT_HEADER_TIMEOUT,
                   help="close a connection whose request headers are not complete this many seconds after it "
                        "opened or after a new request began (slowloris, idle sockets; default %(default)s)")
    p.add_argument("--keep-alive-timeout", type=seconds, default=DEFAULT_KEEP_ALIVE_TIMEOUT,
                   help="close a connection idle this many seconds after its last response; longer than clients' "
                        "idle expiry (httpx: 5 s), so the client closes first (default %(default)s)")
    p.add_argument("--body-timeout", type=seconds, default=ServerConfig.body_timeout,
                   help="answer 408 and close when a request body sends no byte for this many seconds "
                        "(default %(default)s)")
    p.add_argument("--encode-budget-ms", type=float, default=200.0,
                   help="longest a request waits for its blocks' embeddings and analysis; past it, it goes out with "
                        "the new blocks appended (or unchanged) while they finish, for the next call; 'inf': no "
                        "limit (default %(default)s)")
    p.add_argument("--compress-process", type=processes, nargs="?", const=1, default=AUTO, metavar="N|auto",
                   help="compress in N processes of each worker's own (the bare flag: 1; 0: in the worker's own "
                        "process), so that compression never holds the GIL its event loop needs: N more cores a "
                        "worker, each session's requests always in the same process, which keeps its state in "
                        "memory; each loads its own encoder and tokenizer (about 220 MiB with the default one). "
                        "auto: the worker's share of the cores (within a container's CPU quota), at most 4, none "
                        f"under 2 ({default_compress_processes()} here with one worker; default %(default)s)")
    p.add_argument("--compress-niceness", type=int, choices=range(20), default=ServerConfig.compress_niceness,
                   metavar="0-19",
                   help="how much nicer than the proxy the compression processes run (os.nice), so that its event "
                        "loop, forwarding every request, gets a core first; past the encoding budget a request "
                        "they have not compressed goes out appended (default %(default)s)")
    p.add_argument("--count-compressed", action="store_true",
                   help="POST /v1/messages/count_tokens counts the request as it would be forwarded, so an agent's "
                        "own auto-compaction sees the compressed size")
    p.add_argument("--observe", action="store_true",
                   help="forward every request exactly as sent and record, per session, what compression would have "
                        "removed and saved under the provider's cache (GET /v1/gem/sessions)")
    p.add_argument("--report", action="store_true", help="with --observe, print every session's record on exit")
    p.add_argument("--no-compress-endpoint", dest="compress_endpoint", action="store_false",
                   help="do not serve POST /v1/gem/compress")
    p.add_argument("--compress-token-env", metavar="NAME",
                   help="serve POST /v1/gem/compress only to callers sending X-GEM-Token equal to $NAME")
    p.add_argument("--config", metavar="FILE.toml",
                   help="settings from a TOML file: its top-level keys are these flags (max_body_mb = 64), its "
                        "[compression] table GEMConfig's fields (k = 16); a flag beats GEM_<FLAG> in the "
                        "environment, which beats the file (gemkernels.cli.settings)")
    p.set_defaults(func=run, deferred=defer_defaults(p))


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; in-flight requests are drained (up to 60 s) on shutdown."""
    try:
        args = resolve(args, args.deferred, "serve")
        config = server_config(args)
    except (SettingsError, ValueError) as err:
        print(f"gem serve: {err}", file=sys.stderr)
        return 2
    if not require("serve", "serve", *encoder_extras(args.encoder), *(() if config.store == "memory" else ("redis",))):
        return 2
    from gemkernels.serve.workers import Listener, serve, serve_workers

    listener = Listener(args.host, args.port, args.header_timeout, args.keep_alive_timeout)
    if args.workers == 1:
        serve(config, listener)
        return 0
    return serve_workers(config, listener, args.workers)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The proxy's configuration from resolved arguments; ``ValueError`` naming a bad override or a token
    variable that is not set."""
    from gemkernels.compress.config import with_overrides

    try:
        with_overrides(args.preset, args.set)
    except ValueError as err:  # name where a bad item came from: a variable, the file, or --set
        source = next((where for item, where in getattr(args, "set_sources", {}).items() if repr(item) in str(err)),
                      None)
        raise ValueError(f"{err} (from {source})" if source else str(err)) from None
    check_encoder_name(args.encoder)
    for flag, url in (("--upstream", args.upstream), ("--anthropic-upstream", args.anthropic_upstream)):
        try:
            parts = urlsplit(url or "http://host")
            port = parts.port  # reading it checks it
            valid = parts.scheme in ("http", "https") and bool(parts.hostname) and (port is None or port > 0)
        except ValueError:  # a port that is no number or out of range, a broken IPv6 address
            valid = False
        if not valid:
            raise ValueError(f"{flag} takes an http:// or https:// URL, e.g. https://api.openai.com/v1; got {url!r}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must lie in [0, 65535] (0: any free port), got {args.port}")
    if args.workers < 1 or args.threads < 1:
        raise ValueError("--workers and --threads must be at least 1")
    if args.workers > 1 and args.store == "memory":
        raise ValueError(f"--workers {args.workers} needs sessions shared by the workers: add --store "
                         "redis://127.0.0.1:6379/0 (pip install 'gemkernels[redis]'; any Redis 6 or later)")
    if args.workers > 1 and args.observe:
        raise ValueError("--observe records sessions in one process: run it with --workers 1")
    if args.store != "memory" and not args.store.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"--store takes memory or a redis://HOST:PORT/DB URL, got {args.store.split('@')[-1]!r}")
    if args.compress_token_env and not os.environ.get(args.compress_token_env):
        raise ValueError(f"--compress-token-env names ${args.compress_token_env}, which is not set (or empty)")
    budget = None if math.isinf(args.encode_budget_ms) else max(0.0, args.encode_budget_ms) / 1000
    compress_process = (default_compress_processes(args.workers) if args.compress_process == AUTO
                        else args.compress_process)
    return ServerConfig(upstream=args.upstream, preset=args.preset, overrides=tuple(args.set), encoder=args.encoder,
                        max_wait=args.max_wait_ms / 1000, max_batch=args.max_batch, threads=args.threads,
                        max_pending=args.max_pending, max_sessions=args.max_sessions, timeout=args.timeout,
                        max_body_bytes=int(args.max_body_mb * (1 << 20)),
                        max_message_bytes=int(args.max_message_mb * (1 << 20)),
                        max_session_bytes=int(args.max_session_mb * (1 << 20)), body_timeout=args.body_timeout,
                        compress_endpoint=args.compress_endpoint, anthropic_upstream=args.anthropic_upstream,
                        encode_budget=budget, count_compressed=args.count_compressed, observe=args.observe,
                        report=args.report, store=args.store, store_ttl=args.store_ttl,
                        embedding_dtype=args.store_embeddings, compress_process=compress_process,
                        compress_niceness=args.compress_niceness,
                        compress_token=os.environ.get(args.compress_token_env) if args.compress_token_env else None)
