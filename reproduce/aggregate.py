"""``repdegen aggregate <sweep dir>... [--out DIR] [--metrics a,b]``: aggregate a sweep (a Hydra
multirun) into a table and one plot per metric. This module reads the command line; the work is
:mod:`repdegen.reproduce.runs.sweeps` (the jobs as a generated table) and :mod:`repdegen.reproduce.results.sweep_render`
(rendered by the tables' pipeline); ``--help`` is its argument parser's, with the examples below."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Sequence

from repdegen.core.files import output_problem
from repdegen.reproduce.errors import exit_on_user_error
from repdegen.reproduce.results.sweep_render import run
from repdegen.reproduce.runs.sweeps import DEFAULT_METRICS, DEFAULT_REPLICATES, OPTIONAL_METRICS

DESCRIPTION = "Aggregate a Hydra multirun (a sweep) into a table and one plot per metric."


def _comma_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="repdegen aggregate", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", metavar="DIR", help="Hydra multirun folder(s) (hydra.sweep.dir)")
    p.add_argument("--out", help="where to write aggregate.* and the figures (default: the first DIR)")
    p.add_argument("--metrics", type=_comma_list, default=None,
                   help=f"comma-separated metrics of result.json's metrics.<stage> (default: {', '.join(DEFAULT_METRICS)}, "
                        f"plus {', '.join(OPTIONAL_METRICS)} where present)")
    p.add_argument("--stage", default="final", help="which stage's metrics: final (default), finetune, cache...")
    p.add_argument("--replicate", type=_comma_list, default=list(DEFAULT_REPLICATES),
                   help="comma-separated keys that are replicates, not swept values (default: seed)")
    p.add_argument("--runs-dir", help="the ledger folder to read runs from, when it moved since the sweep")
    args = p.parse_args(argv)
    problem = output_problem(args.out, "--out", folder=True) if args.out else None
    if problem:
        p.error(problem)
    return args


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    run(args.dirs, args.out, args.metrics, args.stage, args.replicate, args.runs_dir)


EPILOG = """\
It reads the sweep as a generated table (a row per swept value, mean and sd over seeds) and writes it as every
table is written (table.md, table.csv, table.tex, cells.json, the figures) with sweep_<metric>.png (each metric
against the swept value) into --out, the first DIR by default.

examples:
  repdegen aggregate outputs/multirun/2026-01-31/12-00-00
  repdegen aggregate DIR1 DIR2 --out results/sweeps/agg_alpha --metrics test_ppl,uniq,isotropy
  make aggregate SWEEP_DIR=outputs/multirun/agg_alpha-smoke/2026-01-31_12-00-00

where next:
  repdegen train --help    makes a sweep (-m +sweep=<name>, conf/sweep/; make sweep NAME=<name>)
  docs/sweeps.md (the paper sweeps, how jobs are grouped), docs/cli.md (every entry point)"""


def print_help() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parse_args(["--help"])
    print(out.getvalue().rstrip() + "\n\n" + EPILOG)


def cli() -> None:
    """``repdegen aggregate``: this command's entry (``python -m repdegen.reproduce.aggregate`` runs the same)."""
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print_help()
    else:
        main()


if __name__ == "__main__":
    cli()
