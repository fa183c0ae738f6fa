"""Test setup that must happen before gemkernels (and its Triton kernels) is imported.

Without a CUDA device the Triton kernels run in Triton's interpreter on CPU tensors, which
reads ``TRITON_INTERPRET`` when a kernel is decorated, i.e. at import. conftest.py is loaded
before any test module, so setting it here reaches every kernel. A value set by the caller
(``TRITON_INTERPRET=0``) is respected.

The float64 reference lives in ``tests/reference.py``; this directory is put on ``sys.path``
so ``import reference`` works under any pytest import mode (and from the benchmarks).
"""

from __future__ import annotations

import contextlib
import os
import sys

import pytest

try:
    import torch
except ImportError:  # the core needs numpy alone; torch-backed tests skip themselves
    torch = None

if torch is None or not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") is None:
        raise RuntimeError("triton was imported before tests/conftest.py could set TRITON_INTERPRET=1")
    os.environ.setdefault("TRITON_INTERPRET", "1")

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)


@pytest.fixture
def triton_options():
    """Call with a `TritonOptions` to run the rest of the test's selections with it (left at teardown)."""
    from gemkernels.select.backends import triton_backend

    with contextlib.ExitStack() as stack:
        yield lambda options: stack.enter_context(triton_backend.using(options))


@pytest.fixture(scope="session")
def redis_server():
    """A ``redis-server`` on a free port of 127.0.0.1 for the whole run (`gemkernels.testing.processes`); the test
    skips, saying why, where the machine has none (CI installs Debian's package)."""
    from gemkernels.testing.processes import RedisServer, RedisServerMissing

    try:
        server = RedisServer()
    except RedisServerMissing as err:
        pytest.skip(str(err))
    server.start()
    yield server
    server.stop()
