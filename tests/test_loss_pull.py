"""scripts/loss_pull.py: its first-order description of a step against a finite step (singular values and row norms
recomputed), and its split of the augmented loss against the library's own form (losses/al.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import loss_pull  # noqa: E402
from repdegen.losses.al import augmented_loss  # noqa: E402


def test_first_order_matches_a_small_step():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(300, 20, generator=g, dtype=torch.float64) + 0.5  # a common component: s1 stands out
    G = torch.randn(300, 20, generator=g, dtype=torch.float64) * 0.1
    f = loss_pull.first_order(W, G, k=20)
    eps = 1e-6
    s0, s1 = torch.linalg.svdvals(W), torch.linalg.svdvals(W - eps * G)
    assert f["d_s1"] == pytest.approx(float(s1[0] - s0[0]) / eps, rel=1e-4)
    assert f["d_s_rest"] == pytest.approx(float((s1[1:] - s0[1:]).mean()) / eps, rel=1e-4)
    dn = float(((W - eps * G).norm(dim=1) - W.norm(dim=1)).mean()) / eps
    assert f["d_row_norm"] == pytest.approx(dn, rel=1e-4)
    m = W.mean(0) / W.mean(0).norm()
    assert f["share_along_mean_row"] == pytest.approx(float((G @ m).pow(2).sum() / G.pow(2).sum()))
    along = torch.outer(torch.ones(300, dtype=torch.float64), m)  # every row of G along the mean row
    assert loss_pull.first_order(W, along)["share_along_mean_row"] == pytest.approx(1.0)


@pytest.mark.parametrize("tied", [True, False])
def test_the_split_adds_up_to_the_library_augmented_loss(tied):
    """The two parts' gradients sum to that of repdegen.losses.al.augmented_loss (official target gradient, KL form) times
    alpha, on W and on L; untied, the entropy part does not reach W."""
    g = torch.Generator().manual_seed(1)
    V, d, N, alpha, tau = 50, 8, 30, 3.0, 2.0
    W = torch.randn(V, d, generator=g, dtype=torch.float64).requires_grad_()
    L = W if tied else torch.randn(V, d, generator=g, dtype=torch.float64).requires_grad_()
    h = torch.randn(N, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (N,), generator=g)
    b = None if tied else torch.randn(V, generator=g, dtype=torch.float64)
    parts, entropy = loss_pull.loss_parts(h, y, W, b, L, alpha, tau)
    ours = parts["AL cross-entropy part x alpha"] + parts["AL entropy part x alpha"]
    ref = alpha * augmented_loss(torch.nn.functional.linear(h, W, b), y, L, tau, "kl", "official").mean()
    params = [W] if tied else [W, L]
    for a, r in zip(torch.autograd.grad(ours, params, retain_graph=True), torch.autograd.grad(ref, params)):
        torch.testing.assert_close(a, r)
    if not tied:
        assert torch.autograd.grad(parts["AL entropy part x alpha"], W, allow_unused=True)[0] is None
    probs = torch.softmax(L.detach()[y] @ L.detach().t() / tau, -1)
    assert entropy == pytest.approx(float(-(probs * probs.log()).sum(-1).mean()))
    assert set(loss_pull.loss_parts(h, y, W, b, L, 0.0, tau)[0]) == {"cross-entropy"}
