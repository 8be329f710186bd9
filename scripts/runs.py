"""List the runs in a ledger: label, scale, status, epochs, PPL, geometry, wall time; optionally plot their
validation curves side by side (a diagnostic: e.g. a longer run of the two cells behind a claim that did not show).

    python scripts/runs.py [outputs/runs ...] [--plot results/diagnostics/x.png] [--title "..."]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repdegen.analysis.figures import plot_validation_curves
from repdegen.core.errors import CorruptFile
from repdegen.core.files import output_problem
from repdegen.core.loaders import load_run_record


def load_runs(roots: list[str]) -> list[dict]:
    """The result.json records under each root (a ledger ``.../runs`` or one run directory), in path order."""
    records = []
    for root in roots:
        root = Path(root)
        if not root.exists():
            sys.exit(f"runs.py: {root} does not exist; pass a ledger (e.g. outputs/runs) or a run directory")
        paths = [root / "result.json"] if (root / "result.json").is_file() else sorted(root.glob("*/result.json"))
        try:
            records += [load_run_record(p) for p in paths]
        except CorruptFile as err:
            sys.exit(f"runs.py: error: {err}")
    return records


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_rows(records: list[dict]) -> list[tuple]:
    rows = []
    for r in records:
        final = r.get("metrics", {}).get("final", {})
        last = r["history"][-1] if r.get("history") else {}
        rows.append((r["config_hash"], r.get("label", "?"), r.get("scale", "?"), r.get("status", "?"),
                     len(r.get("history", [])), _fmt(final.get("valid_ppl", last.get("valid_ppl")), ".2f"),
                     _fmt(final.get("test_ppl"), ".2f"), _fmt(final.get("isotropy", last.get("isotropy")), ".3f"),
                     _fmt(final.get("mean_cos", last.get("mean_cos")), ".4f"), f"{r.get('wall_time_s', 0):.0f}s"))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="*", default=["outputs/runs"], help="ledgers or run directories")
    parser.add_argument("--plot", help="write the runs' validation PPL against epoch to this PNG")
    parser.add_argument("--title", default="validation perplexity by epoch", help="the plot's title")
    args = parser.parse_args(argv)
    problem = output_problem(args.plot, "--plot") if args.plot else None
    if problem:
        parser.error(problem)
    records = load_runs(args.roots)
    header = ("hash", "label", "scale", "status", "epochs", "valid", "test", "I(W)", "mean cos", "wall")
    rows = table_rows(records)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in (header, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))
    if args.plot:
        series = [(f"{r.get('label', r['config_hash'])} [{r['config_hash'][:8]}]", None,
                   [{"stage": "train", **h} if "stage" not in h else h for h in r.get("history", [])])
                  for r in records]
        written = plot_validation_curves(series, Path(args.plot), args.title)
        print(f"runs.py: wrote {written}" if written else "runs.py: no run has a history to plot")


if __name__ == "__main__":
    main()
