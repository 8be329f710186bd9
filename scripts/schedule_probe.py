"""A diagnostic, not a table cell: how much a finished run's validation PPL still had to gain from a decaying learning
rate. It continues a ledger run's best weights (``best.pt``) in a separate directory with a fresh optimizer whose
learning rate is multiplied by ``--decay`` every epoch (epoch 1 already at ``lr * decay``), for ``--epochs`` epochs or
until ``--patience`` epochs pass without a better validation PPL, then reports the best weights' valid and test PPL
(the trainer's own final stage: the same evaluation as the run's).

Written for issue 27's Inan 2016 baseline, whose registered schedule (constant Adam lr until early stopping, fixed
before the cells ran) left it at valid 116.35 against a paper test of 104.5: the probe says how much of the gap a
schedule the paper may have used ("we tuned the model parameters") accounts for. The table's cell is not touched and
its number does not change: results/NOTES.md reports the probe beside it.

    python scripts/schedule_probe.py outputs/runs/<hash> [--decay 0.5] [--epochs 6] [--patience 1] [--out F.json]
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from repdegen.core.files import atomic_write_json, output_problem  # noqa: E402
from repdegen.core.provenance import command_line, git_commit, hardware  # noqa: E402


def probe(run: Path, out_dir: Path, decay: float, epochs: int, patience: int, lr: float | None) -> dict:
    from omegaconf import OmegaConf
    from repdegen.losses import build_objective
    from repdegen.models import build_model, resolve_tie
    from repdegen.reproduce.engine.trainer import Trainer
    from repdegen.reproduce.runs.execute import _load_corpus_quiet_off_main, pick_device
    from repdegen.reproduce.runs.ledger import read_record

    for name in ("result.json", "best.pt"):
        if not (run / name).is_file():
            raise SystemExit(f"repdegen: {run / name} is missing: give the directory of a ledger run whose training "
                             f"finished (outputs/runs/<hash>, with result.json and best.pt)")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise SystemExit(f"repdegen: {out_dir} is not empty: the probe does not write over an earlier one; give "
                         f"another --out-dir or remove it")
    cfg = OmegaConf.create(read_record(run / "result.json", "run the cell again (its ledger record is damaged)")["config"])
    base_lr = float(lr if lr is not None else cfg.optim.lr)
    OmegaConf.update(cfg, "optim.lr", base_lr)
    OmegaConf.update(cfg, "optim.lr_decay", decay)
    OmegaConf.update(cfg, "optim.decay_after_epoch", 0)
    OmegaConf.update(cfg, "trainer.max_epochs", epochs)
    OmegaConf.update(cfg, "trainer.early_stopping", patience)
    OmegaConf.update(cfg, "trainer.retrain_sessions", 0)
    OmegaConf.update(cfg, "trainer.finetune_epochs", 0)
    OmegaConf.update(cfg, "trainer.resume", False)
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(run / "best.pt", out_dir / "best.pt")

    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.trainer.device)
    corpus = _load_corpus_quiet_off_main(cfg)
    model = build_model(cfg.model, len(corpus.vocab), resolve_tie(cfg.model, cfg.objective)).to(device)
    objective = build_objective(cfg.objective, len(corpus.vocab), cfg.trainer.label_smoothing).to(device)
    tr = Trainer(cfg, model, objective, corpus, out_dir, device)
    tr.load_weights("best.pt")
    start = tr.evaluate("valid")["nll"]
    tr.state.best_val = start  # an epoch that does not beat the loaded weights leaves best.pt as it is
    tr.print(f"repdegen: probe of {run.name}: from best.pt (valid PPL {math.exp(start):.2f}), Adam lr "
             f"{base_lr:g} x {decay:g}^epoch, at most {epochs} epochs, patience {patience}")
    t0 = time.time()
    stages = tr.fit()
    final = stages.get("train") or next(iter(stages.values()))
    result = {
        "run": run.name, "label": OmegaConf.select(cfg, "model.name"), "from": "best.pt",
        "start_valid_ppl": math.exp(start),
        "schedule": {"optimizer": cfg.optim.name, "lr": base_lr, "decay_per_epoch": decay, "epochs": epochs,
                     "patience": patience, "fresh_optimizer": True},
        "epochs": [{"epoch": r["epoch"], "lr": r.get("lr"), "train_ppl": r.get("train_ppl"),
                    "valid_ppl": r.get("valid_ppl")} for r in tr.state.history],
        "final": {k: final.get(k) for k in ("valid_ppl", "test_ppl")},
        "wall_s": time.time() - t0,
        # where and with what it ran, as a run's record says it
        "command": command_line(), "git": git_commit(), "hardware": hardware(device),
    }
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--decay", type=float, default=0.5)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--patience", type=int, default=1)
    ap.add_argument("--lr", type=float, default=None, help="the base lr (default: the run's optim.lr)")
    ap.add_argument("--out-dir", type=Path, default=None, help="default: outputs/probes/<hash>-decay<d>")
    ap.add_argument("--out", type=Path, default=None, help="the result as JSON")
    a = ap.parse_args(argv)
    if not 0 < a.decay <= 1 or a.epochs < 1 or a.patience < 0:
        ap.error(f"--decay must be in (0, 1] (got {a.decay}), --epochs >= 1 (got {a.epochs}), --patience >= 0 "
                 f"(got {a.patience})")
    problem = ((output_problem(a.out, "--out", overwrite=False) if a.out else None)
               or (output_problem(a.out_dir, "--out-dir", folder=True) if a.out_dir else None))
    if problem:
        ap.error(problem)
    out_dir = a.out_dir or REPO / "outputs" / "probes" / f"{a.run.name}-decay{a.decay:g}"
    res = probe(a.run, out_dir, a.decay, a.epochs, a.patience, a.lr)
    print(f"repdegen: probe: valid {res['start_valid_ppl']:.2f} -> {res['final']['valid_ppl']:.2f}, test "
          f"{res['final']['test_ppl']:.2f} ({res['wall_s'] / 60:.1f} min)")
    atomic_write_json(a.out or out_dir / "probe.json", res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
