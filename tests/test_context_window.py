"""The context-window reading of a test split (fairseq-eval-lm's ``--context-window``; Yu et al. 2022's evaluation)
against a brute-force loop that scores each token alone from the context the protocol gives it."""

from __future__ import annotations

import math

import pytest
import torch
from repdegen.analysis.evaluate import evaluate_nll, scored_segments
from repdegen.analysis.groups import group_metrics
from repdegen.data.batching import batchify
from repdegen.models import build_model
from repdegen.models.lstm_lm import LSTMLMConfig
from repdegen.models.transformer import TransformerLMConfig

V = 23
CPU = torch.device("cpu")


def tiny_transformer_lm():
    torch.manual_seed(0)
    cfg = TransformerLMConfig(name="t", d_model=16, n_layers=2, n_heads=4, d_ffn=24, dropout=0.1, attention_dropout=0.1)
    return build_model(cfg, vocab_size=V, tie_weights=True).train()  # dropout on: the reading must switch it off


def brute_force_nll(model, ids: torch.Tensor, batch_size: int, bptt: int, context: int) -> tuple[float, int]:
    """Each predicted position p (1..T-1) of each column scored on its own: the model reads the column from the
    start of p's segment's window (``max(0, s - context)``, ``s`` = the segment's first input position) up to p - 1,
    and only its last output is scored."""
    model.eval()
    stream = batchify(ids, batch_size)
    total, count = 0.0, 0
    with torch.no_grad():
        for col in range(stream.size(1)):
            column = stream[:, col]
            for p in range(1, column.numel()):
                s = (p - 1) // bptt * bptt
                x = column[max(0, s - context) : p].unsqueeze(1)
                hidden = model(x, None).hidden[-1]
                logits = model.logits(hidden.reshape(1, -1))
                total += float(torch.nn.functional.cross_entropy(logits.double(), column[p : p + 1]))
                count += 1
    return total, count


@pytest.mark.parametrize("batch_size,bptt,context", [(1, 7, 0), (1, 7, 5), (1, 4, 13), (3, 6, 10)])
def test_context_window_nll_is_the_per_token_loop(batch_size, bptt, context):
    model = tiny_transformer_lm()
    ids = torch.randint(0, V, (61,), generator=torch.Generator().manual_seed(1))
    got = evaluate_nll(model, ids, batch_size, bptt, CPU, context=context)
    want, count = brute_force_nll(model, ids, batch_size, bptt, context)
    assert got["tokens"] == count
    assert got["nll_sum"] == pytest.approx(want, rel=1e-5)
    # the analysis pass reads the split the same way: its total is the same PPL
    model.train()
    assert group_metrics(model, ids, {}, batch_size, bptt, CPU, context=context)["ppl"] == pytest.approx(got["ppl"], rel=1e-6)


def test_a_window_as_long_as_the_stream_is_one_forward_over_it():
    """With ``context`` at least the column's length, every segment sees the column from its start: the sum is that
    of one forward over the whole column, and differs from the context-free reading (segments seen alone)."""
    model = tiny_transformer_lm().eval()
    ids = torch.randint(0, V, (40,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(ids[:-1].unsqueeze(1), None).hidden.reshape(39, -1)
        whole = float(torch.nn.functional.cross_entropy(model.logits(out).double(), ids[1:], reduction="sum"))
    windowed = evaluate_nll(model, ids, 1, 8, CPU, context=64)
    alone = evaluate_nll(model, ids, 1, 8, CPU, context=0)
    assert windowed["nll_sum"] == pytest.approx(whole, rel=1e-5)
    assert not math.isclose(alone["nll_sum"], whole, rel_tol=1e-4)


def test_each_position_is_scored_once_and_the_model_mode_is_restored():
    model = tiny_transformer_lm()
    ids = torch.arange(50) % V
    targets = torch.cat([y.reshape(-1) for _, y in scored_segments(model, ids, 1, 9, CPU, context=20)])
    assert torch.equal(targets, ids[1:])
    assert model.training


def test_a_recurrent_model_or_a_negative_context_is_refused():
    torch.manual_seed(0)
    lstm = build_model(LSTMLMConfig(name="t", hidden_size=8), vocab_size=V, tie_weights=True)
    ids = torch.arange(30) % V
    with pytest.raises(ValueError, match="stateless models"):
        evaluate_nll(lstm, ids, 1, 5, CPU, context=4)
    with pytest.raises(ValueError, match=r"context=-1: expected"):
        evaluate_nll(tiny_transformer_lm(), ids, 1, 5, CPU, context=-1)
