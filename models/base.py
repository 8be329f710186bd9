"""The interface every language model in repdegen implements.

A model maps token ids to hidden states; it never computes a loss. The objective owns the output
layer: it reads ``output_embedding`` (V x d) and ``output_bias`` (V or None) and forms the logits
``h W^T + b`` itself, which is what AL, CosReg, AGG and UL need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class ModelOutput:
    """``hidden``: (T, B, d) states fed to the softmax (after the model's output dropout).
    ``state``: the recurrent state to carry into the next BPTT segment.
    ``extras``: whatever the model's own regularizer needs (AWD-LSTM: per-layer outputs)."""

    hidden: torch.Tensor
    state: Any
    extras: dict = field(default_factory=dict)


class LanguageModel(nn.Module):
    """Base class: subclasses set ``self.embedding`` (nn.Embedding) and, when untied,
    ``self.output_weight`` (nn.Parameter V x d); ``self.output_bias_param`` may be None."""

    tie_weights: bool
    # runs PyTorch's fused LSTM kernel (oneDNN on a CPU, cuDNN on a GPU): bf16 on a CPU needs oneDNN's bf16 LSTM
    # (reproduce/engine/optim.py check_bf16)
    uses_lstm_kernel: bool = False
    embedding: nn.Embedding
    output_weight: nn.Parameter | None
    output_bias_param: nn.Parameter | None

    @property
    def input_embedding(self) -> torch.Tensor:
        return self.embedding.weight

    @property
    def output_embedding(self) -> torch.Tensor:
        """W in ``logits = h W^T + b``; the input embedding itself when tied."""
        return self.embedding.weight if self.tie_weights else self.output_weight

    @property
    def output_bias(self) -> torch.Tensor | None:
        return self.output_bias_param

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(hidden, self.output_embedding, self.output_bias)

    def init_state(self, batch_size: int, device: torch.device | None = None) -> Any:
        raise NotImplementedError  # pragma: no cover - abstract

    def forward(self, tokens: torch.Tensor, state: Any) -> ModelOutput:
        raise NotImplementedError  # pragma: no cover - abstract

    def regularization(self, output: ModelOutput) -> torch.Tensor | float:
        """Model-specific training penalties (AWD-LSTM's AR/TAR); 0 for most models."""
        return 0.0

    @staticmethod
    def detach_state(state: Any) -> Any:
        if state is None:  # stateless models (Transformers)
            return None
        if isinstance(state, torch.Tensor):
            return state.detach()
        return type(state)(LanguageModel.detach_state(s) for s in state)

    def parameter_breakdown(self) -> dict[str, int]:
        """Parameter counts by part (embedding, each recurrent layer, output layer)."""
        parts: dict[str, int] = {}
        for name, p in self.named_parameters():
            part = name.split(".")[0].replace("_param", "")
            if part in ("rnns", "layers"):
                part = ".".join(name.split(".")[:2])
            parts[part] = parts.get(part, 0) + p.numel()
        return parts
