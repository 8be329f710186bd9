"""Objectives against independent computations: explicit float64 formulas, the analytic gradient of
Inan et al. (2017) eq. 3.4, and the O(N^2) double sum of Gao et al. (2019) eq. 6."""

from __future__ import annotations

import math

import pytest
import torch
from repdegen.losses import build_objective, objective_names
from repdegen.losses.al import augmented_loss, augmented_loss_mean
from repdegen.losses.cosreg import cosine_regularizer
from repdegen.models import build_model
from repdegen.models.lstm_lm import LSTMLMConfig
from repdegen.reproduce.errors import ConfigError

from tests.tiny import TinyOutputModel

torch.manual_seed(0)
V, D, N = 13, 6, 9


def TinyModel(tied: bool, bias: bool = True) -> TinyOutputModel:
    """Just an output layer: logits = h W^T + b, W = L when tied."""
    return TinyOutputModel(V, D, tied, bias)


def brute_nll(h, y, W, b):
    """-1/N sum_t log(exp(z_t[y_t]) / sum_j exp(z_t[j])), written out in float64."""
    h, W = h.double(), W.double()
    total = 0.0
    for t in range(h.size(0)):
        z = [float(h[t] @ W[j] + (b[j] if b is not None else 0.0)) for j in range(W.size(0))]
        m = max(z)
        log_norm = m + math.log(sum(math.exp(v - m) for v in z))
        total += log_norm - z[int(y[t])]
    return total / h.size(0)


@pytest.mark.parametrize("tied", [False, True])
def test_mle_value_and_gradient(tied):
    model = TinyModel(tied)
    h = torch.randn(N, D, requires_grad=True)
    y = torch.randint(0, V, (N,))
    cfg_name = "re" if tied else "mle"
    from omegaconf import OmegaConf

    obj = build_objective(OmegaConf.create({"name": cfg_name, "tie_weights": tied}), V)
    out = obj(h, y, model)
    brute = brute_nll(h.detach(), y, model.output_embedding.detach(), model.b.detach())
    assert out.token_loss.item() == pytest.approx(brute, rel=1e-6)
    # gradient w.r.t. the logits is (softmax(z) - onehot(y)) / N
    out.token_loss.backward()
    z = model.logits(h.detach()).double()
    dz = (torch.softmax(z, -1) - torch.nn.functional.one_hot(y, V).double()) / N
    expected_dh = dz @ model.output_embedding.detach().double()
    assert torch.allclose(h.grad.double(), expected_dh, atol=1e-6)


def explicit_kl(logits, y, L, tau, detach_ce_target, detach_entropy):
    """KL(y~ || y^) with y~ = softmax(L^T L[y] / tau), y^ = softmax(z / tau), as elementwise float64 ops."""
    L64, z64 = L.double(), logits.double()
    t = (L64[y] @ L64.t()) / tau
    y_tilde = torch.exp(t - t.logsumexp(-1, keepdim=True))
    log_y_hat = z64 / tau - (z64 / tau).logsumexp(-1, keepdim=True)
    y_ce = y_tilde.detach() if detach_ce_target else y_tilde
    y_ent = y_tilde.detach() if detach_entropy else y_tilde
    return (y_ent * torch.log(y_ent)).sum(-1) - (y_ce * log_y_hat).sum(-1)


@pytest.mark.parametrize("tau", [1.0, 2.5, 20.0])
def test_augmented_loss_equals_explicit_kl(tau):
    L = torch.randn(V, D)
    z = torch.randn(N, V) * 3
    y = torch.randint(0, V, (N,))
    ours = augmented_loss(z, y, L, tau, form="kl")
    ref = explicit_kl(z, y, L, tau, True, False)
    assert torch.allclose(ours.double(), ref, atol=1e-5)
    assert (ours >= -1e-6).all(), "a KL divergence is never negative"
    # the CE form differs from the KL form by the entropy of y~ exactly
    ce = augmented_loss(z, y, L, tau, form="ce")
    t = (L[y] @ L.t()) / tau
    entropy = -(torch.softmax(t, -1) * torch.log_softmax(t, -1)).sum(-1)
    assert torch.allclose(ce - ours, entropy, atol=1e-5)


