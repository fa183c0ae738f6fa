"""gemkernels: GEM evidence-preserving history compression with batched selection kernels.

    import gemkernels as gk
    sel = gk.select(x, protected=(3, 7), tau=0.9, k=16)          # one session
    sels = gk.select_batch([x0, x1], protected=[p0, p1])           # many sessions, one launch
    out = gk.GEM("paper").compress(messages, session_id="agent-1")  # a chat request, compressed
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path


def _alias_source_kernels() -> None:
    """``kernels/`` lives beside this package in a source checkout; an install maps it to ``gemkernels.kernels``
    (pyproject.toml). Without an install, load it under that name from the checkout (before anything below
    imports it)."""
    init = Path(__file__).resolve().parent.parent / "kernels" / "__init__.py"
    if importlib.util.find_spec(f"{__name__}.kernels") is not None or not init.is_file():
        return
    spec = importlib.util.spec_from_file_location(f"{__name__}.kernels", init,
                                                  submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    setattr(sys.modules[__name__], "kernels", module)


_alias_source_kernels()


class _PastTheCheckout(importlib.abc.MetaPathFinder):
    """Run from a source checkout's root, the checkout's ``kernels/`` folder would be the top-level package
    ``kernels`` and hide an installed one of that name (Hugging Face's, which transformers imports since 5.25): the
    name is looked up on the path without the checkout first, so the installed package wins where there is one."""

    def __init__(self, checkout: Path):
        self.checkout = checkout

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if name != "kernels" or path is not None:
            return None
        elsewhere = [entry for entry in sys.path if _resolved(entry) != self.checkout]
        return importlib.machinery.PathFinder.find_spec(name, elsewhere)


def _resolved(entry: str) -> Path | None:
    try:
        return Path(entry or ".").resolve()
    except (OSError, RuntimeError, TypeError):
        return None


_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "kernels" / "__init__.py").is_file() and not any(
        isinstance(finder, _PastTheCheckout) for finder in sys.meta_path):
    sys.meta_path.insert(0, _PastTheCheckout(_CHECKOUT))

# the selection package, callable as gemkernels.select.api.select
from gemkernels import select  # noqa: E402
from gemkernels.compress.config import PRESETS, GEMConfig  # noqa: E402
from gemkernels.compress.evidence import EvidenceConfig  # noqa: E402
from gemkernels.compress.gem import GEM, Compressed, CompressionStats  # noqa: E402
from gemkernels.select.api import DEFAULT_EPS, DEFAULT_K, DEFAULT_TAU, select_batch, select_ragged  # noqa: E402
from gemkernels.select.backends import BACKENDS, BackendUnavailableError, available_backends  # noqa: E402
from gemkernels.select.ragged import RaggedBatch  # noqa: E402
from gemkernels.select.result import RaggedSelection, Selection  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "BACKENDS", "DEFAULT_EPS", "DEFAULT_K", "DEFAULT_TAU", "GEM", "PRESETS", "BackendUnavailableError",
    "Compressed", "CompressionStats", "EvidenceConfig", "GEMConfig", "RaggedBatch",
    "RaggedSelection", "Selection", "available_backends", "select", "select_batch", "select_ragged",
]
