"""Models against independent computations: nn.LSTMCell loops that follow the official REAL code's
masking, a plain nn.LSTM with the dropped matrix for WeightDrop, and parameter counts by formula."""

from __future__ import annotations

import pytest
import repdegen.models.awd_lstm as awd
import repdegen.models.lstm_lm as lstm_lm
import torch
from repdegen.models import build_model
from repdegen.models.awd_lstm import AWDLSTMConfig
from repdegen.models.lstm_lm import LSTMLMConfig, lstm_layer
from torch import nn


def test_fused_layer_equals_masked_loop_with_unit_mask():
    torch.manual_seed(0)
    T, B, I, H = 7, 3, 5, 4
    x, h0, c0 = torch.randn(T, B, I), torch.randn(B, H), torch.randn(B, H)
    w_ih, w_hh, b = torch.randn(4 * H, I), torch.randn(4 * H, H), torch.randn(4 * H)
    fused = lstm_layer(x, h0, c0, w_ih, w_hh, b)
    loop = lstm_layer(x, h0, c0, w_ih, w_hh, b, recurrent_mask=torch.ones(B, H))
    for a, c in zip(fused, loop):
        assert torch.allclose(a, c, atol=1e-6)


@pytest.mark.parametrize("p,B,H", [(0.5, 5, 4), (0.3, 5, 4), (0.5, 3, 8), (0.3, 4, 4)])
def test_masked_fused_layer_equals_the_step_loop(p, B, H):
    """The closed-output-gate form (one torch.lstm call) against the Python step loop: outputs, final
    state and the gradients of every input, with a carried-in (already masked) state."""
    torch.manual_seed(4)
    T, I = 6, 3
    scale = 1.0 / (1.0 - p)
    mask = (torch.rand(B, H) > p).double() * scale
    assert (mask == 0).any() and (mask != 0).any()
    leaves = [torch.randn(T, B, I), torch.randn(B, H) * (torch.rand(B, H) > 0.5) * scale, torch.randn(B, H),
              torch.randn(4 * H, I), torch.randn(4 * H, H), torch.randn(4 * H)]
    leaves = [t.double().requires_grad_(True) for t in leaves]
    results = {}
    for name, kw in (("loop", {}), ("fused", {"mask_scale": scale})):
        out, h_n, c_n = lstm_layer(*leaves, recurrent_mask=mask, **kw)
        weights = torch.randn(T, B, H, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        loss = (out * weights).sum() + (h_n * 1.7).sum() + (c_n * 0.3).sum()
        results[name] = (out, h_n, c_n, *torch.autograd.grad(loss, leaves))
    for a, b in zip(results["loop"], results["fused"]):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-9), (a - b).abs().max()
    assert (results["fused"][0][:, mask == 0] == 0).all()  # dropped units emit exact zeros


def reference_vd_lstm(model, tokens, masks):
    """The official REAL code's forward pass, step by step with nn.LSTMCell: input mask on the
    embedding; each layer's output h multiplied by its mask, and that masked h is both the recurrent
    state and the next layer's input; the cell state is never masked."""
    cells = []
    for layer in model.layers:
        cell = nn.LSTMCell(layer.weight_ih.size(1), layer.weight_hh.size(1))
        with torch.no_grad():
            cell.weight_ih.copy_(layer.weight_ih)
            cell.weight_hh.copy_(layer.weight_hh)
            cell.bias_ih.copy_(layer.bias)
            cell.bias_hh.zero_()
        cells.append(cell)
    B = tokens.size(1)
    H = model.cfg.hidden_size
    state = [(torch.zeros(B, H), torch.zeros(B, H)) for _ in cells]
    outputs = []
    for t in range(tokens.size(0)):
        x = model.embedding(tokens[t]) * masks[0]
        for i, cell in enumerate(cells):
            h, c = cell(x, state[i])
            h = h * masks[i + 1]
            state[i] = (h, c)
            x = h
        outputs.append(x)
    return torch.stack(outputs)


def test_vd_lstm_matches_reference_masking(monkeypatch):
    torch.manual_seed(1)
    cfg = LSTMLMConfig(name="vd", hidden_size=6, dropout=0.5, variational=True, init_scale=0.3)
    model = build_model(cfg, vocab_size=11, tie_weights=True).train()
    B, T = 4, 9
    tokens = torch.randint(0, 11, (T, B))
    masks = [(torch.rand(B, 6) > 0.5).float() * 2 for _ in range(3)]
    drawn = iter(masks)

    def fixed_mask(shape, p, like):
        return next(drawn).view(shape)

    monkeypatch.setattr(lstm_lm, "_dropout_mask", fixed_mask)
    ours = model(tokens, model.init_state(B)).hidden
    ref = reference_vd_lstm(model, tokens, masks)
    assert torch.allclose(ours, ref, atol=1e-5)


