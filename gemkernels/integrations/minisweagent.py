"""mini-swe-agent: `GEMModel`, a model that wraps any mini-swe-agent model and sends it GEM's compression of the
messages on each query.

A YAML config turns it on with ``model_class: gemkernels.integrations.minisweagent.GEMModel`` in its ``model``
section; every other key of that section configures the wrapped model, whose class ``gem_model_class`` names as
``model_class`` would (default: the one mini-swe-agent picks for the model name). Tool-call configs (``mini.yaml``)
and text-action ones (``mini_textbased.yaml``, mini-swe-agent 1.x formats) alike. The agent's ``messages`` are never
changed: each query forwards the agent's own message objects minus GEM's dropped blocks, and the message it returns
carries GEM's record of the call under ``extra["gem"]``, saved with the trajectory and logged on the
``gemkernels.integrations`` logger. A history GEM cannot read reaches the model unchanged, the reason in that record.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

try:
    from minisweagent.models import get_model
    from pydantic import BaseModel, ConfigDict, Field, model_validator
except ImportError as err:  # pragma: no cover - exercised in a venv without mini-swe-agent
    raise ImportError("gemkernels.integrations.minisweagent needs mini-swe-agent: "
                      "pip install 'gemkernels[minisweagent]'") from err

from gemkernels.compress.config import with_overrides
from gemkernels.integrations.session_compressor import SessionCompressor, log_call, summary

#: One compressor per settings in the process: the encoder loads once, every run (one model each) has its session.
shared_compressor = functools.lru_cache(maxsize=8)(SessionCompressor)


class GEMModelConfig(BaseModel):
    """GEM's settings in a ``model`` section (``model_name`` is the wrapped model's); the other keys configure the
    wrapped model."""

    model_config = ConfigDict(extra="forbid")  # a misspelt gem_ key is an error, not silently ignored

    model_name: str = Field("", description="the wrapped model's name (mini-swe-agent's -m)")
    gem_preset: str = Field("cache-aware", description="GEM preset: paper, balanced, core or cache-aware")
    gem_overrides: list[str] = Field(default_factory=list,
                                     description="GEMConfig field=value items applied to the preset, e.g. k=24")
    gem_encoder: str = Field("minilm", description="block encoder: minilm, hash or openai:<model>[:<dims>]")
    gem_model_class: str = Field("", description="the wrapped model's class, as model_class (default by model name)")

    @model_validator(mode="after")
    def _check_settings(self) -> GEMModelConfig:
        with_overrides(self.gem_preset, self.gem_overrides)  # a ValueError names the bad preset or item
        return self


class GEMModel:
    """A mini-swe-agent ``Model`` that compresses ``messages`` with GEM before the wrapped model's ``query``; one
    GEM session per instance (mini-swe-agent makes one model per run)."""

    def __init__(self, **kwargs: Any):
        """``gem_*`` keys configure GEM (`GEMModelConfig`); the others (``model_name`` ...) the wrapped model."""
        settings = {name: kwargs.pop(name) for name in list(kwargs) if name.startswith("gem_")}
        self.config = GEMModelConfig(model_name=kwargs.get("model_name", ""), **settings)
        self.model = get_model(config={**kwargs, "model_class": self.config.gem_model_class})
        self.session_id = f"mini-swe-agent-{uuid.uuid4().hex}"
        self.compressor = shared_compressor(self.config.gem_preset, self.config.gem_encoder,
                                            tuple(self.config.gem_overrides))

    def query(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict:
        """The wrapped model's answer to GEM's compression of ``messages`` (read without their ``extra`` field, which
        no model sends), with GEM's record of the call under ``extra["gem"]``."""
        views = [{k: v for k, v in m.items() if k != "extra"} if isinstance(m, dict) else m for m in messages]
        forwarded, stats = self.compressor.compress_views(messages, views, session_id=self.session_id)
        log_call(stats)
        response = self.model.query(forwarded, **kwargs)
        return {**response, "extra": {**(response.get("extra") or {}), "gem": summary(stats)}}

    def format_message(self, **kwargs: Any) -> dict:
        """The wrapped model's message of ``kwargs``."""
        return self.model.format_message(**kwargs)

    def format_observation_messages(self, message: dict, outputs: list[dict],
                                    template_vars: dict | None = None) -> list[dict]:
        """The wrapped model's observation messages of ``outputs``."""
        return self.model.format_observation_messages(message, outputs, template_vars)

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The wrapped model's template variables."""
        return self.model.get_template_vars(**kwargs)

    def serialize(self) -> dict:
        """The wrapped model's record, with GEM's settings and session under ``info.config.gem``."""
        record = self.model.serialize()
        config = record.setdefault("info", {}).setdefault("config", {})
        config["gem"] = {**self.config.model_dump(mode="json"), "session_id": self.session_id}
        return record
