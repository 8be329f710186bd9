"""``repdegen aggregate <sweep dir>... [--out DIR] [--metrics a,b]``: aggregate a sweep (a Hydra
multirun) into a table and one plot per metric. The work is :mod:`repdegen.reproduce.runs.sweeps`; ``--help`` is its
argument parser's, with the examples below."""

import contextlib
import io
import sys

from repdegen.reproduce.runs.sweeps import main, parse_args

EPILOG = """\
It writes aggregate.md, aggregate.csv, aggregate.json and aggregate_<metric>.png (mean and sd over seeds per swept
value) into --out, the first DIR by default.

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
