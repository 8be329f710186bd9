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
:func:`repdegen.losses.ul.unlikelihood_candidates`.

Passes over the (N, V) logits: the forward keeps the logits as the matmul gave them (bf16 under autocast) and
the row log-normalisers, computed in float32/64 row chunk by row chunk (no full-precision copy, no
``log_softmax`` tensor); the backward makes one (N, V) buffer, p = exp(z - lse), turns it into the logit
gradient in place (the scalar dL/dloss / N multiplies the (N, d) and (V, d) results instead), and casts it
once for the two matmuls. AGG gates W's gradient without an (N, V) gate: g1 * (the plain sum over all rows)
+ (g2 - g1) * (the sum over the rare-target rows alone), which finds those rows with one host sync; UL+AGG
with an ungated UL part keeps one more (N, V) buffer (its UL part) and the (N, V) gate.
``tests/test_fused.py`` checks values and gradients against autograd of the unfused formulas.
"""

from __future__ import annotations

import torch
from torch import nn

UL_CLAMP = 1e-5  # Welleck et al.'s clamp of 1 - p


def _log_normalisers(logits: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """Per-row log-sum-exp in ``acc`` (float32/64) without keeping a full-precision copy of the logits."""
    if logits.dtype == acc:
        return torch.logsumexp(logits, dim=-1)
    rows = max(1, (1 << 26) // max(logits.shape[1], 1))  # ~256 MB of float32 a chunk
    return torch.cat([torch.logsumexp(part.to(acc), dim=-1) for part in logits.split(rows)])


class _FusedSoftmaxLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, W, b, targets, eps, g1, g2, rare_rows, cand, valid, alpha, gate_ul):
        logits = nn.functional.linear(h, W, b)  # bf16 under autocast
        acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
        lse = _log_normalisers(logits, acc)
        col = targets.unsqueeze(1)
        nll = (lse - logits.gather(1, col).squeeze(1).to(acc)).mean()
        # mean_k(-lp_ik) = lse_i - mean_k z_ik
        term = nll if not eps else (1.0 - eps) * nll + eps * (lse - logits.mean(-1, dtype=acc)).mean()
        n = max(targets.numel(), 1)
        ul = lse.new_zeros(())
        if cand is not None and cand.numel():
            one_minus = 1.0 - (logits.gather(1, cand).to(acc) - lse.unsqueeze(1)).exp()
            ul = torch.where(valid, -torch.log(one_minus.clamp(min=UL_CLAMP)), 0.0).sum() / n
        gated = g1 is not None
        loss = (2.0 if gated else 1.0) * term + (alpha * ul if cand is not None else 0.0)
        ctx.save_for_backward(h, W, b, logits, lse, targets, g1, g2, rare_rows, cand, valid)
        ctx.eps, ctx.alpha, ctx.gate_ul, ctx.acc = eps, alpha, gate_ul, acc
        ctx.mark_non_differentiable(nll, ul)
        return loss, nll, ul

    @staticmethod
    def backward(ctx, grad_loss, grad_nll, grad_ul):
        h, W, b, logits, lse, targets, g1, g2, rare_rows, cand, valid = ctx.saved_tensors
        eps, alpha, acc = ctx.eps, ctx.alpha, ctx.acc
        n, v = logits.shape
        cdt = logits.dtype  # the matmuls' dtype: bf16 under autocast, else the inputs'
        gz = torch.sub(logits, lse.unsqueeze(1)).exp_()  # p, in acc (bf16 - float32 promotes): one new buffer
        col = targets.unsqueeze(1)
        has_ul = cand is not None and cand.numel() > 0 and alpha != 0.0
        if has_ul:
            p_c = gz.gather(1, cand)
            one_minus = 1.0 - p_c
            w = torch.where(valid & (one_minus >= UL_CLAMP), p_c / one_minus.clamp(min=UL_CLAMP), 0.0) * alpha
            s = w.sum(1, keepdim=True)
        ul_part = None
        if has_ul and g1 is not None and not ctx.gate_ul:
            # the UL part stays ungated for W and b (UL+AGG): keep it apart, alpha (scatter(w) - p S)
            ul_part = gz * -s
            ul_part.scatter_add_(1, cand, w)
        if has_ul:
            gz.mul_(1.0 - s).scatter_add_(1, cand, w)  # p - alpha p S + alpha scatter(w)
        if eps:
            gz.sub_(eps / v)
        own = gz.gather(1, col) - (1.0 - eps)
        gz.scatter_(1, col, own)  # one entry per row: no atomics
        # the scalar dL/dloss / N multiplies the (N, d) and (V, d) results, not the (N, V) buffer
        scale = grad_loss.to(acc) / max(n, 1)
        gz_c = gz if gz.dtype == cdt else gz.to(cdt)
        grad_h = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_h = ((gz_c @ W.to(cdt)).to(acc) * scale).to(h.dtype)
        want_w, want_b = ctx.needs_input_grad[1], b is not None and ctx.needs_input_grad[2]
        if g1 is None:
            if want_w:
                grad_w = ((gz_c.t() @ h.to(cdt)).to(acc) * scale).to(W.dtype)
            if want_b:
                grad_b = (gz.sum(0) * scale).to(b.dtype)
        elif ul_part is not None:
            # UL+AGG: gz_W = gate * gz + (1 - gate) * ul_part (the gate as one (N, V) tensor; the target's own
            # logit ungated)
            gate = torch.where(rare_rows.unsqueeze(1), g2.to(acc), g1.to(acc))
            gz.sub_(ul_part).mul_(gate).add_(ul_part)
            del ul_part, gate
            gz.scatter_(1, col, own)
            if want_w:
                grad_w = ((gz.to(cdt).t() @ h.to(cdt)).to(acc) * scale).to(W.dtype)
            if want_b:
                grad_b = (gz.sum(0) * scale).to(b.dtype)
        else:
            gw, gb = _gated_output_grads(gz, gz_c, h, targets, own, g1, g2, rare_rows, want_w, want_b, cdt, acc)
            grad_w = (gw * scale).to(W.dtype) if want_w else None
            grad_b = (gb * scale).to(b.dtype) if want_b else None
        return grad_h, grad_w, grad_b, None, None, None, None, None, None, None, None, None


def _gated_output_grads(gz, gz_c, h, targets, own, g1, g2, rare_rows, want_w: bool, want_b: bool, cdt, acc,
                        rare_idx=None):
    """AGG's (unscaled) gradients of W and b from the logit gradient ``gz`` (``gz_c``: the same in the matmul dtype):
    column k of row i is scaled by g1[k] (target not rare) or g2[k] (rare target), the target's own entry by 1:
    g1 * (the plain sum over all rows) + (g2 - g1) * (the sum over the rare-target rows alone, a few; finding them is
    one host sync), then what the gates took from the own entries ``own`` (N, 1) is put back. (None, None) parts
    that are not wanted. ``rare_idx``: the rare-target rows' indices when the caller has them (no host sync here)."""
    if rare_idx is None:
        rare_idx = rare_rows.nonzero().squeeze(1)
    g1a, g2a = g1.to(acc), g2.to(acc)
    fix = own.squeeze(1) * (1.0 - torch.where(rare_rows, g2a[targets], g1a[targets]))  # (N,)
    gw = gb = None
    if want_w:
        hc = h.to(cdt)
        gw = (gz_c.t() @ hc).to(acc).mul_(g1a.unsqueeze(1))
        if rare_idx.numel():
            gw.add_((gz_c[rare_idx].t() @ hc[rare_idx]).to(acc).mul_((g2a - g1a).unsqueeze(1)))
        gw.index_add_(0, targets, fix.unsqueeze(1) * h.to(acc))
    if want_b:
        gb = gz.sum(0).mul_(g1a)
        if rare_idx.numel():
            gb.add_(gz[rare_idx].sum(0).mul_(g2a - g1a))
        gb.index_add_(0, targets, fix)
    return gw, gb


