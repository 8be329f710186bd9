"""Shared test helpers."""

from __future__ import annotations

import torch


class TinyOutputModel(torch.nn.Module):
    """Just an output layer: logits = h W^T + b, W = the input embedding when tied."""

    def __init__(self, v: int, d: int, tied: bool = True, bias: bool = True, dtype=torch.float32):
        super().__init__()
        self.embedding = torch.nn.Embedding(v, d, dtype=dtype)
        self.tie_weights = tied
        self.w = None if tied else torch.nn.Parameter(torch.randn(v, d, dtype=dtype))
        self.b = torch.nn.Parameter(torch.randn(v, dtype=dtype)) if bias else None

    @property
    def input_embedding(self):
        return self.embedding.weight

    @property
    def output_embedding(self):
        return self.embedding.weight if self.tie_weights else self.w

    @property
    def output_bias(self):
        return self.b

    def logits(self, h):
        return torch.nn.functional.linear(h, self.output_embedding, self.output_bias)
