"""Which way each part of a run's training loss moves its output embedding W, at the run's weights (a diagnosis for
the Inan 2017 REAL row: its tied embedding degenerates as it trains, results/NOTES.md).

For each run given (a run directory of the ledger; the weights file ``best.pt`` by default), the model reads the
first ``--tokens`` training tokens in ``--batch`` columns with dropout off; with its hidden states h held fixed, the
gradient G of each part with respect to W is taken, and a step -G is described to first order by

    d s_k = -u_k^T G v_k          (the change of W's k-th singular value, W = U S V^T)
    d|w_i| = -(w_i . G_i) / |w_i|  (the change of a row's norm; the mean over rows is printed)

and by the share of |G|^2 along the mean row's direction (1/d by chance; Gao et al.'s common direction when large).
The parts: the plain cross-entropy, and for an AL/REAL run (``objective.alpha``, ``objective.temperature``) the
augmented loss's two parts times alpha, as the official code differentiates them: its cross-entropy part
-sum y~ log softmax(z / tau) with y~ = softmax(L u_y / tau) held fixed, and its entropy part sum y~ log y~, which
reaches W only when W is L (tied). H(y~), its mean entropy, against log V (uniform) says how much y~ still tells
about the target.

    python scripts/loss_pull.py outputs/runs/<hash> [outputs/runs/<hash> ...] [--weights best.pt] [--out F.json]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from repdegen.core.files import atomic_write_json, output_problem  # noqa: E402


def first_order(W: torch.Tensor, G: torch.Tensor, k: int = 50) -> dict:
    """A step -G on W to first order: d s_1, the mean d s_k for k = 2..k, the mean d|w_i|, |G| and the share of
    |G|^2 along the mean row's direction."""
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    k = min(k, S.numel())
    ds = -torch.einsum("ik,ij,kj->k", U[:, :k], G, Vh[:k])
    mean_dir = W.mean(0)
    mean_dir = mean_dir / mean_dir.norm()
    g2 = float(G.pow(2).sum())
    return {"d_s1": float(ds[0]), "d_s_rest": float(ds[1:].mean()) if k > 1 else 0.0,
            "d_row_norm": float(((W * -G).sum(1) / W.norm(dim=1)).mean()), "grad_norm": math.sqrt(g2),
            "share_along_mean_row": float((G @ mean_dir).pow(2).sum()) / g2 if g2 > 0 else float("nan")}


def loss_parts(h: torch.Tensor, targets: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, L: torch.Tensor,
               alpha: float, tau: float) -> tuple[dict, float]:
    """The parts of the training loss (per-token means) as functions of W (and L, which is W when tied), and the
    mean entropy of y~ (nan without the augmented loss)."""
    z = torch.nn.functional.linear(h, W, b)
    parts = {"cross-entropy": torch.nn.functional.cross_entropy(z, targets)}
    if not alpha:
        return parts, float("nan")
    log_yt = torch.log_softmax(L[targets] @ L.t() / tau, -1)
    yt = log_yt.exp()
    parts["AL cross-entropy part x alpha"] = alpha * -(yt.detach() * torch.log_softmax(z / tau, -1)).sum(-1).mean()
    parts["AL entropy part x alpha"] = alpha * (yt * log_yt).sum(-1).mean()
    return parts, float(-(yt * log_yt).sum(-1).mean().detach())


def pull(run_dir: Path, weights: str, tokens: int, batch: int) -> dict:
    from repdegen.reproduce.runs.trained import load_lm

    lm = load_lm(Path(run_dir) / weights, "cpu", "scripts/loss_pull.py")
    obj = lm.cfg.objective
    alpha = float(obj.get("alpha") or 0.0) if obj.get("name") in ("al", "real") else 0.0
    tau = float(obj.get("temperature") or 1.0)
    ids = lm.corpus.train[: (tokens // batch + 1) * batch].view(batch, -1).t()  # (T, B), the batching's layout
    with torch.no_grad():
        hidden = lm.model(ids[:-1], lm.model.init_state(batch)).hidden
    h, y = hidden.reshape(-1, hidden.size(-1)), ids[1:].reshape(-1)
    tied = lm.model.output_embedding is lm.model.input_embedding
    W = lm.model.output_embedding.detach().clone().requires_grad_()
    L = W if tied else lm.model.input_embedding.detach().clone().requires_grad_()
    b = lm.model.output_bias.detach() if lm.model.output_bias is not None else None
    parts, entropy = loss_parts(h, y, W, b, L, alpha, tau)
    S = torch.linalg.svdvals(W.detach())
    mean_dir = W.detach().mean(0) / W.detach().mean(0).norm()
    out = {"run": str(run_dir), "label": lm.record.get("label"), "weights": weights, "tied": tied, "alpha": alpha,
           "tau": tau, "tokens": int(y.numel()), "singular_values": [round(float(s), 3) for s in S[:5]],
           "cos_v1_mean_row": float(abs(torch.linalg.svd(W.detach(), full_matrices=False)[2][0] @ mean_dir)),
           "row_norm": float(W.detach().norm(dim=1).mean()), "entropy_y_tilde": entropy,
           "log_vocab": math.log(W.size(0)), "parts": {}}
    for name, loss in parts.items():
        G, = torch.autograd.grad(loss, W, retain_graph=True, allow_unused=True)
        out["parts"][name] = first_order(W.detach(), G if G is not None else torch.zeros_like(W))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run directories of the ledger (outputs/runs/<hash>)")
    ap.add_argument("--weights", default="best.pt", help="the weights file in each run directory (default: best.pt)")
    ap.add_argument("--tokens", type=int, default=4200, help="training tokens read (default: 4200)")
    ap.add_argument("--batch", type=int, default=20, help="columns they are read in (default: 20)")
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    a = ap.parse_args(argv)
    if a.tokens < 2 * a.batch or a.batch < 1:
        ap.error(f"--batch must be >= 1 and --tokens >= 2 x --batch (got --tokens {a.tokens}, --batch {a.batch})")
    problem = output_problem(a.out, "--out", overwrite=False) if a.out else None
    if problem:
        ap.error(problem)
    torch.manual_seed(0)
    results = []
    for run in a.runs:
        r = pull(run, a.weights, a.tokens, a.batch)
        results.append(r)
        ent = (f", H(y~) {r['entropy_y_tilde']:.3f} of log V {r['log_vocab']:.3f}"
               if not math.isnan(r["entropy_y_tilde"]) else "")
        print(f"{r['label']} [{run.name}] ({'tied' if r['tied'] else 'untied'}): s1..s3 "
              f"{r['singular_values'][:3]}, cos(v1, mean row) {r['cos_v1_mean_row']:.3f}, mean row norm "
              f"{r['row_norm']:.2f}{ent}")
        for name, f in r["parts"].items():
            print(f"    {name:30s} d s1 {f['d_s1']:+.3g}, mean d s2..50 {f['d_s_rest']:+.3g}, mean d|w| "
                  f"{f['d_row_norm']:+.3g}, |G| {f['grad_norm']:.3g}, along the mean row {f['share_along_mean_row']:.3f}")
    if a.out:
        atomic_write_json(a.out, {"command": " ".join(["python scripts/loss_pull.py", *(argv or sys.argv[1:])]),
                                  "results": results}, parents=True)
        print(f"loss_pull: wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
