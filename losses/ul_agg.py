"""UL+AGG (Yu et al. 2022, Tables 3 and 5): AGG's gated loss plus token-level unlikelihood.

The official AGG code has no UL+AGG criterion; as the notes direct, it is the AGG loss of
``losses/agg.py`` (with its counter memory and gates) plus ``alpha_ul`` times the token-level
unlikelihood term of ``losses/ul.py`` (Welleck et al. 2020: candidates = previous targets of the
same sequence, ``-log(clamp(1 - p, 1e-5))``, summed and divided by the number of tokens). The UL term
uses the ungated logits (its gradient reaches h and W as in plain UL); AGG gates only the NLL's
gradient to rare output embeddings. The reported ``nll`` is the plain NLL.

``implementation=fused`` (default) computes both from one logits matmul and one ``log_softmax``
(``losses/fused.py``); ``literal`` is AGG's three-logit form plus the autograd UL term on a fourth
logits matmul (the reference the tests compare against).

``ul_agg_gated`` applies AGG's gates to the UL term's gradient to W as well (a rare token's embedding is
then pushed away by UL only as much as the gate lets the NLL push it). It is the form the UL+AGG rows of
Yu et al.'s Tables 4 and 11 run: the ungated form stalls at ~4x UL's perplexity at lite, and Yu et al.
define AGG as gating what rare embeddings receive from non-target contexts (docs/fidelity.md, UL+AGG;
results/NOTES.md, yu2022_t4). It has only the fused implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from repdegen.core.errors import ConfigError
from repdegen.losses import ObjectiveOutput, as_output_layer, register_objective
from repdegen.losses.agg import AGG, AGGConfig
from repdegen.losses.fused import fused_softmax_loss
from repdegen.losses.ul import unlikelihood_candidates, unlikelihood_token_sum


@dataclass
class ULAGGConfig(AGGConfig):
    name: str = "ul_agg"
    alpha_ul: float = 1.0  # the UL weight (Welleck et al.; Yu Table 12)


@dataclass
class ULAGGGatedConfig(ULAGGConfig):
    name: str = "ul_agg_gated"


@register_objective("ul_agg", ULAGGConfig)
class ULAGG(AGG):
    """AGG plus ``alpha_ul`` x unlikelihood (the module docstring): AGG's options, hooks and state, and UL's
    ``layout``.

    >>> import torch
    >>> from repdegen.losses import ULAGG, OutputLayer, TokenLayout
    >>> ul_agg = ULAGG.create(vocab_size=10, alpha=0.5, memory_updates=4, alpha_ul=1.0)
    >>> T, B = 4, 2  # a (T, B) block flattened time-major
    >>> out = ul_agg(torch.randn(T * B, 4), torch.randint(10, (T * B,)), OutputLayer(torch.randn(10, 4)), step=0,
    ...              layout=TokenLayout.time_major(T, B))
    >>> sorted(out.logs)
    ['rare_count', 'rare_target_frac', 'ul_loss']
    """

    gate_ul = False  # AGG gates the NLL part of W's gradient only

    @staticmethod
    def supports_chunk_rows(cfg) -> bool:
        return False  # the UL term is not in the chunked kernel

    @staticmethod
    def validate_config(cfg) -> None:
        AGG.validate_config(cfg)
        if cfg.alpha_ul < 0:
            raise ConfigError(f"objective.alpha_ul={cfg.alpha_ul} must be >= 0 (the unlikelihood weight; 1.0 in the paper)")

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, model, step: int | None = None,
                layout=None) -> ObjectiveOutput:
        model = as_output_layer(model)
        if layout is None:
            raise ValueError(
                f"objective={self.cfg.name} needs the rows' sequence layout (layout=TokenLayout(...)), as objective=ul"
            )
        return super().forward(hidden, targets, model, step, layout)

    def gated_loss(self, hidden, targets, model, g1, g2, rare_rows, layout):
        W, b = model.output_embedding, model.output_bias
        if self.cfg.implementation == "fused":
            loss, nll, ul = fused_softmax_loss(
                hidden, W, b, targets, self.label_smoothing, gates=(g1, g2, rare_rows),
                candidates=unlikelihood_candidates(targets, layout), alpha=self.cfg.alpha_ul, gate_ul=self.gate_ul)
            return loss, nll, {"ul_loss": ul}
        loss, nll = self.literal_loss(hidden, W, b, targets, g1, g2, rare_rows)
        ul = unlikelihood_token_sum(model.logits(hidden), targets, layout) / max(targets.numel(), 1)
        return loss + self.cfg.alpha_ul * ul, nll, {"ul_loss": ul.detach()}


@register_objective("ul_agg_gated", ULAGGGatedConfig)
class ULAGGGated(ULAGG):
    """UL+AGG with AGG's gates on the unlikelihood term's gradient to W too (the module docstring)."""

    gate_ul = True

    @staticmethod
    def validate_config(cfg) -> None:
        ULAGG.validate_config(cfg)
        if cfg.implementation != "fused":
            raise ConfigError(
                f"objective.implementation={cfg.implementation!r}: ul_agg_gated has only the fused implementation "
                "(set objective.implementation=fused)"
            )