def store_chunk_grad_h(grad_h, w_c, g_c, h, W, start: int, acc):
    """The rows of h's gradient that one chunk's logit gradient ``g_c`` gives, ``g_c @ W`` (W cast once to the
    chunk's dtype and kept, ``w_c``), written into ``grad_h`` (made on the first chunk); returns (grad_h, w_c)."""
    if grad_h is None:
        grad_h = torch.empty(h.shape[0], h.shape[1], dtype=acc, device=h.device)
    if w_c is None:
        w_c = W.to(g_c.dtype)
    grad_h[start:start + g_c.shape[0]] = (g_c @ w_c).to(acc)
    return grad_h, w_c


class _ChunkedSoftmaxLoss(torch.autograd.Function):
    """The NLL (AGG: gated) loss of ``fused_softmax_loss`` without UL, computed row chunk by row chunk with the
    gradients formed in the forward pass: per chunk the logits, their log-normaliser, the logit gradient and its
    products with W and h, so no (N, V) tensor ever exists (the largest is chunk x V); the backward only scales the
    (N, d), (V, d) and (V,) results by dL/dloss / N."""

    @staticmethod
    def forward(ctx, h, W, b, targets, eps, g1, g2, rare_rows, chunk_rows):
        n, v = targets.numel(), W.shape[0]
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        want_b = b is not None and ctx.needs_input_grad[2]
        gated = g1 is not None
        grad_h = grad_w = grad_b = None
        nll_sum = smooth_sum = None
        w_c = None  # W in the matmuls' dtype, cast once for all chunks
        if gated:  # the rare-target rows of every chunk with one host sync for the whole batch, not one a chunk
            rare_all = rare_rows.nonzero().squeeze(1)
            starts = torch.arange(0, n, chunk_rows, device=rare_all.device)
            bounds = torch.searchsorted(rare_all, torch.cat([starts, starts.new_tensor([n])])).tolist()
        for k, start in enumerate(range(0, n, chunk_rows)):
            hc, tc = h[start:start + chunk_rows], targets[start:start + chunk_rows]
            logits = nn.functional.linear(hc, W, b)  # bf16 under autocast
            cdt = logits.dtype
            acc = torch.float64 if cdt == torch.float64 else torch.float32
            # the chunk's log-probabilities in acc from log_softmax (for bf16 a cast and one kernel, for fp16 one
            # kernel; before: a cast, a log-sum-exp and a subtraction, whose passes cost MLE 6.5 % on an H100,
            # results/bench/gpu/README.md 2026-11-27)
            lp = torch.log_softmax(logits, dim=-1, dtype=acc)
            del logits
            col = tc.unsqueeze(1)
            part = -lp.gather(1, col).sum()
            nll_sum = part if nll_sum is None else nll_sum + part
            if eps:  # mean_k(-lp_ik)
                part = -lp.mean(-1).sum()
                smooth_sum = part if smooth_sum is None else smooth_sum + part
            gz = lp.exp_()  # p, in place of the chunk's log-probabilities
            if eps:
                gz.sub_(eps / v)
            own = gz.gather(1, col) - (1.0 - eps)
            gz.scatter_(1, col, own)
            gz_c = gz if gz.dtype == cdt else gz.to(cdt)
            if want_h:
                grad_h, w_c = store_chunk_grad_h(grad_h, w_c, gz_c, h, W, start, acc)
            if gated:
                gw, gb = _gated_output_grads(gz, gz_c, hc, tc, own, g1, g2, rare_rows[start:start + chunk_rows],
                                             want_w, want_b, cdt, acc, rare_all[bounds[k]:bounds[k + 1]] - start)
            else:
                gw = (gz_c.t() @ hc.to(cdt)).to(acc) if want_w else None
                gb = gz.sum(0) if want_b else None
            if gw is not None:
                grad_w = gw if grad_w is None else grad_w.add_(gw)
            if gb is not None:
                grad_b = gb if grad_b is None else grad_b.add_(gb)
        if nll_sum is None:  # no rows: a zero loss, no gradient (autograd reads None as zero)
            nll_sum = smooth_sum = h.new_zeros((), dtype=torch.float64 if h.dtype == torch.float64 else torch.float32)
        nll = nll_sum / max(n, 1)
        term = nll if not eps else (1.0 - eps) * nll + eps * smooth_sum / max(n, 1)
        loss = (2.0 if gated else 1.0) * term
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.n, ctx.dtypes = max(n, 1), (h.dtype, W.dtype, b.dtype if b is not None else None)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        out = []
        for g, dtype in zip((grad_h, grad_w, grad_b), ctx.dtypes):
            out.append(None if g is None else (g * (grad_loss.to(g.dtype) / ctx.n)).to(dtype))
        return (*out, None, None, None, None, None, None)


