"""The fused softmax losses (losses/fused.py) against autograd of their unfused formulas: plain UL
(NLL + ``unlikelihood_token_sum`` on ``F.linear`` logits), UL+AGG fused against its literal form
(AGG's three-logit construction + the autograd UL term), and the gated-UL variant against a
construction that gates the UL term's logits as AGG gates the NLL's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from repdegen.losses import TokenLayout, build_objective
from repdegen.losses.agg import agg_gates
from repdegen.losses.fused import fused_softmax_loss
from repdegen.losses.ul import unlikelihood_candidates, unlikelihood_token_sum
from repdegen.reproduce.errors import ConfigError

V, D, T, B = 9, 5, 6, 4
N = T * B


class OutputLayer:
    def __init__(self, W, b=None):
        self.output_embedding, self.output_bias = W, b

    def logits(self, h):
        return F.linear(h, self.output_embedding, self.output_bias)


def case(seed, bias=True, dtype=torch.float64, peaked=False):
    """h, W, b, targets (time-major T x B flattened, few types so candidates repeat), layout, rare mask."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, D, generator=g, dtype=dtype)
    W = torch.randn(V, D, generator=g, dtype=dtype)
    b = torch.randn(V, generator=g, dtype=dtype) if bias else None
    y = torch.randint(0, V, (T, B), generator=g)
    layout = TokenLayout.time_major(T, B)
    y = y.reshape(-1)
    if peaked:  # some candidate with 1 - p < 1e-5: the clamp is active and passes no gradient
        W = W.clone()
        W[y[0]] = 40.0 * h[B]  # row B (t = 1, same sequence as row 0) puts almost all its mass on y[0]
        y[B] = (y[0] + 1) % V
    a = torch.tensor([5.0, 0.0, 0.01, 0.02, 0.005, 1.5, 0.3, 0.025, 2.0], dtype=torch.float64)
    special = torch.zeros(V, dtype=torch.bool)
    special[0] = True
    rare = (a < 0.03) & ~special
    return h, W, b, y, layout, a, rare


def grads(fn, h, W, b):
    leaves = [t.clone().requires_grad_(True) for t in (h, W) + ((b,) if b is not None else ())]
    loss = fn(leaves[0], leaves[1], leaves[2] if b is not None else None)
    return loss.detach(), torch.autograd.grad(loss, leaves)


def assert_close(a, b, tol=1e-10):
    loss_a, grads_a = a
    loss_b, grads_b = b
    assert torch.allclose(loss_a, loss_b, atol=tol, rtol=tol)
    for ga, gb in zip(grads_a, grads_b):
        assert torch.allclose(ga, gb, atol=tol, rtol=tol), (ga - gb).abs().max()


