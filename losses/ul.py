"""Token-level unlikelihood training (UL) of Welleck et al. (2020), the "UL" row of Yu et al. (2022)
Tables 4 and 11 (alpha = 1.0, their Table 12):

    L_t   = -log p(y_t | y_<t)  +  alpha * sum_{c in C_t} -log(clamp(1 - p(c | y_<t), min=1e-5))
    C_t   = {y_1, ..., y_{t-1}} \\ {y_t}          (previous targets of the same sequence, each once)
    loss  = (1/N) sum_t L_t                        (N = number of non-pad target tokens)

as in the authors' fairseq criterion (facebookresearch/unlikelihood_training,
``candidate_penalty_ce_loss.py``: the clamp at 1e-5, the sum over candidates, the division of the whole
loss by the token count). Two deliberate differences from that code, both its known bugs: candidates
come from the **same sequence** only (the official code flattens the batch, so candidates leak across
sequences, upstream #11) and padding is never a candidate for any padding index (upstream #3).

What a "sequence" is comes from the :class:`~losses.TokenLayout` the task passes: a translation target
sentence, or one BPTT column of the current segment for language modelling (a stateless LM's block is
such a column too), so the candidates of a recurrent LM do not reach back across segment boundaries.

Vectorised, with no loop over tokens: the targets are scattered into an (n_seq, L) grid, the first
occurrence of each token in each sequence is marked with one stable sort per row (so duplicates count
once), and row t gathers its sequence's grid row, keeping position j when j < pos_t, j is a first
occurrence and grid[j] != y_t. Memory is O(N L) (indices and gathered log-probabilities), never
O(N L V) and not even an (N, V) mask; L is the longest sequence in the batch.

Training computes the loss with :func:`repdegen.losses.fused.fused_softmax_loss`: one ``log_softmax`` gives both the
NLL and the candidates' probabilities, and the backward forms the logit gradient in place (no second
normaliser, no dense scatter for the gather's gradient, no host sync when the layout knows its length).
``unlikelihood_token_sum`` is the plain autograd form, kept as the reference the tests compare against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from repdegen.core.errors import ConfigError
from repdegen.losses import Objective, ObjectiveConfig, ObjectiveOutput, TokenLayout, as_output_layer, register_objective
from repdegen.losses.fused import fused_softmax_loss


@dataclass
class ULConfig(ObjectiveConfig):
    """``alpha`` = 1.0: Welleck et al.'s token-level setting and Yu et al. (2022) Table 12."""

    name: str = "ul"
    alpha: float = 1.0


def unlikelihood_candidates(targets: torch.Tensor, layout: TokenLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(cand (N, L) long, valid (N, L) bool): row t's candidate tokens C_t are ``cand[t][valid[t]]``, each
    distinct token once, all from earlier positions of row t's sequence and none equal to ``targets[t]``."""
    n = targets.numel()
    device = targets.device
    if n == 0:
        empty = torch.zeros((0, 0), dtype=torch.long, device=device)
        return empty, empty.bool()
    seq, pos = layout.seq.to(device), layout.pos.to(device)
    length = layout.length if layout.length is not None else int(pos.max()) + 1
    sentinel = -1  # empty grid cells (padding, positions absent from the layout); never a token id
    grid = torch.full((layout.n_seq, length), sentinel, dtype=torch.long, device=device)
    grid[seq, pos] = targets
    # first occurrence of each token in its sequence: a stable sort keeps equal tokens in position order
    sorted_tokens, order = torch.sort(grid, dim=1, stable=True)
    first_sorted = torch.ones_like(sorted_tokens, dtype=torch.bool)
    first_sorted[:, 1:] = sorted_tokens[:, 1:] != sorted_tokens[:, :-1]
    first = torch.empty_like(first_sorted).scatter_(1, order, first_sorted)
    cand = grid[seq]  # (N, L): the whole sequence of each row
    earlier = torch.arange(length, device=device).unsqueeze(0) < pos.unsqueeze(1)
    valid = earlier & first[seq] & (cand != targets.unsqueeze(1)) & (cand != sentinel)
    return cand.clamp_min(0), valid


def unlikelihood_token_sum(logits: torch.Tensor, targets: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """sum_t sum_{c in C_t} -log(clamp(1 - p_t(c), min=1e-5)) over all N rows (not yet divided by N)."""
    cand, valid = unlikelihood_candidates(targets, layout)
    if cand.numel() == 0:
        return logits.sum() * 0.0
    dtype = torch.promote_types(logits.dtype, torch.float32)  # half precision is upcast, float64 kept
    log_norm = torch.logsumexp(logits.to(dtype), dim=-1, keepdim=True)
    log_p = logits.gather(1, cand).to(dtype) - log_norm
    one_minus_p = torch.clamp(1.0 - log_p.exp(), min=1e-5)
    return torch.where(valid, -torch.log(one_minus_p), torch.zeros_like(one_minus_p)).sum()


@register_objective("ul", ULConfig)
class Unlikelihood(Objective):
    """Token-level unlikelihood (the module docstring); option ``alpha``. Needs ``layout``, the sequence and
    position of every row (:class:`~repdegen.losses.TokenLayout`: ``time_major(T, B)`` for a (T, B) block
    flattened time-major, ``from_mask(mask)`` for a batch-first (B, T) one). No hooks. ``logs["ul_loss"]``: the
    unlikelihood term.

    >>> import torch
    >>> from repdegen.losses import OutputLayer, TokenLayout, Unlikelihood
    >>> ul = Unlikelihood.create(vocab_size=10, alpha=1.0)
    >>> B, T = 2, 5  # a batch-first (B, T) block, flattened row-major
    >>> out = ul(torch.randn(B * T, 4), torch.randint(10, (B * T,)), OutputLayer(torch.randn(10, 4)),
    ...          layout=TokenLayout.from_mask(torch.ones(B, T, dtype=torch.bool)))
    >>> sorted(out.logs)
    ['ul_loss']
    """

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.cfg = cfg

    @staticmethod
    def validate_config(cfg) -> None:
        if cfg.alpha < 0:
            raise ConfigError(f"objective.alpha={cfg.alpha} must be >= 0 (Welleck et al. and Yu et al. use 1.0)")

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, model, step: int = 0, layout=None) -> ObjectiveOutput:
        model = as_output_layer(model)
        if layout is None:
            raise ValueError(
                "objective=ul needs the sequence layout of the rows (layout=TokenLayout(...)) to find each token's "
                "previous targets; the LM and translation tasks pass it: pass one when calling the objective directly"
            )
        if layout.seq.numel() != targets.numel():
            raise ValueError(f"layout has {layout.seq.numel()} rows but there are {targets.numel()} targets")
        loss, nll, ul = fused_softmax_loss(hidden, model.output_embedding, model.output_bias, targets,
                                           self.label_smoothing, candidates=unlikelihood_candidates(targets, layout),
                                           alpha=self.cfg.alpha)
        return ObjectiveOutput(token_loss=loss, nll=nll, logs={"ul_loss": ul})
