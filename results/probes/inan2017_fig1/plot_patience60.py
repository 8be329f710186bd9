"""J_tot over training for the patience-60 probe and the registered cells it extends (beta = 1, tau = 10, y~ constant).

    python results/probes/inan2017_fig1/plot_patience60.py

Reads the records under results/probes/inan2017_fig1/ and results/tables/inan2017_fig1/paper/records/ and writes
patience60_jtot.png beside this script: the epoch mean of J_tot (eq. 6.1) against the epoch, one line per run, with
the distance of each run's last weights in its legend entry.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
TABLE = HERE.parents[1] / "tables" / "inan2017_fig1" / "paper" / "records"
RUNS = [(HERE / "050efc09ac1830e4", "probe, seed 1 (patience 60, cap 300)", "-"),
        (HERE / "d5531444c177e80b", "probe, seed 2 (patience 60, cap 300)", "-"),
        (TABLE / "013a7f907d4f3609", "registered cell, seed 1 (patience 20)", "--"),
        (TABLE / "0c654226b4ffa114", "registered cell, seed 2 (patience 20)", "--")]


def main() -> int:
    fig, ax = plt.subplots(figsize=(7, 4))
    for run, label, style in RUNS:
        record = json.loads((run / "result.json").read_text())
        history = record["history"]
        distance = record["metrics"]["final"]["subspace_distance"]
        ax.plot([r["epoch"] for r in history], [r["train_loss"] for r in history], style,
                label=f"{label}: distance {distance:.3f}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("J_tot (epoch mean, eq. 6.1)")
    ax.set_yscale("log")
    ax.set_title("Fig. 1, beta = 1, tau = 10, y~ held constant: past the early bump")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "patience60_jtot.png", dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
