"""The lite-v2 baseline-only pilot of docs/lite_v2.md: the MLE row of one experiment at its lite
budget, on a seed outside every table's (101), at the preset's lr x {0.5, 1, 2, 4}; the lr with the lowest validation
PPL wins (within 0.5 % of the preset's lr: the preset's); then the regime checks of section 2 on the chosen run.

    python scripts/lite_pilot.py --name yu_lm experiment=yu2022/lm6_wt103 objective=mle
    python scripts/lite_pilot.py --name inan2017_small --checks overfits levelled -- experiment=inan2017/small objective=mle
    python scripts/lite_pilot.py --name yu_lm_agg_alpha --param objective.alpha --values 0.175 0.525 0.875 --tie-to 0.525 \
        -- experiment=yu2022/lm6_wt103 objective=agg optim.lr=0.0028      # another setting's grid (section 2.3)

(``--`` ends the options before the overrides where an option takes several values.)

Two one-thread cells at a time (``--parallel``); each is an ordinary ``repdegen.reproduce.train`` run in the ledger, so an
interrupted pilot resumes. Writes ``results/pilots/<name>.json`` and ``.md`` (the runs, the checks, the decision).
The decision is applied by hand to the preset's ``conf/experiment_scale/<experiment>/lite.yaml`` (with a comment
naming the pilot file), before the table's cells run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHECKS = ("overfits", "degenerates", "levelled", "rare")
TIE = 0.005  # an lr within 0.5 % of the preset's lr's validation PPL: the preset's lr stays


def run_cell(overrides: list[str], log: Path) -> str:
    """Train one cell (or find it complete in the ledger); its run directory."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "repdegen.reproduce.train", *overrides, "trainer.progress=false", "trainer.resume=true"]
    with log.open("w") as out:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    text = log.read_text()
    found = re.findall(r"\[([0-9a-f]{16})\]", text)
    if rc != 0 or not found:
        raise SystemExit(f"lite_pilot: {' '.join(cmd)} failed (exit {rc}); see {log}")
    return str(ROOT / "outputs" / "runs" / found[-1])


def init_geometry(run_dir: Path) -> dict:

    from repdegen.analysis.metrics import embedding_metrics

    path = run_dir / "init_embedding.pt"
    if not path.is_file():
        return {}
    from repdegen.core.loaders import load_tensor_file

    init = load_tensor_file(path, "initial embedding file", "move it aside, or train the run again")
    return {k: float(v) for k, v in embedding_metrics(init).items() if k in ("isotropy", "mean_cos")}


def rare_counts(run_dir: Path) -> dict:

    from repdegen.analysis.groups import frequency_groups
    from repdegen.core.loaders import load_tensor_file

    counts = load_tensor_file(run_dir / "vocab_counts.pt", "vocabulary counts file", "train the run again")
    specials = 4 if (run_dir / "bpe.model").is_file() else 0
    rare = counts[frequency_groups(counts, n_specials=specials)["rare"]].float()
    return {"rare_types": int(rare.numel()), "rare_median_count": float(rare.median()),
            "rare_frac_ge5": float((rare >= 5).float().mean()), "rare_frac_unseen": float((rare == 0).float().mean())}


def hardware(run_dir: Path) -> str:
    """Where the run trained, from its record (the GPU's name, or the CPU's cores), and its precision."""
    from repdegen.core.loaders import load_run_record

    result = load_run_record(run_dir / "result.json")
    hw, precision = result.get("hardware", {}), result.get("config", {}).get("trainer", {}).get("precision", "?")
    if hw.get("device") == "cuda":
        return f"one {hw.get('gpu', 'GPU')} ({precision})"
    return f"{hw.get('cpu_count', '?')}-core {hw.get('cpu', 'CPU')} CPU ({precision})"


