"""One logits matmul, one ``log_softmax``, and a hand-written backward for the softmax losses that
need more than ``cross_entropy``: AGG's gated output-embedding gradient (``losses/agg.py``), token-level
unlikelihood (``losses/ul.py``) and their sum, UL+AGG (``losses/ul_agg.py``).

    fused_softmax_loss(h, W, b, targets, eps, gates=None, candidates=None, alpha=0.0, gate_ul=False)
        -> (loss, nll, ul)

with z = h W^T + b, lp = log_softmax(z), q = (1 - eps) onehot(y) + eps / V and, per row i,

    term_i = (1 - eps) (-lp_i[y_i]) + eps mean_k(-lp_ik)          (Objective.token_nll)
    ul_i   = sum_{c in C_i} -log(clamp(1 - p_ic, min=1e-5))         (Welleck et al. 2020)
    loss   = m / N sum_i term_i + alpha / N sum_i ul_i              (m = 2 with gates, the AGG form)

``nll`` is the plain mean NLL and ``ul`` the mean UL term (both detached, for the logs).

The gradient w.r.t. z of one row, written without forming any (N, V) one-hot or scatter target:

    d term / dz = p - q
    d ul / dz   = sum_c w_c (e_c - p) = scatter(w) - p S,   w_c = p_c / (1 - p_c), S = sum_c w_c

(w_c = 0 for invalid candidates and where the clamp is active, 1 - p_c < 1e-5, as autograd of the clamp).
h receives ``(p - q + alpha d ul) W`` (the plain gradient). W and b receive the same logit gradient, except
with ``gates = (g1, g2, rare_rows)`` (AGG): the NLL part is scaled column-wise by g1 (rows whose target
is not rare) or g2 (rare target), the target's own entry ungated; the UL part is left ungated
(``gate_ul=False``, UL+AGG as Yu et al.: AGG gates the NLL only) or gated like the NLL (``gate_ul=True``,
the variant ``ul_agg_gated``). ``candidates = (cand, valid)`` come from
:func:`losses.ul.unlikelihood_candidates`.

Memory: the forward keeps one (N, V) tensor for backward (the float32/float64 log-probabilities, or the
bf16 logits and the row log-normalisers under autocast); the backward builds the logit gradient in
place, plus one more (N, V) buffer only for UL+AGG with an ungated UL part (its W gradient needs p
again). No host synchronisation.
``tests/test_fused.py`` checks values and gradients against autograd of the unfused formulas.
"""

from __future__ import annotations

import torch
from torch import nn

UL_CLAMP = 1e-5  # Welleck et al.'s clamp of 1 - p


class _FusedSoftmaxLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, W, b, targets, eps, g1, g2, rare_rows, cand, valid, alpha, gate_ul):
        logits = nn.functional.linear(h, W, b)  # bf16 under autocast
        acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
        lp = torch.log_softmax(logits.to(acc), dim=-1)
        nll = nn.functional.nll_loss(lp, targets)  # bitwise what cross_entropy gives
        term = nll if not eps else (1.0 - eps) * nll - eps * lp.mean(-1).mean()
        n = max(targets.numel(), 1)
        ul = lp.new_zeros(())
        if cand is not None and cand.numel():
            one_minus = 1.0 - lp.gather(1, cand).exp()
            ul = torch.where(valid, -torch.log(one_minus.clamp(min=UL_CLAMP)), 0.0).sum() / n
        gated = g1 is not None
        loss = (2.0 if gated else 1.0) * term + (alpha * ul if cand is not None else 0.0)
        if logits.dtype == acc:
            saved, lse = lp, None
        else:  # keep the half-precision logits and the normalisers, not a float32 copy
            saved, lse = logits, torch.logsumexp(logits.to(acc), dim=-1)
        del lp
        ctx.save_for_backward(h, W, b, saved, lse, targets, g1, g2, rare_rows, cand, valid)
        ctx.eps, ctx.alpha, ctx.gate_ul, ctx.acc = eps, alpha, gate_ul, acc
        ctx.mark_non_differentiable(nll, ul)
        return loss, nll, ul

    @staticmethod
    def backward(ctx, grad_loss, grad_nll, grad_ul):
        h, W, b, saved, lse, targets, g1, g2, rare_rows, cand, valid = ctx.saved_tensors
        eps, alpha, acc = ctx.eps, ctx.alpha, ctx.acc
        n, v = saved.shape
        cdt = saved.dtype if lse is not None else h.dtype
        lp = saved if lse is None else saved.to(acc) - lse.unsqueeze(1)
        gz = lp.exp()  # p, a new buffer (lp is kept for the ungated UL part below)
        col = targets.unsqueeze(1)
        has_ul = cand is not None and cand.numel() > 0 and alpha != 0.0
        if has_ul:
            p_c = lp.gather(1, cand).exp()
            one_minus = 1.0 - p_c
            w = torch.where(valid & (one_minus >= UL_CLAMP), p_c / one_minus.clamp(min=UL_CLAMP), 0.0) * alpha
            s = w.sum(1, keepdim=True)
            gz.mul_(1.0 - s).scatter_add_(1, cand, w)  # p - alpha p S + alpha scatter(w)
        if eps:
            gz.sub_(eps / v)
        gz.scatter_(1, col, gz.gather(1, col) - (1.0 - eps))  # one entry per row: no atomics
        gz.mul_(grad_loss.to(acc) / max(n, 1))
        grad_h = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_h = (gz.to(cdt) @ W.to(cdt)).to(h.dtype)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            if g1 is not None:
                own = gz.gather(1, col)
                gate = torch.where(rare_rows.unsqueeze(1), g2.to(acc), g1.to(acc))
                if has_ul and not ctx.gate_ul:
                    # gate the NLL part only: gz_W = gate * gz + (1 - gate) * ul_part
                    ul_part = lp.exp()
                    ul_part.mul_(-s).scatter_add_(1, cand, w).mul_(grad_loss.to(acc) / max(n, 1))
                    gz.mul_(gate).add_(ul_part.mul_(1.0 - gate))
                    del ul_part
                else:
                    gz.mul_(gate)
                gz.scatter_(1, col, own)  # the target's own logit: gate 1
            if ctx.needs_input_grad[1]:
                grad_w = (gz.to(cdt).t() @ h.to(cdt)).to(W.dtype)
            if b is not None and ctx.needs_input_grad[2]:
                grad_b = gz.sum(0).to(b.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None, None, None, None, None


def fused_softmax_loss(h, W, b, targets, eps: float = 0.0, gates=None, candidates=None, alpha: float = 0.0,
                       gate_ul: bool = False):
    """(loss, nll, ul): see the module docstring. ``gates`` = (g1, g2, rare_rows) or None;
    ``candidates`` = (cand, valid) or None."""
    g1, g2, rare_rows = gates if gates is not None else (None, None, None)
    cand, valid = candidates if candidates is not None else (None, None)
    return _FusedSoftmaxLoss.apply(h, W, b, targets, float(eps), g1, g2, rare_rows, cand, valid, float(alpha),
                                   bool(gate_ul))
