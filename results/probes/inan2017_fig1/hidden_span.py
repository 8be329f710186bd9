"""Which directions of W a Fig. 1 run uses: the subspace distance of W as a whole against that of the logits it makes.

Sec. 4 of Inan et al. (2017) predicts that the augmented loss matches the logits W h_t to L^T u_t (u_t the target's
input embedding), so that the logits lie in span(L^T). The registered metric compares span(W) with span(L^T) over all
d columns of W, each direction weighted alike. A direction of R^d that the hidden states never take gets no gradient
in W, and stays at its random initialisation. This probe reads a trained run of `experiment=inan2017/fig1`:

* the hidden states h_t (the last LSTM layer) over the run's own 20,000-token training window, in eval mode;
* their principal directions U_k: the fewest that hold 99 % of sum ||h_t||^2 (k; also the participation ratio);
* the registered distance d(L, W), and d(L, W U_k), the distance of the span of the logits the model makes;
* d(L, W) with W's k top singular directions only, and the norm-weighted residual ||W - P_L W||_F / ||W||_F;
* the mean cosine between distinct rows of L (word vectors), (||sum_i u_i||^2 - V) / (V (V - 1)) for unit rows u_i.

    python results/probes/inan2017_fig1/hidden_span.py outputs/runs/<hash> [...] --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from repdegen.analysis.inspection import subspace_distance
from repdegen.reproduce.runs.trained import load_lm


def hidden_states(lm) -> torch.Tensor:
    """The last layer's hidden states over the training window, as one (T, d) matrix (batch 1, state carried)."""
    tokens = lm.corpus.train.view(-1, 1)
    state = lm.model.init_state(1)
    out = []
    with torch.no_grad():
        for i in range(0, tokens.size(0), 200):
            o = lm.model(tokens[i:i + 200], state)
            state = o.state
            out.append(o.hidden.reshape(-1, o.hidden.size(-1)))
    return torch.cat(out).double()


def read(run: Path) -> dict:
    lm = load_lm(run, "cpu", "hidden_span.py")
    L = lm.model.embedding.weight.detach().double()          # V x d: its columns span the rows of the paper's L
    W = lm.model.output_weight.detach().double()             # V x d
    H = hidden_states(lm)
    s = torch.linalg.svdvals(H)
    energy = (s ** 2).cumsum(0) / (s ** 2).sum()
    k = int((energy < 0.99).sum().item()) + 1
    _, _, vh = torch.linalg.svd(H, full_matrices=False)
    uk = vh[:k].t()                                          # d x k
    qw, sw, _ = torch.linalg.svd(W, full_matrices=False)
    ql, _ = torch.linalg.qr(L)
    o = lm.record["config"]["objective"]
    u = L / L.norm(dim=1, keepdim=True)
    n = u.size(0)
    return {
        "run": run.name, "beta": o.get("beta"), "temperature": o.get("temperature"),
        "target_grad": o.get("target_grad"), "seed": lm.record["config"].get("seed"),
        "tokens": int(H.size(0)), "hidden_k99": k,
        "hidden_participation_ratio": float((s ** 2).sum() ** 2 / (s ** 4).sum()),
        "distance_W": subspace_distance(L, W),
        "distance_W_used": subspace_distance(L, W @ uk),
        "distance_W_top_k": subspace_distance(L, qw[:, :k]),
        "relative_residual_W_on_L": float((W - ql @ (ql.t() @ W)).norm() / W.norm()),
        "L_mean_cos": float((u.sum(0).pow(2).sum() - n) / (n * (n - 1))),
        "W_fro": float(W.norm()), "W_top_singular": [round(float(x), 4) for x in sw[:5]],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = []
    for run in args.runs:
        row = read(run)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
