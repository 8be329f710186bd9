"""MLE with cosine regularization (MLE-CosReg), Gao et al. (2019) eq. 6:

    L = L_MLE + gamma * R(W),     R(W) = 1/N^2 * sum_i sum_{j != i} w^_i . w^_j,      w^_i = w_i / ||w_i||

over the N rows of the output embedding. Computed in O(N d) with Appendix B's identity
``sum_i sum_{j != i} w^_i . w^_j = ||sum_i w^_i||^2 - N`` (eq. 20-22).

R is a function of the parameters, not of the tokens: it is applied once per optimizer update, by
:meth:`CosReg.update_penalty` after the backward passes of all the update's micro-batches (as if added
once to the update's loss), with its gradient in closed form (no autograd graph, no V x d temporaries
beyond w^ and the result). With s = sum_j w^_j:

    dR/dw_i = 2 / N^2 * (s - (w^_i . s) w^_i) / max(||w_i||, eps)

(the derivative of w^_i = w_i / max(||w_i||, eps), as ``F.normalize``; a zero row, below eps, has
w^_i = 0 and gets 2 / N^2 * s / eps, as autograd gives). ``tests/test_losses.py`` checks it against
autograd of :func:`cosine_regularizer`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from repdegen.core.errors import ConfigError
from repdegen.losses import Objective, ObjectiveConfig, ObjectiveOutput, add_to_grad, as_output_layer, register_objective
from torch import nn


@dataclass
class CosRegConfig(ObjectiveConfig):
    name: str = "cosreg"
    gamma: float = 1.0


def cosine_regularizer(weight: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``1/N^2 * sum_{i != j} cos(w_i, w_j)`` for the rows of ``weight`` (N, d), in O(N d)."""
    n = weight.size(0)
    w_hat = nn.functional.normalize(weight, dim=1, eps=eps)
    total = w_hat.sum(0)
    return (total.dot(total) - n) / (n * n)


@torch.no_grad()
def cosine_regularizer_and_grad(weight: torch.Tensor, eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """(R(W), dR/dW) in closed form (module docstring), in float32 (float64 kept)."""
    w = weight.to(torch.promote_types(weight.dtype, torch.float32))
    n = w.size(0)
    norm = w.norm(dim=1, keepdim=True).clamp_min(eps)
    w_hat = w / norm
    s = w_hat.sum(0)
    value = (s.dot(s) - n) / (n * n)
    grad = (w_hat @ s).unsqueeze(1) * w_hat  # (w^_i . s) w^_i
    torch.sub(s.unsqueeze(0), grad, out=grad)
    grad.div_(norm).mul_(2.0 / (n * n))
    return value, grad


@register_objective("cosreg", CosRegConfig)
class CosReg(Objective):
    """MLE plus ``gamma`` x R(W), the mean pairwise cosine of the output embedding's rows (Gao et al. 2019; the
    module docstring). ``forward`` returns the MLE loss; R's gradient is added once per optimizer update by
    :meth:`update_penalty` (``head``, ``step``), which the loop calls after the backward pass(es) and before
    clipping and ``optimizer.step()``. ``logs["cosreg"]``: R(W) at the last update.

    >>> import torch
    >>> from repdegen.losses import CosReg, OutputLayer
    >>> cosreg = CosReg.create(vocab_size=10, gamma=1.0)
    >>> head = OutputLayer(torch.randn(10, 4, requires_grad=True))
    >>> cosreg(torch.randn(6, 4), torch.randint(10, (6,)), head).token_loss.backward()
    >>> nll_grad = head.output_embedding.grad.clone()
    >>> cosreg.update_penalty(head, step=0)
    >>> bool((head.output_embedding.grad != nll_grad).any())
    True
    """

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.last_penalty: torch.Tensor | None = None  # R(W) at the last update (detached), for logs

    @staticmethod
    def validate_config(cfg) -> None:
        if cfg.gamma < 0:
            raise ConfigError(f"objective.gamma={cfg.gamma} must be >= 0")

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, model, step: int = 0, layout=None) -> ObjectiveOutput:
        model = as_output_layer(model)
        loss, nll = self.token_nll(model.logits(hidden), targets)
        logs = {"cosreg": self.last_penalty} if self.last_penalty is not None else {}
        return ObjectiveOutput(token_loss=loss, nll=nll, logs=logs)

    def update_penalty(self, model, step: int) -> None:
        """gamma * dR/dW added to the output embedding's gradient, once per optimizer update."""
        if self.cfg.gamma == 0:
            return
        weight = as_output_layer(model).output_embedding
        value, grad = cosine_regularizer_and_grad(weight.detach())
        add_to_grad(weight, grad.mul_(self.cfg.gamma))
        self.last_penalty = value