@pytest.mark.parametrize("peaked", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_ul_fused_equals_nll_plus_autograd_ul(bias, eps, peaked, seed):
    alpha = 0.7
    h, W, b, y, layout, _, _ = case(seed, bias, peaked=peaked)
    cands = unlikelihood_candidates(y, layout)

    def fused(h, W, b):
        return fused_softmax_loss(h, W, b, y, eps, candidates=cands, alpha=alpha)[0]

    def unfused(h, W, b):
        z = F.linear(h, W, b)
        return F.cross_entropy(z, y, label_smoothing=eps) + alpha * unlikelihood_token_sum(z, y, layout) / N

    assert_close(grads(fused, h, W, b), grads(unfused, h, W, b))
    if peaked:  # the case really has an active clamp
        z = F.linear(h, W, b)
        p = torch.softmax(z, -1)
        assert (1 - p[B, y[0]]) < 1e-5


def test_fused_reports_plain_nll_and_ul_detached():
    h, W, b, y, layout, _, _ = case(0)
    W = W.clone().requires_grad_(True)
    loss, nll, ul = fused_softmax_loss(h, W, b, y, 0.1, candidates=unlikelihood_candidates(y, layout), alpha=2.0)
    z = F.linear(h, W, b)
    assert nll.item() == pytest.approx(F.cross_entropy(z, y).item(), rel=1e-12)
    assert ul.item() == pytest.approx((unlikelihood_token_sum(z, y, layout) / N).item(), rel=1e-12)
    assert loss.requires_grad and not nll.requires_grad and not ul.requires_grad


def test_nll_only_matches_cross_entropy_to_float32_rounding():
    """The forward's NLL is mean(lse - z_y) (logsumexp), cross_entropy's -mean(log_softmax(z)_y): the same number by two
    roundings, equal on some CPUs and an ulp or two apart on others (2026-11-28, an AMD EPYC with AVX-512), so the
    check is a few float32 ulps, against the float64 value as the reference for both."""
    h, W, b, y, _, _, _ = case(1, dtype=torch.float32)
    loss, nll, _ = fused_softmax_loss(h, W, b, y)
    exact = F.cross_entropy(F.linear(h.double(), W.double(), b.double()), y)
    ours, torch_ce = nll.double(), F.cross_entropy(F.linear(h, W, b), y).double()
    ulp = torch.finfo(torch.float32).eps * exact.abs()
    assert nll.dtype == torch.float32 and torch.equal(loss, nll)
    assert (ours - exact).abs() <= 4 * ulp and (torch_ce - exact).abs() <= 4 * ulp and (ours - torch_ce).abs() <= 4 * ulp


def make(name, eps=0.0, **cfg):
    return build_objective(OmegaConf.create({"name": name, **cfg}), V, eps)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("gate1,gate2", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("seed", range(3))
def test_ul_agg_fused_equals_literal(gate1, gate2, bias, eps, seed):
    fused_obj = make("ul_agg", eps, gate1=gate1, gate2=gate2, alpha_ul=0.8)
    literal_obj = make("ul_agg", eps, gate1=gate1, gate2=gate2, alpha_ul=0.8, implementation="literal")
    h, W, b, y, layout, a, rare = case(seed, bias)
    g1, g2 = agg_gates(a, rare, gate1, gate2)

    def run(obj):
        return lambda h, W, b: obj.gated_loss(h, y, OutputLayer(W, b), g1, g2, rare[y], layout)[0]

    assert_close(grads(run(fused_obj), h, W, b), grads(run(literal_obj), h, W, b))


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("peaked", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_ul_agg_gated_equals_gated_ul_construction(peaked, eps, seed):
    """Gradient to h: the plain NLL + UL gradient; to W and b: NLL + UL both through logits gated per
    row (g1 for a non-rare target, g2 for a rare one, the target's own logit ungated)."""
    obj = make("ul_agg_gated", eps, alpha_ul=0.6)
    h, W, b, y, layout, a, rare = case(seed, True, peaked=peaked)
    g1, g2 = agg_gates(a, rare)
    gate = torch.where(rare[y].unsqueeze(1), g2, g1).clone()
    gate[torch.arange(N), y] = 1.0

    def construction(h, W, b):
        def term(z):
            return F.cross_entropy(z, y, label_smoothing=eps) + 0.6 * unlikelihood_token_sum(z, y, layout) / N

        z0 = F.linear(h, W.detach(), b.detach())  # gradient to h only
        z = F.linear(h.detach(), W, b)  # gradient to W and b only, gated
        zg = gate * z + (1 - gate) * z.detach()
        # value: 2 x the NLL term + one UL term, as the fused loss reports it
        return term(z0) + term(zg) - 0.6 * (unlikelihood_token_sum(z, y, layout) / N).detach()

    def fused(h, W, b):
        return obj.gated_loss(h, y, OutputLayer(W, b), g1, g2, rare[y], layout)[0]

    assert_close(grads(fused, h, W, b), grads(construction, h, W, b))


def test_ul_agg_gated_needs_the_fused_implementation():
    from repdegen.losses.ul_agg import ULAGGGated, ULAGGGatedConfig

    with pytest.raises(ConfigError, match="ul_agg_gated has only the fused"):
        ULAGGGated.validate_config(ULAGGGatedConfig(implementation="literal"))


def test_bf16_autocast_path_is_close_to_float32():
    h, W, b, y, layout, _, _ = case(2, dtype=torch.float32)
    cands = unlikelihood_candidates(y, layout)

    def fused(h, W, b):
        return fused_softmax_loss(h, W, b, y, 0.0, candidates=cands, alpha=1.0)[0]

    ref = grads(fused, h, W, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = grads(fused, h, W, b)
    assert low[0].dtype == torch.float32
    assert torch.allclose(low[0], ref[0], rtol=2e-2)
    for gl, gr in zip(low[1], ref[1]):
        assert gl.dtype == gr.dtype == torch.float32
        assert torch.allclose(gl, gr, atol=3e-2 * gr.abs().max().item())


def test_layout_length_known_on_the_host():
    lay = TokenLayout.time_major(5, 3)
    assert lay.length == 5 and lay.n_seq == 3
    mask = torch.tensor([[True, True, False, False], [True, True, True, False]])
    lay = TokenLayout.from_mask(mask)
    assert lay.length == 4 and lay.n_seq == 2
    y = torch.tensor([1, 2, 2, 1, 3])
    known = unlikelihood_candidates(y, lay)
    lay.length = None  # read from pos instead: the same candidates (a shorter grid, same valid entries)
    read = unlikelihood_candidates(y, lay)
    for i in range(y.numel()):
        assert sorted(known[0][i][known[1][i]].tolist()) == sorted(read[0][i][read[1][i]].tolist())


# ---- the chunked kernel (objective.chunk_rows): gradients formed in the forward pass, chunk by chunk ---------------
@pytest.mark.parametrize("chunk", [1, 5, N, 4 * N])  # one row, chunks that do not divide N, one chunk, larger than N
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_mle_equals_autograd_cross_entropy(chunk, eps, bias):
    from repdegen.losses.fused import chunked_softmax_loss

    h, W, b, y, _, _, _ = case(4, bias)

    def chunked(h, W, b):
        return chunked_softmax_loss(h, W, b, y, eps, chunk_rows=chunk)[0]

    def unfused(h, W, b):
        return F.cross_entropy(F.linear(h, W, b), y, label_smoothing=eps)

    assert_close(grads(chunked, h, W, b), grads(unfused, h, W, b))


@pytest.mark.parametrize("chunk", [1, 7, 4 * N])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("gate1,gate2", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("seed", range(2))
def test_chunked_agg_equals_the_literal_three_logit_form(chunk, eps, gate1, gate2, seed):
    """Through the objectives: AGG with objective.chunk_rows against AGG's literal (official) form, in training mode."""
    chunked_obj = make("agg", eps, gate1=gate1, gate2=gate2, chunk_rows=chunk)
    literal_obj = make("agg", eps, gate1=gate1, gate2=gate2, implementation="literal")
    h, W, b, y, layout, a, rare = case(seed, True)
    g1, g2 = agg_gates(a, rare, gate1, gate2)
    assert rare[y].any() and (~rare[y]).any()  # both row groups are present

    def run(obj):
        return lambda h, W, b: obj.gated_loss(h, y, OutputLayer(W, b), g1, g2, rare[y], layout)[0]

    assert_close(grads(run(chunked_obj), h, W, b), grads(run(literal_obj), h, W, b))


def test_chunked_objectives_in_training_only_and_the_reported_nll():
    """MLE with chunk_rows reports the plain mean NLL (detached); in eval mode it takes the default path (no
    gradients to form), with the same value."""
    obj = make("mle", chunk_rows=5)
    h, W, b, y, _, _, _ = case(5, True)
    layer = OutputLayer(W.clone().requires_grad_(True), b)
    out = obj(h, y, layer)
    ref = F.cross_entropy(F.linear(h, W, b), y)
    assert out.nll.item() == pytest.approx(ref.item(), rel=1e-12) and not out.nll.requires_grad
    assert out.token_loss.requires_grad
    obj.eval()
    with torch.no_grad():
        assert obj(h, y, layer).token_loss.item() == pytest.approx(ref.item(), rel=1e-12)


def test_chunked_bf16_autocast_is_close_to_float32():
    from repdegen.losses.fused import chunked_softmax_loss

    h, W, b, y, _, _, _ = case(6, dtype=torch.float32)

    def chunked(h, W, b):
        return chunked_softmax_loss(h, W, b, y, 0.0, chunk_rows=7)[0]

    ref = grads(chunked, h, W, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = grads(chunked, h, W, b)
    for gl, gr in zip(low[1], ref[1]):
        assert gl.dtype == gr.dtype == torch.float32
        assert torch.allclose(gl, gr, atol=3e-2 * gr.abs().max().item())


@pytest.mark.parametrize("name,extra", [("al", {"target_grad": "full"}), ("real", {"target_grad": "full"}), ("ul", {}),
                                        ("ul_agg", {}), ("cosreg", {}), ("agg", {"implementation": "literal"})])
def test_chunk_rows_is_refused_where_the_kernel_does_not_apply(name, extra):
    from repdegen.losses import validate_objective

    cfg = OmegaConf.merge(OmegaConf.structured(_config_cls(name)), {"name": name, "chunk_rows": 8, **extra})
    able = "agg, al, mle, re, real"
    with pytest.raises(ConfigError, match=rf"objective.chunk_rows=8 is not supported by objective={name}.*{able}"):
        validate_objective(cfg)
    validate_objective(OmegaConf.merge(cfg, {"chunk_rows": None}))  # the same config without it is fine


def _config_cls(name):
    from types import SimpleNamespace

    from repdegen.losses import OBJECTIVES

    return OBJECTIVES.entry(SimpleNamespace(name=name))[1]


def test_chunked_with_no_rows_is_a_zero_loss_without_gradient():
    from repdegen.losses.fused import chunked_softmax_loss

    W = torch.randn(V, D, dtype=torch.float64, requires_grad=True)
    loss, nll = chunked_softmax_loss(torch.zeros(0, D, dtype=torch.float64), W, None, torch.zeros(0, dtype=torch.long),
                                     0.1, chunk_rows=4)
    assert loss.item() == 0.0 and nll.item() == 0.0
    loss.backward()
    assert W.grad is None or not W.grad.any()
