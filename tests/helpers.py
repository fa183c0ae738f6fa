"""What several test modules share: the bundled example, the development runs, small test doubles."""

from __future__ import annotations

from pathlib import Path

import pytest

from gemkernels.cli.extras import EXTRA_MODULES
from gemkernels.compress.encoders import HashEncoder

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "django-11276.json"
#: Small runs cut from the development runs, one per format (tests/fixtures/).
FIXTURES = ROOT / "tests" / "fixtures"
#: The development runs beside the project (``../shared``); tests that need them skip without them.
TRAJECTORIES = ROOT.parent / "shared" / "data" / "trajectories"
#: Real sessions in agents' native formats (``../shared/data/logs``, see its SOURCES.md).
LOGS = ROOT.parent / "shared" / "data" / "logs"


def needs_extra(*extras: str) -> None:
    """Skip the calling test unless every module of these extras (pyproject.toml) imports, as a subcommand that
    requires them checks before any work."""
    for extra in extras:
        for module in EXTRA_MODULES[extra]:
            pytest.importorskip(module)


def call_ids(messages: list[dict]) -> list[str]:
    """The ids of every OpenAI tool call, in order."""
    return [call["id"] for m in messages for call in m.get("tool_calls") or []]


class CountingEncoder(HashEncoder):
    """A hash encoder that records every text it is asked to embed."""

    def __init__(self, dim: int = 32):
        super().__init__(dim)
        self.seen: list[str] = []

    def encode(self, texts):
        self.seen.extend(texts)
        return super().encode(texts)


class KernelSpy:
    """Stands in for a Triton kernel: records each launch as ``(name, constexprs)``, then launches the kernel."""

    def __init__(self, kernel, name: str, log: list):
        self.kernel, self.name, self.log = kernel, name, log

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append((self.name, {k: v for k, v in kwargs.items() if k.isupper()}))
            return self.kernel[grid](*args, **kwargs)
        return launch


def array_layout(raw: bytes, key: str = "messages"):
    """The byte layout `gemkernels.serve.body.parse_body` gives the ``key`` array of ``raw`` (None: none)."""
    from gemkernels.serve.body import parse_body

    parsed = parse_body(raw, key)
    return None if parsed is None else parsed[1]


def same_role_pairs(messages: list[dict]) -> int:
    """How many adjacent messages share a role (0 for a history that alternates)."""
    return sum(a["role"] == b["role"] for a, b in zip(messages, messages[1:]))
