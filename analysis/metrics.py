"""Geometry of an embedding matrix W (N x d): isotropy, mean pairwise cosine, singular values.

Isotropy (Mu & Viswanath 2018; the I(W) of Wang et al. 2020 and Yu et al. 2022):

    I(W) = min_a Z(a) / max_a Z(a),     Z(a) = sum_i exp(w_i . a),

with a over the eigenvectors of W^T W. An eigenvector's sign is arbitrary and Z(a) != Z(-a), so both
signs are taken (2d candidates). Z overflows for real embeddings, so it is computed as
``logsumexp(W a)`` in float64 and I(W) = exp(min log Z - max log Z). I(W) = 1 is perfectly isotropic.
"""

from __future__ import annotations

import math

import torch


def perplexity(mean_nll: float) -> float:
    """exp(mean NLL), and inf (not an OverflowError) for a diverged model whose NLL exceeds ~709 nats."""
    return math.exp(mean_nll) if mean_nll < 709.0 else math.inf


@torch.no_grad()
def isotropy(weight: torch.Tensor) -> float:
    w = weight.detach().to(torch.float64)
    _, eigvecs = torch.linalg.eigh(w.t() @ w)
    directions = torch.cat([eigvecs, -eigvecs], dim=1)  # (d, 2d)
    log_z = torch.logsumexp(w @ directions, dim=0)
    return float(torch.exp(log_z.min() - log_z.max()))


@torch.no_grad()
def mean_cosine(weight: torch.Tensor) -> float:
    """Mean of cos(w_i, w_j) over the N(N-1) ordered pairs i != j, in O(N d)."""
    w = torch.nn.functional.normalize(weight.detach().to(torch.float64), dim=1)
    n = w.size(0)
    total = w.sum(0)
    return float((total.dot(total) - n) / (n * (n - 1)))


@torch.no_grad()
def singular_values(weight: torch.Tensor) -> list[float]:
    """Singular values of W, descending (float64)."""
    return torch.linalg.svdvals(weight.detach().to(torch.float64)).tolist()


def embedding_metrics(weight: torch.Tensor, spectrum: bool = True) -> dict:
    out = {"isotropy": isotropy(weight), "mean_cos": mean_cosine(weight)}
    if spectrum:
        out["singular_values"] = singular_values(weight)
    return out
