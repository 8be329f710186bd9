"""AWD-LSTM (Merity, Keskar & Socher 2018), as used by Gao et al. (2019) Table 1.

Three single-layer LSTMs 400 -> 1150 -> 1150 -> 400 (the last one has the embedding size when the
decoder is tied), a decoder that keeps its bias, and these regularizers (salesforce/awd-lstm-lm):

* embedding dropout (``dropoute``): whole rows of the embedding matrix dropped, one mask per batch;
* LockedDropout: one mask per batch shared over time on the embedding output (``dropouti``), between
  layers (``dropouth``) and on the final output (``dropout``);
* WeightDrop (``wdrop``): DropConnect on each layer's hidden-to-hidden matrix, one mask per batch.
  The upstream implementation broke with PyTorch 1.0; here the dropped matrix is passed to the
  unchanged ``nn.LSTM`` through ``torch.func.functional_call``, so the fused (cuDNN) kernel still runs
  and the gradient reaches the raw matrix;
* AR (``ar_alpha``) on the dropped last-layer output and TAR (``tar_beta``) on the undropped one,
  returned by :meth:`regularization` for the trainer to add.

Initialisation as upstream: embedding and untied decoder U(-0.1, 0.1), decoder bias 0, LSTMs with
PyTorch's default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from repdegen.core.errors import ConfigError
from repdegen.models import register_model
from repdegen.models.base import LanguageModel, ModelOutput
from torch import nn
from torch.func import functional_call


@dataclass
class AWDLSTMConfig:
    arch: str = "awd_lstm"
    name: str = "awd_lstm"
    embedding_size: int = 400
    hidden_size: int = 1150
    num_layers: int = 3
    dropout: float = 0.4
    dropouth: float = 0.25
    dropouti: float = 0.4
    dropoute: float = 0.1
    wdrop: float = 0.5
    init_scale: float = 0.1
    tie_weights: bool = True
    # AWD-LSTM's tied decoder keeps its bias
    tied_output_bias: bool = True
    ar_alpha: float = 2.0
    tar_beta: float = 1.0


def locked_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout with one (1, B, d) mask shared over the time axis of a (T, B, d) tensor."""
    if not training or p == 0:
        return x
    mask = x.new_empty(1, x.size(1), x.size(2)).bernoulli_(1 - p).div_(1 - p)
    return x * mask


def embedded_dropout(embedding: nn.Embedding, tokens: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Drop whole word types: every occurrence of a dropped type in the batch gets a zero vector."""
    weight = embedding.weight
    if training and p > 0:
        mask = weight.new_empty(weight.size(0), 1).bernoulli_(1 - p).div_(1 - p)
        weight = weight * mask
    return nn.functional.embedding(tokens, weight)


@register_model("awd_lstm", AWDLSTMConfig)
class AWDLSTM(LanguageModel):
    uses_lstm_kernel = True
    WIDTH_FIELDS = ("embedding_size", "hidden_size")

    @staticmethod
    def validate_config(cfg) -> None:
        for key in ("dropout", "dropouth", "dropouti", "dropoute", "wdrop"):
            if not 0.0 <= cfg[key] < 1.0:
                raise ConfigError(f"model.{key}={cfg[key]} must be a drop probability in [0, 1)")
        for key in ("embedding_size", "hidden_size", "num_layers"):
            if cfg[key] <= 0:
                raise ConfigError(f"model.{key}={cfg[key]} must be positive")

    @staticmethod
    def check_tie(cfg, tie: bool) -> None:
        """Tying always fits: the last layer is built with the embedding size when tied."""

    def __init__(self, cfg: AWDLSTMConfig, vocab_size: int, tie_weights: bool):
        super().__init__()
        self.cfg = cfg
        self.tie_weights = tie_weights
        self.embedding = nn.Embedding(vocab_size, cfg.embedding_size)
        last = cfg.embedding_size if tie_weights else cfg.hidden_size
        self.sizes = [cfg.embedding_size] + [cfg.hidden_size] * (cfg.num_layers - 1) + [last]
        self.rnns = nn.ModuleList(nn.LSTM(self.sizes[i], self.sizes[i + 1], 1) for i in range(cfg.num_layers))
        self.output_weight = None if tie_weights else nn.Parameter(torch.empty(vocab_size, last))
        self.output_bias_param = nn.Parameter(torch.zeros(vocab_size)) if (cfg.tied_output_bias or not tie_weights) else None
        nn.init.uniform_(self.embedding.weight, -cfg.init_scale, cfg.init_scale)
        if self.output_weight is not None:
            nn.init.uniform_(self.output_weight, -cfg.init_scale, cfg.init_scale)

    def init_state(self, batch_size: int, device=None):
        device = device or self.embedding.weight.device
        return [
            (torch.zeros(1, batch_size, n, device=device), torch.zeros(1, batch_size, n, device=device))
            for n in self.sizes[1:]
        ]

    def forward(self, tokens: torch.Tensor, state) -> ModelOutput:
        cfg, training = self.cfg, self.training
        x = embedded_dropout(self.embedding, tokens, cfg.dropoute, training)
        x = locked_dropout(x, cfg.dropouti, training)
        raw_outputs, new_state = [], []
        for i, (rnn, layer_state) in enumerate(zip(self.rnns, state)):
            w_hh = nn.functional.dropout(rnn.weight_hh_l0, cfg.wdrop, training)
            x, layer_state = functional_call(rnn, {"weight_hh_l0": w_hh}, (x, layer_state))
            raw_outputs.append(x)
            new_state.append(layer_state)
            if i != len(self.rnns) - 1:
                x = locked_dropout(x, cfg.dropouth, training)
        output = locked_dropout(x, cfg.dropout, training)
        return ModelOutput(hidden=output, state=new_state, extras={"raw_last": raw_outputs[-1]})

    def regularization(self, output: ModelOutput) -> torch.Tensor | float:
        """AR: alpha * mean(dropped_h^2); TAR: beta * mean((h_t - h_{t-1})^2) on the raw last layer."""
        reg = 0.0
        if self.cfg.ar_alpha:
            reg = reg + self.cfg.ar_alpha * output.hidden.pow(2).mean()
        raw = output.extras["raw_last"]
        if self.cfg.tar_beta and raw.size(0) > 1:
            reg = reg + self.cfg.tar_beta * (raw[1:] - raw[:-1]).pow(2).mean()
        return reg
