"""gemkernels: GEM evidence-preserving history compression with batched selection kernels.

    import gemkernels as gk
    sel = gk.select(x, protected=(3, 7), tau=0.9, k=16)          # one session
    sels = gk.select_batch([x0, x1], protected=[p0, p1])           # many sessions, one launch
    out = gk.GEM("paper").compress(messages, session_id="agent-1")  # a chat request, compressed
"""

from gemkernels.compress.config import PRESETS, GEMConfig
from gemkernels.compress.evidence import EvidenceConfig
from gemkernels.compress.gem import GEM, Compressed, CompressionStats
from gemkernels.select.api import (
    DEFAULT_EPS,
    DEFAULT_K,
    DEFAULT_TAU,
    select,
    select_batch,
    select_ragged,
)
from gemkernels.select.backends import (
    BACKENDS,
    BackendUnavailableError,
    available_backends,
)
from gemkernels.select.ragged import RaggedBatch
from gemkernels.select.result import RaggedSelection, Selection

__version__ = "0.1.0"

__all__ = [
    "BACKENDS", "DEFAULT_EPS", "DEFAULT_K", "DEFAULT_TAU", "GEM", "PRESETS", "BackendUnavailableError",
    "Compressed", "CompressionStats", "EvidenceConfig", "GEMConfig", "RaggedBatch",
    "RaggedSelection", "Selection", "available_backends", "select", "select_batch", "select_ragged",
]
