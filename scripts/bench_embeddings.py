"""Benchmark of ``repdegen embeddings``: a 50,000 x 1,024 float32 matrix with counts, the command run as a user runs it
(a child process), its wall time and peak resident memory (``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``).

    python scripts/bench_embeddings.py --out results/bench/cpu/embeddings-50k.json
    python scripts/bench_embeddings.py --rows 5000 --dim 256 --out /tmp/emb-bench.json   # a quick check

The matrix is a Gaussian cloud shifted along one common direction with the rarest rows shifted more (a degenerate
embedding's shape, so that no group is trivially isotropic), the counts a Zipf law over the row ids. The targets: at
most 60 s and below 2 GB for 50,000 x 1,024 on a 2-core CPU. The JSON notes the load average before and after
(other processes on the machine slow the run down).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_inputs(folder: Path, rows: int, dim: int, seed: int = 0) -> tuple[Path, Path]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, dim, generator=g) * 0.05
    axis = torch.randn(dim, generator=g)
    w += (0.02 + 0.08 * torch.linspace(0, 1, rows))[:, None] * (axis / axis.norm())  # rarer rows further along it
    matrix, counts = folder / "matrix.pt", folder / "counts.json"
    torch.save({"lm_head.weight": w}, matrix)
    counts.write_text(json.dumps([int(1e7 / (i + 1)) for i in range(rows)]))
    return matrix, counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=50000)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--out", required=True, help="the JSON file to write")
    args = p.parse_args(argv)
    from repdegen.core.provenance import git_commit, hardware

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        matrix, counts = make_inputs(tmp, args.rows, args.dim)
        command = [sys.executable, "-m", "repdegen.reproduce.embeddings", str(matrix), "--counts", str(counts),
                   "--out", str(tmp / "report")]
        load_before = os.getloadavg()
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - start
        load_after = os.getloadavg()
        if proc.returncode:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
        metrics = json.loads((tmp / "report" / "metrics.json").read_text())
    result = {
        "command": f"python scripts/bench_embeddings.py --rows {args.rows} --dim {args.dim} --out {args.out}",
        "torch": torch.__version__, "git": git_commit(), "hardware": hardware("cpu"),
        "note": (f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after (other processes ran beside "
                 f"it); torch threads in the child: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"),
        "measurement": {"rows": args.rows, "dim": args.dim, "wall_s": round(wall, 2),
                        "report_seconds": round(metrics["seconds"], 2), "peak_rss_gb": round(peak_kb / 2**20, 3),
                        "targets": {"wall_s": 60, "peak_rss_gb": 2.0}, "isotropy": metrics["isotropy"],
                        "isotropy_groups": {k: g["isotropy"] for k, g in metrics["groups"].items()}},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    m = result["measurement"]
    print(f"embeddings {args.rows:,} x {args.dim:,}: {m['wall_s']} s, peak RSS {m['peak_rss_gb']} GB -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
