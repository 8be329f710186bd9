"""Objective-independent evaluation: perplexity is always the plain softmax NLL of the model's
logits, in nats, and PPL = exp(mean NLL) over every predicted token of the split."""

from __future__ import annotations

import torch
from repdegen.analysis.metrics import perplexity
from repdegen.data.batching import batchify, get_batch
from torch import nn


def scored_segments(model, ids: torch.Tensor, batch_size: int, bptt: int, device, columns: slice | None = None,
                    context: int = 0):
    """(softmax inputs, targets) of each ``bptt`` segment of ``ids`` read as ``batch_size`` columns (only ``columns``
    of them, if given), in eval mode; the model's mode is restored after. Hidden states are (seq, batch, d), targets
    (seq, batch); every predicted position of the stream is yielded exactly once.

    ``context = 0``: the recurrent state is carried across segments (a stateless model sees each segment alone).
    ``context = c > 0`` (stateless models, e.g. a Transformer LM): each segment is read after up to ``c`` preceding
    tokens of its column, and only the segment's own ``bptt`` positions are scored: fairseq-eval-lm's
    ``--context-window c`` with ``--tokens-per-sample bptt + c`` (Yu et al. 2022's evaluation: 512 and 400)."""
    if context < 0:
        raise ValueError(f"context={context}: expected a number of tokens >= 0")
    was_training = model.training
    model.eval()
    stream = batchify(ids, batch_size)
    if columns is not None:
        stream = stream[:, columns].contiguous()
    stream = stream.to(device)
    state = model.init_state(stream.size(1), device)
    if context and state is not None:
        raise ValueError(f"context={context}: a context window is for stateless models; a recurrent model carries its "
                         f"state across segments (use context=0)")
    try:
        for i in range(0, stream.size(0) - 1, bptt):
            start = max(0, i - context)
            x, y = get_batch(stream, start, i + bptt - start)
            out = model(x, state)
            state = out.state
            yield out.hidden[i - start :], y[i - start :]
    finally:
        model.train(was_training)


@torch.no_grad()
def evaluate_nll(model, ids: torch.Tensor, batch_size: int, bptt: int, device, columns: slice | None = None,
                 context: int = 0) -> dict:
    """Mean NLL and PPL of ``ids`` (1-D) read as ``batch_size`` columns in ``bptt`` segments, with the
    NLL sum and token count they come from (``nll_sum``, ``tokens``).

    With no dropout at evaluation, carrying the state across segments makes the result independent
    of ``bptt``; ``batch_size`` changes only which N mod B trailing tokens are dropped. ``columns``
    (e.g. ``slice(r, None, W)``: rank r of W) reads only those columns of the ``batch_size``: the
    columns are independent, so the sums over a partition of the columns add up to the whole's. ``context``:
    each segment read after that many preceding tokens (:func:`scored_segments`; stateless models).
    """
    nll_sum, count = 0.0, 0
    for hidden, y in scored_segments(model, ids, batch_size, bptt, device, columns, context):
        logits = model.logits(hidden.reshape(-1, hidden.size(-1)))
        nll_sum += nn.functional.cross_entropy(logits.float(), y.reshape(-1), reduction="sum").item()
        count += y.numel()
    mean = nll_sum / count
    return {"nll": mean, "ppl": perplexity(mean), "tokens": count, "nll_sum": nll_sum}


@torch.no_grad()
def lm_hidden_states(model, ids: torch.Tensor, batch_size: int, bptt: int, device, context: int = 0):
    """The vectors the softmax multiplies by W (``out.hidden``) at every predicted position of ``ids``, read as
    :func:`evaluate_nll` reads it (eval mode, the state carried across segments), one (N, d) block per segment."""
    for hidden, _ in scored_segments(model, ids, batch_size, bptt, device, context=context):
        yield hidden.reshape(-1, hidden.size(-1))


def frac_negative(hidden_blocks, direction: torch.Tensor) -> float:
    """The share of the rows h (over all blocks) with h . direction < 0 (Gao et al. 2019 Sec. 1: the never-seen rows
    drift in a direction negatively correlated with most hidden states); NaN without rows."""
    neg, total = 0, 0
    for h in hidden_blocks:
        dots = h.double() @ direction.to(h.device, torch.float64)
        neg += int((dots < 0).sum())
        total += dots.numel()
    return neg / total if total else float("nan")
