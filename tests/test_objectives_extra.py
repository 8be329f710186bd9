"""Unlikelihood, Adv MLE and spectrum control against independent computations: a per-token Python loop over
each sequence's previous targets (Welleck et al. 2020), the closed-form adversarial target logit
w_y.h - eps ||w_y|| ||h|| (Wang, Gong & Liu 2019), NumPy's SVD and the analytic gradient sum_k 2 (s_k - p_k) u_k v_k^T
(Wang et al. 2020); then one smoke epoch of each through the trainer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from repdegen.losses import TokenLayout, build_objective, objective_names, validate_objective
from repdegen.losses.adv_mle import adversarial_target_shift
from repdegen.losses.sc import spectrum_penalty, spectrum_prior
from repdegen.losses.ul import unlikelihood_candidates, unlikelihood_token_sum
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.train import train
from torch.nn import functional as F

from tests.tiny import TinyOutputModel

V, D = 7, 5


def TinyModel(tied: bool = True, bias: bool = True, dtype=torch.float32, v: int = V, d: int = D) -> TinyOutputModel:
    """Just an output layer: logits = h W^T + b, W = the input embedding when tied."""
    return TinyOutputModel(v, d, tied, bias, dtype)


def make(name: str, **fields):
    base = {"name": name, "tie_weights": None}
    return build_objective(OmegaConf.create({**base, **fields}), V)


# --------------------------------------------------------------------------------------------------
# unlikelihood
# --------------------------------------------------------------------------------------------------
def brute_candidates(targets, seq, pos) -> list[set[int]]:
    """C_t = {targets of earlier positions of the same sequence} - {y_t}, row by row."""
    out = []
    for i in range(len(targets)):
        prev = {int(targets[j]) for j in range(len(targets)) if int(seq[j]) == int(seq[i]) and int(pos[j]) < int(pos[i])}
        out.append(prev - {int(targets[i])})
    return out


def brute_ul_sum(logits, targets, seq, pos):
    """sum_t sum_{c in C_t} -log(max(1 - p_t(c), 1e-5)), one token and one candidate at a time."""
    total = logits.sum() * 0
    for i, cands in enumerate(brute_candidates(targets, seq, pos)):
        p = torch.softmax(logits[i], -1)
        for c in sorted(cands):
            total = total - torch.log(torch.clamp(1 - p[c], min=1e-5))
    return total


def padded_layout(lengths, v=V, pad=None, left=False, seed=0):
    """Translation-style: (B, T) targets with padding after (or before) each sentence, few token types."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    pad = v if pad is None else pad
    target = torch.full((len(lengths), T), pad, dtype=torch.long)
    for b, n in enumerate(lengths):
        cols = slice(T - n, T) if left else slice(0, n)
        target[b, cols] = torch.randint(0, v, (n,), generator=g)
    mask = target != pad
    return target[mask], TokenLayout.from_mask(mask)


def time_major_layout(T, B, v=V, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, v, (T, B), generator=g)
    return y.reshape(-1), TokenLayout.time_major(T, B)


LAYOUTS = {
    "translation": lambda: padded_layout([5, 1, 7, 3, 6]),
    "left_padded": lambda: padded_layout([4, 7, 2], left=True, seed=3),
    "bptt": lambda: time_major_layout(9, 3, seed=1),
    "bptt_one_column": lambda: time_major_layout(12, 1, seed=2),
}


def test_candidates_by_hand():
    """Sequence a b a c b: C = {}, {a}, {b}, {a, b}, {a, c} (the current target excluded, a counted once)."""
    a, b, c = 2, 4, 1
    targets = torch.tensor([a, b, a, c, b])
    layout = TokenLayout(torch.zeros(5, dtype=torch.long), torch.arange(5), 1)
    cand, valid = unlikelihood_candidates(targets, layout)
    got = [sorted(cand[t][valid[t]].tolist()) for t in range(5)]
    assert got == [[], [a], [b], sorted([a, b]), sorted([a, c])]
    assert all(len(set(row)) == len(row) for row in got), "each candidate once"


