"""Spectrum control (SC), Wang, Huang, Huang, Hu, Wang & Gu (ICLR 2020), "Improving neural language
generation with spectrum control"; the "SC" row of Yu et al. (2022) Table 7.

The paper reparameterises the output embedding W (V x d) as W = U diag(sigma) V^T with U (V x d) and
V (d x d) kept near-orthogonal by lambda1 ||U^T U - I||_F^2 + lambda2 ||V^T V - I||_F^2 (plus spectral-norm
versions), and pulls the singular values toward a slowly decaying prior:

    exponential:  prior_k = c1 * exp(-c2 * k^gamma)        (the paper's choice for WikiText-2)
    polynomial:   prior_k = c1 * k^(-gamma)                 (WikiText-103 and WMT14 En-De)
    R(W)        = lambda_prior * sum_{k=1..d} (sigma_k - prior_k)^2

**Documented deviation: the reparameterisation-free variant.** The model owns the embedding and the
objective owns only the loss, so instead of new parameters (U, sigma, V) this objective penalises the
singular values of the model's existing output embedding (the tied matrix when tied),
sigma = ``torch.linalg.svdvals(W)`` in float32 (float64 kept), differentiable (d sigma_k / dW = u_k v_k^T). Its SVD factors
are exactly orthogonal, so the paper's orthogonality penalties on U and V are identically zero and vanish;
what remains is the prior penalty R, applied once per optimizer update by ``update_penalty`` (like CosReg). The
optimisation path differs from the paper's (gradients reach sigma through W rather than directly),
the fixed point sought is the same kind of spectrum.

``normalize``: ``max`` (default) compares sigma_k / sigma_1 with the prior (sigma_1 not detached, so the
penalty constrains the *shape* of the spectrum and leaves its scale to the likelihood; c1 = 1 then makes
prior_1 match exactly); ``none`` compares raw singular values, as the paper's penalty does, where c1 must
match the scale of the model's embedding (roughly std(W) * (sqrt(V) + sqrt(d)) at initialisation).

**Open choices (not reported by the paper; must be tuned on validation and recorded):** c1, c2, gamma and
lambda_prior. The defaults -- polynomial prior, c1 = 1, gamma = 0.3, c2 = 0.08 (exponential only),
lambda_prior = 1 (the middle of the paper's grid {0.1, 1, 10, 100}), normalize = max -- give a normalised
spectrum that decays slowly, like the SC curves of the paper's figures: k^(-0.3) falls to 0.5 at k = 10
and to about 0.15 at k = 512 (exp(-0.08 sqrt(k)), i.e. exponential with gamma = 0.5, to about 0.16),
far slower than the MLE spectra plotted by Gao et al. (2019) and Wang et al. (2020).

Cost: one SVD of the V x d matrix, O(V d^2) time and O(V d) memory, for the value and again for its
gradient, every ``every`` optimizer updates. On other updates there is no penalty; on the updates that compute it
the penalty is multiplied by ``every`` ("lazy regularization", as StyleGAN2's lazy R1), so its gradient
averaged over updates equals that of the every-update penalty and ``lambda_prior`` keeps its meaning at any
period. For V = 44k, d = 1024 that is ~5e10 flops per computation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from repdegen.core.errors import ConfigError
from repdegen.losses import Objective, ObjectiveConfig, ObjectiveOutput, add_to_grad, as_output_layer, register_objective

PRIORS = ("polynomial", "exponential")
NORMALIZE = ("max", "none")


@dataclass
class SCConfig(ObjectiveConfig):
    """Defaults are our choice (the paper reports neither c1, c2 nor gamma): see the module docstring."""

    name: str = "sc"
    prior: str = "polynomial"
    c1: float = 1.0
    c2: float = 0.08
    gamma: float = 0.3
    lambda_prior: float = 1.0
    normalize: str = "max"
    every: int = 1


def spectrum_prior(d: int, prior: str, c1: float, c2: float, gamma: float, device=None) -> torch.Tensor:
    """prior_k for k = 1..d (float32): c1 * k^(-gamma), or c1 * exp(-c2 * k^gamma)."""
    k = torch.arange(1, d + 1, dtype=torch.float64, device=device)
    if prior == "polynomial":
        out = c1 * k.pow(-gamma)
    elif prior == "exponential":
        out = c1 * torch.exp(-c2 * k.pow(gamma))
    else:
        raise ValueError(f"prior={prior!r} must be one of {PRIORS}")
    return out.float()


def spectrum_penalty(weight: torch.Tensor, prior: torch.Tensor, normalize: str = "max") -> torch.Tensor:
    """sum_k (s_k - prior_k)^2 with s = the singular values of ``weight`` in decreasing order, divided by
    the largest when ``normalize='max'``. Differentiable in ``weight``."""
    sigma = torch.linalg.svdvals(weight.to(torch.promote_types(weight.dtype, torch.float32)))
    if normalize == "max":
        sigma = sigma / sigma[0].clamp_min(1e-12)
    elif normalize != "none":
        raise ValueError(f"normalize={normalize!r} must be one of {NORMALIZE}")
    return (sigma - prior[: sigma.numel()].to(sigma.dtype)).pow(2).sum()


@register_objective("sc", SCConfig)
class SpectrumControl(Objective):
    """MLE plus a penalty pulling the output embedding's singular values toward a prior (the module docstring;
    options of :class:`SCConfig`). As CosReg, the penalty's gradient is added by :meth:`update_penalty` (``head``,
    ``step``) after the backward pass and before ``optimizer.step()``, on the updates with ``step % every == 0``.
    ``logs["sc_penalty"]``: the penalty at the last update that computed it.

    >>> import torch
    >>> from repdegen.losses import OutputLayer, SpectrumControl
    >>> sc = SpectrumControl.create(vocab_size=10, lambda_prior=1.0)
    >>> head = OutputLayer(torch.randn(10, 4, requires_grad=True))
    >>> sc(torch.randn(6, 4), torch.randint(10, (6,)), head).token_loss.backward()
    >>> sc.update_penalty(head, step=0)
    >>> sorted(sc(torch.randn(6, 4), torch.randint(10, (6,)), head).logs)
    ['sc_penalty']
    """

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self._prior: torch.Tensor | None = None
        self.last_penalty: torch.Tensor | None = None  # R(W) at the last update that computed it

    @staticmethod
    def validate_config(cfg) -> None:
        if cfg.prior not in PRIORS:
            raise ConfigError(f"objective.prior={cfg.prior!r} must be 'polynomial' or 'exponential' (Wang et al. 2020)")
        if cfg.normalize not in NORMALIZE:
            raise ConfigError(
                f"objective.normalize={cfg.normalize!r} must be 'max' (sigma_k / sigma_1 against the prior) or 'none' "
                "(raw singular values)"
            )
        if cfg.c1 <= 0:
            raise ConfigError(f"objective.c1={cfg.c1} must be > 0 (the prior's first singular value)")
        if cfg.c2 < 0 or cfg.gamma < 0:
            raise ConfigError(
                f"objective.c2={cfg.c2} and objective.gamma={cfg.gamma} must be >= 0 for a non-increasing prior"
            )
        if cfg.lambda_prior < 0:
            raise ConfigError(f"objective.lambda_prior={cfg.lambda_prior} must be >= 0 (the paper searched 0.1-100)")
        if cfg.every < 1:
            raise ConfigError(f"objective.every={cfg.every} must be >= 1 (compute the penalty every that many updates)")

    def prior(self, d: int, device) -> torch.Tensor:
        if self._prior is None or self._prior.numel() != d or self._prior.device != torch.device(device):
            c = self.cfg
            self._prior = spectrum_prior(d, c.prior, c.c1, c.c2, c.gamma, device)
        return self._prior

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, model, step: int = 0, layout=None) -> ObjectiveOutput:
        model = as_output_layer(model)
        loss, nll = self.token_nll(model.logits(hidden), targets)
        logs = {"sc_penalty": self.last_penalty} if self.last_penalty is not None else {}
        return ObjectiveOutput(token_loss=loss, nll=nll, logs=logs)

    def update_penalty(self, model, step: int) -> None:
        """every x lambda_prior x dR/dW added to the output embedding's gradient on the updates
        ``step % every == 0`` (lazy regularization: the mean pull is lambda_prior's); autograd of the
        SVD on a detached copy of W."""
        cfg = self.cfg
        if cfg.lambda_prior == 0 or step % cfg.every != 0:
            return
        weight = as_output_layer(model).output_embedding
        with torch.enable_grad():
            w = weight.detach().requires_grad_(True)
            penalty = spectrum_penalty(w, self.prior(min(w.shape), w.device), cfg.normalize)
            (grad,) = torch.autograd.grad(penalty, w)
        add_to_grad(weight, grad.mul_(cfg.every * cfg.lambda_prior))
        self.last_penalty = penalty.detach()
