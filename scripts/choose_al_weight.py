"""Apply the AL/REAL weight procedure of docs/fidelity.md (Inan 2017) to the grid's runs, mechanically.

    repdegen train -m +sweep=inan2017_al_weight scale=paper objective=al     # the grid (6 runs)
    python scripts/choose_al_weight.py --objective al [--write]                         # the choice

The grid: alpha in {30, 100, 300} x target_grad in {official, none}, the small VD-LSTM at paper settings, seed 101,
4 PTB epochs, one session (conf/sweep/inan2017_al_weight.yaml). The rule, fixed before the grid ran: the lowest
validation PPL at epoch 4 wins; runs within 0.5 % of it tie, and a tie goes to target_grad=official, then to the
larger alpha. Each grid run is found in the ledger by its config hash (composed here exactly as the sweep composes
it). ``--write`` writes results/sweeps/inan2017_<objective>_weight.md. Exit status 1 while a run is incomplete.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ALPHAS = (30.0, 100.0, 300.0)
TARGET_GRADS = ("official", "none")
TIE = 0.005  # relative
EPOCH = 4


def choose(results: dict[tuple[float, str], float]) -> tuple[float, str]:
    """(alpha, target_grad) by the rule: the lowest PPL; within TIE of it, official first, then the larger alpha."""
    best = min(results.values())
    tied = [k for k, v in results.items() if v <= best * (1 + TIE)]
    return max(tied, key=lambda k: (k[1] == "official", k[0]))


def grid_hashes(objective: str, runs_dir: str) -> dict[tuple[float, str], str]:
    from hydra import initialize_config_dir
    from repdegen.reproduce.runs.cells import compose_cell
    from repdegen.reproduce.settings.config import CONF_DIR, config_hash, finalize, register_all

    register_all()
    out = {}
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for alpha in ALPHAS:
            for tg in TARGET_GRADS:
                cfg = compose_cell("inan2017/small", ["+sweep=inan2017_al_weight", "scale=paper", f"objective={objective}",
                                                      f"objective.alpha={alpha:g}", f"objective.target_grad={tg}",
                                                      "seed=101", "trainer.max_epochs=4", "trainer.retrain_sessions=0",
                                                      f"paths.runs_dir={runs_dir}"])
                out[(alpha, tg)] = config_hash(finalize(cfg))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objective", required=True, choices=["al", "real"])
    p.add_argument("--runs-dir", default="outputs/runs")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    from repdegen.reproduce.runs.ledger import Ledger

    hashes = grid_hashes(args.objective, args.runs_dir)
    ledger = Ledger(args.runs_dir, repair=False)  # read only: a corrupt record is an error naming the file
    rows, ppl = [], {}
    for key, h in hashes.items():
        rec = ledger.load(h) or {}
        hist = [e for e in rec.get("history", []) if e.get("stage") == "train"]
        at = next((e["valid_ppl"] for e in hist if e["epoch"] == EPOCH), None)
        if at is not None:
            ppl[key] = at
        rows.append((key, h, rec.get("status", "not run"), len(hist), at))
    lines = [f"# Inan 2017 small, {args.objective.upper()} weight grid (docs/fidelity.md: the procedure)", "",
             "| alpha | target_grad | config hash | status | epochs | valid PPL at epoch 4 |", "|---|---|---|---|---|---|"]
    for (alpha, tg), h, status, n, at in rows:
        shown = "–" if at is None else f"{at:.2f}" if at < 1e5 else f"{at:.3g} (diverged)"
        lines.append(f"| {alpha:g} | {tg} | `{h}` | {status} | {n} | {shown} |")
    complete = len(ppl) == len(hashes)
    if complete:
        alpha, tg = choose(ppl)
        lines += ["", f"**Choice by the rule: alpha = {alpha:g}, target_grad = {tg}** (lowest valid PPL at epoch 4; "
                      f"within {TIE:.1%} a tie, resolved towards official, then the larger alpha)."]
    else:
        lines += ["", f"Not decided: {len(hashes) - len(ppl)} of {len(hashes)} runs have not reached epoch {EPOCH}."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write and complete:
        out = REPO / "results" / "sweeps" / f"inan2017_{args.objective}_weight.md"
        out.write_text(text)
        print(f"choose_al_weight: wrote {out}")
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