@pytest.mark.parametrize("tau", [1.0, 20.0])
def test_augmented_loss_logit_gradient_is_eq_3_4(tau):
    """Inan et al. (2017) eq. 3.4: dJ_aug / dz = (y^ - y~) / tau."""
    L = torch.randn(V, D)
    z = (torch.randn(N, V) * 2).requires_grad_(True)
    y = torch.randint(0, V, (N,))
    augmented_loss(z, y, L, tau).sum().backward()
    y_hat = torch.softmax(z.detach() / tau, -1)
    y_tilde = torch.softmax((L[y] @ L.t()) / tau, -1)
    assert torch.allclose(z.grad, (y_hat - y_tilde) / tau, atol=1e-6)


@pytest.mark.parametrize(
    "target_grad,detach_ce,detach_ent", [("official", True, False), ("none", True, True), ("full", False, False)]
)
def test_augmented_loss_gradient_into_embedding(target_grad, detach_ce, detach_ent):
    """Each target_grad option against autograd of the explicit formula with the matching detaches."""
    L1 = torch.randn(V, D, dtype=torch.float64, requires_grad=True)
    L2 = L1.detach().clone().requires_grad_(True)
    h = torch.randn(N, D, dtype=torch.float64)
    y = torch.randint(0, V, (N,))
    # tied (REAL): the logits h L^T depend on L as well as the target distribution does
    augmented_loss(h @ L1.t(), y, L1, 3.0, "kl", target_grad).sum().backward()
    explicit_kl(h @ L2.t(), y, L2, 3.0, detach_ce, detach_ent).sum().backward()
    assert torch.allclose(L1.grad, L2.grad, atol=1e-9)
    # and the three options really differ
    L3 = L1.detach().clone().requires_grad_(True)
    other = "full" if target_grad != "full" else "none"
    augmented_loss(h @ L3.t(), y, L3, 3.0, "kl", other).sum().backward()
    assert not torch.allclose(L1.grad, L3.grad, atol=1e-6)


def test_the_ce_form_with_official_has_the_kl_forms_gradient_with_none():
    """docs/fidelity.md (Inan 2016): the CE form under ``official`` and the KL form under ``none`` differ only by y~'s
    negative entropy held constant, so their gradients (tied: the logits and the target both read L) are equal,
    and the KL form under ``official`` differs from both by that entropy's gradient alone. Hand-derived from the
    explicit formula: d/dL of sum y~ log y~ with y~ = softmax(L[y] L^T / tau), by autograd here."""
    torch.manual_seed(5)
    h = torch.randn(N, D, dtype=torch.float64)
    y = torch.randint(0, V, (N,))
    L0 = torch.randn(V, D, dtype=torch.float64)

    def grad(form, target_grad):
        L = L0.clone().requires_grad_(True)
        augmented_loss_mean(h @ L.t(), y, L, 2.0, form, target_grad).backward()
        return L.grad

    assert torch.allclose(grad("ce", "official"), grad("kl", "none"), atol=1e-12, rtol=0)
    L = L0.clone().requires_grad_(True)
    y_t = torch.softmax(L[y] @ L.t() / 2.0, -1)
    (y_t * torch.log(y_t)).sum(-1).mean().backward()  # the negative entropy's own gradient, the KL's only extra
    assert torch.allclose(grad("kl", "official") - grad("kl", "none"), L.grad, atol=1e-10, rtol=0)
    assert L.grad.abs().max() > 1e-3


@pytest.mark.parametrize("form", ["kl", "ce"])
@pytest.mark.parametrize("target_grad,detach_ce,detach_ent",
                         [("official", True, False), ("none", True, True), ("full", False, False)])
@pytest.mark.parametrize("tied", [True, False])
def test_the_batch_mean_form_equals_the_explicit_formula(form, target_grad, detach_ce, detach_ent, tied):
    """augmented_loss_mean (y~ once per distinct target, a hand-written backward) against autograd of the explicit
    float64 formula's mean: value, and the gradients of the embedding L and (untied) of the output matrix W, for each
    form and target_grad, with targets that repeat as words do in a batch (7 distinct of 12)."""
    torch.manual_seed(3)
    y = torch.tensor([3, 7, 3, 3, 11, 7, 0, 5, 3, 11, 1, 2])
    h = torch.randn(y.numel(), D, dtype=torch.float64)
    L1 = torch.randn(V, D, dtype=torch.float64, requires_grad=True)
    W1 = torch.randn(V, D, dtype=torch.float64, requires_grad=True)
    L2, W2 = (t.detach().clone().requires_grad_(True) for t in (L1, W1))
    ours = augmented_loss_mean(h @ (L1 if tied else W1).t(), y, L1, 2.5, form, target_grad)
    ref = explicit_kl(h @ (L2 if tied else W2).t(), y, L2, 2.5, detach_ce, detach_ent)
    if form == "ce":  # the KL less y~'s negative entropy
        y_ent = torch.softmax(L2[y] @ L2.t() / 2.5, -1)
        y_ent = y_ent.detach() if detach_ent else y_ent
        ref = ref - (y_ent * torch.log(y_ent)).sum(-1)
    ref = ref.mean()
    assert torch.allclose(ours, ref, atol=1e-12, rtol=0)
    (1.7 * ours).backward()
    (1.7 * ref).backward()
    for a, b in ((L1, L2), (W1, W2)):  # None: nothing depends on it (the reference's subtraction leaves ~1e-17)
        ga, gb = (t.grad if t.grad is not None else torch.zeros_like(t) for t in (a, b))
        assert torch.allclose(ga, gb, atol=1e-12, rtol=0)


