"""Multi-layer LSTM language models of Zaremba et al. (2014), Inan & Khosravi (2016) and
Inan, Khosravi & Socher (2017).

    x_t = L y*_{t-1}                (embedding, Inan 2017 eq. 2.1)
    h_t = f(x_t, h_{t-1})           (a stack of LSTM layers, eq. 2.2)
    logits_t = W h_t + b            (untied)  or  L^T h_t  (RE: tied, no bias; Inan 2016 eq. 6)

Two dropout schemes:

* ``variational=false`` (Zaremba et al. 2014; Inan 2016 "as described in [5]"): fresh dropout masks
  at every time step on the non-recurrent connections only: the embedded input, between layers and
  on the final output.
* ``variational=true`` (VD-LSTM, Inan 2017 Sec. 6.1, following the official REAL code): one mask per
  minibatch, shared over all time steps; on the embedded input, and on each layer's output h, where
  the *same* masked h is both the recurrent state of that layer at the next step and the input of the
  next layer (and the final output for the top layer). The cell state is never dropped; the masked h
  is what carries over to the next BPTT segment.

Weights follow the TensorFlow PTB code of both papers: every weight U(-init_scale, init_scale), LSTM
biases zero, a single bias per gate (TensorFlow's BasicLSTMCell has one; PyTorch's nn.LSTM has two),
forget-gate bias offset 0, gate order (i, f, g, o) as in PyTorch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from repdegen.core.errors import ConfigError
from repdegen.models import register_model
from repdegen.models.base import LanguageModel, ModelOutput
from torch import nn


@dataclass
class LSTMLMConfig:
    arch: str = "lstm_lm"
    name: str = "lstm_lm"
    hidden_size: int = 200
    # None: equal to hidden_size (all three papers use equal sizes)
    embedding_size: int | None = None
    num_layers: int = 2
    # drop probability p = 1 - keep_prob, the same for every dropped connection
    dropout: float = 0.0
    variational: bool = False
    init_scale: float = 0.1
    tie_weights: bool = False
    # with tying: keep an output bias? (RE of Inan 2017 has none)
    tied_output_bias: bool = False


# added to the output gate's pre-activation of a dropped unit: sigmoid(-1e4) is exactly 0 in float32/bfloat16
CLOSED_GATE = -1.0e4


def lstm_layer(
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    bias: torch.Tensor,
    recurrent_mask: torch.Tensor | None = None,
    mask_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One LSTM layer over a (T, B, in) sequence; returns (outputs, h_T, c_T).

    Without ``recurrent_mask`` this is the fused ``torch.lstm`` kernel (cuDNN on GPU). With a (B, H)
    mask, each step's output h is multiplied by the mask before it is emitted and fed back (the
    VD-LSTM). No kernel takes such a mask, but a dropout mask (values 0 and ``mask_scale`` = 1 / (1 - p))
    fits one exactly when ``mask_scale`` is given:

    * the 0/1 part closes the output gate of each dropped (example, unit): min(B, H) extra input
      columns, constant over time, whose weights add ``CLOSED_GATE`` to that unit's o-gate
      pre-activation, so sigmoid(o) = 0 and h = 0 exactly; the cell state c is untouched, as in the
      step loop. With B <= H (the usual case: batch 20, 200+ units) the columns are the examples'
      one-hots and the weights hold each example's closures; with B > H, the mask's complement and
      the identity;
    * the scale is folded into the recurrent weight (``mask_scale * w_hh``, shared by all examples) and
      into the outputs, and the incoming state is divided by it.

    The result equals the step loop up to float rounding (``tests/test_models.py``), for the price of
    an input projection min(B, H) columns wider. Without ``mask_scale`` the steps run in a Python loop (the
    reference form).
    """
    if recurrent_mask is None:
        return _fused_lstm(x, h0, c0, w_ih, w_hh, bias)
    if mask_scale is not None:
        T, B, H = x.size(0), x.size(1), h0.size(1)
        closed = (recurrent_mask == 0).to(x.dtype)
        # K = min(B, H) extra input columns carry the (B, H) closure pattern: with B <= H, column b is the
        # one-hot of example b and its o-gate weights are example b's closures; with B > H, column j is
        # unit j's closure over the batch and its o-gate weight is the identity's
        eye = torch.eye(min(B, H), dtype=x.dtype, device=x.device)
        columns, o_block = (eye, closed.t()) if B <= H else (closed, eye)
        x_aug = torch.cat([x, columns.unsqueeze(0).expand(T, B, -1)], dim=-1)
        gate_block = torch.zeros(4 * H, columns.size(1), dtype=w_ih.dtype, device=w_ih.device)
        gate_block[3 * H :] = CLOSED_GATE * o_block.to(w_ih.dtype)
        w_ih_aug = torch.cat([w_ih, gate_block], dim=1)
        out, h_n, c_n = _fused_lstm(x_aug, h0 / mask_scale, c0, w_ih_aug, w_hh * mask_scale, bias)
        return out * mask_scale, h_n * mask_scale, c_n
    gates_x = torch.addmm(bias, x.reshape(-1, x.size(-1)), w_ih.t()).view(x.size(0), x.size(1), -1)
    h, c = h0, c0
    outputs = []
    for t in range(x.size(0)):
        gates = gates_x[t] + h @ w_hh.t()
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c) * recurrent_mask
        outputs.append(h)
    return torch.stack(outputs), h, c


