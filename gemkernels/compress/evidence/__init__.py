"""Evidence protection (DESIGN.md §2.4; paper §5.2 and appendix B.2): the blocks GEM must keep.

`rules` (the protection rules and their limits) over `features` (what one block changed, failed or read),
which reads tool calls through `shell`, `python_writes` and `errors`; `effects` is what those readers return.
"""

from gemkernels.compress.evidence.features import BlockFeatures, block_features
from gemkernels.compress.evidence.rules import RULES, EvidenceConfig, evidence_picks, protect, rank

__all__ = ["RULES", "BlockFeatures", "EvidenceConfig", "block_features", "evidence_picks", "protect", "rank"]
