"""Augmented loss (AL) and REAL (AL with reused embeddings).

Inan, Khosravi & Socher (2017), eq. 3.1-3.7 (Inan & Khosravi 2016, eq. 7-9, is the case tau = 1):

    y^_t   = softmax(z_t / tau),  z_t = W h_t + b                  (3.1)
    u_t    = L y*_t               (the target's input embedding)   (3.6)
    y~_t   = softmax(L^T u_t / tau)                                 (3.7)
    J_tot  = CE(y*_t, softmax(z_t)) + alpha * KL(y~_t || y^_t)      (3.2, 3.3)

``form``: ``kl`` = KL(y~ || y^) = sum y~ log y~ - sum y~ log y^; ``ce`` = the cross-entropy part only
(Inan 2016 found no notable difference and used it for the large networks).

``target_grad`` (how y~, which depends on L, is differentiated):
  * ``official`` (default): as the authors' TensorFlow code (inanhkn/REAL): the cross-entropy part
    treats y~ as a constant, the entropy part ``sum y~ log y~`` is differentiated through y~;
  * ``none``: y~ is a constant everywhere (plain distillation toward a fixed target);
  * ``full``: the exact gradient of the KL through y~ as well.
No tau^2 factor is applied (none is in the paper or the code).

REAL = AL on a model whose output projection is tied to the embedding (``objective=real``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from repdegen.core.errors import ConfigError
from repdegen.losses import Objective, ObjectiveConfig, ObjectiveOutput, as_output_layer, register_objective
from repdegen.losses.fused import store_chunk_grad_h
from torch import nn


@dataclass
class ALConfig(ObjectiveConfig):
    """Defaults: tau = 20 (the official code) and alpha = 300 (an early choice for tau = 20, kept as the schema's
    default so configs that rely on it keep their hash); the Inan 2017 presets set alpha = 30 with
    target_grad=official, chosen by the paper-scale grid of docs/fidelity.md. Inan & Khosravi (2016)'s settings use
    tau = 1 and alpha 0.15-0.35."""

    name: str = "al"
    alpha: float = 300.0
    temperature: float = 20.0
    form: str = "kl"
    target_grad: str = "official"
    # Inan 2017 Sec. 6.2 (Fig. 1): J_tot = beta * tau^2 * |V| * J_aug + (1 - beta) * J (eq. 6.1) replaces
    # J + alpha * J_aug when beta is set; unit_norm_embedding renormalises the rows of L to norm 1
    # after every update ("we also constrain each row of the input embedding matrix to have a norm of 1");
    # unit_norm_axis says which rows: "word" (each word vector, a row of our V x d matrix) or "dimension" (each of the
    # d rows of the paper's L in R^{d_x x |V|}, a column of ours: the notation of Sec. 3 and of Sec. 6.2's subspace)
    beta: float | None = None
    unit_norm_embedding: bool = False
    unit_norm_axis: str = "word"


# the dim of the V x d input embedding along which unit_norm_embedding takes each norm
UNIT_NORM_AXES = {"word": 1, "dimension": 0}


@dataclass
class REALConfig(ALConfig):
    name: str = "real"
    tie_weights: bool | None = True


def augmented_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    embedding: torch.Tensor,
    temperature: float,
    form: str = "kl",
    target_grad: str = "official",
) -> torch.Tensor:
    """Per-token augmented loss (N,) for ``logits`` (N, V), ``targets`` (N,), ``embedding`` L (V, d)."""
    target_logits = embedding[targets] @ embedding.t() / temperature
    log_y_tilde = torch.log_softmax(target_logits, dim=-1)
    y_tilde = log_y_tilde.exp()
    log_y_hat = torch.log_softmax(logits / temperature, dim=-1)
    if target_grad == "full":
        y_ce = y_tilde
    else:
        y_ce = y_tilde.detach()
    cross_entropy = -(y_ce * log_y_hat).sum(-1)
    if form == "ce":
        return cross_entropy
    if target_grad == "none":
        neg_entropy = (y_tilde * log_y_tilde).sum(-1).detach()
    else:
        neg_entropy = (y_tilde * log_y_tilde).sum(-1)
    return cross_entropy + neg_entropy


@torch.no_grad()
def target_entropy(L: torch.Tensor, tau: float, weights: torch.Tensor | None = None, samples: int = 2048,
                   chunk_rows: int = 1024) -> float:
    """The mean over words w of H(softmax(L u_w / tau)) with u_w = L[w], weighted by ``weights`` (V,) summing to 1
    (uniform when None). Exact for V <= ``samples``; above, the mean over ``samples`` words taken systematically from
    the weights' cumulative distribution (the word at each of the points (i + 1/2) / samples; no random draw, so the
    same weights give the same words), which keeps a per-epoch diagnostic at ~2k x V similarities. ``chunk_rows`` rows
    of similarities at a time, in float32 (float64 for a float64 L)."""
    V = L.shape[0]
    w = (torch.full((V,), 1.0 / V, dtype=torch.float64) if weights is None else weights.to(torch.float64)).cpu()
    if V <= samples:
        rows, row_w = torch.arange(V), w
    else:
        points = (torch.arange(samples, dtype=torch.float64) + 0.5) / samples
        picked = torch.searchsorted(torch.cumsum(w, 0) / w.sum(), points).clamp(max=V - 1)
        rows, mult = torch.unique(picked, return_counts=True)
        row_w = mult.to(torch.float64) / samples
    acc = torch.float64 if L.dtype == torch.float64 else torch.float32
    Lf = L.to(acc)
    total = 0.0
    for start in range(0, rows.numel(), chunk_rows):
        idx = rows[start:start + chunk_rows].to(L.device)
        lp = torch.log_softmax(Lf[idx] @ Lf.t() / tau, dim=-1)
        h = -(lp.exp() * lp).sum(-1)
        total += float((h.double().cpu() * row_w[start:start + chunk_rows]).sum())
    return total


class _AugMean(torch.autograd.Function):
    """:func:`augmented_loss_mean`; ``L`` is the input embedding (V, d), ``targets`` (N,)."""

    @staticmethod
    def forward(ctx, logits, L, targets, tau, form, target_grad):
        n = targets.numel()
        uniq, inv = torch.unique(targets, return_inverse=True)
        cnt = torch.bincount(inv, minlength=uniq.numel()).to(logits.dtype)
        s = (L[uniq] @ L.t()).div_(tau)                      # (U, V) logits of y~
        s.sub_(torch.logsumexp(s, 1, keepdim=True))          # log y~
        y = s.exp()                                          # y~
        negent = torch.linalg.vecdot(y, s)                   # (U,) sum y~ log y~
        sy = y.sum(1)                                        # (U,) ~1
        a = logits / tau                                     # (N, V)
        lse = torch.logsumexp(a, 1)                          # (N,)
        z_sum = a.new_zeros(uniq.numel(), a.size(1)).index_add_(0, inv, a)   # (U, V) sum of a over each target's rows
        ce = (lse * sy[inv]).sum() - torch.linalg.vecdot(y, z_sum).sum()
        total = ce + (cnt * negent).sum() if form == "kl" else ce
        ctx.save_for_backward(a, lse, y, s, negent, sy, z_sum, cnt, L, uniq, inv)
        ctx.tau, ctx.form, ctx.target_grad, ctx.n = tau, form, target_grad, n
        return total / n

    @staticmethod
    def backward(ctx, g):
        a, lse, y, s, negent, sy, z_sum, cnt, L, uniq, inv = ctx.saved_tensors
        tau, form, tg, n = ctx.tau, ctx.form, ctx.target_grad, ctx.n
        c = g / n
        grad_logits = grad_L = None
        ds = None
        want_L = ctx.needs_input_grad[1] and tg != "none" and (form == "kl" or tg == "full")
        if want_L:
            ds = torch.zeros_like(y)
            if form == "kl":  # d(sum p log p)/ds = p (log p - sum p log p), once per row of each target
                ds.add_((s - negent[:, None]).mul_(y).mul_(cnt[:, None]))
            if tg == "full":  # the cross-entropy through y~: sum_t p ((lse_t - a_t) - CE_t)
                ce_u = torch.zeros_like(sy).index_add_(0, inv, lse * sy[inv]) - torch.linalg.vecdot(y, z_sum)
                lse_u = torch.zeros_like(sy).index_add_(0, inv, lse)
                ds.add_((lse_u[:, None] - z_sum - ce_u[:, None]).mul_(y))
            ds.mul_(c / tau)
        if ctx.needs_input_grad[0]:
            p = a.sub_(lse[:, None]).exp_()                  # softmax(a), in a's buffer
            p.mul_(sy[inv][:, None]).sub_(y.index_select(0, inv)).mul_(c / tau)
            grad_logits = p
        if ds is not None:
            lu = L[uniq]
            grad_L = ds.t() @ lu
            grad_L.index_add_(0, uniq, ds @ L)
        return grad_logits, grad_L, None, None, None, None


def augmented_loss_mean(logits: torch.Tensor, targets: torch.Tensor, embedding: torch.Tensor, temperature: float,
                        form: str = "kl", target_grad: str = "official") -> torch.Tensor:
    """``augmented_loss(...).mean()``, the same function (value and gradients, every ``form`` and ``target_grad``)
    computed with fewer (N, V) passes: y~ depends on the target word alone, so it is formed once per distinct target
    of the batch (U rows: ~360 of PTB's 700 tokens a batch), and with a = z / tau, lse_t = logsumexp(a_t),
    s_u = sum_k y~_uk and A_u = the sum of a_t over the rows whose target is u,

        mean_t CE_t = (sum_t lse_t s_u(t) - sum_u <y~_u, A_u>) / N,   CE_t = -sum_k y~_k log softmax(a_t)_k,

    with a hand-written backward: the logits get (softmax(a_t) s_u(t) - y~_u(t)) / tau, the embedding (through y~)
    y~_u (log y~_u - sum y~_u log y~_u) per row of target u (the entropy part; official, full) and, with
    ``target_grad=full``, y~_u ((lse_t - a_t) - CE_t) summed over those rows. tests/test_losses.py: against autograd
    of the explicit float64 formula."""
    return _AugMean.apply(logits, embedding, targets, temperature, form, target_grad)


class _ChunkedAugmented(torch.autograd.Function):
    """:func:`chunked_augmented_loss`: the objective's whole training loss (cross-entropy and augmented loss) from
    the hidden states, with every gradient formed in the forward pass, row chunk by row chunk."""

    @staticmethod
    def forward(ctx, h, W, b, L, targets, eps, tau, w_ce, w_aug, form, target_grad, chunk_rows):
        n, v = targets.numel(), W.shape[0]
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        want_b = b is not None and ctx.needs_input_grad[2]
        want_l = ctx.needs_input_grad[3] and target_grad == "official" and form == "kl"
        acc = torch.float64 if h.dtype == torch.float64 else torch.float32
        # y~ once per distinct target (as augmented_loss_mean)
        uniq, inv = torch.unique(targets, return_inverse=True)
        cnt = torch.bincount(inv, minlength=uniq.numel()).to(acc)
        lu = L[uniq]
        s = torch.log_softmax((lu @ L.t()).to(acc).div_(tau), dim=1)     # (U, V) log y~
        y = s.exp()
        negent = torch.linalg.vecdot(y, s)                                # (U,) sum y~ log y~
        k = w_aug / tau
        coef = y.sum(1).mul_(k)                                           # (U,) k sum_j y~_j (1 up to rounding)
        grad_h = grad_w = grad_b = None
        ce_sum = smooth_sum = aug_sum = None
        w_c = None
        for start in range(0, n, chunk_rows):
            hc, tc, ic = h[start:start + chunk_rows], targets[start:start + chunk_rows], inv[start:start + chunk_rows]
            z = nn.functional.linear(hc, W, b)                            # bf16 under autocast
            cdt = z.dtype
            lp = torch.log_softmax(z, dim=-1, dtype=acc)                  # log softmax(z)
            za = z.to(acc) if cdt != acc else z
            lpa = torch.log_softmax(za.div_(tau), dim=-1)                 # log y^ = log softmax(z / tau)
            del z, za
            col = tc.unsqueeze(1)
            ce_part = -lp.gather(1, col).sum()
            ce_sum = ce_part if ce_sum is None else ce_sum + ce_part
            if eps:
                part = -lp.mean(-1).sum()
                smooth_sum = part if smooth_sum is None else smooth_sum + part
            yc = y.index_select(0, ic)                                    # y~ of each row's target
            part = -torch.linalg.vecdot(yc, lpa).sum()                    # sum_t -sum_j y~_j log y^_j
            aug_sum = part if aug_sum is None else aug_sum + part
            # d loss / dz (times n): w_ce (p - q) + k (y^ sum y~ - y~)
            g = lp.exp_()
            if w_ce != 1.0:
                g.mul_(w_ce)
            if eps:
                g.sub_(w_ce * eps / v)
            g.addcmul_(lpa.exp_(), coef.index_select(0, ic).unsqueeze(1))
            g.add_(yc, alpha=-k)
            del lpa, yc
            g.scatter_add_(1, col, g.new_full(col.shape, -w_ce * (1.0 - eps)))
            g_c = g if g.dtype == cdt else g.to(cdt)
            if want_h:
                grad_h, w_c = store_chunk_grad_h(grad_h, w_c, g_c, h, W, start, acc)
            if want_w:
                gw = (g_c.t() @ hc.to(cdt)).to(acc)
                grad_w = gw if grad_w is None else grad_w.add_(gw)
            if want_b:
                gb = g.sum(0)
                grad_b = gb if grad_b is None else grad_b.add_(gb)
        zero = h.new_zeros((), dtype=acc)
        ce_sum = zero if ce_sum is None else ce_sum
        aug_sum = zero if aug_sum is None else aug_sum
        smooth_sum = zero if smooth_sum is None else smooth_sum
        if form == "kl":
            aug_sum = aug_sum + (cnt * negent).sum()
        term = ce_sum if not eps else (1.0 - eps) * ce_sum + eps * smooth_sum
        grad_l = None
        if want_l:  # the entropy part through y~: y~ (log y~ - sum y~ log y~) per row of each target, / tau
            ds = s.sub_(negent.unsqueeze(1)).mul_(y).mul_((cnt * k).unsqueeze(1))
            grad_l = ds.t() @ lu.to(acc)
            grad_l.index_add_(0, uniq, ds @ L.to(acc))
        m = max(n, 1)
        ctx.save_for_backward(grad_h, grad_w, grad_b, grad_l)
        ctx.n, ctx.dtypes = m, (h.dtype, W.dtype, b.dtype if b is not None else None, L.dtype)
        nll, aug = ce_sum / m, aug_sum / m
        ctx.mark_non_differentiable(nll, aug)
        return (w_ce * term + w_aug * aug_sum) / m, nll, aug

    @staticmethod
    def backward(ctx, grad_loss, grad_nll, grad_aug):
        out = []
        for g, dtype in zip(ctx.saved_tensors, ctx.dtypes):
            out.append(None if g is None else (g * (grad_loss.to(g.dtype) / ctx.n)).to(dtype))
        return (*out, None, None, None, None, None, None, None, None)


def chunked_augmented_loss(h, W, b, L, targets, eps: float, tau: float, w_ce: float, w_aug: float, form: str = "kl",
                           target_grad: str = "official", chunk_rows: int = 1024):
    """(loss, nll, aug) of the AL objective's training step, from the hidden states ``h`` (N, d) rather than the
    logits: loss = w_ce * CE(y*, softmax(z)) + w_aug * J_aug with z = h W^T + b, CE label-smoothed by ``eps``, J_aug
    as :func:`augmented_loss_mean` (``form`` kl or ce; ``target_grad`` official or none); nll the plain mean NLL and
    aug the mean J_aug, both detached. The same function as the objective's default path (``token_nll`` of the
    logits + ``augmented_loss_mean``), with fewer passes over the (N, V) logits: per chunk of ``chunk_rows`` rows one
    logits matmul, the two log-softmaxes (z and z / tau), y~'s rows of the chunk, and the logits' gradient
    w_ce (p - q) + (w_aug / tau)(y^ sum y~ - y~) built in place of the first, multiplied into h's, W's and b's
    gradients at once (the backward only scales them). For one backward per forward (a training step). Passing L
    as W (the tied REAL) sums both gradients into it, as autograd does. tests/test_losses.py: against autograd of
    the explicit float64 formulas."""
    return _ChunkedAugmented.apply(h, W, b, L, targets, float(eps), float(tau), float(w_ce), float(w_aug), form,
                                   target_grad, int(chunk_rows))


@register_objective("al", ALConfig)
class AugmentedLoss(Objective):
    """The augmented loss (the module docstring). Options (:class:`ALConfig`): ``alpha``, ``temperature``,
    ``form``, ``target_grad``, ``beta``, ``unit_norm_embedding`` (``unit_norm_axis``). The target distribution is
    built from the input embedding L: ``OutputLayer(W, b, input_embedding=L)`` for an untied model; a tied one (REAL,
    ``make_objective("real", ...)``) passes ``OutputLayer(L)``. Hooks: :meth:`after_update` renormalises L's rows (or
    columns) when ``unit_norm_embedding``; :meth:`setup`'s ``train_counts`` only weigh the words of :meth:`epoch_metrics`'
    diagnostic. ``logs["aug_loss"]``: the augmented term (absent where its weight is zero, ``beta = 0`` or ``alpha = 0``
    without ``beta``, outside ``chunk_rows``: the term is then not formed).

    >>> import torch
    >>> from repdegen.losses import OutputLayer, make_objective
    >>> real = make_objective("real", vocab_size=10, alpha=30.0, temperature=20.0)
    >>> L = torch.randn(10, 4, requires_grad=True)
    >>> out = real(torch.randn(6, 4), torch.randint(10, (6,)), OutputLayer(L))
    >>> out.token_loss.backward()
    >>> bool(out.token_loss > out.nll)  # NLL + alpha x KL
    True
    """

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.cfg = cfg

    @staticmethod
    def validate_config(cfg) -> None:
        if cfg.temperature <= 0:
            raise ConfigError(f"objective.temperature={cfg.temperature} must be positive")
        if cfg.alpha < 0:
            raise ConfigError(f"objective.alpha={cfg.alpha} must be >= 0")
        if cfg.form not in ("kl", "ce"):
            raise ConfigError(f"objective.form={cfg.form!r} must be 'kl' or 'ce'")
        beta = cfg.get("beta") if hasattr(cfg, "get") else getattr(cfg, "beta", None)
        if beta is not None and not 0.0 <= beta <= 1.0:
            raise ConfigError(f"objective.beta={cfg.beta} must be in [0, 1] (the share of the augmented loss, Inan 2017 eq. 6.1)")
        if cfg.target_grad not in ("official", "none", "full"):
            raise ConfigError(f"objective.target_grad={cfg.target_grad!r} must be 'official', 'none' or 'full'")
        axis = cfg.get("unit_norm_axis", "word") if hasattr(cfg, "get") else getattr(cfg, "unit_norm_axis", "word")
        if axis not in UNIT_NORM_AXES:
            raise ConfigError(f"objective.unit_norm_axis={axis!r} must be 'word' (each word vector has norm 1) or "
                              f"'dimension' (each embedding dimension, over the vocabulary, has norm 1)")

    @staticmethod
    def supports_chunk_rows(cfg) -> bool:
        target_grad = cfg.get("target_grad") if hasattr(cfg, "get") else getattr(cfg, "target_grad", "official")
        return target_grad in ("official", "none")

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, model, step: int = 0, layout=None) -> ObjectiveOutput:
        model = as_output_layer(model)
        cfg = self.cfg
        if cfg.chunk_rows is not None and self.training:
            w_ce, w_aug = ((1.0 - cfg.beta, cfg.beta * cfg.temperature**2 * model.output_embedding.shape[0])
                           if cfg.beta is not None else (1.0, cfg.alpha))
            loss, nll, aug = chunked_augmented_loss(
                hidden, model.output_embedding, model.output_bias, model.input_embedding, targets, self.label_smoothing,
                cfg.temperature, w_ce, w_aug, cfg.form, cfg.target_grad, cfg.chunk_rows)
            return ObjectiveOutput(token_loss=loss, nll=nll, logs={"aug_loss": aug})
        logits = model.logits(hidden)
        # at beta = 1 the cross-entropy's weight (1 - beta) is zero: its value is still read (the NLL, and the sum
        # below), its gradient, exactly zero, is not formed
        loss, nll = self.token_nll(logits.detach() if cfg.beta == 1.0 else logits, targets)
        if cfg.beta == 0.0 or (cfg.beta is None and cfg.alpha == 0.0):
            # the augmented term's weight is zero: it adds exactly zero to the loss and to every gradient, so it is
            # not formed (the loss and gradients equal those of the weighted sum, bitwise: tests/test_losses.py)
            return ObjectiveOutput(token_loss=loss, nll=nll, logs={})  # (1 - beta) J = J
        aug = augmented_loss_mean(logits if logits.dtype == torch.float64 else logits.float(), targets,
                                  model.input_embedding, cfg.temperature, cfg.form,
                                  cfg.target_grad)
        if cfg.beta is not None:  # Inan 2017 eq. 6.1
            total = cfg.beta * cfg.temperature**2 * logits.size(-1) * aug + (1.0 - cfg.beta) * loss
        else:
            total = loss + cfg.alpha * aug
        return ObjectiveOutput(token_loss=total, nll=nll, logs={"aug_loss": aug.detach()})

    def setup(self, updates_per_epoch: int = 1, special_ids=(), train_counts: torch.Tensor | None = None,
              model=None) -> None:
        # a plain attribute, not a buffer: not part of the objective's state or its checkpoints; without train_counts
        # the diagnostic of epoch_metrics weighs the words uniformly
        self.target_weights = (train_counts.double() / train_counts.sum().clamp(min=1)
                               if train_counts is not None else None)

    def epoch_metrics(self, model) -> dict:
        """``al_target_entropy``: the entropy (nats) of y~ = softmax(L u_w / tau), averaged over the words w as the
        training targets weigh them; log V means y~ says nothing of word similarity (results/NOTES.md, Inan 2017)."""
        return {"al_target_entropy": target_entropy(as_output_layer(model).input_embedding.detach(), self.cfg.temperature,
                                                    getattr(self, "target_weights", None))}

    @torch.no_grad()
    def after_update(self, model=None, step: int | None = None) -> None:
        if self.cfg.unit_norm_embedding:
            w = as_output_layer(model).input_embedding  # V x d
            w.div_(w.norm(dim=UNIT_NORM_AXES[getattr(self.cfg, "unit_norm_axis", "word")], keepdim=True).clamp(min=1e-12))


@register_objective("real", REALConfig)
class REAL(AugmentedLoss):
    """AL on a tied model (``tie_weights`` stays true): pass the tied ``OutputLayer(L)``."""

    @staticmethod
    def validate_config(cfg) -> None:
        AugmentedLoss.validate_config(cfg)
        if cfg.tie_weights is not True:
            raise ConfigError(
                "objective=real is AL with tied weights: objective.tie_weights must stay true (use objective=al for untied)"
            )