def _fused_lstm(x, h0, c0, w_ih, w_hh, bias):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*contiguous chunk of memory.*")
        out, h_n, c_n = torch.lstm(
            x, (h0.unsqueeze(0), c0.unsqueeze(0)), [w_ih, w_hh, bias, torch.zeros_like(bias)],
            # train=True whenever autograd records: cuDNN keeps the reserve space its backward needs
            # ("cudnn RNN backward can only be called in training mode"); with dropout 0 the outputs are
            # the same either way, and the CPU kernel ignores the flag
            True, 1, 0.0, torch.is_grad_enabled(), False, False,
        )
    return out, h_n.squeeze(0), c_n.squeeze(0)


class LSTMLayerParams(nn.Module):
    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.weight_ih = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        self.bias = nn.Parameter(torch.zeros(4 * hidden_size))


def _dropout_mask(shape: tuple[int, ...], p: float, like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(shape).bernoulli_(1.0 - p).div_(1.0 - p)


@register_model("lstm_lm", LSTMLMConfig)
class LSTMLanguageModel(LanguageModel):
    uses_lstm_kernel = True
    WIDTH_FIELDS = ("hidden_size", "embedding_size")

    @staticmethod
    def validate_config(cfg) -> None:
        if not 0.0 <= cfg.dropout < 1.0:
            raise ConfigError(f"model.dropout={cfg.dropout} must be a drop probability in [0, 1) (= 1 - keep_prob)")
        for key in ("hidden_size", "num_layers", "init_scale"):
            if cfg[key] <= 0:
                raise ConfigError(f"model.{key}={cfg[key]} must be positive")

    @staticmethod
    def check_tie(cfg, tie: bool) -> None:
        emb = cfg.embedding_size or cfg.hidden_size
        if tie and emb != cfg.hidden_size:
            raise ConfigError(
                f"weight tying needs the embedding size to equal the last hidden size, but model "
                f"{cfg.name!r} has embedding_size={emb} and hidden_size={cfg.hidden_size}; set "
                f"model.embedding_size={cfg.hidden_size} (or null), or use an untied objective (objective=mle)"
            )

    def __init__(self, cfg: LSTMLMConfig, vocab_size: int, tie_weights: bool):
        super().__init__()
        self.cfg = cfg
        self.tie_weights = tie_weights
        emb = cfg.embedding_size or cfg.hidden_size
        self.embedding = nn.Embedding(vocab_size, emb)
        sizes = [emb] + [cfg.hidden_size] * cfg.num_layers
        self.layers = nn.ModuleList(LSTMLayerParams(sizes[i], sizes[i + 1]) for i in range(cfg.num_layers))
        if tie_weights:
            self.output_weight = None
            self.output_bias_param = nn.Parameter(torch.zeros(vocab_size)) if cfg.tied_output_bias else None
        else:
            self.output_weight = nn.Parameter(torch.empty(vocab_size, cfg.hidden_size))
            self.output_bias_param = nn.Parameter(torch.empty(vocab_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        s = self.cfg.init_scale
        for name, p in self.named_parameters():
            if name.startswith("layers.") and name.endswith(".bias"):
                nn.init.zeros_(p)
            elif name == "output_bias_param" and self.tie_weights:
                nn.init.zeros_(p)
            else:
                nn.init.uniform_(p, -s, s)

    def init_state(self, batch_size: int, device=None):
        device = device or self.embedding.weight.device
        h = self.cfg.hidden_size
        return [
            (torch.zeros(batch_size, h, device=device), torch.zeros(batch_size, h, device=device))
            for _ in range(self.cfg.num_layers)
        ]

    def forward(self, tokens: torch.Tensor, state) -> ModelOutput:
        p = self.cfg.dropout
        drop = self.training and p > 0
        x = self.embedding(tokens)
        B = tokens.size(1)
        variational = drop and self.cfg.variational
        if variational:
            x = x * _dropout_mask((1, B, x.size(-1)), p, x)
        elif drop:
            x = nn.functional.dropout(x, p, training=True)
        new_state = []
        for layer, (h0, c0) in zip(self.layers, state):
            mask = _dropout_mask((B, self.cfg.hidden_size), p, x) if variational else None
            x, h_n, c_n = lstm_layer(x, h0, c0, layer.weight_ih, layer.weight_hh, layer.bias, mask,
                                     mask_scale=1.0 / (1.0 - p) if variational else None)
            if drop and not variational:
                x = nn.functional.dropout(x, p, training=True)
            new_state.append((h_n, c_n))
        return ModelOutput(hidden=x, state=new_state)
