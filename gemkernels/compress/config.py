"""`GEMConfig` and its presets: every number of GEM is a configuration value.

``paper`` is the paper's operating point (Table B.1, §5.3). Its per-rewrite guard (delta =
0.05) removes at most 5% of a request, so it saves little per run; ``balanced`` and
``core`` let a rewrite go deeper (keep >= 50% of the characters, or only the selected
core and evidence) at the price of forwarding less of the history. ``cache-aware`` rewrites
rarely and deeply and appends in between, so the provider's prompt cache holds: a rewrite happens
when the forwarded context passes a budget (blocks or tokens) or when a cost model says the saving
over the expected remaining calls repays the one-time cache miss.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gemkernels.compress.evidence import EvidenceConfig
from gemkernels.compress.text_actions import text_action_profiles
from gemkernels.compress.tokens import Prices
from gemkernels.select.backends import BACKENDS

RANKINGS = ("geometry", "router", "retrieval")


@dataclass(frozen=True)
class GEMConfig:
    """Selection (tau, k, eps), online policy, guard (delta) and evidence settings.

    Online policy: nothing below ``min_blocks``; a global selection at a session's first eligible
    request, on a goal change (if ``reselect_on_goal_change``), when the history is not an extension of the
    last one, after ``reselect_every`` new blocks, or when appending would forward more than
    ``rewrite_above_blocks`` blocks or ``rewrite_above_tokens`` tokens (None: no budget); otherwise append.
    Without an explicit goal, the goal is the ``goal_from`` = ``"latest"`` user instruction, or the
    ``"first"`` (for agents that inject reminders as user messages, each of which would be a goal change).

    Budgeted (any of the two budgets or ``repay_factor`` set): the session starts from the full history
    (no selection at the first eligible request), appends only new blocks between rewrites (evidence
    that becomes protected waits for the next rewrite, so the previous request stays a prefix), and
    rewrites when a budget is passed or when the cost model repays it: with F the tokens of the blocks
    appending would forward, K those a rewrite keeps, M the kept tokens from the first changed block on
    (re-sent uncached once) and R = ``repay_factor`` x blocks so far (the expected remaining calls),
    rewrite if ``c * (F - K) * (R + 1) > (u - c) * M`` (it repays) and F - K has reached the renewal gap
    ``sqrt(2 (u - c) M a / c)``, a the mean block tokens (the per-call saving at which the cycle of growth
    and rewrite is cheapest; `gem.renewal_gap`), with c = ``cached_price`` and u = ``uncached_price``: the
    provider's prices of a cached and of an uncached input token relative to a plain one (e.g. 0.1 and 1.25
    for Anthropic's cache reads and 5-minute cache writes; 1.0 where writing the cache costs nothing extra).
    ``keep_recent_size``: a rewrite keeps GEM's picks (protected first, then residual completion order)
    while their tokens fit those of the newest ``k`` blocks (the size amortized forgetting keeps;
    protected blocks are kept even past it), instead of at most ``k`` blocks. Tokens are the GEM's
    token counter's, or serialised characters / 4 without one.

    ``text_actions``: the profiles that find blocks in a history without tool calls whose actions are written as text
    (`gemkernels.compress.text_actions.text_action_profiles`): ``auto`` (all), ``off``, or names among
    ``mini-swe-agent``, ``swe-agent``, ``aider`` and ``pattern``, the user's own ``text_action_regex`` (its last group
    is the command, in the assistant text) with ``text_observation_regex`` (searched in the next user text).

    ``ranking``: what orders the blocks a rewrite may keep after the protected ones: ``geometry`` (the paper's
    residual completion), ``router`` (the learned keep/ready model, `gemkernels.compress.router`: the file
    ``router``, default the shipped one, scores each block) or ``retrieval`` (a block's largest cosine to the last
    three blocks, the PaMER idea); a score ranks with ``keep_recent_size`` by score / tokens ** ``size_power``
    (blocks taken while they fit), else by score (the ``k`` best). ``drop_superseded``: a block that a newer one
    supersedes (the same tool calls again, a read of the same sources) is never a completion candidate.

    ``keep_tools``: tool names whose blocks are always kept (protected as evidence ``kept_tool``).
    ``max_forward_tokens``: a hard ceiling on the request's tokens (None: none): past it, after the policy has
    chosen, blocks go, oldest first, outside the selected core, then in the core, then protected ones, never the
    newest block (so the request fits the model's window whenever dropping blocks can make it fit).

    Anthropic thinking: a block of the current tool loop whose assistant message thinks is always sent (the API
    refuses a tool loop whose last turn lost its thinking). ``thinking_bound`` (models with preserved thinking bind
    each thinking block to every message before it and may think in any response) forwards an Anthropic Messages
    history, or a chat history carrying LiteLLM's ``thinking_blocks``, whole; set it False for a model that drops
    earlier turns' thinking instead (`GEM.compress`'s ``thinking="drop"`` does so for one request that asks
    ``prefix_mismatch_behavior: "drop_block"``, and ``thinking="api"`` binds one that goes to Anthropic's API
    whatever its messages hold)."""

    tau: float = 0.90
    k: int = 16
    eps: float = 1e-6
    min_blocks: int = 16
    reselect_every: int = 256
    reselect_on_goal_change: bool = True
    goal_from: str = "latest"
    rewrite_above_blocks: int | None = None
    rewrite_above_tokens: int | None = None
    repay_factor: float | None = None
    cached_price: float = 0.1
    uncached_price: float = 1.0
    keep_recent_size: bool = False
    delta: float = 0.05
    max_text_chars: int = 12_000
    backend: str = "auto"
    text_actions: str = "auto"
    text_action_regex: str = ""
    text_observation_regex: str = ""
    ranking: str = "geometry"
    router: str = ""
    size_power: float = 1.0
    drop_superseded: bool = False
    keep_tools: tuple[str, ...] = ()
    max_forward_tokens: int | None = None
    thinking_bound: bool = True
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)

    def __post_init__(self) -> None:
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must lie in (0, 1], got {self.tau}")
        if not 0 <= self.delta <= 1:
            raise ValueError(f"delta must lie in [0, 1], got {self.delta}")
        for name in ("k", "min_blocks", "reselect_every", "max_text_chars"):
            if getattr(self, name) < (1 if name != "k" else 0):
                raise ValueError(f"{name} must be {'positive' if name != 'k' else 'at least 0'}, got "
                                 f"{getattr(self, name)}")
        if self.rewrite_above_blocks is not None and self.rewrite_above_blocks <= self.k:
            raise ValueError(f"rewrite_above_blocks ({self.rewrite_above_blocks}) must exceed k ({self.k}), "
                             "or every append would rewrite")
        if self.rewrite_above_tokens is not None and self.rewrite_above_tokens < 1:
            raise ValueError(f"rewrite_above_tokens must be positive, got {self.rewrite_above_tokens}")
        if self.repay_factor is not None and self.repay_factor <= 0:
            raise ValueError(f"repay_factor must be positive, got {self.repay_factor}")
        if self.goal_from not in ("latest", "first"):
            raise ValueError(f"goal_from must be 'latest' or 'first', got {self.goal_from!r}")
        text_action_profiles(self.text_actions, self.text_action_regex, self.text_observation_regex)
        if self.backend != "auto" and self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {', '.join(('auto', *BACKENDS))}")
        if self.ranking not in RANKINGS:
            raise ValueError(f"ranking must be one of {', '.join(RANKINGS)}, got {self.ranking!r}")
        if not 0 <= self.size_power <= 2:
            raise ValueError(f"size_power must lie in [0, 2], got {self.size_power}")
        if not isinstance(self.keep_tools, tuple) or not all(isinstance(t, str) and t for t in self.keep_tools):
            raise ValueError(f"keep_tools must be a tuple of tool names, got {self.keep_tools!r}")
        if self.max_forward_tokens is not None and self.max_forward_tokens < 1:
            raise ValueError(f"max_forward_tokens must be positive, got {self.max_forward_tokens}")
        try:
            Prices(self.cached_price, self.uncached_price)  # the one rule for a pair of prices
        except ValueError as err:
            raise ValueError(f"cached_price / uncached_price: {err}") from None

    @property
    def budgeted(self) -> bool:
        """Whether rewrites are triggered by a budget or the cost model (append-only in between)."""
        return (self.rewrite_above_blocks is not None or self.rewrite_above_tokens is not None
                or self.repay_factor is not None)


PRESETS: dict[str, GEMConfig] = {
    "paper": GEMConfig(),
    "balanced": GEMConfig(delta=0.5),
    "core": GEMConfig(delta=1.0),
    # Amortized and evidence-aware: forward everything, rewrite when the cost model says so (it repays within
    # the expected remaining calls, 0.5 x blocks so far, and the per-call saving has reached the renewal gap,
    # cached tokens at 0.1) or when more than 60 blocks would be forwarded; a rewrite keeps the newest 4 blocks,
    # then the blocks the learned router scores highest per token, within the tokens of the newest 15 blocks,
    # then appends only. Goal changes wait for the next rewrite (a rewrite breaks the cache). Measured in
    # docs/router.md (what it keeps) and docs/cache_aware.md (what it costs).
    "cache-aware": GEMConfig(k=15, tau=0.95, delta=1.0, min_blocks=16, rewrite_above_blocks=60, repay_factor=0.5,
                             cached_price=0.1, keep_recent_size=True, reselect_on_goal_change=False, ranking="router",
                             evidence=EvidenceConfig(recent=4, goal=0, state=0, error=0, source=0)),
    # The same schedule with the paper's selection: evidence rules (the newest 10 blocks among them), then residual
    # completion to 95% coverage, within the tokens of the newest 15 blocks; rewrites past 40 blocks.
    "cache-aware-geometry": GEMConfig(k=15, tau=0.95, delta=1.0, min_blocks=16, rewrite_above_blocks=40,
                                      repay_factor=0.5, cached_price=0.1, keep_recent_size=True,
                                      reselect_on_goal_change=False, evidence=EvidenceConfig(recent=10)),
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


OVERRIDE_HELP = ("override a field of the preset's GEMConfig (repeatable), e.g. --set uncached_price=1.25 "
                 "--set rewrite_above_tokens=100000 --set evidence.recent=8")


def with_overrides(config: GEMConfig | str, overrides: Sequence[str]) -> GEMConfig:
    """``config`` (or a preset name) with each ``field=value`` applied (a Python literal, the plain text for a
    string field such as ``backend`` or ``text_actions``; ``evidence.<field>`` for the evidence limits); ``ValueError``
    naming a bad item."""
    top: dict[str, Any] = {}
    evidence: dict[str, Any] = {}
    types = {f.name: str(f.type) for f in fields(GEMConfig) if f.name != "evidence"}
    evidence_types = {f"evidence.{f.name}": str(f.type) for f in fields(EvidenceConfig)}
    for item in overrides:
        name, sep, text = item.partition("=")
        annotation = types.get(name) or evidence_types.get(name)
        if not sep or annotation is None:
            raise ValueError(f"override {item!r} is not field=value with a field of GEMConfig "
                             f"({', '.join(types)}) or {', '.join(evidence_types)}")
        value = override_value(item, text, annotation)
        if name in types:
            top[name] = value
        else:
            evidence[name.removeprefix("evidence.")] = value
    config = resolve_config(config, **top)
    return replace(config, evidence=replace(config.evidence, **evidence)) if evidence else config


def override_value(item: str, text: str, annotation: str) -> Any:
    """``text`` as a value of a field annotated ``annotation`` (str, bool, int, float, optionally None)."""
    if annotation == "str":
        return text
    if annotation.startswith("tuple[str"):  # a list literal, or names separated by commas
        try:
            names = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            names = [name.strip() for name in text.split(",") if name.strip()]
        if isinstance(names, str):
            names = [names]
        if isinstance(names, (list, tuple)) and all(isinstance(name, str) for name in names):
            return tuple(names)
        raise ValueError(f"override {item!r}: {text!r} is not a list of names")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    if value is None and "None" in annotation:
        return value
    if isinstance(value, bool):
        if "bool" in annotation:
            return value
    elif isinstance(value, int) and ("int" in annotation or "float" in annotation):
        return value
    elif isinstance(value, float) and "float" in annotation:
        return value
    raise ValueError(f"override {item!r}: {text!r} is not a value of type {annotation}")