def test_variational_masks_are_constant_over_time():
    torch.manual_seed(2)
    cfg = LSTMLMConfig(name="vd", hidden_size=32, dropout=0.5, variational=True)
    model = build_model(cfg, vocab_size=50, tie_weights=False).train()
    out = model(torch.randint(0, 50, (20, 8)), model.init_state(8)).hidden  # (T, B, H)
    zero = out == 0
    # each (example, unit) is either dropped at every step or at none
    assert torch.equal(zero.all(0), zero.any(0))
    assert 0.3 < zero[0].float().mean() < 0.7
    # ...and the masks differ between examples (one mask per example, not per batch)
    assert not torch.equal(zero[0, 0], zero[0, 1])
    # fresh masks at the next minibatch
    out2 = model(torch.randint(0, 50, (20, 8)), model.init_state(8)).hidden
    assert not torch.equal(zero[0], out2[0] == 0)


def test_zaremba_dropout_is_not_shared_over_time():
    torch.manual_seed(3)
    cfg = LSTMLMConfig(name="z", hidden_size=32, dropout=0.5, variational=False)
    model = build_model(cfg, vocab_size=50, tie_weights=False).train()
    zero = model(torch.randint(0, 50, (20, 8)), model.init_state(8)).hidden == 0
    assert not torch.equal(zero.all(0), zero.any(0))


def test_eval_mode_is_deterministic_and_dropout_free():
    cfg = LSTMLMConfig(name="vd", hidden_size=8, dropout=0.5, variational=True)
    model = build_model(cfg, vocab_size=20, tie_weights=True).eval()
    tokens = torch.randint(0, 20, (5, 3))
    a = model(tokens, model.init_state(3)).hidden
    b = model(tokens, model.init_state(3)).hidden
    assert torch.equal(a, b) and (a != 0).all()


def test_tied_output_is_the_embedding_and_has_no_bias():
    model = build_model(LSTMLMConfig(name="re", hidden_size=8), vocab_size=20, tie_weights=True)
    assert model.output_embedding is model.embedding.weight and model.output_bias is None
    untied = build_model(LSTMLMConfig(name="u", hidden_size=8), vocab_size=20, tie_weights=False)
    assert untied.output_embedding is not untied.embedding.weight and untied.output_bias is not None


def test_lstm_init_follows_tensorflow_code():
    cfg = LSTMLMConfig(name="i", hidden_size=30, init_scale=0.05)
    model = build_model(cfg, vocab_size=40, tie_weights=False)
    for name, p in model.named_parameters():
        if name.endswith(".bias") and name.startswith("layers"):
            assert torch.count_nonzero(p) == 0
        else:
            assert p.abs().max() <= 0.05 and p.abs().max() > 0.03


# ------------------------------------------------------------------------------------------------ AWD
def test_weight_drop_uses_a_dropped_recurrent_matrix_in_training(monkeypatch):
    torch.manual_seed(4)
    cfg = AWDLSTMConfig(embedding_size=6, hidden_size=10, dropout=0, dropouth=0, dropouti=0, dropoute=0, wdrop=0.5)
    model = build_model(cfg, vocab_size=15, tie_weights=True).train()
    dropped = []
    real_dropout = nn.functional.dropout

    def recording_dropout(x, p=0.5, training=True, inplace=False):
        y = real_dropout(x, p, training, inplace)
        if x.dim() == 2 and x.size(0) == 4 * x.size(1):  # a weight_hh matrix
            dropped.append(y.detach().clone())
        return y

    monkeypatch.setattr(nn.functional, "dropout", recording_dropout)
    tokens = torch.randint(0, 15, (8, 2))
    out = model(tokens, model.init_state(2))
    assert len(dropped) == 3
    # reference: the same layers as plain nn.LSTMs whose weight_hh is the dropped matrix
    x = model.embedding(tokens)
    for rnn, w in zip(model.rnns, dropped):
        ref = nn.LSTM(rnn.input_size, rnn.hidden_size)
        ref.load_state_dict(rnn.state_dict())
        with torch.no_grad():
            ref.weight_hh_l0.copy_(w)
        x, _ = ref(x)
        frac_zero = (w == 0).float().mean().item()
        assert 0.35 < frac_zero < 0.65
    assert torch.allclose(out.hidden, x, atol=1e-6)
    # the raw matrix is untouched and receives the gradient
    assert torch.count_nonzero(model.rnns[0].weight_hh_l0) == model.rnns[0].weight_hh_l0.numel()
    out.hidden.sum().backward()
    assert model.rnns[0].weight_hh_l0.grad is not None and model.rnns[0].weight_hh_l0.grad.abs().sum() > 0