def test_inan2016_target_is_softmax_of_LtLy():
    """Inan & Khosravi (2016) eq. 7-8: v = L^T (L y), y~ = softmax(v); our temperature-1 case."""
    L = torch.randn(V, D)
    z = torch.randn(N, V)
    y = torch.randint(0, V, (N,))
    onehot = torch.nn.functional.one_hot(y, V).float()
    v = onehot @ L @ L.t()  # row t: L^T (L y_t) in the paper's column layout
    y_tilde = torch.softmax(v, -1)
    kl = (y_tilde * (torch.log(y_tilde) - torch.log_softmax(z, -1))).sum(-1)
    assert torch.allclose(augmented_loss(z, y, L, 1.0, "kl"), kl, atol=1e-5)


def test_al_objective_combines_ce_and_weighted_kl():
    from omegaconf import OmegaConf

    model = TinyModel(tied=False)
    h = torch.randn(N, D)
    y = torch.randint(0, V, (N,))
    cfg = OmegaConf.create(
        {"name": "al", "alpha": 0.7, "temperature": 4.0, "form": "kl", "target_grad": "official", "tie_weights": False}
    )
    out = build_objective(cfg, V)(h, y, model)
    z = model.logits(h)
    expected = torch.nn.functional.cross_entropy(z, y) + 0.7 * explicit_kl(z, y, model.input_embedding, 4.0, True, False).mean()
    assert out.token_loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert out.nll.item() == pytest.approx(torch.nn.functional.cross_entropy(z, y).item(), rel=1e-6)


# ---- the chunked AL kernel (objective.chunk_rows with al/real): CE + AL from the hidden states ---------------------
@pytest.mark.parametrize("chunk", [1, 5, 64])  # one row, chunks that do not divide N, one chunk larger than N
@pytest.mark.parametrize("form,target_grad", [("kl", "official"), ("kl", "none"), ("ce", "official")])
@pytest.mark.parametrize("tied,bias", [(True, False), (False, True)])
@pytest.mark.parametrize("eps,w_ce,w_aug", [(0.0, 1.0, 0.7), (0.1, 0.4, 2.5)])
def test_chunked_augmented_loss_equals_the_explicit_formula(chunk, form, target_grad, tied, bias, eps, w_ce, w_aug):
    """chunked_augmented_loss against autograd of the explicit float64 objective, w_ce * CE_eps(y*, softmax(h W^T + b))
    + w_aug * mean_t KL(y~_t || y^_t) (ce form: without y~'s negative entropy), the detaches of ``target_grad``: its
    three outputs and the gradients of h, W (untied), b and L, with targets that repeat (7 distinct of 12)."""
    from repdegen.losses.al import chunked_augmented_loss

    torch.manual_seed(11)
    y = torch.tensor([3, 7, 3, 3, 11, 7, 0, 5, 3, 11, 1, 2])
    tau = 2.5
    leaves = [torch.randn(y.numel(), D, dtype=torch.float64), torch.randn(V, D, dtype=torch.float64),
              torch.randn(V, dtype=torch.float64) if bias else None, torch.randn(V, D, dtype=torch.float64)]

    def run(fn):
        h, W, b, L = (None if t is None else t.detach().clone().requires_grad_(True) for t in leaves)
        W_used = L if tied else W
        loss, *rest = fn(h, W_used, b, L)
        (1.3 * loss).backward()
        return [loss.detach(), *rest], [None if t is None or t.grad is None else t.grad for t in (h, W, b, L)]

    def ours(h, W, b, L):
        return chunked_augmented_loss(h, W, b, L, y, eps, tau, w_ce, w_aug, form, target_grad, chunk)

    def explicit(h, W, b, L):
        z = torch.nn.functional.linear(h, W, b)
        ce = torch.nn.functional.cross_entropy(z, y, label_smoothing=eps)
        aug = explicit_kl(z, y, L, tau, True, target_grad == "none")
        if form == "ce":
            y_ent = torch.softmax(L[y] @ L.t() / tau, -1)
            y_ent = y_ent.detach() if target_grad == "none" else y_ent
            aug = aug - (y_ent * torch.log(y_ent)).sum(-1)
        return w_ce * ce + w_aug * aug.mean(), torch.nn.functional.cross_entropy(z, y).detach(), aug.mean().detach()

    values, grads_ours = run(ours)
    ref_values, grads_ref = run(explicit)
    for a, b in zip(values, ref_values):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)
    assert not values[1].requires_grad and not values[2].requires_grad
    for name, a, b in zip("hWbL", grads_ours, grads_ref):
        if tied and name == "W":
            continue
        if a is None or b is None:  # nothing depends on it on one side: the other's is zero up to rounding
            assert (a if a is not None else b if b is not None else torch.zeros(1)).abs().max() < 1e-14, name
            continue
        assert torch.allclose(a, b, atol=1e-12, rtol=0), name


