"""Credentials out of the proxy's logs: query-string values of credential-like parameters (``?key=...``, as some
providers take their API key) are replaced in uvicorn's access log. Headers are never logged."""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote

#: A query parameter: its separator, name and value (``&`` or ``;`` between parameters). A value goes on past a
#: ``?`` or ``;`` unless a ``name=`` follows it, so ``?next=/a?token=...`` shows its second parameter and
#: ``token=a;b`` is one value.
QUERY_PARAM = re.compile(r"([?&;])([^=&;#\s\"?]*)=((?:[^&;#\s\"?]|[;?](?![^=&;#\s\"?]*=))*)")
#: What a credential parameter's name ends with, once percent-decoded, lower-cased and stripped of ``-``, ``_`` and
#: ``.``: ``key``, ``api-key``, ``x-goog-api-key``, ``subscription-key``, ``client_secret``, ``X-Amz-Signature``,
#: ``X-Amz-Security-Token``, ``access_token``, ``sig``, ``password``, ``auth``.
CREDENTIAL_ENDINGS = ("key", "token", "secret", "signature", "sig", "password", "passwd", "pwd", "auth",
                      "authorization", "credential", "credentials", "bearer")


def credential_name(name: str) -> bool:
    """Whether a query parameter of this name (as written, percent-encoded or not) carries a credential."""
    return re.sub(r"[-_.]", "", unquote(name).lower()).endswith(CREDENTIAL_ENDINGS)


def redact_query(text: str) -> str:
    """``text`` with the value of every credential-like query parameter replaced by ``[redacted]``."""
    return QUERY_PARAM.sub(lambda m: f"{m[1]}{m[2]}=[redacted]" if credential_name(m[2]) else m[0], text)


class QueryCredentialFilter(logging.Filter):
    """Redacts credential-like query parameters in a log record's arguments (uvicorn's access log passes the
    request line as one); the record is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_query(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact_query(record.msg)
        return True
