"""Credentials out of the proxy's logs: query-string values of credential-like parameters (``?key=...``, as some
providers take their API key) are replaced in uvicorn's access log. Headers are never logged."""

from __future__ import annotations

import logging
import re

#: Query parameters whose values are credentials (matched case-insensitively, ``-`` or ``_`` alike).
CREDENTIAL_PARAMS = re.compile(r"(?i)([?&](?:api[-_]?key|key|token|access[-_]?token|auth|sig|signature|"
                               r"password|secret)=)[^&#\s\"]*")


def redact_query(text: str) -> str:
    """``text`` with the value of every credential-like query parameter replaced by ``[redacted]``."""
    return CREDENTIAL_PARAMS.sub(r"\1[redacted]", text)


class QueryCredentialFilter(logging.Filter):
    """Redacts credential-like query parameters in a log record's arguments (uvicorn's access log passes the
    request line as one); the record is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_query(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact_query(record.msg)
        return True
