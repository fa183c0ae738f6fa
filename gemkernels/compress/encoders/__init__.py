"""Frozen block encoders behind one small protocol (DESIGN.md §2.3), and `make_encoder` to build one by name.

``hash``: `HashEncoder`, deterministic and dependency-free; ``minilm`` (default): `MiniLMEncoder`,
all-MiniLM-L6-v2 offline; ``openai:<model>``: `OpenAIEmbeddingsEncoder`, any OpenAI-compatible embeddings
endpoint. `make_encoder` wraps each in a `CachedEncoder` (each distinct text encoded once per process).
"""

from __future__ import annotations

import os

from gemkernels.compress.encoders.base import Encoder, EncodingDeferred, WrappedEncoder, normalise_rows
from gemkernels.compress.encoders.cache import CachedEncoder
from gemkernels.compress.encoders.hashing import HashEncoder

__all__ = ["CachedEncoder", "Encoder", "EncodingDeferred", "HashEncoder", "WrappedEncoder", "ENCODER_HELP",
           "is_hash_encoder", "make_encoder", "normalise_rows"]


ENCODER_HELP = ("minilm (offline all-MiniLM-L6-v2, the default), hash, hash-<dim>, or openai:<model>[:<dimensions>] "
                "(an OpenAI-compatible /v1/embeddings at $GEM_EMBEDDINGS_BASE_URL)")


def is_hash_encoder(name: str) -> bool:
    """Whether ``name`` is the dependency-free deterministic encoder (``hash`` or ``hash-<dim>``)."""
    return name == "hash" or name.startswith("hash-")


def make_encoder(name: str, cached: bool = True) -> Encoder:
    """An encoder by name, wrapped in a `CachedEncoder` unless ``cached`` is false: ``minilm`` (default real
    model), ``hash`` / ``hash-<dim>``, or ``openai:<model>[:<dimensions>]`` served at ``$GEM_EMBEDDINGS_BASE_URL``
    (default OpenAI's API), key from ``$GEM_EMBEDDINGS_API_KEY``, else ``$OPENAI_API_KEY``."""
    encoder = named_encoder(name)
    return CachedEncoder(encoder) if cached else encoder


def named_encoder(name: str) -> Encoder:
    if name == "minilm":
        from gemkernels.compress.encoders.minilm import MiniLMEncoder

        return MiniLMEncoder()
    if is_hash_encoder(name):
        return HashEncoder(int(name[5:]) if name != "hash" else 256)
    if name.startswith("openai:"):
        from gemkernels.compress.encoders.remote import OpenAIEmbeddingsEncoder

        model, _, dimensions = name[len("openai:"):].partition(":")
        key_env = "GEM_EMBEDDINGS_API_KEY" if "GEM_EMBEDDINGS_API_KEY" in os.environ else "OPENAI_API_KEY"
        return OpenAIEmbeddingsEncoder(os.environ.get("GEM_EMBEDDINGS_BASE_URL", "https://api.openai.com/v1"), model,
                                       dimensions=int(dimensions) if dimensions else None, api_key_env=key_env)
    raise ValueError(f"unknown encoder {name!r}; choose minilm, hash, hash-<dim> or openai:<model>[:<dimensions>]")
