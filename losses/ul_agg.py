"""UL+AGG (Yu et al. 2022, Tables 3 and 5): AGG's gated loss plus token-level unlikelihood.

The official AGG code has no UL+AGG criterion; as the notes direct, it is the AGG loss of
``losses/agg.py`` (with its counter memory and gates) plus ``alpha_ul`` times the token-level
unlikelihood term of ``losses/ul.py`` (Welleck et al. 2020: candidates = previous targets of the
same sequence, ``-log(clamp(1 - p, 1e-5))``, summed and divided by the number of tokens). The UL term
uses the ungated logits (its gradient reaches h and W as in plain UL); AGG gates only the NLL's
gradient to rare output embeddings. The reported ``nll`` is the plain NLL.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from losses import ObjectiveOutput, register_objective
from losses.agg import AGG, AGGConfig
from losses.ul import unlikelihood_token_sum
from reproduce.errors import ConfigError


@dataclass
class ULAGGConfig(AGGConfig):
    name: str = "ul_agg"
    alpha_ul: float = 1.0  # the UL weight (Welleck et al.; Yu Table 12)


@register_objective("ul_agg", ULAGGConfig)
class ULAGG(AGG):
    @staticmethod
    def validate_config(cfg) -> None:
        AGG.validate_config(cfg)
        if cfg.alpha_ul < 0:
            raise ConfigError(f"objective.alpha_ul={cfg.alpha_ul} must be >= 0 (the unlikelihood weight; 1.0 in the paper)")

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, model, step: int = 0, layout=None) -> ObjectiveOutput:
        if layout is None:
            raise ValueError("objective=ul_agg needs the rows' sequence layout (layout=TokenLayout(...)), as objective=ul")
        out = super().forward(hidden, targets, model, step, layout)
        ul = unlikelihood_token_sum(model.logits(hidden), targets, layout) / max(targets.numel(), 1)
        out.token_loss = out.token_loss + self.cfg.alpha_ul * ul
        out.logs["ul_loss"] = ul.detach()
        return out