@pytest.mark.parametrize("name,tied", [("al", False), ("real", True)])
@pytest.mark.parametrize("beta", [None, 0.3])
def test_al_objectives_with_chunk_rows_equal_their_default_path(name, tied, beta):
    """Through the objectives: AL and REAL with objective.chunk_rows against the same objective without it (the
    logits, token_nll and augmented_loss_mean), in training mode: loss, the logged NLL and aug_loss, and every
    gradient; in eval mode chunk_rows takes the default path."""
    from omegaconf import OmegaConf

    torch.manual_seed(5)
    y = torch.randint(0, V, (N,))
    h0 = torch.randn(N, D, dtype=torch.float64)
    base = TinyOutputModel(V, D, tied, bias=not tied, dtype=torch.float64)
    results = []
    for chunk in (None, 4):
        model = TinyOutputModel(V, D, tied, bias=not tied, dtype=torch.float64)
        model.load_state_dict(base.state_dict())
        cfg = OmegaConf.create({"name": name, "alpha": 0.7, "temperature": 4.0, "form": "kl", "target_grad": "official",
                                "tie_weights": tied, "beta": beta, "chunk_rows": chunk})
        obj = build_objective(cfg, V, label_smoothing=0.05)
        h = h0.clone().requires_grad_(True)
        out = obj(h, y, model)
        out.token_loss.backward()
        results.append((out, h.grad, {k: p.grad for k, p in model.named_parameters()}))
        obj.eval()
        with torch.no_grad():
            assert obj(h0, y, model).token_loss.item() == pytest.approx(results[0][0].token_loss.item(), rel=1e-12)
    (a, ha, pa), (b, hb, pb) = results
    assert torch.allclose(a.token_loss, b.token_loss, atol=1e-12, rtol=0)
    assert a.nll.item() == pytest.approx(b.nll.item(), rel=1e-12)
    assert a.logs["aug_loss"].item() == pytest.approx(b.logs["aug_loss"].item(), rel=1e-12)
    assert torch.allclose(ha, hb, atol=1e-12, rtol=0)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.allclose(pa[k], pb[k], atol=1e-12, rtol=0), k


