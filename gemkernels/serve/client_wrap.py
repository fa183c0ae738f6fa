"""In-process GEM: wrap an SDK client so its ``create(messages=...)`` sends compressed histories.

    client = wrap(openai.OpenAI(), gem=GEM("paper"), session_id="agent-1")
    client.chat.completions.create(model=..., messages=history)   # history compressed, then sent

`wrap` returns a view of the client: ``chat.completions.create`` (OpenAI, `OpenAI` and
`AsyncOpenAI`) and ``messages.create`` (Anthropic, `Anthropic` and `AsyncAnthropic`) compress
``messages`` first; every other attribute is the client's own. The client object itself is not
modified. The session is ``session_id``, else the call's ``user``, else ``metadata.user_id``,
else GEM's prefix hash. GEM never raises, so a failed compression sends the original messages.
Async clients compress in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from gemkernels.compress.gem import GEM, THINKING_CONTENT, anthropic_thinking
from gemkernels.compress.sessions import request_session

#: The attribute paths whose ``create`` takes ``messages``.
CREATE_PATHS = (("chat", "completions"), ("messages",))


def wrap(client: Any, gem: GEM | None = None, session_id: str | None = None) -> Any:
    """A view of ``client`` whose chat ``create`` calls compress ``messages`` with ``gem``
    (default ``GEM("paper")`` with the default encoder)."""
    return _View(client, (), gem if gem is not None else GEM("paper"), session_id)


class _View:
    """Delegates to ``target``; at a path in `CREATE_PATHS`, ``create`` compresses first."""

    def __init__(self, target: Any, path: tuple[str, ...], gem: GEM, session_id: str | None):
        self._target, self._path, self._gem, self._session_id = target, path, gem, session_id

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name == "create" and self._path in CREATE_PATHS:
            return self._compressing(value)
        path = self._path + (name,)
        if any(p[:len(path)] == path for p in CREATE_PATHS):
            return _View(value, path, self._gem, self._session_id)
        return value

    def __repr__(self) -> str:
        return f"wrap({self._target!r})"

    def _compress(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        messages = kwargs.get("messages")
        if not isinstance(messages, list):
            return kwargs
        session = self._session_id or request_session(kwargs)
        mode = anthropic_thinking(kwargs) if self._path == ("messages",) else THINKING_CONTENT  # Anthropic's: bound
        return {**kwargs, "messages": self._gem.compress(messages, session_id=session, thinking=mode).messages}

    def _compressing(self, create: Any) -> Any:
        if inspect.iscoroutinefunction(create) or inspect.iscoroutinefunction(getattr(create, "__wrapped__", None)):
            async def acreate(*args: Any, **kwargs: Any) -> Any:
                return await create(*args, **await asyncio.to_thread(self._compress, kwargs))
            return acreate

        def screate(*args: Any, **kwargs: Any) -> Any:
            return create(*args, **self._compress(kwargs))
        return screate
