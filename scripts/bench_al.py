"""The augmented loss on a training step's output layer, CPU, one thread: cross-entropy alone, + the per-token
autograd form (``augmented_loss(...).mean()``), + the batch-mean form the objective uses (``augmented_loss_mean``),
in blocks of one form, A B C A B C (a block's first step untimed), forward and backward, on the targets of PTB
batches (20 streams x 35 steps: ~360 distinct
words in 700 tokens) and on random ones (~670 distinct), tied (REAL) and untied (AL). Ratios only; JSON out.

    python scripts/bench_al.py --out results/bench/cpu/al-batch-mean.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from repdegen.core.provenance import git_commit  # noqa: E402
from repdegen.losses.al import augmented_loss, augmented_loss_mean  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--alpha", type=float, default=30.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = Path(os.environ.get("REPDEGEN_DATA_DIR", REPO.parent / "shared" / "data")) / "ptb" / "ptb.train.txt"
    if not data.is_file():
        print(f"bench_al: no PTB at {data}; set REPDEGEN_DATA_DIR to the folder holding ptb/ptb.train.txt", file=sys.stderr)
        return 2
    vocab: dict = {}
    ids = torch.tensor([vocab.setdefault(w, len(vocab)) for w in data.read_text().replace("\n", " <eos> ").split()])
    n = ids.numel() // 20
    cols = ids[: n * 20].view(20, n)
    step = (n - 35) // args.rounds
    cases = {"ptb": [cols[:, s: s + 35].reshape(-1) for s in range(0, step * args.rounds, step)],
             "random": [torch.randint(0, len(vocab), (700,)) for _ in range(args.rounds)]}
    v, d = len(vocab), 200
    L, W = torch.randn(v, d, requires_grad=True), torch.randn(v, d, requires_grad=True)
    h = torch.randn(700, d)
    results = []
    for case, batches in cases.items():
        for tied in (True, False):
            M = L if tied else W
            def step(t, al=None, M=M):
                z = h @ M.t()
                loss = torch.nn.functional.cross_entropy(z, t)
                return loss if al is None else loss + args.alpha * al(z, t)

            forms = {"ce": step,
                     "ce+al_per_token": lambda t, M=M: step(t, lambda z, t: augmented_loss(z, t, L, 20.0).mean(), M),
                     "ce+al_batch_mean": lambda t, M=M: step(t, lambda z, t: augmented_loss_mean(z, t, L, 20.0), M)}
            times: dict[str, list[float]] = {k: [] for k in forms}
            for _ in range(2):  # blocks of one form (a block's first step is not timed), A B C A B C: load
                for name, f in forms.items():  # drifting over the run moves all three
                    for i, t in enumerate(batches):
                        start = time.perf_counter()
                        f(t).backward()
                        if i:
                            times[name].append(time.perf_counter() - start)
            med = {k: statistics.median(x) for k, x in times.items()}
            al_old, al_new = med["ce+al_per_token"] - med["ce"], med["ce+al_batch_mean"] - med["ce"]
            r = {"targets": case, "tied": tied, "distinct_targets": statistics.median(len(t.unique()) for t in batches),
                 "tokens": 700, "vocab": v, "dim": d, "step_s_median": med,
                 "al_part_speedup": al_old / al_new,
                 "with_output_layer_speedup": med["ce+al_per_token"] / med["ce+al_batch_mean"]}
            results.append(r)
            print(f"{case:6} {'tied' if tied else 'untied':6} {r['distinct_targets']:.0f} distinct of 700: "
                  f"CE {1000 * med['ce']:.0f} ms, +AL per-token {1000 * med['ce+al_per_token']:.0f} ms, +AL batch-mean "
                  f"{1000 * med['ce+al_batch_mean']:.0f} ms (AL part {r['al_part_speedup']:.2f}x)")
    if args.out:
        args.out.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "git": git_commit(), "threads": 1,
                                        "load_average": list(os.getloadavg()), "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