def test_weight_drop_is_off_in_eval():
    cfg = AWDLSTMConfig(embedding_size=6, hidden_size=10, wdrop=0.9)
    model = build_model(cfg, vocab_size=15, tie_weights=True).eval()
    tokens = torch.randint(0, 15, (8, 2))
    out = model(tokens, model.init_state(2)).hidden
    x = model.embedding(tokens)
    for rnn in model.rnns:
        x, _ = rnn(x)
    assert torch.allclose(out, x, atol=1e-6)


def test_locked_and_embedding_dropout_masks():
    torch.manual_seed(5)
    x = torch.ones(30, 4, 16)
    y = awd.locked_dropout(x, 0.5, training=True)
    assert torch.equal((y == 0).all(0), (y == 0).any(0))  # the same mask at every step
    assert torch.equal(awd.locked_dropout(x, 0.5, training=False), x)
    emb = nn.Embedding(10, 5)
    tokens = torch.tensor([[1, 1, 2], [2, 3, 3]])
    out = awd.embedded_dropout(emb, tokens, 0.5, training=True)
    for w in (1, 2, 3):  # a dropped word type is dropped at every occurrence
        rows = out[tokens == w]
        assert bool((rows == 0).all(1).all()) or bool((rows != 0).all())


def test_ar_tar_regularization_formula():
    """AR on the dropped last-layer output, TAR on the undropped one (Merity et al.), with the undropped output
    computed here by running the embedding and the LSTMs directly (only the final dropout on)."""
    torch.manual_seed(3)
    cfg = AWDLSTMConfig(embedding_size=4, hidden_size=6, ar_alpha=2.0, tar_beta=1.0, dropout=0.5, dropouth=0.0,
                        dropouti=0.0, dropoute=0.0, wdrop=0.0)
    model = build_model(cfg, vocab_size=9, tie_weights=True).train()
    tokens = torch.randint(0, 9, (5, 3))
    out = model(tokens, model.init_state(3))
    x = model.embedding(tokens)
    for rnn in model.rnns:
        x, _ = rnn(x)
    assert torch.allclose(out.extras["raw_last"], x, atol=1e-6)
    dropped = out.hidden
    assert not torch.allclose(dropped, x)  # the final dropout is on
    # locked dropout at 0.5: each feature of each sequence is 0 at every step or 2x at every step
    kept = (dropped != 0).all(0)
    assert torch.equal(kept, (dropped != 0).any(0))
    assert torch.allclose(dropped, x * kept * 2.0, atol=1e-6)
    expected = 2.0 * (x * kept * 2.0).pow(2).mean() + 1.0 * (x[1:] - x[:-1]).pow(2).mean()
    assert model.regularization(out).item() == pytest.approx(expected.item(), rel=1e-6)


# ------------------------------------------------------------------------------------ parameter counts
def lstm_params(inp, hid, biases):
    return 4 * hid * (inp + hid) + biases * 4 * hid


AWD_LAYERS = lstm_params(400, 1150, 2) + lstm_params(1150, 1150, 2) + lstm_params(1150, 400, 2)  # nn.LSTM: two biases


@pytest.mark.parametrize(
    "cfg,vocab,tie,expected,paper_millions",
    [
        # Inan 2017 Table 2: VD-LSTM+REAL large 51M; medium untied (Gal/Zaremba) 20M
        (LSTMLMConfig(name="l", hidden_size=1500), 10000, True, 10000 * 1500 + 2 * lstm_params(1500, 1500, 1), 51),
        (LSTMLMConfig(name="m", hidden_size=650), 10000, False, 2 * 10000 * 650 + 10000 + 2 * lstm_params(650, 650, 1), 20),
        # AWD-LSTM: 24M on PTB, ~33M on WikiText-2 (33,278 types)
        (AWDLSTMConfig(), 10000, True, 10000 * 400 + 10000 + AWD_LAYERS, 24),
        (AWDLSTMConfig(), 33278, True, 33278 * 400 + 33278 + AWD_LAYERS, 34),
    ],
)
def test_parameter_counts_match_the_papers(cfg, vocab, tie, expected, paper_millions):
    with torch.device("meta"):
        model = build_model(cfg, vocab, tie)
    total = sum(p.numel() for p in model.parameters())
    assert total == expected
    assert round(total / 1e6) == paper_millions


def test_medium_real_count_is_13_3m_not_the_papers_14m():
    """Documented gap: 10k x 650 + two 650-unit layers = 13.27M; Inan 2017 Table 2 prints 14M."""
    with torch.device("meta"):
        model = build_model(LSTMLMConfig(name="m", hidden_size=650), 10000, True)
    assert sum(p.numel() for p in model.parameters()) == 13_265_200
