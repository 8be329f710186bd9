"""Objective registry: ``build_objective(cfg.objective, vocab)``.

An objective receives the model's hidden states and the targets, forms the logits from the
model's ``output_embedding`` / ``output_bias`` itself, and returns an :class:`ObjectiveOutput`.
Adding one = a module here with a config dataclass and a class registered with
``@register_objective(name, ConfigClass)``, plus ``conf/objective/<name>.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from reproduce.registry import Registry

OBJECTIVES = Registry("objective", "name")
register_objective = OBJECTIVES.register


@dataclass
class ObjectiveOutput:
    """``token_loss``: the per-token objective averaged over the tokens of the batch (the trainer
    multiplies it by the BPTT length under ``loss_reduction=sum_over_time``).
    ``reg_loss``: a once-per-step penalty on parameters (CosReg), never scaled by the token count.
    ``nll``: the plain softmax NLL, mean over tokens, detached: what the progress bar reports."""

    token_loss: torch.Tensor
    reg_loss: torch.Tensor | float
    nll: torch.Tensor
    # extra detached scalars (tensors: reading them would force a device sync on every step)
    logs: dict[str, torch.Tensor] = field(default_factory=dict)


def validate_objective(cfg: Any) -> None:
    OBJECTIVES.entry(cfg)[0].validate_config(cfg)


def build_objective(cfg: Any, vocab_size: int):
    return OBJECTIVES.entry(cfg)[0](OBJECTIVES.to_object(cfg), vocab_size)


def objective_names() -> list[str]:
    return OBJECTIVES.names()


from losses import al, cosreg, mle  # noqa: E402,F401  (register the objectives)
