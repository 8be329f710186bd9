"""Inan, Khosravi & Socher (2017), Figure 1: subspace distance between L and W against beta (tau = 10)
and against tau (beta = 1), averaged over seeds.

    python scripts/inan2017_fig1.py --scale lite --seeds 10          # the paper averages 10 runs
    python scripts/inan2017_fig1.py --scale smoke --seeds 1 --betas 0 0.5 1 --taus 2 10

Each point is a run of ``experiment=inan2017/fig1 objective=al`` (the ledger skips runs already done);
writes ``results/figures/inan2017_fig1/<scale>/fig1.{png,json}`` (mean and std over seeds, every run's
config hash).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from hydra import initialize_config_dir  # noqa: E402
from repdegen.reproduce.settings.config import CONF_DIR, compose_config, finalize, register_all  # noqa: E402
from repdegen.reproduce.train import train  # noqa: E402


def run_point(beta: float, tau: float, seed: int, scale: str, extra: list[str]) -> dict:
    overrides = ["experiment=inan2017/fig1", "objective=al", f"objective.beta={beta}", f"objective.temperature={tau}",
                 f"seed={seed}", f"scale={scale}", "trainer.resume=true", *extra]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = finalize(compose_config(overrides))
    record = train(cfg)
    return {"beta": beta, "tau": tau, "seed": seed, "config_hash": record["config_hash"],
            "subspace_distance": record["metrics"]["final"]["subspace_distance"]}


def summarise(points: list[dict], key: str) -> list[dict]:
    out = []
    for x in sorted({p[key] for p in points}):
        vals = [p["subspace_distance"] for p in points if p[key] == x]
        out.append({key: x, "mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                    "n": len(vals)})
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="lite")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.1, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--taus", type=float, nargs="+", default=[1.0, 2.0, 5.0, 10.0, 20.0])
    parser.add_argument("--out", default="results/figures/inan2017_fig1")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for every run (e.g. trainer.device=cuda)")
    args = parser.parse_args(argv)
    register_all()
    seeds = range(1, args.seeds + 1)
    panel_a = [run_point(b, 10.0, s, args.scale, args.overrides) for b in args.betas for s in seeds]
    panel_b = [run_point(1.0, t, s, args.scale, args.overrides) for t in args.taus for s in seeds]
    result = {"scale": args.scale, "beta_at_tau10": summarise(panel_a, "beta"), "tau_at_beta1": summarise(panel_b, "tau"),
              "runs": panel_a + panel_b}
    out = Path(args.out) / args.scale
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, rows, key, label in ((axes[0], result["beta_at_tau10"], "beta", "β (τ = 10)"),
                                 (axes[1], result["tau_at_beta1"], "tau", "τ (β = 1)")):
        ax.errorbar([r[key] for r in rows], [r["mean"] for r in rows], yerr=[r["std"] for r in rows], marker="o", capsize=3)
        ax.set_xlabel(label)
        ax.set_ylabel("subspace distance(L, W)")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Inan et al. 2017, Fig. 1 — scale {args.scale}, {args.seeds} seed(s)")
    fig.tight_layout()
    fig.savefig(out / "fig1.png", dpi=120)
    plt.close(fig)
    (out / "fig1.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"inan2017_fig1: wrote {out}/fig1.png and fig1.json")
    return result


if __name__ == "__main__":
    main()
