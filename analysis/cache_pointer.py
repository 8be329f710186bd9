"""Continuous cache pointer (Grave, Joulin & Usunier 2017) at evaluation, as AWD-LSTM's pointer.py.

For position t of the evaluated stream (batch size 1), with h_t the last layer's output and y_t the
word that follows it:

    p_cache(w) = sum_{i in [t-window, t), y_i = w} softmax_i(theta * h_t . h_i)
    p(w)       = (1 - lambdah) * p_vocab(w) + lambdah * p_cache(w)

As upstream, the cache is used only once more than ``window`` positions have been seen (t > window);
before that p = p_vocab. Only p(y_t) is needed for the NLL, so p_cache(y_t) is the attention mass on
the window positions whose next word equals y_t; the window attention is computed for a block of
positions at once with a banded mask.
"""

from __future__ import annotations

import torch
from repdegen.analysis.metrics import perplexity
from repdegen.data.batching import batchify, get_batch
from torch import nn


def _cache_target_prob(h, y, past_h, past_y, first_t, offset, window, theta):
    """p_cache(y_j) for the positions j of a block (global positions first_t + j); ``past_*`` holds the
    stored positions, the block's own first position at index ``offset``."""
    n, P = h.size(0), past_h.size(0)
    scores = theta * (h.double() @ past_h.double().t())  # (n, P)
    k = torch.arange(P, device=h.device)
    j = torch.arange(n, device=h.device)
    hi = offset + j  # exclusive: the window ends just before the position itself
    valid = (k[None, :] >= (hi - window)[:, None]) & (k[None, :] < hi[:, None])
    attn = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=1).nan_to_num(0.0)
    match = past_y[None, :] == y[:, None]
    use = (first_t + j) > window
    return (attn * match).sum(1), use


@torch.no_grad()
def evaluate_cache(model, ids: torch.Tensor, window: int, theta: float, lambdah: float, bptt: int, device,
                   block: int = 512) -> dict:
    was_training = model.training
    model.eval()
    stream = batchify(ids, 1).to(device)
    state = model.init_state(1, device)
    past_h = torch.empty(0, model.output_embedding.size(1), device=device)
    past_y = torch.empty(0, dtype=torch.long, device=device)
    n_seen, nll_sum, count = 0, 0.0, 0
    for i in range(0, stream.size(0) - 1, bptt):
        x, y = get_batch(stream, i, bptt)
        out = model(x, state)
        state = out.state
        h = out.hidden.reshape(-1, out.hidden.size(-1))
        y = y.reshape(-1)
        p_vocab = torch.exp(-nn.functional.cross_entropy(model.logits(h).float(), y, reduction="none")).double()
        past_h = torch.cat([past_h, h])
        past_y = torch.cat([past_y, y])
        base = past_h.size(0) - h.size(0)
        for s in range(0, h.size(0), block):
            e = min(s + block, h.size(0))
            lo = max(0, base + s - window)
            p_cache, use = _cache_target_prob(
                h[s:e], y[s:e], past_h[lo : base + e], past_y[lo : base + e], n_seen + s, base + s - lo, window, theta
            )
            p = torch.where(use, (1 - lambdah) * p_vocab[s:e] + lambdah * p_cache, p_vocab[s:e])
            nll_sum -= torch.log(p).sum().item()
        count += h.size(0)
        n_seen += h.size(0)
        past_h, past_y = past_h[-window:], past_y[-window:]
    model.train(was_training)
    mean = nll_sum / count
    return {"nll": mean, "ppl": perplexity(mean), "tokens": count}
