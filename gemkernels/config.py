"""`GEMConfig` and its presets: every number of GEM is a configuration value.

``paper`` is the paper's operating point (Table B.1, §5.3). Its per-rewrite guard (delta =
0.05) removes at most 5% of a request, so it saves little per run; ``balanced`` and
``core`` let a rewrite go deeper (keep >= 50% of the characters, or only the selected
core and evidence) at the price of forwarding less of the history. ``cache-aware`` rewrites
rarely and deeply (a block budget) and appends in between, so the provider's prompt cache holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .evidence import EvidenceConfig


@dataclass(frozen=True)
class GEMConfig:
    """Selection (tau, k, eps), online policy, guard (delta) and evidence settings.

    Online policy: nothing below ``min_blocks``; a global selection at a session's first eligible
    request, on a goal change (if ``reselect_on_goal_change``), when the history is not an extension
    of the last one, after ``reselect_every`` new blocks, or when appending would forward more than
    ``rewrite_above_blocks`` blocks (None: no budget); otherwise append."""

    tau: float = 0.90
    k: int = 16
    eps: float = 1e-6
    min_blocks: int = 16
    reselect_every: int = 256
    reselect_on_goal_change: bool = True
    rewrite_above_blocks: int | None = None
    delta: float = 0.05
    max_text_chars: int = 12_000
    backend: str = "auto"
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)

    def __post_init__(self) -> None:
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must lie in (0, 1], got {self.tau}")
        if not 0 <= self.delta <= 1:
            raise ValueError(f"delta must lie in [0, 1], got {self.delta}")
        for name in ("k", "min_blocks", "reselect_every", "max_text_chars"):
            if getattr(self, name) < (1 if name != "k" else 0):
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.rewrite_above_blocks is not None and self.rewrite_above_blocks <= self.k:
            raise ValueError(f"rewrite_above_blocks ({self.rewrite_above_blocks}) must exceed k ({self.k}), "
                             "or every append would rewrite")


PRESETS: dict[str, GEMConfig] = {
    "paper": GEMConfig(),
    "balanced": GEMConfig(delta=0.5),
    "core": GEMConfig(delta=1.0),
    # Amortized and evidence-aware: forward everything up to 40 blocks, then rewrite deeply to the
    # 20 blocks GEM selects (evidence first, then residual completion), append until the forwarded
    # context passes 40 blocks again. Goal changes wait for the next rewrite (a rewrite breaks the cache).
    "cache-aware": GEMConfig(k=20, tau=1.0, delta=1.0, min_blocks=41, rewrite_above_blocks=40,
                             reselect_on_goal_change=False),
}


def resolve_config(config: GEMConfig | str | None, **overrides: Any) -> GEMConfig:
    """A preset name or a config, with field overrides applied."""
    if config is None:
        config = "paper"
    if isinstance(config, str):
        if config not in PRESETS:
            raise ValueError(f"unknown preset {config!r}; choose one of {', '.join(PRESETS)}")
        config = PRESETS[config]
    if not isinstance(config, GEMConfig):
        raise TypeError(f"config must be a GEMConfig or a preset name, got {type(config).__name__}")
    return replace(config, **overrides) if overrides else config
