"""Qualitative inspection of trained language models and their embeddings.

* :func:`nearest_neighbours`: top-k tokens by cosine similarity of embedding rows (Yu et al. 2022,
  Tables 13, 14: "the top-5 nearest neighbor token predicted by the cosine distance between token
  embeddings").
* :func:`top_predictions`: the k most probable next tokens after a prefix (Inan et al. 2017, Table 3:
  "Top 10 word predictions are sorted in descending probability").
* :func:`subspace_distance` / :func:`principal_angles`: distance between the column spaces of two
  matrices (Inan et al. 2017, Sec. 6.2 and Fig. 1).
* :func:`continuation_uniq`: greedy continuations of test prefixes and their number of distinct tokens
  (Yu et al. 2022, Tables 5, 15: "50 BPE tokens are given as prefix and the models are to generate the
  continuation of 100 next BPE tokens", with the "uniq tokens for each text").

(The module is ``repdegen.analysis.inspection``; import it by that name. Running a file of ``analysis/`` as a script
would put ``analysis/`` first on ``sys.path`` and shadow the standard library's ``inspect``.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from repdegen.models.generation import lm_continue
from torch import nn


def _name(i: int, itos: Sequence[str] | None):
    return itos[i] if itos is not None else i


def _model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:  # pragma: no cover - parameterless model
        return torch.device("cpu")


@torch.no_grad()
def nearest_neighbours(weight: torch.Tensor, ids: Sequence[int | str], k: int = 5, itos: Sequence[str] | None = None,
                       exclude: Sequence[int] = ()) -> dict:
    """For each query, the ``k`` rows of ``weight`` (V x d) with the largest cosine similarity to its row,
    the query itself excluded (and any id in ``exclude``, e.g. specials), best first.

    ``ids``: ids, or tokens looked up in ``itos``. Returns ``{query: [(neighbour, cos), ...]}`` with tokens
    named by ``itos`` when given (else ids). Ties are broken by ``torch.topk``.
    """
    w = nn.functional.normalize(weight.detach().to(torch.float64), dim=1)
    stoi = {t: i for i, t in enumerate(itos)} if itos is not None else None
    out = {}
    for q in ids:
        if isinstance(q, str):
            if stoi is None or q not in stoi:
                raise KeyError(f"nearest_neighbours: token {q!r} not in itos")
            i = stoi[q]
        else:
            i = int(q)
        cos = w @ w[i]
        cos[i] = -math.inf
        if exclude:
            cos[torch.as_tensor(list(exclude), device=cos.device)] = -math.inf
        kk = min(k, int(torch.isfinite(cos).sum()))
        vals, idx = cos.topk(kk)
        out[_name(i, itos)] = [(_name(int(j), itos), float(v)) for v, j in zip(vals.tolist(), idx.tolist())]
    return out


@torch.no_grad()
def next_token_distribution(model, prefix_ids: torch.Tensor) -> torch.Tensor:
    """p(next token | prefix) (V,), float32 softmax of ``model.logits`` after the prefix (T,) run from the
    model's initial state (``model.init_state(1)``; None for stateless models, which see at most their
    last ``cfg.max_positions`` tokens, as in :func:`repdegen.models.generation.lm_continue`). Eval mode; the
    training flag is restored afterwards."""
    prefix = torch.as_tensor(prefix_ids, dtype=torch.long).reshape(-1, 1).to(_model_device(model))
    if prefix.size(0) < 1:
        raise ValueError("top_predictions needs a prefix of at least one token")
    was_training = model.training
    model.eval()
    try:
        state = None
        if hasattr(model, "init_state"):
            try:
                state = model.init_state(1, prefix.device)
            except NotImplementedError:
                state = None
        max_positions = getattr(getattr(model, "cfg", None), "max_positions", None)
        if state is None and max_positions is not None:
            prefix = prefix[-int(max_positions):]
        out = model(prefix, state)
        return torch.softmax(model.logits(out.hidden[-1, 0]).float(), dim=-1)
    finally:
        model.train(was_training)


def top_predictions(model, prefix_ids: torch.Tensor, k: int = 10, itos: Sequence[str] | None = None) -> list[tuple]:
    """The ``k`` most probable next tokens after ``prefix_ids`` (T,) with their probabilities, in descending
    probability (Inan et al. 2017, Table 3), as ``[(token, p), ...]``; tokens named by ``itos`` when given.
    See :func:`next_token_distribution` for how the prefix is run."""
    p = next_token_distribution(model, prefix_ids)
    vals, idx = p.topk(min(k, p.numel()))
    return [(_name(int(i), itos), float(v)) for v, i in zip(vals.tolist(), idx.tolist())]


def _orthonormal_basis(a: torch.Tensor, rtol: float | None) -> torch.Tensor:
    u, s, _ = torch.linalg.svd(a, full_matrices=False)
    if s.numel() == 0 or s[0] == 0:
        return u[:, :0]
    tol = (rtol if rtol is not None else max(a.shape) * torch.finfo(a.dtype).eps) * s[0]
    return u[:, s > tol]


@torch.no_grad()
def principal_angles(a: torch.Tensor, b: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
    """The min(rank A, rank B) principal angles (radians, ascending) between the column spaces of ``a``
    (n x p) and ``b`` (n x q) (Björck & Golub 1973): cos(theta_i) = the singular values of Q_A^T Q_B,
    with Q_A, Q_B orthonormal bases (SVD; singular values below ``rtol * s_max`` are rank-deficient
    directions, default ``max(n, p) * eps``)."""
    qa = _orthonormal_basis(a.detach().to(torch.float64), rtol)
    qb = _orthonormal_basis(b.detach().to(torch.float64), rtol)
    cos = torch.linalg.svdvals(qa.t() @ qb).clamp(0.0, 1.0)
    return torch.arccos(cos)


@torch.no_grad()
def subspace_distance(a: torch.Tensor, b: torch.Tensor, rtol: float | None = None) -> float:
    """Distance between the column spaces of ``a`` (n x p) and ``b`` (n x q), in [0, 1]: 0 when they are the
    same, 1 when they are orthogonal.

    Inan et al. 2017 (Sec. 6.2, Fig. 1) compare the subspace spanned by the rows of the input embedding
    L (d x |V| in their notation) with the one spanned by the columns of the output projection W
    (|V| x d) using "a common metric based on the relative residual norm from projection of one matrix
    onto another (Björck & Golub, 1973). The computed distance between the subspaces is 1 when they are
    orthogonal, and 0 when they are the same." The paper gives no formula and the official code
    (inanhkn/REAL) does not contain the computation, so we take the relative residual of projecting an
    orthonormal basis of one space onto the other:

        d(A, B) = ||Q_s - Q_l Q_l^T Q_s||_F / ||Q_s||_F = sqrt( (1/k) * sum_{i=1..k} sin^2(theta_i) )

    with Q_A, Q_B orthonormal bases of the two column spaces, Q_s the one of smaller dimension
    k = min(rank A, rank B), Q_l the other, and theta_i the principal angles. Using orthonormal bases
    makes d depend on the subspaces only (not on the scale or basis of a or b); it is symmetric; for
    equal dimensions it equals ||P_A - P_B||_F / sqrt(2k) (the normalised projection / chordal distance).
    In this repository's orientation pass the two V x d matrices: ``subspace_distance(model.input_embedding,
    model.output_embedding)`` (their column spaces are the d-dimensional subspaces of R^V that Inan et al.
    compare; an untied model's output bias is not part of W).
    """
    qa = _orthonormal_basis(a.detach().to(torch.float64), rtol)
    qb = _orthonormal_basis(b.detach().to(torch.float64), rtol)
    if qa.size(0) != qb.size(0):
        raise ValueError(f"subspace_distance: the matrices have {qa.size(0)} and {qb.size(0)} rows; the spaces must share R^n")
    small, large = (qa, qb) if qa.size(1) <= qb.size(1) else (qb, qa)
    k = small.size(1)
    if k == 0:
        raise ValueError("subspace_distance: a matrix of rank 0 spans no subspace")
    residual = small - large @ (large.t() @ small)
    return min(1.0, float(residual.norm()) / math.sqrt(k))


def input_output_distance(model) -> dict:
    """``{"subspace_distance": d}`` of a model whose output embedding is not its input embedding (untied): the
    distance of their spans, :func:`subspace_distance` in float64 on the CPU; ``{}`` for a tied model."""
    if model.output_embedding is model.input_embedding:
        return {}
    return {"subspace_distance": subspace_distance(model.input_embedding.detach().double().cpu(),
                                                   model.output_embedding.detach().double().cpu())}


@torch.no_grad()
def continuation_uniq(model, test_ids: torch.Tensor, prefix_len: int = 50, steps: int = 100, n: int | None = None,
                      batch_size: int = 64, forbid: Sequence[int] = (), decode=None) -> dict:
    """Greedy continuations of test prefixes and their Uniq (Yu et al. 2022, Tables 5 and 15).

    Prefixes: the consecutive, non-overlapping ``prefix_len``-token chunks of ``test_ids`` (1-D), as the
    official AGG / unlikelihood-training evaluation cuts the split (``batch_input_sequence_by_prefix_length``);
    the first ``n`` of them (default: all full chunks). Each prefix is run from the model's initial state
    and continued greedily for ``steps`` tokens with :func:`repdegen.models.generation.lm_continue` (no early stop
    at eos; ``forbid`` ids are never generated), in batches of ``batch_size`` prefixes.

    Uniq of a continuation = the number of distinct tokens among its ``steps`` generated tokens (the
    prefix excluded): Yu's "uniq tokens for each text". ``uniq_total`` is the number of distinct tokens
    over all continuations (the "uniq" of Welleck et al.'s completion metrics).

    Returns ``{"prefixes": [[ids]], "continuations": [[ids]], "uniq": [int], "mean_uniq": float,
    "uniq_total": int}``, plus ``"texts"`` (``decode(ids)`` of each continuation) when ``decode`` is given.
    """
    if prefix_len < 1 or steps < 1:
        raise ValueError(f"prefix_len={prefix_len}, steps={steps}: both must be >= 1")
    ids = torch.as_tensor(test_ids, dtype=torch.long).reshape(-1)
    m = ids.numel() // prefix_len
    if n is not None:
        m = min(m, int(n))
    if m < 1:
        raise ValueError(f"{ids.numel()} test tokens hold no {prefix_len}-token prefix")
    prefixes = ids[: m * prefix_len].view(m, prefix_len)
    device = _model_device(model)
    continuations: list[list[int]] = []
    for start in range(0, m, batch_size):
        chunk = prefixes[start : start + batch_size].t().contiguous().to(device)  # (T, B)
        cont = lm_continue(model, chunk, steps, forbid=forbid)
        continuations.extend(cont.tokens.t().tolist())
    uniq = [len(set(c)) for c in continuations]
    out = {
        "prefixes": prefixes.tolist(),
        "continuations": continuations,
        "uniq": uniq,
        "mean_uniq": sum(uniq) / len(uniq),
        "uniq_total": len(set().union(*map(set, continuations))),
    }
    if decode is not None:
        out["texts"] = [decode(c) for c in continuations]
    return out
