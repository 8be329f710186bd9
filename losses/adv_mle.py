"""Adversarial MLE (Adv MLE, "adversarial softmax"), Wang, Gong & Liu (ICML 2019), "Improving neural
language modeling via adversarial training"; the "Adv MLE" row of Yu et al. (2022) Table 7.

During training the output embedding of the target word is perturbed within an L2 ball of radius eps in
the direction that lowers its logit most. The worst case has a closed form:

    delta_t = -eps_t * h_t / ||h_t||,    z'_t[y_t] = (w_{y_t} + delta_t) . h_t + b_{y_t}
                                                   =  z_t[y_t] - eps_t * ||h_t||

and every other logit is unchanged; the training loss is the NLL of z' (label-smoothed if configured).
As in the authors' code (ChengyueGongR/advsoft, ``mos-awd-lstm-lm/model.py``):

* ``relative=true`` (default): eps_t = eps * ||w_{y_t}||, the norm detached (a relative ball);
  ``relative=false`` is the paper's absolute radius eps_t = eps;
* the perturbation is applied only where cos(h_t, w_{y_t}) > 0 (elsewhere eps_t = 0);
* delta_t is a constant for autograd (computed from detached h and w), so the perturbation adds
  ``delta_t`` to the gradient w.r.t. h_t (which equals the gradient of -eps_t ||h_t||) and nothing to the
  gradient w.r.t. W; norms use sqrt(||.||^2 + 1e-8) like the official code;
* eps = 0.005 (relative) is the authors' default for their language models.

Deviations, each the paper's intent over an artefact of the official code: the official code writes
delta into a (V, d) buffer indexed by the target word, so rows sharing a target all receive the delta of
one of them (whichever write lands last); here every row gets its own delta_t. The official code measures
||w_y|| and the cosine on the *input* embedding (its model is tied, where they coincide); here both use the
output embedding row w_y that is perturbed.

The authors released no translation code: for WMT14 eps must be tuned on validation and recorded. Input
embeddings are not perturbed. In eval mode (``objective.eval()``) the objective is plain MLE; the reported
``nll`` is always the plain, unperturbed NLL. Under bf16/fp16 autocast the perturbed logits are formed in
float32 (the shift is small next to the logit's rounding step in half precision).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from repdegen.core.errors import ConfigError
from repdegen.losses import Objective, ObjectiveConfig, ObjectiveOutput, as_output_layer, register_objective
from torch import nn


@dataclass
class AdvMLEConfig(ObjectiveConfig):
    """``eps`` = 0.005 with ``relative`` = true: the authors' released language-model setting."""

    name: str = "adv_mle"
    eps: float = 0.005
    relative: bool = True


def adversarial_target_shift(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, eps: float,
                             relative: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(shift (N,), active (N,) bool): the amount ``h_t . delta_t`` added to each row's target logit, and
    where the perturbation applies (cos(h_t, w_{y_t}) > 0). ``delta_t`` is detached; ``h_t`` is not."""
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    h = hidden.to(dtype)
    with torch.no_grad():
        w = weight[targets].to(dtype)
        h_norm = torch.sqrt((h * h).sum(1, keepdim=True) + 1e-8)
        w_norm = torch.sqrt((w * w).sum(1, keepdim=True) + 1e-8)
        cos = (h * w).sum(1, keepdim=True) / h_norm / w_norm
        active = cos > 0
        radius = eps * (w_norm if relative else torch.ones_like(w_norm)) * active
        delta = -radius * h / h_norm
    return (h * delta).sum(1), active.squeeze(1)


@register_objective("adv_mle", AdvMLEConfig)
class AdvMLE(Objective):
    """Adversarial MLE (the module docstring): in training mode the target's logit is lowered by the worst case
    perturbation of its embedding within a ball of radius ``eps``; ``eval()`` mode is plain MLE. No hooks.

    >>> import torch
    >>> from repdegen.losses import AdvMLE, OutputLayer
    >>> adv = AdvMLE.create(vocab_size=10, eps=0.005)
    >>> out = adv(torch.randn(6, 4), torch.randint(10, (6,)), OutputLayer(torch.randn(10, 4)))
    >>> bool(out.token_loss >= out.nll), sorted(out.logs)
    (True, ['adv_active', 'adv_nll'])
    """

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.cfg = cfg

    @staticmethod
    def validate_config(cfg) -> None:
        if cfg.eps < 0:
            raise ConfigError(
                f"objective.eps={cfg.eps} must be >= 0 (the radius of the adversarial ball; the authors use 0.005 "
                "relative to ||w_y||)"
            )

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, model, step: int = 0, layout=None) -> ObjectiveOutput:
        model = as_output_layer(model)
        logits = model.logits(hidden)
        if not self.training or self.cfg.eps == 0:
            loss, nll = self.token_nll(logits, targets)
            return ObjectiveOutput(token_loss=loss, nll=nll)
        with torch.no_grad():
            nll = nn.functional.cross_entropy(logits, targets)
        shift, active = adversarial_target_shift(hidden, targets, model.output_embedding, self.cfg.eps, self.cfg.relative)
        rows = torch.arange(targets.numel(), device=targets.device)
        # a shift of ~eps ||w|| ||h|| would be lost to bf16/fp16 rounding of the logit: perturb in float32
        upcast = logits.to(torch.promote_types(logits.dtype, torch.float32))
        index = (rows, targets)
        if upcast is logits:  # never modify the model's output in place
            perturbed = logits.index_put(index, shift.to(logits.dtype), accumulate=True)
        else:
            perturbed = upcast.index_put_(index, shift.to(upcast.dtype), accumulate=True)
        loss, adv_nll = self.token_nll(perturbed, targets)
        logs = {"adv_nll": adv_nll, "adv_active": active.float().mean()}
        return ObjectiveOutput(token_loss=loss, nll=nll.detach(), logs=logs)
