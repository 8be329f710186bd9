"""MLE with cosine regularization (MLE-CosReg), Gao et al. (2019) eq. 6:

    L = L_MLE + gamma * 1/N^2 * sum_i sum_{j != i} w^_i . w^_j,      w^_i = w_i / ||w_i||

over the N rows of the output embedding. Computed in O(N d) with Appendix B's identity
``sum_i sum_{j != i} w^_i . w^_j = ||sum_i w^_i||^2 - N`` (eq. 20-22). The penalty is added once
per optimizer step (it is a function of the parameters, not of the tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from losses import Objective, ObjectiveOutput, register_objective
from reproduce.errors import ConfigError


@dataclass
class CosRegConfig:
    name: str = "cosreg"
    gamma: float = 1.0
    tie_weights: bool | None = None


def cosine_regularizer(weight: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``1/N^2 * sum_{i != j} cos(w_i, w_j)`` for the rows of ``weight`` (N, d), in O(N d)."""
    n = weight.size(0)
    w_hat = nn.functional.normalize(weight, dim=1, eps=eps)
    total = w_hat.sum(0)
    return (total.dot(total) - n) / (n * n)


@register_objective("cosreg", CosRegConfig)
class CosReg(Objective):
    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.cfg = cfg

    @staticmethod
    def validate_config(cfg) -> None:
        if cfg.gamma < 0:
            raise ConfigError(f"objective.gamma={cfg.gamma} must be >= 0")

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, model, step: int = 0, layout=None) -> ObjectiveOutput:
        loss, nll = self.token_nll(model.logits(hidden), targets)
        reg = cosine_regularizer(model.output_embedding.float())
        return ObjectiveOutput(token_loss=loss, reg_loss=self.cfg.gamma * reg, nll=nll, logs={"cosreg": reg.detach()})
