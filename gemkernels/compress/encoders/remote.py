"""An `Encoder` served by any OpenAI-compatible ``POST {base_url}/embeddings`` endpoint (DESIGN.md §2.3).

Needs ``httpx`` (``pip install 'gemkernels[remote]'``). The API key is read from the environment once, at
construction, and never appears in a log, a repr or an error message.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from gemkernels.compress.encoders.base import normalise_rows

try:
    import httpx
except ImportError as err:  # the core depends on numpy alone
    raise ImportError(f"OpenAIEmbeddingsEncoder needs pip install 'gemkernels[remote]' (httpx): {err}") from err

RETRIED_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


class OpenAIEmbeddingsEncoder:
    """Embeds texts in batches through ``{base_url}/embeddings``; rows come back in input order, L2-normalised float32.

    ``dim`` is ``dimensions`` when given (and is sent with every request); otherwise it is the width of the first
    response, and reading ``dim`` before any text was embedded sends one short probe request to learn it.
    Connect errors, timeouts, 429 and 5xx are retried ``max_retries`` times with exponential backoff (a numeric
    ``Retry-After`` is honoured); any other 4xx fails at once. Failures raise ``RuntimeError``.
    """

    def __init__(self, base_url: str, model: str, dimensions: int | None = None,
                 api_key_env: str | None = "OPENAI_API_KEY", batch_size: int = 64, timeout: float = 30.0,
                 max_retries: int = 3, backoff: float = 0.5):
        if batch_size < 1 or max_retries < 0 or (dimensions is not None and dimensions < 1):
            raise ValueError("batch_size and dimensions must be >= 1 and max_retries >= 0")
        self.model, self.dimensions = model, dimensions
        self.name = model if dimensions is None else f"{model}@{dimensions}"
        self.batch_size, self.max_retries, self.backoff = batch_size, max_retries, backoff
        self.url = base_url.rstrip("/") + "/embeddings"
        self._dim = dimensions
        self._key = os.environ.get(api_key_env) if api_key_env else None
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers)

    @property
    def dim(self) -> int:
        """Embedding width; learning it may cost one probe request (see the class docstring)."""
        if self._dim is None:
            self.encode(["dimension probe"])
        assert self._dim is not None
        return self._dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows = [self._embed(list(texts[i:i + self.batch_size])) for i in range(0, len(texts), self.batch_size)]
        return normalise_rows(np.concatenate(rows))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIEmbeddingsEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _embed(self, batch: list[str]) -> np.ndarray:
        """One request's embeddings, rows ordered by the response's ``index``."""
        body: dict[str, Any] = {"model": self.model, "input": batch}
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        try:
            data = self._post(body)["data"]
            if sorted(item["index"] for item in data) != list(range(len(batch))):
                raise ValueError("the indices are not one per input")
            rows = np.asarray([item["embedding"] for item in sorted(data, key=lambda item: item["index"])],
                              dtype=np.float64)
        except (KeyError, TypeError, ValueError) as err:
            raise RuntimeError(f"POST {self.url}: malformed embeddings response ({err})") from None
        if rows.ndim != 2 or (self._dim is not None and rows.shape[1] != self._dim):
            raise RuntimeError(f"POST {self.url}: embeddings of shape {rows.shape}, expected width {self._dim}")
        norms = np.linalg.norm(rows, axis=1)
        if not np.all(np.isfinite(norms) & (norms > 0)):
            raise RuntimeError(f"POST {self.url}: the server returned a zero or non-finite embedding")
        self._dim = rows.shape[1]
        return rows

    def _post(self, body: dict[str, Any]) -> Any:
        """The decoded JSON of a successful POST, retrying what is transient."""
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._client.post(self.url, json=body)
            except RETRIED_ERRORS as err:
                if attempt > self.max_retries:
                    raise RuntimeError(f"POST {self.url} failed after {attempt} attempt(s): "
                                       f"{type(err).__name__}: {self._redact(str(err))}") from None
                delay = self.backoff * 2 ** (attempt - 1)
            else:
                if response.status_code < 400:
                    return response.json()
                transient = response.status_code == 429 or response.status_code >= 500
                if not transient or attempt > self.max_retries:
                    raise RuntimeError(f"POST {self.url} failed with HTTP {response.status_code} after {attempt} "
                                       f"attempt(s): {self._redact(response.text[:300])}")
                delay = max(self.backoff * 2 ** (attempt - 1), retry_after(response))
            time.sleep(delay)

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "[redacted]") if self._key else text


def retry_after(response: httpx.Response) -> float:
    """The response's numeric ``Retry-After`` in seconds, capped at 60 (0 when absent or a date)."""
    try:
        seconds = float(response.headers.get("retry-after", "0"))
    except ValueError:
        return 0.0
    return min(seconds, 60.0) if math.isfinite(seconds) and seconds > 0 else 0.0
