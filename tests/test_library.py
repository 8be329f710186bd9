"""The objectives as a library (docs/library.md): the page's code blocks and the classes' docstring examples run,
``make_objective`` checks its options, and the objectives called through the public API against independent
computations: MLE against ``cross_entropy``, AGG with no rare token against MLE's gradient, AGG's gated gradient
against Yu et al. App. A eq. 23 row by row, CosReg's penalty against autograd of the pairwise cosines summed over
all pairs, and AGG's memory through ``state_dict`` against continuing with the original module."""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest
import torch
from repdegen.core.errors import ConfigError
from repdegen.losses import AGG, MLE, CosReg, OutputLayer, as_output_layer, make_objective, objective_names
from torch import nn

DOC = Path(__file__).resolve().parents[1] / "docs" / "library.md"
MODULES = ["repdegen.losses"] + [f"repdegen.losses.{m}" for m in
                                 ("mle", "agg", "cosreg", "ul", "ul_agg", "al", "sc", "adv_mle", "freeze")]
V, D, N = 12, 5, 30


def test_library_page_code_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 5
    namespace: dict = {"__name__": "library_doc"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{DOC.name} block {i + 1}", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "AGG's rare group after training" in printed and "I(W)" in printed
    assert namespace["rare"].any()  # the tail of the Zipf stream is rare under alpha = 0.5


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module):
    mod = importlib.import_module(module)
    results = doctest.testmod(mod, optionflags=doctest.ELLIPSIS, verbose=False)
    assert results.failed == 0
    assert results.attempted > 0


def test_every_objective_class_has_an_example():
    # re, real and ul_agg_gated: their parents' examples cover them
    names = ["adv_mle", "agg", "al", "cosreg", "freeze", "mle", "sc", "ul", "ul_agg"]
    assert set(names) | {"re", "real", "ul_agg_gated"} <= set(objective_names())
    for name in names:
        cls = type(make_objective(name, vocab_size=V))
        assert ">>>" in (cls.__doc__ or ""), f"{cls.__name__} has no docstring example"


def test_make_objective_errors_name_the_bad_value():
    with pytest.raises(ConfigError, match=r"alfa=0.03 \(did you mean alpha\?\).*alpha, gate1"):
        make_objective("agg", vocab_size=V, alfa=0.03)
    with pytest.raises(ConfigError, match=r"'ag'.*did you mean 'agg'"):
        make_objective("ag", vocab_size=V)
    with pytest.raises(ConfigError, match=r"alpha='big' is a str, expected float"):
        make_objective("agg", vocab_size=V, alpha="big")
    with pytest.raises(ConfigError, match=r"objective.alpha=-1.0 must be > 0"):
        make_objective("agg", vocab_size=V, alpha=-1)
    with pytest.raises(ConfigError, match=r"vocab_size=0"):
        make_objective("mle", vocab_size=0)
    with pytest.raises(ConfigError, match=r"label_smoothing=1.5"):
        make_objective("mle", vocab_size=V, label_smoothing=1.5)
    with pytest.raises(ConfigError, match=r"updates_per_epoch"):
        make_objective("agg", vocab_size=V).setup(special_ids=[0])
    with pytest.raises(ConfigError, match=r"neither output_embedding nor a 2-D weight"):
        as_output_layer(object())
    with pytest.raises(ConfigError, match=r"bias must be None or a \(12,\) tensor"):
        OutputLayer(torch.zeros(V, D), torch.zeros(3))
    agg = AGG.create(vocab_size=V, alpha=1, memory_updates=3)
    assert agg.cfg.alpha == 1.0 and isinstance(agg.cfg.alpha, float) and agg.memory_updates == 3


