"""The subspace distance and J_tot at every epoch of the distance-over-training probe (beta = 1, tau = 10, y~ held
constant, patience 60, cap 300; declared in results/tables/inan2017_fig1/NOTES.md before it ran).

    python results/probes/inan2017_fig1/plot_distance_over_training.py [RUN_DIR ...]

Reads each run's result.json (default: the records under distance_over_training/ beside this script) and writes,
beside this script, distance_over_training.png (top: the distance of L^T and W per epoch, with the random-subspace
level sqrt(1 - d/|V|); bottom: the epoch mean of J_tot, eq. 6.1, log scale) and distance_over_training.json (per run:
the distance at chosen epochs, the first epoch under each of a few levels, [epoch, J_tot, distance] at J_tot's first
low and at the peak of the bump after it, the lowest J_tot, and the largest one-epoch rise of the distance).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT = HERE / "distance_over_training"
EPOCHS = (1, 6, 19, 27, 50, 100, 150, 200, 250, 300)
LEVELS = (0.9, 0.75, 0.5, 0.4, 0.3)


def summary(record: dict) -> dict:
    history = [h for h in record["history"] if "subspace_distance" in h]
    by_epoch = {h["epoch"]: h for h in history}
    loss = [h["train_loss"] for h in history]
    # the bump: J_tot's first low (within the first 12 epochs) and its peak after it (up to epoch 40)
    low_early = min((h for h in history if h["epoch"] <= 12), key=lambda h: h["train_loss"], default=None)
    peak = max((h for h in history if low_early and low_early["epoch"] < h["epoch"] <= 40),
               key=lambda h: h["train_loss"], default=None)
    rises = [(b["subspace_distance"] - a["subspace_distance"], b["epoch"]) for a, b in zip(history, history[1:])]
    vocab, width = record["corpus"]["vocab_size"], record["config"]["model"]["hidden_size"]
    return {
        "seed": record["config"]["seed"], "status": record.get("status"), "epochs": len(history),
        "cpu": record["hardware"]["cpu"], "commits": [s["git"]["commit"][:7] for s in record.get("starts", [])],
        "random_level": math.sqrt(1 - width / vocab),
        "distance_at": {e: by_epoch[e]["subspace_distance"] for e in EPOCHS if e in by_epoch},
        "train_loss_at": {e: by_epoch[e]["train_loss"] for e in EPOCHS if e in by_epoch},
        "first_epoch_below": {str(level): next((h["epoch"] for h in history if h["subspace_distance"] < level), None)
                              for level in LEVELS},
        "first_low": low_early and [low_early["epoch"], low_early["train_loss"],
                                                     low_early["subspace_distance"]],
        "bump_peak": peak and [peak["epoch"], peak["train_loss"], peak["subspace_distance"]],
        "lowest_train_loss": [history[loss.index(min(loss))]["epoch"], min(loss)],
        "largest_one_epoch_rise": max(rises) if rises else None,
        "final": record.get("metrics", {}).get("final", {}).get("subspace_distance"),
    }


def main(argv: list[str]) -> int:
    runs = [Path(a) for a in argv] or sorted(p for p in DEFAULT.iterdir() if (p / "result.json").is_file())
    records = [json.loads((run / "result.json").read_text()) for run in runs]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    out = {}
    for run, record in zip(runs, records):
        history = [h for h in record["history"] if "subspace_distance" in h]
        epochs = [h["epoch"] for h in history]
        label = f"seed {record['config']['seed']} ({run.name})"
        top.plot(epochs, [h["subspace_distance"] for h in history], label=label)
        bottom.plot(epochs, [h["train_loss"] for h in history], label=label)
        out[run.name] = summary(record)
    level = next(iter(out.values()))["random_level"]
    top.axhline(level, ls=":", color="grey", label=f"random subspaces ({level:.5f})")
    top.set_ylabel("subspace distance (L^T, W)")
    top.set_ylim(0, 1.02)
    top.legend(fontsize=8)
    top.set_title("Fig. 1, beta = 1, tau = 10, y~ held constant (patience 60, cap 300)")
    bottom.set_yscale("log")
    bottom.set_ylabel("J_tot (epoch mean, eq. 6.1)")
    bottom.set_xlabel("epoch")
    fig.tight_layout()
    fig.savefig(HERE / "distance_over_training.png", dpi=120)
    (HERE / "distance_over_training.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
