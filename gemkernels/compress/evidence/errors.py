"""Whether an observation records an error: exit statuses, tracebacks, failing tests, shell failures."""


from __future__ import annotations

import re

RETURNCODE_TAG = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
EXIT_TEXT = re.compile(r"\b(?:return ?code|exit(?:ed with)? (?:code|status)|exit_code)\s*[:=]?\s*(-?\d+)\b", re.I)
ERROR_TEXT = re.compile(
    r"Traceback \(most recent call last\)"
    r"|\b[A-Z]\w*(?:Error|Exception): \S"  # "ValueError: bad", "caught TypeError: x", not "except KeyError:"
    r"|(?<![\w/.\-])(?:error|Error|ERROR|fatal|FATAL|failed|Failed):"  # "error: x", not "errors=0", ".../error_log"
    r"|(?<![\w/.\-'\"])(?:ERROR|FAILED)(?![\w/.\-'\"])"  # pytest/unittest/logging, not logging.ERROR
    r"|\b(?:AssertionError|SyntaxError|IndentationError)\b"
    r"|\b[1-9]\d* (?:failed|errors?)\b"  # "2 failed, 5 passed", "1 error in 0.2s"
    r"|command not found|No such file or directory|Permission denied|Segmentation fault|\bcore dumped\b"
    r"|\btimed out\b|\bTimeout(?:Error|Expired)\b",
    re.M)
FIRST_LINE_ERROR = re.compile(
    r"^(?:[\w./-]+: )*(?:error|Error|ERROR|fatal)\b|^Traceback \(most recent call last\)|No such file or directory"
    r"|command not found|Permission denied|does not exist|No replacement was performed|did not appear verbatim")
OUTPUT_WRAPPER = re.compile(r"<returncode>\s*-?\d+\s*</returncode>|</?output>")


def exit_status(text: str) -> int | None:
    """The exit status an observation reports (``<returncode>N</returncode>``, ``exit code N``, ...), else None.

    Only the first and last 200 characters are read: harnesses report the status there, file content
    in between may mention exit codes."""
    edges = text if len(text) <= 400 else text[:200] + "\n" + text[-200:]
    match = RETURNCODE_TAG.search(edges) or EXIT_TEXT.search(edges)
    return int(match.group(1)) if match else None


def is_error_output(text: str, content: bool, quiet: bool) -> bool:
    """Whether one observation records an error.

    A non-zero exit status is an error, except status 1 of grep/diff-like commands (``quiet``: nothing
    found). Output that is file or page content (``content``) is not searched for error words: only its
    status, or its first line when no status is reported. Other output is searched for tracebacks,
    failing tests, ``error:`` and shell failures."""
    status = exit_status(text)
    if status not in (None, 0) and not (status == 1 and quiet):
        return True
    if content:
        return status is None and bool(FIRST_LINE_ERROR.search(first_line(text)))
    return bool(ERROR_TEXT.search(OUTPUT_WRAPPER.sub("", text)))


def first_line(text: str) -> str:
    """The first non-blank line of an observation, harness tags removed."""
    return next((line.strip() for line in OUTPUT_WRAPPER.sub("", text).splitlines() if line.strip()), "")


def has_output(text: str) -> bool:
    """Whether an observation carries anything beyond the harness tags."""
    return bool(OUTPUT_WRAPPER.sub("", text).strip())
