"""The learned keep/ready router: per-block signals at a rewrite (`features`) and the model that scores them
(`model`). GEM's ``ranking="router"`` orders the blocks a rewrite may keep by this score (DESIGN.md §2.5)."""

from gemkernels.compress.router.features import FEATURES, call_signature, request_features
from gemkernels.compress.router.model import Router, default_router, load_router

__all__ = ["FEATURES", "Router", "call_signature", "default_router", "load_router", "request_features"]
