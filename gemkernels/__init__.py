"""gemkernels: GEM evidence-preserving history compression with batched selection kernels.

    import gemkernels as gk
    sel = gk.select(x, protected=(3, 7), tau=0.9, k=16)          # one session
    sels = gk.select_batch([x0, x1], protected=[p0, p1])           # many sessions, one launch
"""

from .api import DEFAULT_EPS, DEFAULT_K, DEFAULT_TAU, select, select_batch, select_ragged
from .backends import BACKENDS, BackendUnavailableError, available_backends
from .ragged import RaggedBatch
from .result import RaggedSelection, Selection

__version__ = "0.1.0"

__all__ = [
    "BACKENDS", "DEFAULT_EPS", "DEFAULT_K", "DEFAULT_TAU", "BackendUnavailableError", "RaggedBatch",
    "RaggedSelection", "Selection", "available_backends", "select", "select_batch", "select_ragged",
]