def summarize(run_dir: Path) -> dict:
    from repdegen.core.loaders import load_run_record

    result = load_run_record(run_dir / "result.json")
    hist = [h for h in result["history"] if "valid_ppl" in h]
    valid = [h["valid_ppl"] for h in hist]
    best = min(range(len(valid)), key=valid.__getitem__)
    return {"run": run_dir.name, "epochs": len(hist), "valid_ppl": valid, "best_epoch": best + 1, "best_valid_ppl": valid[best],
            "mean_cos": [h.get("mean_cos") for h in hist], "isotropy": [h.get("isotropy") for h in hist],
            "epoch_seconds": [h.get("epoch_seconds") for h in hist], "init": init_geometry(run_dir), **rare_counts(run_dir)}


def lasting_overfit_epoch(valid: list[float], rise: float = 0.01) -> int | None:
    """docs/lite_v2.md section 5 as amended (an overfit must last): the smallest E such that the best validation PPL of
    the first E epochs is at an epoch <= E - 2 and every epoch after it, up to E, is >= ``rise`` above it; None: none."""
    for e in range(3, len(valid) + 1):
        head = valid[:e]
        b = min(range(e), key=head.__getitem__)
        if b + 1 <= e - 2 and all(x >= head[b] * (1 + rise) for x in head[b + 1:]):
            return e
    return None


