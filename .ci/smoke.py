"""What one optional extra must make work on its own, in a fresh virtual environment holding only it.

    python .ci/smoke.py core|serve|embed|replay|bench

Runs in a temporary folder, so that the installed package is imported, not the checkout's sources; exits
non-zero, naming the failed check, when the install does not do what the README promises for it (a missing extra
must be named by the command that needs it, never a traceback).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "django-11276.json")
FIXTURES = str(ROOT / "tests" / "fixtures")
HEAVY = {"torch", "triton", "numba", "scipy", "matplotlib", "starlette", "httpx", "sentence_transformers", "tqdm",
         "uvicorn", "prometheus_client", "bpe_openai", "websockets"}
SUBCOMMANDS = ("compress", "serve", "replay", "online", "analyze", "bench")


def gem(*args: str, expect: int = 0, says: str | None = None) -> str:
    """Run ``python -m gemkernels ARGS``; check its exit status and, with ``says``, that stderr contains it."""
    done = subprocess.run([sys.executable, "-m", "gemkernels", *args], capture_output=True, text=True, timeout=900)
    if done.returncode != expect or (says is not None and says not in done.stderr):
        raise SystemExit(f"FAILED: gem {' '.join(args)} exited {done.returncode} (expected {expect}"
                         f"{', saying ' + repr(says) if says else ''})\nstdout: {done.stdout[-2000:]}\n"
                         f"stderr: {done.stderr[-2000:]}")
    print(f"ok: gem {' '.join(args)} -> {done.returncode}")
    return done.stdout


def core() -> None:
    """numpy alone: the library, the hash encoder, every --help, and each extra named before any work."""
    started = time.perf_counter()
    probe = ("import time; t = time.perf_counter(); import gemkernels, sys; "
             "print(json.dumps([time.perf_counter() - t, sorted(m for m in sys.modules if m.split('.')[0] in H)]))")
    out = subprocess.run([sys.executable, "-c", f"import json; H = {sorted(HEAVY)!r}; {probe}"],
                         capture_output=True, text=True, check=True).stdout
    seconds, heavy = json.loads(out)
    assert heavy == [], f"import gemkernels imported {heavy}"
    print(f"ok: import gemkernels in {seconds * 1000:.0f} ms, nothing heavy imported")
    import numpy as np

    import gemkernels as gk

    x = np.random.default_rng(0).standard_normal((40, 64)).astype(np.float32)
    sel = gk.select(x, protected=[39], k=8)
    assert len(sel.indices) == 8 and sel.indices[0] == 39, sel
    messages = json.loads(Path(EXAMPLE).read_text())["messages"]
    out = gk.GEM("core", encoder="hash").compress(messages)
    assert out.stats.action == "reselected" and len(out.messages) < len(messages), out.stats
    print(f"ok: gk.select and GEM(encoder='hash') ({out.stats.blocks} blocks, {len(out.stats.removed_blocks)} removed)")
    gem("--help")
    for command in SUBCOMMANDS:
        gem(command, "--help")
    gem("compress", EXAMPLE, "--encoder", "hash", "--preset", "core")
    gem("compress", EXAMPLE, expect=2, says="pip install 'gemkernels[embed]'")
    gem("serve", "--upstream", "http://127.0.0.1:9", "--encoder", "hash", expect=2, says="pip install 'gemkernels[serve]'")
    for command in ("replay", "analyze"):
        gem(command, FIXTURES, "--encoder", "hash", expect=2, says="pip install 'gemkernels[replay]'")
    gem("online", FIXTURES, "--encoder", "hash", expect=2, says="pip install 'gemkernels[tokens]'")
    gem("bench", "--quick", expect=2, says="pip install 'gemkernels[bench]'")
    print(f"core: {time.perf_counter() - started:.1f} s")


def serve() -> None:
    """The proxy app answers and compresses with the hash encoder (no model, no network), and the uvicorn that
    ``gem serve`` runs accepts WebSocket upgrades."""
    import uvicorn
    from starlette.testclient import TestClient

    from gemkernels.serve.app import ServerConfig, create_app
    from gemkernels.serve.connections import uvicorn_options

    messages = json.loads(Path(EXAMPLE).read_text())["messages"]
    with TestClient(create_app(ServerConfig(upstream="http://127.0.0.1:9", preset="core", encoder="hash"))) as client:
        assert client.get("/healthz").status_code == 200
        reply = client.post("/v1/gem/compress", json={"messages": messages}).json()
        assert reply["stats"]["action"] == "reselected" and len(reply["messages"]) < len(messages), reply["stats"]
        assert b"gem_requests" in client.get("/metrics").content
    print("ok: gem serve's app compresses and reports metrics")
    config = uvicorn.Config(create_app(ServerConfig(upstream="http://127.0.0.1:9")), **uvicorn_options())
    config.load()
    assert config.ws_protocol_class is not None, "gem serve's uvicorn has no WebSocket implementation"
    print(f"ok: gem serve's uvicorn accepts WebSockets ({config.ws_protocol_class.__name__})")
    gem("serve", "--help")


def embed() -> None:
    """The default encoder, offline and without torch: the Quickstart's main job."""
    import importlib.util

    assert importlib.util.find_spec("sentence_transformers") is None, "[embed] brought sentence-transformers"
    from gemkernels.compress.encoders import make_encoder

    vectors = make_encoder("minilm").encode(["pytest tests/test_models.py -x", "git diff setup.cfg"])
    assert vectors.shape[0] == 2 and abs(float(vectors[0] @ vectors[0]) - 1) < 1e-5, vectors
    assert "torch" not in sys.modules, "the default encoder imported torch"
    print(f"ok: make_encoder('minilm') encodes without torch ({vectors.shape[1]}-d; torch installed here: "
          f"{importlib.util.find_spec('torch') is not None})")
    os.environ["HF_HUB_OFFLINE"] = "1"
    gem("compress", EXAMPLE, "-v")


def replay() -> None:
    """gem replay, online and analyze on the bundled fixtures (hash encoder: no model needed to check the stack)."""
    with tempfile.TemporaryDirectory() as tmp:
        gem("replay", FIXTURES, "--encoder", "hash", "--min-blocks", "4", "--out", f"{tmp}/replay",
            "--cache-dir", f"{tmp}/cache", "--quiet")
        gem("online", FIXTURES, "--encoder", "hash", "--out", f"{tmp}/online")
        gem("analyze", FIXTURES, "--encoder", "hash", "--min-blocks", "4", "--out", f"{tmp}/analysis",
            "--cache-dir", f"{tmp}/cache", "--quiet")


def bench() -> None:
    """A one-point sweep on the CPU backends, with its report and plots."""
    with tempfile.TemporaryDirectory() as tmp:
        gem("bench", "-n", "16", "-d", "32", "-S", "2", "--dtype", "fp32", "--mode", "fixed", "--backend", "numpy",
            "torch", "--repeats", "3", "--warmup", "2", "--point-seconds", "0.05", "--device", "cpu", "--out", tmp)


if __name__ == "__main__":
    checks = {"core": core, "serve": serve, "embed": embed, "replay": replay, "bench": bench}
    if len(sys.argv) != 2 or sys.argv[1] not in checks:
        raise SystemExit(f"usage: python .ci/smoke.py {'|'.join(checks)}")
    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (ROOT, ROOT / ".ci")]
        import gemkernels

        assert ROOT not in Path(gemkernels.__file__).resolve().parents, f"imported the checkout: {gemkernels.__file__}"
        checks[sys.argv[1]]()
