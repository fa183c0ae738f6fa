"""Frozen block encoders behind one small protocol (DESIGN.md §2.3), and `make_encoder` to build one by name.

``minilm`` (the default) and ``minilm-static``: `StaticEncoder`, a static word-piece table distilled from
all-MiniLM-L6-v2 and shipped in the package (numpy and ``tokenizers``); ``minilm-numpy``: `NumpyMiniLMEncoder`, the
full model in numpy; ``minilm-torch``: `MiniLMEncoder`, the full model through sentence-transformers (GPU when
there is one); ``hash``: `HashEncoder`, deterministic and dependency-free; ``openai:<model>``:
`OpenAIEmbeddingsEncoder`, any OpenAI-compatible embeddings endpoint. `make_encoder` wraps each in a
`CachedEncoder` (each distinct text encoded once per process). Figures: docs/encoders.md.
"""

from __future__ import annotations

import os

from gemkernels.compress.encoders.base import Encoder, EncodingDeferred, WrappedEncoder, normalise_rows
from gemkernels.compress.encoders.cache import CachedEncoder
from gemkernels.compress.encoders.hashing import HashEncoder

__all__ = ["CachedEncoder", "Encoder", "EncodingDeferred", "HashEncoder", "WrappedEncoder", "ENCODER_HELP",
           "MINILM_ENCODERS", "check_encoder_name", "is_hash_encoder", "make_encoder", "normalise_rows"]


ENCODER_HELP = ("minilm (the default: minilm-static, all-MiniLM-L6-v2 distilled to static word-piece vectors), "
                "minilm-numpy or minilm-torch (the full model), hash, hash-<dim>, or openai:<model>[:<dimensions>] "
                "(an OpenAI-compatible /v1/embeddings at $GEM_EMBEDDINGS_BASE_URL)")
#: The MiniLM encoders by name; ``minilm`` is the default's name.
MINILM_ENCODERS = ("minilm", "minilm-static", "minilm-numpy", "minilm-torch")


def is_hash_encoder(name: str) -> bool:
    """Whether ``name`` is the dependency-free deterministic encoder (``hash`` or ``hash-<dim>``)."""
    return name == "hash" or name.startswith("hash-")


def check_encoder_name(name: str) -> None:
    """``ValueError`` naming the choices unless ``name`` is one `make_encoder` takes (checked without loading it)."""
    if name in MINILM_ENCODERS or name in ("minilm", "hash"):
        return
    if is_hash_encoder(name):
        if not name[5:].isdigit() or int(name[5:]) < 1:
            raise ValueError(f"encoder {name!r}: hash-<dim> takes a positive whole dimension, e.g. hash-256")
        return
    if name.startswith("openai:"):
        model, _, dimensions = name[len("openai:"):].partition(":")
        if not model or (dimensions and not dimensions.isdigit()):
            raise ValueError(f"encoder {name!r}: write openai:<model> or openai:<model>:<dimensions>, e.g. "
                             "openai:text-embedding-3-small:512")
        return
    raise ValueError(f"unknown encoder {name!r}; choose {', '.join(MINILM_ENCODERS)}, hash, hash-<dim> or "
                     "openai:<model>[:<dimensions>]")


def make_encoder(name: str, cached: bool = True) -> Encoder:
    """An encoder by name, wrapped in a `CachedEncoder` unless ``cached`` is false: one of `MINILM_ENCODERS`
    (``minilm``, the default, is ``minilm-static``), ``hash`` / ``hash-<dim>``, or ``openai:<model>[:<dimensions>]``
    served at ``$GEM_EMBEDDINGS_BASE_URL`` (default OpenAI's API), key from ``$GEM_EMBEDDINGS_API_KEY``, else
    ``$OPENAI_API_KEY``."""
    check_encoder_name(name)
    encoder = named_encoder(name)
    return CachedEncoder(encoder) if cached else encoder


def named_encoder(name: str) -> Encoder:
    """The encoder ``name`` names (a name `check_encoder_name` accepted), without the cache."""
    if name in ("minilm", "minilm-static"):
        from gemkernels.compress.encoders.static import StaticEncoder

        return StaticEncoder()
    if name == "minilm-numpy":
        from gemkernels.compress.encoders.minilm_numpy import NumpyMiniLMEncoder

        return NumpyMiniLMEncoder()
    if name == "minilm-torch":
        from gemkernels.compress.encoders.minilm import MiniLMEncoder

        return MiniLMEncoder()
    if is_hash_encoder(name):
        return HashEncoder(int(name[5:]) if name != "hash" else 256)
    from gemkernels.compress.encoders.remote import OpenAIEmbeddingsEncoder  # the one form left (checked)

    model, _, dimensions = name[len("openai:"):].partition(":")
    key_env = "GEM_EMBEDDINGS_API_KEY" if "GEM_EMBEDDINGS_API_KEY" in os.environ else "OPENAI_API_KEY"
    return OpenAIEmbeddingsEncoder(os.environ.get("GEM_EMBEDDINGS_BASE_URL", "https://api.openai.com/v1"), model,
                                   dimensions=int(dimensions) if dimensions else None, api_key_env=key_env)