@pytest.mark.parametrize("which", sorted(LAYOUTS))
def test_candidates_equal_brute_force(which):
    targets, layout = LAYOUTS[which]()
    cand, valid = unlikelihood_candidates(targets, layout)
    got = [sorted(cand[t][valid[t]].tolist()) for t in range(len(targets))]
    assert all(len(set(row)) == len(row) for row in got)
    expected = [sorted(s) for s in brute_candidates(targets, layout.seq, layout.pos)]
    assert got == expected
    # the first position of every sequence has none
    for t in range(len(targets)):
        if int(layout.pos[t]) == int(layout.pos[layout.seq == layout.seq[t]].min()):
            assert got[t] == []


def test_candidates_never_cross_sequences():
    """Two sequences with disjoint vocabularies: no row has a candidate from the other sequence."""
    targets = torch.tensor([0, 1, 0, 1, 5, 6, 5, 6])
    layout = TokenLayout.time_major(4, 2)  # rows t*2 + b: column 0 = 0 0 5 5, column 1 = 1 1 6 6
    cand, valid = unlikelihood_candidates(targets, layout)
    for t in range(8):
        mine = set(targets[layout.seq == layout.seq[t]].tolist())
        assert set(cand[t][valid[t]].tolist()) <= mine


@pytest.mark.parametrize("which", sorted(LAYOUTS))
def test_unlikelihood_value_and_gradient_equal_brute_force(which):
    targets, layout = LAYOUTS[which]()
    z1 = (torch.randn(len(targets), V, dtype=torch.float64) * 2).requires_grad_(True)
    z2 = z1.detach().clone().requires_grad_(True)
    fast, slow = unlikelihood_token_sum(z1, targets, layout), brute_ul_sum(z2, targets, layout.seq, layout.pos)
    assert slow.item() > 0
    assert fast.item() == pytest.approx(slow.item(), rel=1e-12)
    fast.backward()
    slow.backward()
    assert torch.allclose(z1.grad, z2.grad, atol=1e-12)


def test_unlikelihood_clamps_at_1e5():
    """A candidate with p ~ 1 costs -log(1e-5) and passes no gradient (the clamp of the official code)."""
    targets = torch.tensor([3, 5])
    layout = TokenLayout(torch.zeros(2, dtype=torch.long), torch.arange(2), 1)
    z = torch.zeros(2, V, dtype=torch.float64)
    z[1, 3] = 100.0  # position 1 puts all its mass on the previous target 3
    z.requires_grad_(True)
    value = unlikelihood_token_sum(z, targets, layout)
    assert value.item() == pytest.approx(-math.log(1e-5))
    value.backward()
    assert torch.count_nonzero(z.grad) == 0