@pytest.mark.parametrize("form,target_grad", [("kl", "official"), ("kl", "none"), ("ce", "full")])
@pytest.mark.parametrize("beta,alpha", [(0.0, 0.7), (None, 0.0), (1.0, 0.7)])
def test_al_with_zero_weight_equals_the_weighted_sum_bitwise(beta, alpha, form, target_grad):
    """Where a term's weight is zero the objective does not form it: the augmented term at beta = 0 (Inan 2017
    eq. 6.1) or alpha = 0, the cross-entropy's gradient at beta = 1. Its loss and every gradient equal, bit for bit,
    those of the weighted sum with both terms formed (beta tau^2 |V| J_aug + (1 - beta) J, or J + alpha J_aug), in
    float32 as a training run has them."""
    from omegaconf import OmegaConf

    torch.manual_seed(6)
    y = torch.randint(0, V, (N,))
    h0 = torch.randn(N, D)
    base = TinyOutputModel(V, D, False, bias=True)
    cfg = OmegaConf.create({"name": "al", "alpha": alpha, "temperature": 4.0, "form": form, "target_grad": target_grad,
                            "beta": beta, "chunk_rows": None})
    obj = build_objective(cfg, V)
    grads, losses = [], []
    for formed in (False, True):
        model = TinyOutputModel(V, D, False, bias=True)
        model.load_state_dict(base.state_dict())
        h = h0.clone().requires_grad_(True)
        if formed:  # the weighted sum, term formed, as written in eq. 6.1 / eq. 3.7
            logits = model.logits(h)
            loss, _ = obj.token_nll(logits, y)
            aug = augmented_loss_mean(logits, y, model.input_embedding, 4.0, form, target_grad)
            total = (beta * 4.0**2 * V * aug + (1.0 - beta) * loss) if beta is not None else loss + alpha * aug
        else:
            out = obj(h, y, model)
            assert ("aug_loss" in out.logs) == (beta == 1.0)
            total = out.token_loss
        total.backward()
        losses.append(total.detach())
        grads.append([h.grad] + [p.grad for _, p in sorted(model.named_parameters())])
    assert torch.equal(losses[0], losses[1])
    for a, b in zip(*grads):
        assert (a is None and b is None) or torch.equal(a if a is not None else torch.zeros_like(b),
                                                        b if b is not None else torch.zeros_like(a))


def brute_cosreg(W):
    """gamma-free Gao eq. 6: 1/N^2 sum_i sum_{j != i} cos(w_i, w_j), as a double loop."""
    n = W.size(0)
    total = 0
    for i in range(n):
        for j in range(n):
            if i != j:
                total = total + torch.dot(W[i], W[j]) / (W[i].norm() * W[j].norm())
    return total / n**2


def test_cosreg_linear_form_equals_double_sum_value_and_gradient():
    W1 = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    W2 = W1.detach().clone().requires_grad_(True)
    fast, slow = cosine_regularizer(W1), brute_cosreg(W2)
    assert fast.item() == pytest.approx(slow.item(), abs=1e-12)
    fast.backward()
    slow.backward()
    assert torch.allclose(W1.grad, W2.grad, atol=1e-12)