def chunked_softmax_loss(h, W, b, targets, eps: float = 0.0, gates=None, chunk_rows: int = 1024):
    """(loss, nll): ``fused_softmax_loss``'s value and gradients for the NLL (AGG: ``gates``) without UL, computed
    ``chunk_rows`` rows at a time with the gradients formed in the forward pass (``_ChunkedSoftmaxLoss``). For one
    backward per forward (the training step); a second backward through the same graph is refused by autograd."""
    g1, g2, rare_rows = gates if gates is not None else (None, None, None)
    return _ChunkedSoftmaxLoss.apply(h, W, b, targets, float(eps), g1, g2, rare_rows, int(chunk_rows))


def fused_softmax_loss(h, W, b, targets, eps: float = 0.0, gates=None, candidates=None, alpha: float = 0.0,
                       gate_ul: bool = False):
    """(loss, nll, ul): see the module docstring. ``gates`` = (g1, g2, rare_rows) or None;
    ``candidates`` = (cand, valid) or None."""
    g1, g2, rare_rows = gates if gates is not None else (None, None, None)
    cand, valid = candidates if candidates is not None else (None, None)
    return _FusedSoftmaxLoss.apply(h, W, b, targets, float(eps), g1, g2, rare_rows, cand, valid, float(alpha),
                                   bool(gate_ul))
