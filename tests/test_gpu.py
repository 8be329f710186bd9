"""GPU checks (`make test-gpu`); skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from repdegen.models import build_model
from repdegen.models.awd_lstm import AWDLSTMConfig
from repdegen.models.lstm_lm import LSTMLMConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("cfg", [LSTMLMConfig(name="vd", hidden_size=64, dropout=0.5, variational=True),
                                 LSTMLMConfig(name="z", hidden_size=64, dropout=0.5),
                                 AWDLSTMConfig(embedding_size=32, hidden_size=64)])
def test_models_match_on_cpu_and_gpu_in_eval(cfg):
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size=100, tie_weights=True).eval()
    tokens = torch.randint(0, 100, (30, 4))
    cpu = model(tokens, model.init_state(4)).hidden
    gpu_model = model.cuda()
    gpu = gpu_model(tokens.cuda(), gpu_model.init_state(4)).hidden.cpu()
    assert torch.allclose(cpu, gpu, atol=1e-4)


def test_awd_weight_drop_trains_on_gpu():
    model = build_model(AWDLSTMConfig(embedding_size=32, hidden_size=64), vocab_size=100, tie_weights=True).cuda().train()
    out = model(torch.randint(0, 100, (30, 4), device="cuda"), model.init_state(4))
    model.logits(out.hidden).logsumexp(-1).mean().backward()
    assert model.rnns[1].weight_hh_l0.grad is not None and torch.isfinite(model.rnns[1].weight_hh_l0.grad).all()


def _tiny_transformers():
    from repdegen.models.transformer import TransformerLMConfig, TransformerSeq2SeqConfig

    lm = TransformerLMConfig(name="lm", d_model=64, n_layers=2, n_heads=4, d_ffn=128, dropout=0.0)
    s2s = TransformerSeq2SeqConfig(name="s2s", d_model=64, encoder_layers=2, decoder_layers=2, n_heads=4, d_ffn=128,
                                   dropout=0.0)
    return lm, s2s


def test_transformers_match_on_cpu_and_gpu_and_bf16_is_close():
    lm_cfg, s2s_cfg = _tiny_transformers()
    torch.manual_seed(0)
    lm = build_model(lm_cfg, vocab_size=100, tie_weights=True).eval()
    tokens = torch.randint(1, 100, (32, 3))
    cpu = lm(tokens).hidden
    lm = lm.cuda()
    gpu = lm(tokens.cuda()).hidden.float().cpu()
    assert torch.allclose(cpu, gpu, atol=1e-4)  # the flash/efficient SDPA kernels agree with the CPU math
    with torch.autocast("cuda", dtype=torch.bfloat16):
        bf16 = lm(tokens.cuda()).hidden.float().cpu()
    assert (bf16 - cpu).abs().max() < 0.1
    s2s = build_model(s2s_cfg, vocab_size=100, tie_weights=True).eval()
    src, prev = torch.randint(1, 100, (3, 9)), torch.randint(1, 100, (3, 7))
    src[0, 6:] = 0  # padding
    cpu = s2s(src, prev).hidden
    s2s = s2s.cuda()
    assert torch.allclose(cpu, s2s(src.cuda(), prev.cuda()).hidden.cpu(), atol=1e-4)


def test_bench_runs_on_gpu(tmp_path):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bench

    out = tmp_path / "bench.json"
    bench.main(["--models", "transformer_lm6", "--objectives", "mle", "cosreg", "--smoke", "--steps", "2", "--warmup", "1",
                "--precision", "bf16", "--out", str(out)])
    results = json.loads(out.read_text())["results"]
    assert {r["objective"] for r in results} == {"mle", "cosreg"}
    assert all(r["tokens_per_s"] > 0 and r["peak_mem_gb"] > 0 for r in results)


@pytest.mark.parametrize("mask_scale", [True, False])
def test_vd_lstm_trains_on_gpu_with_the_cpu_gradients(mask_scale):
    """The VD-LSTM's fused layer (torch.lstm) backward on cuDNN: a train-mode step gives the gradients of
    the same step on the CPU (same masks: the model's own dropout off, one shared recurrent mask)."""
    from repdegen.models.lstm_lm import lstm_layer

    torch.manual_seed(0)
    T, B, I, H = 7, 3, 5, 6
    x, h0, c0 = torch.randn(T, B, I), torch.randn(B, H), torch.randn(B, H)
    w_ih, w_hh, bias = torch.randn(4 * H, I) * 0.3, torch.randn(4 * H, H) * 0.3, torch.randn(4 * H) * 0.1
    mask = torch.bernoulli(torch.full((B, H), 0.7)) / 0.7
    grads = {}
    torch.backends.cudnn.allow_tf32 = False  # fp32 on both sides, as the trainer sets at precision fp32
    for dev in ("cpu", "cuda"):
        ps = [t.detach().clone().to(dev).requires_grad_() for t in (x, w_ih, w_hh, bias)]  # leaves on each device
        out, h_n, c_n = lstm_layer(ps[0], h0.to(dev), c0.to(dev), ps[1], ps[2], ps[3], recurrent_mask=mask.to(dev),
                                   mask_scale=1 / 0.7 if mask_scale else None)
        (out.square().sum() + h_n.sum() + c_n.sum()).backward()
        grads[dev] = [p.grad.cpu() for p in ps]
    for g_cpu, g_gpu in zip(grads["cpu"], grads["cuda"]):
        assert torch.allclose(g_cpu, g_gpu, atol=1e-4, rtol=1e-4)


def test_vd_lstm_model_backward_on_gpu():
    model = build_model(LSTMLMConfig(name="vd", hidden_size=64, dropout=0.5, variational=True), vocab_size=100,
                        tie_weights=True).cuda().train()
    out = model(torch.randint(0, 100, (30, 4), device="cuda"), model.init_state(4))
    model.logits(out.hidden).logsumexp(-1).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("gated", [False, True])
def test_chunked_softmax_loss_on_gpu_equals_the_fused_one(gated):
    """objective.chunk_rows on CUDA: the chunked kernel's loss and gradients against the fused kernel's, in fp32 (to
    summation order) and under bf16 autocast (to bf16's precision), MLE and AGG-gated."""
    from repdegen.losses.fused import chunked_softmax_loss, fused_softmax_loss

    g = torch.Generator().manual_seed(0)
    n, d, v = 300, 32, 1000
    h, W, b = torch.randn(n, d, generator=g), torch.randn(v, d, generator=g) * 0.1, torch.randn(v, generator=g)
    y = torch.randint(0, v, (n,), generator=g)
    gates = None
    if gated:
        rare = torch.zeros(v, dtype=torch.bool)
        rare[::7] = True
        g1, g2 = torch.rand(v, generator=g), torch.rand(v, generator=g)
        gates = (g1.cuda(), g2.cuda(), rare[y].cuda())

    def run(fn, autocast):
        leaves = [t.cuda().requires_grad_(True) for t in (h, W, b)]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = fn(*leaves, y.cuda(), 0.1, gates)[0]
        return [loss.detach()] + list(torch.autograd.grad(loss, leaves))

    for autocast, tol in ((False, 1e-5), (True, 3e-2)):
        chunked = run(lambda *a: chunked_softmax_loss(*a, chunk_rows=64), autocast)
        fused = run(fused_softmax_loss, autocast)
        for c, f in zip(chunked, fused):
            assert torch.allclose(c, f, rtol=tol, atol=tol * f.abs().max().item()), (autocast, (c - f).abs().max())


@pytest.mark.parametrize("objective", ["re", "real"])
def test_reduce_overhead_compile_gives_the_eager_losses_on_gpu(compose_cfg, tmp_path, objective):
    """trainer.compile_mode=reduce-overhead (CUDA graphs): the VD-LSTM's hidden state
    carried from one update to the next is an output of the graph, which its next replay overwrites. Six consecutive
    updates (the graph recorded, then replayed) must give eager's losses and leave eager's weights (no dropout: the
    compiled RNG is another stream)."""
    from pathlib import Path

    from repdegen.data.corpus import load_corpus
    from repdegen.losses import build_objective
    from repdegen.reproduce.engine.trainer import Trainer
    from repdegen.reproduce.settings.config import finalize

    device = torch.device("cuda")
    out, weights = {}, {}
    for compile_ in (False, True):
        cfg = finalize(compose_cfg("experiment=inan2017/small", "scale=smoke", f"objective={objective}",
                                   "model.dropout=0", "trainer.bptt=7", "trainer.device=cuda", "optim.name=sgd",
                                   "optim.lr=0.5", "trainer.update_freq=1", f"trainer.compile={str(compile_).lower()}",
                                   "trainer.compile_mode=reduce-overhead"))
        torch.manual_seed(0)
        corpus = load_corpus(cfg.dataset)
        model = build_model(cfg.model, len(corpus.vocab), True).to(device)
        obj = build_objective(cfg.objective, len(corpus.vocab)).to(device)
        t = Trainer(cfg, model, obj, corpus, Path(tmp_path / str(compile_)), device)
        t.model.train()
        t.task.begin_epoch(t.model)
        losses = []
        for b in t.task.train_batches(1, "train")[:6]:
            _, nll_sum, n, _ = t.train_update([b], 0.5)
            t.state.updates += 1
            losses.append(float(nll_sum) / n)
        out[compile_] = losses
        weights[compile_] = {k: v.detach().cpu().clone() for k, v in t.model.state_dict().items()}
    assert len(out[True]) == 6
    assert out[True] == pytest.approx(out[False], rel=1e-4)
    for k, v in weights[False].items():
        assert torch.allclose(weights[True][k], v, atol=1e-4), k
