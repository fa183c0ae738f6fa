"""What the framework integrations add to one model call, side by side, on the bundled example's full history.

    python -m bench.integrations_overhead [--repeats 30] [--encoder hash]

LiteLLM: ``litellm.acompletion`` of the history to an in-process fake upstream (an httpx transport), without and with
`GEMCallback`. LangChain: `GEMMiddleware.wrap_model_call` with a handler that returns at once, against LangChain's
own ``convert_to_openai_messages`` of the same messages (the conversion a chat model does on every call). The session
is warm: every call after the first takes GEM's append path with no new block (a steady agent step's cost, less its
new block's encoding). A framework that is not installed is left out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from gemkernels.benchmark.timing import compare, fmt_seconds

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "django-11276.json")


def litellm_rows(messages: list[dict], encoder: str, repeats: int) -> list[tuple[str, float]]:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import httpx
        import litellm
        import openai
    except ImportError:
        return []
    from gemkernels.integrations.litellm import GEMCallback

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                                         "choices": [{"index": 0, "finish_reason": "stop",
                                                      "message": {"role": "assistant", "content": "ok"}}],
                                         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    loop = asyncio.new_event_loop()
    client = openai.AsyncOpenAI(api_key="bench", base_url="http://upstream.bench/v1",
                                http_client=httpx.AsyncClient(transport=httpx.MockTransport(upstream)))
    callback = GEMCallback("cache-aware", encoder=encoder)

    def call(callbacks: list) -> None:
        litellm.callbacks = callbacks
        loop.run_until_complete(litellm.acompletion(model="openai/m", messages=messages, client=client,
                                                    metadata={"session_id": "bench"}))

    results = compare({"acompletion, no callback": lambda: call([]),
                       "acompletion with GEMCallback": lambda: call([callback])}, repeats=repeats)
    loop.close()
    return [(name, timing.median) for name, timing in results.items()]


def langchain_rows(messages: list[dict], encoder: str, repeats: int) -> list[tuple[str, float]]:
    try:
        from langchain.agents.middleware import ModelRequest, ModelResponse
        from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
        from langchain_core.messages import AIMessage, convert_to_messages, convert_to_openai_messages
    except ImportError:
        return []
    from gemkernels.integrations.langchain import GEMMiddleware

    history = convert_to_messages(messages)
    request = ModelRequest(model=GenericFakeChatModel(messages=iter(())), system_message=history[0],
                           messages=history[1:])
    middleware = GEMMiddleware(preset="cache-aware", encoder=encoder)
    reply = ModelResponse(result=[AIMessage("ok")])
    results = compare({"convert_to_openai_messages": lambda: convert_to_openai_messages(history),
                       "GEMMiddleware.wrap_model_call": lambda: middleware.wrap_model_call(request, lambda r: reply)},
                      repeats=repeats)
    return [(name, timing.median) for name, timing in results.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--encoder", default="hash", help="hash, minilm, ...")
    args = parser.parse_args()
    with open(EXAMPLE) as f:
        messages = json.load(f)["messages"]
    print(f"{len(messages)} messages, {len(json.dumps(messages)):,} serialised characters, encoder {args.encoder}\n")
    print("| what | median | ratio to the first of its pair |\n|---|---|---|")
    for rows in (litellm_rows(messages, args.encoder, args.repeats),
                 langchain_rows(messages, args.encoder, args.repeats)):
        for name, median in rows:
            print(f"| {name} | {fmt_seconds(median)} | {median / rows[0][1]:.2f}x |")


if __name__ == "__main__":
    main()