def regime(s: dict, checks: list[str]) -> dict:
    """Section 2's regime checks on one pilot run: {check: (holds, what was measured)}."""
    v = s["valid_ppl"]
    out = {}
    if "overfits" in checks:
        rise = v[-1] / s["best_valid_ppl"] - 1
        e = lasting_overfit_epoch(v)
        out["overfits"] = (e is not None,
                           f"best valid PPL at epoch {s['best_epoch']} of {len(v)}; the last is {100 * rise:+.2f} % over it; "
                           + (f"a lasting overfit (section 5 as amended) first at E = {e}" if e else
                              "no lasting overfit (best at <= E - 2, every later epoch >= 1 % above it) within these epochs"))
    if "degenerates" in checks:
        c0, i0 = s["init"].get("mean_cos"), s["init"].get("isotropy")
        c1, i1 = s["mean_cos"][-1], s["isotropy"][-1]
        ok = (c0 is not None and c1 - c0 >= 0.05) or (i0 is not None and i1 <= 0.9 * i0)
        out["degenerates"] = (bool(ok), f"mean cosine {c0:.4f} at init -> {c1:.4f}; I(W) {i0:.3g} -> {i1:.3g}")
    if "levelled" in checks:
        gain = (v[-2] - v[-1]) / v[-2] if len(v) > 1 else float("nan")
        out["levelled"] = (len(v) > 1 and gain < 0.02, f"the last epoch improves valid PPL by {100 * gain:.2f} %")
    if "rare" in checks:
        out["rare"] = (s["rare_frac_unseen"] == 0 and s["rare_median_count"] >= 10,
                       f"rare group: {s['rare_types']} types, median count {s['rare_median_count']:.0f} in the slice, "
                       f"{100 * s['rare_frac_unseen']:.1f} % unseen")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True, help="the pilot's name: results/pilots/<name>.{json,md}")
    ap.add_argument("--factors", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0], help="multiples of the preset's lr")
    ap.add_argument("--param", default="optim.lr", help="the setting the grid varies (default: the lr, by --factors)")
    ap.add_argument("--values", type=float, nargs="+", help="the grid's values of --param (instead of --factors)")
    ap.add_argument("--tie-to", type=float, help="the value a tie within 0.5 %% goes to (default: the preset's lr)")
    ap.add_argument("--seed", type=int, default=101, help="a seed outside every table's (docs/lite_v2.md)")
    ap.add_argument("--parallel", type=int, default=2, help="one-thread cells at a time")
    ap.add_argument("--checks", nargs="+", default=["degenerates", "levelled", "rare"], choices=CHECKS)
    ap.add_argument("overrides", nargs="+", help="repdegen.reproduce.train overrides of the baseline row (scale=lite is added)")
    args = ap.parse_args(argv)

    from hydra import initialize_config_dir
    from repdegen.reproduce.settings.config import compose_config, finalize, register_all

    register_all()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        base_lr = float(finalize(compose_config([*args.overrides, "scale=lite"])).optim.lr)
    logs = ROOT / "outputs" / "logs" / f"pilot-{args.name}"
    logs.mkdir(parents=True, exist_ok=True)
    if args.values:
        lrs, factors, tie = list(args.values), [1.0 if v == args.tie_to else 0.0 for v in args.values], args.tie_to
    else:
        lrs, factors, tie = [base_lr * f for f in args.factors], list(args.factors), base_lr
    start = time.time()
    key = args.param

    def one(lr: float) -> str:
        return run_cell([*args.overrides, "scale=lite", f"seed={args.seed}", f"{key}={lr:g}"], logs / f"{key}{lr:g}.log")

    with ThreadPoolExecutor(args.parallel) as pool:
        dirs = list(pool.map(one, lrs))
    runs = [dict(lr=lr, factor=f, **summarize(Path(d))) for lr, f, d in zip(lrs, factors, dirs)]
    preset = next((r for r in runs if r["factor"] == 1.0), None)
    chosen = min(runs, key=lambda r: r["best_valid_ppl"])
    if preset is not None and chosen["best_valid_ppl"] >= preset["best_valid_ppl"] * (1 - TIE):
        chosen = preset
    checks = {k: {"holds": bool(ok), "measured": what} for k, (ok, what) in regime(chosen, args.checks).items()}
    epoch_s = [x for x in chosen["epoch_seconds"] if x]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    out = {"name": args.name, "overrides": args.overrides, "seed": args.seed, "param": key, "base_lr": base_lr,
           "tie_to": tie, "runs": runs, "chosen": chosen["lr"], "checks": checks,
           "cell_minutes": sum(epoch_s) / 60 if epoch_s else None, "wall_minutes": (time.time() - start) / 60,
           "rules": "docs/lite_v2.md section 2", "commit": commit, "hardware": hardware(Path(dirs[0]))}
    dest = ROOT / "results" / "pilots"
    dest.mkdir(parents=True, exist_ok=True)
    written = dest / f"{args.name}.json"
    if written.is_file() and json.loads(written.read_text()).get("runs") == json.loads(json.dumps(runs)):
        # every run was complete in the ledger already: the pilot's record (its commit, its wall time) stays
        print(f"lite_pilot: {written} already records these runs; kept as it is")
        return 0
    written.write_text(json.dumps(out, indent=1) + "\n")
    lines = [f"# Lite-v2 pilot `{args.name}` (docs/lite_v2.md section 2)", "",
             f"`python scripts/lite_pilot.py --name {args.name} {' '.join(args.overrides)}` — seed {args.seed}, "
             f"commit {commit}, {hardware(Path(dirs[0]))}, {args.parallel} cells at a time, {out['wall_minutes']:.0f} min.", "",
             f"| {key} | valid PPL per epoch | best (epoch) | mean cos init → last | I(W) init → last | min/epoch |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        curve = " ".join(f"{x:.1f}" for x in r["valid_ppl"])
        es = [x for x in r["epoch_seconds"] if x]
        init = r["init"]
        lines.append(f"| {r['lr']:g}{' (default)' if r['factor'] == 1.0 else ''} | {curve} | "
                     f"{r['best_valid_ppl']:.2f} ({r['best_epoch']}) | {init.get('mean_cos', math.nan):.4f} → "
                     f"{r['mean_cos'][-1]:.4f} | {init.get('isotropy', math.nan):.3g} → {r['isotropy'][-1]:.3g} | "
                     f"{sum(es) / max(len(es), 1) / 60:.1f} |")
    why = (f"the default, the lowest or within {100 * TIE:g} % of it" if chosen is preset else
           f"the lowest best validation PPL, more than {100 * TIE:g} % below the default's" if preset is not None else
           "the lowest best validation PPL")
    lines += ["", f"**Chosen {key}: {chosen['lr']:g}** ({why}; the rule: the lowest best validation PPL, but the "
              f"default ({tie:g}) where it is within {100 * TIE:g} %).", "", "Regime checks on the chosen run:", ""]
    lines += [f"- {k}: {'holds' if c['holds'] else '**does not hold**'} — {c['measured']}" for k, c in checks.items()]
    (dest / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