@pytest.mark.parametrize("which", ["translation", "bptt"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_ul_objective_equals_brute_force_through_the_model(which, smoothing):
    """token_loss = smoothed NLL + alpha / N * sum UL; gradients w.r.t. h and W equal the brute force's."""
    targets, layout = LAYOUTS[which]()
    n = len(targets)
    torch.manual_seed(0)
    model = TinyModel(tied=True, dtype=torch.float64)
    h1 = torch.randn(n, D, dtype=torch.float64, requires_grad=True)
    h2 = h1.detach().clone().requires_grad_(True)
    obj = make("ul", alpha=0.7)
    obj.label_smoothing = smoothing
    out = obj(h1, targets, model, layout=layout)
    z = model.logits(h2)
    nll = F.cross_entropy(z, targets)
    smooth_nll = F.cross_entropy(z, targets, label_smoothing=smoothing)
    ul = brute_ul_sum(z, targets, layout.seq, layout.pos) / n
    expected = smooth_nll + 0.7 * ul
    assert out.token_loss.item() == pytest.approx(expected.item(), rel=1e-10)
    assert out.nll.item() == pytest.approx(nll.item(), rel=1e-10)
    assert out.logs["ul_loss"].item() == pytest.approx(ul.item(), rel=1e-10)
    assert not out.logs["ul_loss"].requires_grad and not out.nll.requires_grad
    out.token_loss.backward()
    w_grad = model.embedding.weight.grad.clone()
    model.embedding.weight.grad = None
    expected.backward()
    assert torch.allclose(h1.grad, h2.grad, atol=1e-10)
    assert torch.allclose(w_grad, model.embedding.weight.grad, atol=1e-10)


def test_ul_with_alpha_zero_is_mle():
    targets, layout = LAYOUTS["translation"]()
    model = TinyModel(tied=False)
    h1 = torch.randn(len(targets), D, requires_grad=True)
    h2 = h1.detach().clone().requires_grad_(True)
    ul = make("ul", alpha=0.0)(h1, targets, model, layout=layout)
    mle = make("mle")(h2, targets, model)
    # float32 losses computed by two code paths: equal to a few ulps (1e-7 relative is one ulp; a CPU whose kernels
    # round differently gave 1.2e-7)
    assert ul.token_loss.item() == pytest.approx(mle.token_loss.item(), rel=1e-6)
    ul.token_loss.backward()
    mle.token_loss.backward()
    assert torch.allclose(h1.grad, h2.grad, atol=1e-7)


def test_ul_needs_a_layout_and_checks_alpha():
    model = TinyModel()
    with pytest.raises(ValueError, match="needs the sequence layout"):
        make("ul", alpha=1.0)(torch.randn(3, D), torch.tensor([0, 1, 2]), model)
    with pytest.raises(ConfigError, match="objective.alpha=-1"):
        validate_objective(OmegaConf.create({"name": "ul", "alpha": -1.0, "tie_weights": None}))


# --------------------------------------------------------------------------------------------------
# Adv MLE
# --------------------------------------------------------------------------------------------------
def mixed_sign_hidden(model, targets, signs, seed=0):
    """h_t = sign_t * w_{y_t} + noise: cos(h_t, w_{y_t}) has the sign of sign_t."""
    g = torch.Generator().manual_seed(seed)
    w = model.output_embedding.detach()[targets]
    return signs.unsqueeze(1) * w + 0.1 * torch.randn(w.shape, generator=g, dtype=w.dtype)


def hand_perturbed_logits(model, h, targets, eps, relative):
    """z with z[t, y_t] -= eps_t ||h_t|| where cos(h_t, w_{y_t}) > 0, eps_t = eps ||w_{y_t}|| (relative) or eps."""
    z = model.logits(h).detach().clone()
    W = model.output_embedding.detach()
    for t in range(len(targets)):
        w, ht = W[targets[t]], h[t].detach()
        if torch.dot(w, ht) > 0:
            radius = eps * (w.norm() if relative else 1.0)
            z[t, targets[t]] -= radius * ht.norm()
    return z


@pytest.mark.parametrize("relative", [True, False])
def test_adv_target_logit_equals_the_closed_form(relative):
    torch.manual_seed(1)
    model = TinyModel(tied=True, dtype=torch.float64)
    targets = torch.tensor([0, 3, 3, 5, 0, 6, 3, 2])  # duplicates: each row still gets its own delta
    signs = torch.tensor([1.0, 1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0], dtype=torch.float64)
    h = mixed_sign_hidden(model, targets, signs)
    eps = 0.05
    shift, active = adversarial_target_shift(h, targets, model.output_embedding, eps, relative)
    assert active.tolist() == (signs > 0).tolist()
    W = model.output_embedding.detach()
    for t in range(len(targets)):
        radius = eps * (W[targets[t]].norm() if relative else 1.0)
        expected = -radius * h[t].norm() if signs[t] > 0 else 0.0
        assert float(shift[t]) == pytest.approx(float(expected), rel=1e-7, abs=1e-12)
    # the objective: NLL of the hand-perturbed logits (other logits untouched); nll = plain NLL
    out = make("adv_mle", eps=eps, relative=relative)(h, targets, model)
    hand = hand_perturbed_logits(model, h, targets, eps, relative)
    plain = model.logits(h).detach()
    changed = (hand != plain)
    assert changed.sum() == (signs > 0).sum() and changed[torch.arange(len(targets)), targets].sum() == changed.sum()
    assert out.token_loss.item() == pytest.approx(F.cross_entropy(hand, targets).item(), rel=1e-9)
    assert out.nll.item() == pytest.approx(F.cross_entropy(plain, targets).item(), rel=1e-9)
    assert out.token_loss.item() > out.nll.item(), "a worst-case perturbation raises the loss"


@pytest.mark.parametrize("tied", [True, False])
def test_adv_gradient_is_that_of_the_closed_form_with_detached_radius(tied):
    """d/dh of h.delta (delta constant) = d/dh of -eps ||w_y|| ||h|| (||w_y|| detached); nothing extra to W."""
    torch.manual_seed(2)
    model = TinyModel(tied=tied, dtype=torch.float64)
    targets = torch.tensor([1, 4, 4, 6, 0, 2])
    h1 = mixed_sign_hidden(model, targets, torch.tensor([1.0, 1.0, -1.0, 1.0, 1.0, -1.0], dtype=torch.float64))
    h1.requires_grad_(True)
    h2 = h1.detach().clone().requires_grad_(True)
    eps = 0.1
    out = make("adv_mle", eps=eps, relative=True)(h1, targets, model)
    out.token_loss.backward()
    grads1 = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    z = model.logits(h2)
    W = model.output_embedding
    rows = torch.arange(len(targets))
    cos_pos = ((h2 * W[targets]).sum(1) > 0).detach()
    shift = -eps * W[targets].detach().norm(dim=1) * h2.norm(dim=1) * cos_pos
    F.cross_entropy(z.index_put((rows, targets), shift, accumulate=True), targets).backward()
    grads2 = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert torch.isfinite(h1.grad).all() and all(torch.isfinite(g).all() for g in grads1)
    assert torch.allclose(h1.grad, h2.grad, atol=1e-8)
    assert len(grads1) == len(grads2) and all(torch.allclose(a, b, atol=1e-8) for a, b in zip(grads1, grads2))


def test_adv_in_eval_mode_is_mle_and_gradients_are_finite():
    model = TinyModel(tied=True)
    targets = torch.randint(0, V, (10,))
    h = torch.randn(10, D, requires_grad=True)
    obj = make("adv_mle", eps=0.005, relative=True)
    obj.eval()
    out = obj(h, targets, model)
    assert out.token_loss.item() == pytest.approx(F.cross_entropy(model.logits(h), targets).item(), rel=1e-6)  # float32
    obj.train()
    out = obj(h, targets, model)
    out.token_loss.backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(model.embedding.weight.grad).all()
    # h = 0 (cos undefined): no perturbation, no NaN
    shift, active = adversarial_target_shift(torch.zeros(2, D), torch.tensor([1, 2]), model.output_embedding, 0.1)
    assert torch.equal(shift, torch.zeros(2)) and not active.any()
    with pytest.raises(ConfigError, match="objective.eps=-0.1"):
        validate_objective(OmegaConf.create({"name": "adv_mle", "eps": -0.1, "relative": True, "tie_weights": None}))


def test_adv_perturbation_survives_bf16_autocast():
    """The shift is applied in float32 to the bf16 logits (in bf16 it would round away at |z| ~ 10)."""
    torch.manual_seed(4)
    model = TinyModel(tied=True, bias=False)
    with torch.no_grad():
        model.embedding.weight.mul_(3.0)
    targets = torch.tensor([0, 1, 2, 3, 4, 5])
    h = mixed_sign_hidden(model, targets, torch.ones(6))
    eps = 0.002
    obj = make("adv_mle", eps=eps, relative=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = obj(h, targets, model)
        z = model.logits(h).float()
    shift, _ = adversarial_target_shift(h, targets, model.output_embedding, eps)
    hand = z.index_put((torch.arange(6), targets), shift.detach(), accumulate=True)
    assert out.token_loss.dtype == torch.float32
    assert out.token_loss.item() == pytest.approx(F.cross_entropy(hand, targets).item(), rel=1e-6)
    assert out.token_loss.item() > out.nll.item()


# --------------------------------------------------------------------------------------------------
# spectrum control
# --------------------------------------------------------------------------------------------------
SC_DEFAULTS = {"prior": "polynomial", "c1": 1.0, "c2": 0.08, "gamma": 0.3, "lambda_prior": 1.0, "normalize": "max", "every": 1}


def numpy_prior(d, prior, c1, c2, gamma):
    k = np.arange(1, d + 1, dtype=np.float64)
    return c1 * k**-gamma if prior == "polynomial" else c1 * np.exp(-c2 * k**gamma)


def test_priors_have_the_papers_shapes():
    k = np.arange(1, 65)
    poly = spectrum_prior(64, "polynomial", 2.0, 0.0, 0.5).double().numpy()
    expo = spectrum_prior(64, "exponential", 2.0, 0.1, 0.7).double().numpy()
    assert np.allclose(poly, 2.0 / np.sqrt(k), rtol=1e-6) and np.allclose(expo, 2.0 * np.exp(-0.1 * k**0.7), rtol=1e-6)
    for p in (poly, expo):
        assert p[0] == pytest.approx(2.0 if p is poly else 2.0 * math.exp(-0.1)) and (np.diff(p) < 0).all()
    assert np.allclose(spectrum_prior(8, "polynomial", 1.5, 0.0, 0.0).numpy(), 1.5), "gamma = 0: a flat spectrum"
    # the defaults decay slowly: half by k = 10, about 0.15 by k = 512
    default = spectrum_prior(512, "polynomial", 1.0, 0.08, 0.3).numpy()
    assert default[9] == pytest.approx(0.5, abs=0.01) and default[-1] == pytest.approx(0.154, abs=0.005)


@pytest.mark.parametrize("prior", ["polynomial", "exponential"])
@pytest.mark.parametrize("normalize", ["max", "none"])
@pytest.mark.parametrize("shape", [(40, 6), (5, 9)])
def test_spectrum_penalty_equals_numpy_svd(prior, normalize, shape):
    W = torch.randn(*shape) * 0.3
    s = np.linalg.svd(W.double().numpy(), compute_uv=False)
    if normalize == "max":
        s = s / s[0]
    p = numpy_prior(min(shape), prior, 1.2, 0.2, 0.6)
    expected = ((s - p) ** 2).sum()
    prior_t = spectrum_prior(min(shape), prior, 1.2, 0.2, 0.6)
    assert spectrum_penalty(W, prior_t, normalize).item() == pytest.approx(expected, rel=1e-5)


def test_spectrum_penalty_gradient_is_sum_2_residual_u_v():
    """Unnormalised: dR/dW = sum_k 2 (s_k - p_k) u_k v_k^T."""
    W = (torch.randn(30, 6) * 0.5).requires_grad_(True)
    prior = spectrum_prior(6, "polynomial", 1.0, 0.0, 0.5)
    spectrum_penalty(W, prior, "none").backward()
    u, s, vt = np.linalg.svd(W.detach().double().numpy(), full_matrices=False)
    expected = (u * (2 * (s - prior.double().numpy()))) @ vt
    assert np.allclose(W.grad.double().numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("normalize", ["max", "none"])
@pytest.mark.parametrize("prior", ["polynomial", "exponential"])
def test_a_small_gradient_step_lowers_the_penalty(normalize, prior):
    torch.manual_seed(3)
    # an anisotropic matrix (one dominant direction, fast-decaying spectrum): far from the prior
    W = (torch.randn(50, 8) @ torch.diag(torch.logspace(0, -3, 8))).requires_grad_(True)
    prior_t = spectrum_prior(8, prior, 1.0, 0.3, 0.5)
    before = spectrum_penalty(W, prior_t, normalize)
    before.backward()
    with torch.no_grad():
        after = spectrum_penalty(W - 1e-3 * W.grad, prior_t, normalize)
    assert after.item() < before.item()
    # and many steps move the normalised spectrum toward the prior
    if normalize == "max":
        V_ = W.detach().clone().requires_grad_(True)
        opt = torch.optim.SGD([V_], lr=0.05)
        for _ in range(300):
            opt.zero_grad()
            spectrum_penalty(V_, prior_t, "max").backward()
            opt.step()
        assert spectrum_penalty(V_, prior_t, "max").item() < 0.1 * before.item()


def test_sc_objective_adds_the_penalty_gradient_once_every_updates():
    model = TinyModel(tied=True, v=20, d=D)
    h = torch.randn(6, D)
    y = torch.randint(0, 20, (6,))
    fields = {**SC_DEFAULTS, "lambda_prior": 3.0, "every": 2}
    obj = build_objective(OmegaConf.create({"name": "sc", "tie_weights": None, **fields}), 20)
    prior = numpy_prior(D, "polynomial", 1.0, 0.08, 0.3)
    W = model.output_embedding.detach().double().numpy()
    u, s, vt = np.linalg.svd(W, full_matrices=False)
    # lazy regularization: on the updates that compute it, the penalty is x every (2), so its mean is lambda's
    expected = (((s / s[0]) - prior) ** 2).sum()
    # d sigma_k / dW = u_k v_k^T; P = sum_k (s_k / s_1 - prior_k)^2
    r = 2 * ((s / s[0]) - prior)
    grad = sum(r[k] * (np.outer(u[:, k], vt[k]) / s[0] - s[k] / s[0] ** 2 * np.outer(u[:, 0], vt[0]))
               for k in range(len(s)))
    ce = F.cross_entropy(model.logits(h), y).item()
    for step in range(4):
        out = obj(h, y, model, step)
        assert out.token_loss.item() == pytest.approx(ce, rel=1e-6)
        model.output_embedding.grad = None
        obj.update_penalty(model, step)
        g = model.output_embedding.grad
        if step % 2 == 0:
            assert float(obj.last_penalty) == pytest.approx(expected, rel=1e-5)
            np.testing.assert_allclose(g.double().numpy(), 2 * 3.0 * grad, rtol=1e-3, atol=1e-5)
        else:
            assert g is None


@pytest.mark.parametrize("field,value,message", [
    ("prior", "gaussian", "objective.prior='gaussian'"),
    ("normalize", "l2", "objective.normalize='l2'"),
    ("c1", 0.0, "objective.c1=0.0"),
    ("gamma", -1.0, "objective.gamma=-1.0"),
    ("lambda_prior", -1.0, "objective.lambda_prior=-1.0"),
    ("every", 0, "objective.every=0"),
])
def test_sc_config_errors(field, value, message):
    cfg = OmegaConf.create({"name": "sc", "tie_weights": None, **{**SC_DEFAULTS, field: value}})
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        validate_objective(cfg)


# --------------------------------------------------------------------------------------------------
# end to end
# --------------------------------------------------------------------------------------------------
def test_registry_has_the_new_objectives():
    assert {"ul", "adv_mle", "sc"} <= set(objective_names())


@pytest.mark.parametrize("objective", ["ul", "adv_mle", "sc"])
def test_one_smoke_epoch_through_the_trainer(compose_cfg, objective):
    rec = train(compose_cfg("model=vd_lstm_small", "scale=smoke", f"objective={objective}", "objective.tie_weights=true"))
    assert rec["status"] == "complete" and rec["parameters"]["tie_weights"] is True
    assert rec["config"]["objective"]["name"] == objective
    assert math.isfinite(rec["metrics"]["final"]["test_ppl"]) and len(rec["history"]) == 1


def test_ul_smoke_epoch_on_padded_translation_batches(tmp_path):
    """The translation task passes TokenLayout.from_mask(target != pad): UL over padded target sentences."""
    from tests.test_transformer_train import MT, compose_train, sentences, to_german, write_multi30k

    root = write_multi30k(tmp_path / "mt", sentences(120, 0), sentences(10, 1), sentences(10, 2), to_german)
    cfg = compose_train(*MT, "scale=smoke", "objective=ul", "trainer.max_updates=4", "trainer.generation.bleu_splits=[]",
                        data_dir=root, output_dir=tmp_path / "out")
    rec = train(cfg)
    assert rec["status"] == "complete" and math.isfinite(rec["metrics"]["final"]["test_ppl"])
    assert rec["history"][-1]["updates"] == 4 and math.isfinite(rec["history"][-1]["train_nll"])
