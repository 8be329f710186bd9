"""A real training epoch against ``scripts/bench.py``'s update rate for the same model, on the same machine, in one run.

    python scripts/epoch_vs_bench.py --out results/bench/cpu/epoch-vs-bench-vd_lstm_small.json

Three measurements, interleaved so that load drifting over the run moves them together:

1. ``bench.py``'s rate (tokens per second of ``Trainer.train_update`` alone: forward, loss, backward, clipping, SGD
   step) for the model of the cell on synthetic tokens of its batch shape and vocabulary;
2. one full training epoch of the cell through ``repdegen.reproduce.train`` (the PTB batches, the update loop with its
   logging and checks, and the epoch's validation pass with I(W), the mean cosine and the spectrum): the epoch's
   training tokens over (train seconds + validation seconds), from the run's own history and wall clock;
3. ``bench.py``'s rate again.

The ratio epoch / bench (epoch = training tokens / (train + validation seconds); bench = the mean of 1 and 3) says
how much of an epoch goes to work that is not the model's math (batching, host syncs, logging, evaluation). Issue
27's target: >= 0.85. The run's config is the cell's except for ``trainer.max_epochs=1`` (and
``trainer.retrain_sessions=0``), in a temporary output folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))


def bench_rate(args) -> dict:
    import bench

    report = bench.main(["--models", args.model, "--objectives", "mle", "--precision", "fp32", "--batch-size",
                         str(args.batch_size), "--bptt", str(args.bptt), "--vocab", str(args.vocab),
                         "--steps", str(args.bench_steps), "--warmup", "3", "--device", "cpu"])
    r = report["results"][0]
    return {"tokens_per_s": r["tokens_per_s"], "step_time_s": r["step_time_s"], "tokens_per_update": r["tokens_per_update"]}


def real_epoch(args, out_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "repdegen.reproduce.train", f"experiment={args.experiment}", "scale=paper",
           f"objective={args.objective}", "trainer.max_epochs=1", "trainer.retrain_sessions=0", "trainer.progress=false",
           f"paths.output_dir={out_dir}", f"hydra.run.dir={out_dir}/hydra"]
    start = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    wall = time.time() - start
    if proc.returncode != 0:
        sys.exit(f"epoch_vs_bench: the epoch run failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    from repdegen.core.loaders import load_run_record

    record = load_run_record(next(out_dir.glob("runs/*/result.json")))
    h = record["history"][0]
    tokens = h["tokens_per_s"] * h["epoch_seconds"]
    return {"config_hash": record["config_hash"], "train_tokens": tokens, "train_seconds": h["epoch_seconds"],
            "valid_seconds": h["valid_seconds"], "train_tokens_per_s": h["tokens_per_s"],
            "epoch_tokens_per_s": tokens / (h["epoch_seconds"] + h["valid_seconds"]),
            "updates": h["epoch_updates"], "process_wall_s": wall,
            "log_tail": proc.stdout.strip().splitlines()[-3:]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", default="inan2017/small")
    p.add_argument("--objective", default="mle")
    p.add_argument("--model", default="vd_lstm_small")
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--bench-steps", type=int, default=40)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from repdegen.core.files import output_problem

    problem = output_problem(args.out, "--out", overwrite=False) if args.out else None
    if problem:
        p.error(problem)
    import torch
    from repdegen.core.provenance import git_commit, hardware

    before = bench_rate(args)
    with tempfile.TemporaryDirectory(prefix="repdegen-epoch-") as tmp:
        epoch = real_epoch(args, Path(tmp))
    after = bench_rate(args)
    bench_mean = (before["tokens_per_s"] + after["tokens_per_s"]) / 2
    report = {
        "command": " ".join(["python", "scripts/epoch_vs_bench.py", *(argv if argv is not None else sys.argv[1:])]),
        "git": git_commit(), "hardware": hardware(torch.device("cpu")), "threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "bench_before": before, "epoch": epoch, "bench_after": after,
        "bench_tokens_per_s": bench_mean,
        "epoch_train_vs_bench": epoch["train_tokens_per_s"] / bench_mean,
        "epoch_vs_bench": epoch["epoch_tokens_per_s"] / bench_mean,
        "epoch_process_vs_bench": epoch["train_tokens"] / epoch["process_wall_s"] / bench_mean,
    }
    print(f"bench {before['tokens_per_s']:,.0f} / {after['tokens_per_s']:,.0f} tok/s; epoch (train loop + validation) "
          f"{epoch['epoch_tokens_per_s']:,.0f} tok/s = {report['epoch_vs_bench']:.2f} x bench (train loop alone "
          f"{report['epoch_train_vs_bench']:.2f}); whole process "
          f"(start, data, train, validation, final test) {report['epoch_process_vs_bench']:.2f} x bench")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"epoch_vs_bench: wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
