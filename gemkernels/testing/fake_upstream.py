"""A fake OpenAI/Anthropic upstream and a helper that serves any ASGI app on 127.0.0.1 in a thread.

The upstream records every request (path, headers, raw body) and answers by ``model``:
``fail`` -> 500 with a JSON error, ``hang`` -> sleeps ``HANG_S`` before answering, ``drop`` -> a stream
cut off after two events, ``slow`` -> answers after 0.3 s; otherwise a chat completion (or three
server-sent events and ``[DONE]`` when ``stream`` is true) naming how many messages arrived. A body
that is not JSON gets a 400 that quotes it. ``delay_s`` delays every answer (a model's latency, for load
benchmarks); ``record=False`` keeps no requests (bounded memory under load).

``POST /v1/responses`` answers as the Responses API does (a response object, or its ``response.*`` events when
``stream`` is true) naming how many input items arrived; ``POST /v1/messages/count_tokens`` answers
``{"input_tokens": bytes // 4}``; ``GET /v1/models`` lists one model; a path holding ``/missing`` is a 404; any
other method and path is echoed (``{"method", "path", "query", "body_bytes"}``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

HANG_S = 5.0


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes
    method: str = "POST"
    query: str = ""

    @property
    def body(self) -> Any:
        return json.loads(self.raw)


@dataclass
class FakeUpstream:
    received: list[Received] = field(default_factory=list)
    delay_s: float = 0.0
    record: bool = True

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            raw = await request.body()
            if self.record:
                self.received.append(Received(request.url.path, dict(request.headers), raw))
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            try:
                body = json.loads(raw)
            except ValueError:
                return JSONResponse({"error": {"message": f"bad json: {raw[:40]!r}"}}, status_code=400)
            model = body.get("model")
            if model == "fail":
                return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
            if model == "hang":
                await asyncio.sleep(HANG_S)
            if model == "slow":
                await asyncio.sleep(0.3)
            if request.url.path == "/v1/responses":
                return responses_answer(body, model)
            n = len(body.get("messages") or [])
            if body.get("stream") or model == "drop":
                return StreamingResponse(events(n, drop=model == "drop"), media_type="text/event-stream")
            if request.url.path == "/v1/messages":
                return JSONResponse({"id": "msg_1", "type": "message", "role": "assistant", "model": model,
                                     "content": [{"type": "text", "text": f"got {n}"}], "stop_reason": "end_turn",
                                     "usage": {"input_tokens": 1, "output_tokens": 1}})
            return JSONResponse(completion(model, f"got {n}"))

        async def other(request: Request) -> Response:
            raw = await request.body()
            if self.record:
                self.received.append(Received(request.url.path, dict(request.headers), raw, request.method,
                                              request.url.query))
            if request.url.path == "/v1/messages/count_tokens":
                return JSONResponse({"input_tokens": len(raw) // 4})
            if "/missing" in request.url.path:
                return JSONResponse({"error": {"message": "no such route", "type": "not_found"}}, status_code=404)
            if request.url.path == "/v1/models" and request.method == "GET":
                return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})
            return JSONResponse({"method": request.method, "path": request.url.path, "query": request.url.query,
                                 "body_bytes": len(raw)}, headers={"x-echo": "1"})

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                                 Route("/v1/messages", chat, methods=["POST"]),
                                 Route("/v1/responses", chat, methods=["POST"]),
                                 Route("/{path:path}", other, methods=list(ALL_METHODS))])


#: The methods the catch-all routes answer.
ALL_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


def responses_answer(body: dict[str, Any], model: Any) -> Response:
    """A Responses API answer naming how many input items arrived: JSON, or its server-sent events."""
    n = len(body["input"]) if isinstance(body.get("input"), list) else 1
    response = {"id": "resp_1", "object": "response", "status": "completed", "model": model,
                "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": f"got {n}", "annotations": []}]}],
                "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}
    if not body.get("stream"):
        return JSONResponse(response)

    async def stream():
        created = {**response, "status": "in_progress", "output": []}
        sequence = [("response.created", {"response": created}),
                    ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "delta": "got "}),
                    ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "delta": str(n)}),
                    ("response.completed", {"response": response})]
        for number, (kind, data) in enumerate(sequence):
            yield f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': number, **data})}\n\n".encode()
            await asyncio.sleep(0.005)

    return StreamingResponse(stream(), media_type="text/event-stream")


def completion(model: str, text: str) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


async def events(n: int, drop: bool):
    for i, piece in enumerate(["got ", str(n), "!"]):
        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        yield f"data: {json.dumps(chunk)}\n\n".encode()
        await asyncio.sleep(0.01)
        if drop and i == 1:
            raise RuntimeError("upstream dropped the stream")
    yield b"data: [DONE]\n\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """``app`` served by uvicorn on 127.0.0.1 in a daemon thread; ``url`` is its root; ``options`` are more
    ``uvicorn.Config`` arguments (``http``, ``timeout_keep_alive``, ...)."""

    def __init__(self, app: Any, graceful_s: float = 1.0, **options: Any):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        options = {"timeout_keep_alive": 60, **options}
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    timeout_graceful_shutdown=graceful_s, **options))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
