"""Objective registry: ``build_objective(cfg.objective, vocab)``.

An objective receives the model's hidden states and the targets, forms the logits from the
model's ``output_embedding`` / ``output_bias`` itself, and returns an :class:`ObjectiveOutput`.
Adding one = a module here with a config dataclass and a class registered with
``@register_objective(name, ConfigClass)``, plus ``conf/objective/<name>.yaml``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from reproduce.errors import ConfigError

_OBJECTIVES: dict[str, tuple[type, type]] = {}


@dataclass
class ObjectiveOutput:
    """``token_loss``: the per-token objective averaged over the tokens of the batch (the trainer
    multiplies it by the BPTT length under ``loss_reduction=sum_over_time``).
    ``reg_loss``: a once-per-step penalty on parameters (CosReg), never scaled by the token count.
    ``nll``: the plain softmax NLL, mean over tokens, detached: what the progress bar reports."""

    token_loss: torch.Tensor
    reg_loss: torch.Tensor | float
    nll: torch.Tensor
    logs: dict[str, float] = field(default_factory=dict)


def register_objective(name: str, config_cls: type) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        _OBJECTIVES[name] = (cls, config_cls)
        ConfigStore.instance().store(group="objective", name=f"schema_{name}", node=config_cls)
        return cls

    return wrap


def _entry(cfg: Any) -> tuple[type, type]:
    if cfg.name not in _OBJECTIVES:
        raise ConfigError(f"objective.name={cfg.name!r} is not a known objective ({', '.join(sorted(_OBJECTIVES))})")
    return _OBJECTIVES[cfg.name]


def validate_objective(cfg: Any) -> None:
    _entry(cfg)[0].validate_config(cfg)


def build_objective(cfg: Any, vocab_size: int):
    cls, config_cls = _entry(cfg)
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(config_cls), cfg))
    return cls(cfg, vocab_size)


def objective_names() -> list[str]:
    return sorted(_OBJECTIVES)


from losses import al, cosreg, mle  # noqa: E402,F401  (register the objectives)
