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


class _PastSourceTrees(importlib.abc.MetaPathFinder):
    """A gemkernels source tree on ``sys.path`` (a checkout or an unpacked sdist, run from its root or put there by
    its tests) makes its ``kernels/`` folder the top-level package ``kernels``, hiding an installed one of that name
    (Hugging Face's, which transformers imports since 5.25): the name is looked up past such trees first, so an
    installed package wins where there is one."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if name != "kernels" or path is not None:
            return None
        return importlib.machinery.PathFinder.find_spec(name, [e for e in sys.path if not _source_tree(e)])


def _source_tree(entry: object) -> bool:
    """Whether a ``sys.path`` entry holds a gemkernels source tree: this project's ``kernels/`` folder at its top
    (told from another package of that name by its numba kernel's module)."""
    try:
        return (Path(entry or ".") / "kernels" / "greedy_cpu.py").is_file()
    except (OSError, TypeError, ValueError):
        return False


if not any(isinstance(finder, _PastSourceTrees) for finder in sys.meta_path):
    sys.meta_path.insert(0, _PastSourceTrees())

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