def data(seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, D, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(V, D, generator=g, dtype=torch.float64, requires_grad=True)
    b = (torch.randn(V, generator=g, dtype=torch.float64) * 0.1).requires_grad_(True) if bias else None
    y = torch.randint(0, V, (N,), generator=g)
    return h, W, b, y


def grads(loss, *tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


@pytest.mark.parametrize("head_kind", ["output_layer", "linear"])
def test_mle_is_cross_entropy_of_the_logits(head_kind):
    h, W, b, y = data()
    if head_kind == "linear":  # an nn.Linear LM head, as a Hugging Face model's get_output_embeddings()
        lin = nn.Linear(D, V).double()
        with torch.no_grad():
            lin.weight.copy_(W)
            lin.bias.copy_(b)
        W, b, head = lin.weight, lin.bias, lin
    else:
        head = OutputLayer(W, b)
    out = MLE.create(vocab_size=V)(h, y, head)
    ref = nn.functional.cross_entropy(h @ W.t() + b, y)
    torch.testing.assert_close(out.token_loss, ref)
    torch.testing.assert_close(out.nll, ref.detach())
    for got, want in zip(grads(out.token_loss, h, W, b), grads(ref, h, W, b)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("implementation", ["fused", "literal"])
def test_agg_without_rare_tokens_is_mle(implementation):
    """Every id special: no rare group, all gates 1, so the gradient is the softmax's (the value is 2 x NLL)."""
    h, W, b, y = data(1)
    agg = AGG.create(vocab_size=V, alpha=0.03, memory_updates=4, implementation=implementation)
    agg.setup(special_ids=list(range(V)))
    out = agg(h, y, OutputLayer(W, b), step=0)
    assert int(out.logs["rare_count"]) == 0
    ref = nn.functional.cross_entropy(h @ W.t() + b, y)
    torch.testing.assert_close(out.nll, ref.detach())
    torch.testing.assert_close(out.token_loss, 2 * ref)
    for got, want in zip(grads(out.token_loss, h, W, b), grads(ref, h, W, b)):
        torch.testing.assert_close(got, want)


def test_agg_gated_gradient_is_yu_eq_23():
    """The gradient of row r of W: (p_ri - 1) h_i where y_i = r; g1_r p_ri h_i where y_i is not rare; g2_r p_ri h_i
    otherwise (rare r only; frequent r: the softmax gradient); h and b get the softmax gradient (b gated like W)."""
    h, W, b, y = data(2)
    y = torch.where(y < 8, y % 3, y)  # ids 0-2 frequent, 8-11 rare-ish, 3-7 unseen
    agg = AGG.create(vocab_size=V, alpha=1.5, memory_updates=2)
    agg.setup(special_ids=[])
    out = agg(h, y, OutputLayer(W, b), step=0)
    a, rare = agg.groups(0)
    counts = torch.bincount(y, minlength=V).double()
    torch.testing.assert_close(a, counts)  # one update in memory: the appearance is the count
    assert torch.equal(rare, counts < 1.5)
    mean_rare = a[rare].mean()
    g1 = torch.where(rare, a.clamp(max=1.0), 1.0)
    g2 = torch.where(rare, (a / mean_rare).clamp(max=1.0), 1.0)
    with torch.no_grad():
        p = torch.softmax(h @ W.t() + b, dim=1)
        gz = p.clone()
        gz[torch.arange(N), y] -= 1.0
        gate = torch.where(rare[y].unsqueeze(1), g2.unsqueeze(0), g1.unsqueeze(0)).expand(N, V).clone()
        gate[torch.arange(N), y] = 1.0
        grad_W = torch.zeros(V, D, dtype=torch.float64)
        grad_b = torch.zeros(V, dtype=torch.float64)
        for i in range(N):
            for r in range(V):
                grad_W[r] += gate[i, r] * gz[i, r] * h[i] / N
                grad_b[r] += gate[i, r] * gz[i, r] / N
        grad_h = gz @ W / N
    got_h, got_W, got_b = grads(out.token_loss, h, W, b)
    torch.testing.assert_close(got_h, grad_h)
    torch.testing.assert_close(got_W, grad_W)
    torch.testing.assert_close(got_b, grad_b)


def test_cosreg_penalty_is_the_gradient_of_all_pairwise_cosines():
    h, W, b, y = data(3)
    gamma = 0.7
    W = nn.Parameter(W.detach().clone())
    head = OutputLayer(W, b)
    cosreg = CosReg.create(vocab_size=V, gamma=gamma)
    cosreg(h, y, head, 0).token_loss.backward()
    nll_grad = W.grad.clone()
    cosreg.update_penalty(head, step=0)
    w = W.detach().clone().requires_grad_(True)
    total = sum(torch.dot(w[i], w[j]) / (w[i].norm() * w[j].norm()) for i in range(V) for j in range(V) if i != j)
    R = total / V**2  # Gao et al. eq. 6: 1 / N^2 over the ordered pairs i != j
    (dR,) = torch.autograd.grad(R, w)
    torch.testing.assert_close(W.grad, nll_grad + gamma * dR)
    torch.testing.assert_close(cosreg.last_penalty.double(), R.detach())
    torch.testing.assert_close(cosreg(h, y, head, 1).token_loss, nn.functional.cross_entropy(h @ W.t() + b, y))


def train_agg(agg, W, steps, seed, pass_step):
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        for _ in range(2):  # two micro-batches an update
            y = torch.randint(0, 6, (N,), generator=g)
            h = torch.randn(N, D, generator=g, dtype=torch.float64)
            agg(h, y, OutputLayer(W), step if pass_step else None)
        agg.after_update(OutputLayer(W), step if pass_step else None)


@pytest.mark.parametrize("pass_step", [True, False])
def test_agg_state_dict_resumes_the_same_gates(pass_step):
    """Train a few updates, save, load into a fresh module, and gate the next batch: the same groups, gates and
    gradients as the original module continuing (K = 3 < the updates done, so the ring has wrapped)."""
    opts = dict(alpha=2.0, memory_updates=3)
    W = torch.randn(V, D, dtype=torch.float64, requires_grad=True)
    original = AGG.create(vocab_size=V, **opts)
    original.setup(special_ids=[0])
    train_agg(original, W, steps=5, seed=4, pass_step=pass_step)
    state = {k: v.clone() for k, v in original.state_dict().items()}
    assert set(state) == {"counts", "total", "slot_step", "special", "static_rare"}
    resumed = AGG.create(vocab_size=V, **opts)  # no setup: K and the specials come with the state
    resumed.load_state_dict(state)
    assert resumed.current_step() == original.current_step() == 5
    g = torch.Generator().manual_seed(5)
    y = torch.randint(0, V, (N,), generator=g)
    h = torch.randn(N, D, generator=g, dtype=torch.float64, requires_grad=True)
    step = 5 if pass_step else None
    outs, results = [], []
    for agg in (original, resumed):
        out = agg(h, y, OutputLayer(W), step)  # training mode: counts the batch into the memory, then gates
        outs.append(out)
        agg.eval()  # read the groups and gates without counting the batch again
        results.append((agg.groups(5), agg.gates(y, 5, torch.float64)[:3], grads(out.token_loss, h, W)))
        agg.train()
    (a0, r0), gates0, g0 = results[0]
    (a1, r1), gates1, g1 = results[1]
    torch.testing.assert_close(a0, a1)
    assert torch.equal(r0, r1) and r0.any() and not r0.all()
    for x0, x1 in zip(gates0, gates1):
        torch.testing.assert_close(x0, x1)
    for x0, x1 in zip(g0, g1):
        torch.testing.assert_close(x0, x1)
    assert int(outs[0].logs["rare_count"]) == int(outs[1].logs["rare_count"])
    for key in state:
        assert torch.equal(original.state_dict()[key], resumed.state_dict()[key]), key


def test_agg_own_step_count_matches_explicit_steps():
    W = torch.randn(V, D, dtype=torch.float64)
    explicit, counted = (AGG.create(vocab_size=V, alpha=2.0, memory_updates=3) for _ in range(2))
    for agg in (explicit, counted):
        agg.setup(special_ids=[0])
    train_agg(explicit, W, steps=4, seed=6, pass_step=True)
    train_agg(counted, W, steps=4, seed=6, pass_step=False)
    for key, value in explicit.state_dict().items():
        assert torch.equal(value, counted.state_dict()[key]), key