def test_cosreg_objective_adds_gamma_times_regularizer_gradient_once_per_update():
    from omegaconf import OmegaConf

    model = TinyModel(tied=True)
    h = torch.randn(N, D)
    y = torch.randint(0, V, (N,))
    obj = build_objective(OmegaConf.create({"name": "cosreg", "gamma": 2.5, "tie_weights": True}), V)
    out = obj(h, y, model)
    # the token loss is plain cross-entropy: the penalty is not in it
    assert out.token_loss.item() == pytest.approx(torch.nn.functional.cross_entropy(model.logits(h), y).item(), rel=1e-6)
    W = model.output_embedding
    W2 = W.detach().double().clone().requires_grad_(True)
    brute = brute_cosreg(W2)
    brute.backward()
    W.grad = None
    obj.update_penalty(model, 0)
    # the objective computes in float32 (|sum w^_i|^2 - N cancels): agreement to float32 precision
    assert float(obj.last_penalty) == pytest.approx(brute.item(), rel=1e-4, abs=1e-6)
    assert torch.allclose(W.grad.double(), 2.5 * W2.grad, rtol=1e-4, atol=1e-7)
    before = W.grad.clone()
    obj.update_penalty(model, 1)  # adds to an existing gradient
    assert torch.allclose(W.grad, 2 * before, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("zero_row", [False, True])
def test_cosreg_closed_form_gradient_matches_autograd(zero_row):
    from repdegen.losses.cosreg import cosine_regularizer_and_grad

    torch.manual_seed(3)
    W = torch.randn(13, 5, dtype=torch.float64)
    if zero_row:
        W[4] = 0.0  # below eps: F.normalize's branch
    value, grad = cosine_regularizer_and_grad(W)
    W1 = W.clone().requires_grad_(True)
    ref = cosine_regularizer(W1)
    ref.backward()
    assert value.item() == pytest.approx(ref.item(), abs=1e-12)
    assert torch.allclose(grad, W1.grad, rtol=1e-9, atol=1e-9 * W1.grad.abs().max().item())


def test_identical_rows_give_maximal_regularizer():
    W = torch.ones(7, 3)
    assert cosine_regularizer(W).item() == pytest.approx((7 * 7 - 7) / 49)


def test_tying_an_incompatible_model_is_a_config_error():
    cfg = LSTMLMConfig(name="odd", hidden_size=16, embedding_size=8)
    with pytest.raises(ConfigError, match="embedding_size=8 and hidden_size=16"):
        build_model(cfg, vocab_size=20, tie_weights=True)
    build_model(cfg, vocab_size=20, tie_weights=False)  # untied is fine


def test_re_and_real_refuse_untying():
    from omegaconf import OmegaConf
    from repdegen.losses import validate_objective

    for name in ("re", "real"):
        cfg = OmegaConf.create(
            {"name": name, "tie_weights": False, "alpha": 1.0, "temperature": 1.0, "form": "kl", "target_grad": "official"}
        )
        with pytest.raises(ConfigError, match="tie_weights must stay true"):
            validate_objective(cfg)


def test_registry_has_the_papers_objectives():
    assert {"mle", "al", "re", "real", "cosreg"} <= set(objective_names())


def test_chunked_augmented_loss_under_bf16_autocast_is_close_to_float32():
    """Under CPU bf16 autocast (a GPU run's precision=bf16) the kernel runs, returns float32 gradients for float32
    leaves, and stays within bf16 rounding of its float32 result."""
    from repdegen.losses.al import chunked_augmented_loss

    torch.manual_seed(2)
    y = torch.randint(0, V, (N,))
    leaves = [torch.randn(N, D), torch.randn(V, D) * 0.5, torch.randn(V) * 0.1, torch.randn(V, D) * 0.5]

    def run():
        h, W, b, L = (t.clone().requires_grad_(True) for t in leaves)
        loss = chunked_augmented_loss(h, W, b, L, y, 0.0, 2.0, 1.0, 0.7, "kl", "official", 4)[0]
        loss.backward()
        return loss.detach().float(), [t.grad for t in (h, W, b, L)]

    ref_loss, ref = run()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low_loss, low = run()
    assert abs(low_loss.item() - ref_loss.item()) < 3e-2 * abs(ref_loss.item())
    for gl, gr in zip(low, ref):
        assert gl.dtype == gr.dtype == torch.float32
        assert torch.allclose(gl, gr, atol=3e-2 * gr.abs().max().item())


@pytest.mark.parametrize("chunk", [1, 3, 100])
@pytest.mark.parametrize("weighted", [False, True])
def test_target_entropy_by_brute_force(chunk, weighted):
    """AL's per-epoch diagnostic against a loop over the words in float64: H(softmax(L u_w / tau)) weighted."""
    from repdegen.losses.al import target_entropy

    g = torch.Generator().manual_seed(3)
    L = torch.randn(7, 4, generator=g, dtype=torch.float64) * 2
    counts = torch.tensor([50.0, 20, 10, 5, 3, 1, 0], dtype=torch.float64)
    w = counts / counts.sum() if weighted else torch.full((7,), 1 / 7, dtype=torch.float64)
    expected = 0.0
    for i in range(7):
        p = torch.softmax(torch.tensor([float(L[i] @ L[j]) / 3.0 for j in range(7)], dtype=torch.float64), 0)
        expected += float(w[i]) * -sum(float(q) * math.log(float(q)) for q in p)
    got = target_entropy(L, 3.0, w if weighted else None, chunk_rows=chunk)
    assert got == pytest.approx(expected, rel=1e-12)
    assert target_entropy(torch.zeros(7, 4), 20.0) == pytest.approx(math.log(7), rel=1e-6)  # y~ uniform


def test_target_entropy_above_its_sample_size_is_close_to_the_exact_mean():
    """Above ``samples`` words the mean is over words drawn systematically from the weights: close to the exact
    weighted mean (computed with a sample size above V), and the same on every call."""
    from repdegen.losses.al import target_entropy

    g = torch.Generator().manual_seed(4)
    V = 6000
    L = torch.randn(V, 16, generator=g) * torch.linspace(0.5, 3.0, V).unsqueeze(1)  # entropies differ by word
    counts = 1.0 / torch.arange(1, V + 1, dtype=torch.float64)  # Zipf
    w = counts / counts.sum()
    exact = target_entropy(L, 2.0, w, samples=V)
    sampled = target_entropy(L, 2.0, w)  # the default 2,048 words
    assert sampled == pytest.approx(exact, rel=0.01) and sampled != exact
    assert target_entropy(L, 2.0, w) == sampled
