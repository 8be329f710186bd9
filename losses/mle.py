"""Maximum likelihood, and RE (reused embeddings).

MLE: ``loss = -1/N sum_t log softmax(W h_t + b)[y_t]`` (Inan 2017 eq. 2.4).

RE (Inan, Khosravi & Socher 2017 Sec. 4; Inan & Khosravi 2016 eq. 6): the same loss with the
output projection tied to the input embedding, ``logits = L^T h`` (``W = L^T``). Tying is a
property of the model; ``objective=re`` forces it on (and ``model.tied_output_bias`` says whether the
tied decoder keeps a bias: no for VD-LSTM, yes for AWD-LSTM).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from repdegen.core.errors import ConfigError
from repdegen.losses import Objective, ObjectiveConfig, ObjectiveOutput, as_output_layer, register_objective
from repdegen.losses.fused import chunked_softmax_loss


@dataclass
class MLEConfig(ObjectiveConfig):
    name: str = "mle"


@dataclass
class REConfig(MLEConfig):
    name: str = "re"
    tie_weights: bool | None = True


@register_objective("mle", MLEConfig)
class MLE(Objective):
    """Maximum likelihood: ``token_loss`` is the mean softmax NLL of ``hidden @ W.T + b`` (label-smoothed when
    ``label_smoothing`` is set), ``nll`` the plain one. No options beyond ``chunk_rows``, no hooks.

    >>> import torch
    >>> from repdegen.losses import MLE, OutputLayer
    >>> mle = MLE.create(vocab_size=10)
    >>> head = OutputLayer(torch.randn(10, 4, requires_grad=True), torch.zeros(10))
    >>> out = mle(torch.randn(6, 4), torch.randint(10, (6,)), head)
    >>> out.token_loss.backward()
    >>> bool(out.token_loss.detach() == out.nll), head.output_embedding.grad.shape
    (True, torch.Size([10, 4]))
    """

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.cfg = cfg

    @staticmethod
    def validate_config(cfg) -> None:
        pass

    @staticmethod
    def supports_chunk_rows(cfg) -> bool:
        return True

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, model, step: int = 0, layout=None) -> ObjectiveOutput:
        model = as_output_layer(model)
        if self.cfg.chunk_rows is not None and self.training:
            loss, nll = chunked_softmax_loss(hidden, model.output_embedding, model.output_bias, targets,
                                             self.label_smoothing, chunk_rows=self.cfg.chunk_rows)
            return ObjectiveOutput(token_loss=loss, nll=nll.detach())
        loss, nll = self.token_nll(model.logits(hidden), targets)
        return ObjectiveOutput(token_loss=loss, nll=nll)


@register_objective("re", REConfig)
class RE(MLE):
    """MLE on a tied model (``logits = h L^T``): outside the trainer, MLE with the tied ``OutputLayer(L)``."""

    @staticmethod
    def validate_config(cfg) -> None:
        if cfg.tie_weights is not True:
            raise ConfigError(
                "objective=re is MLE with tied weights: objective.tie_weights must stay true (use objective=mle for untied)"
            )
