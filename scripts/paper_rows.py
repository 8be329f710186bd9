"""The paper-scale rows rendered so far, one line each: paper vs ours for every metric the table has (valid and test
PPL, ...), Δ %, and each cell's provenance (epochs per training session, wall time, hardware, commit) from the
rendering's ``cells.json`` (``repdegen.reproduce.results.paper_rows``; ``results/README.md`` shows the same lines). Reads
``results/tables/*/paper/`` only: the lines the notes on the paper-scale runs report.

    python scripts/paper_rows.py [--tables inan2017_t1 inan2016_t1 ...] [--all]   # --all: rows not run yet too
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from repdegen.core.errors import UserError  # noqa: E402
from repdegen.reproduce.errors import EXIT_USER_ERROR, report_user_error  # noqa: E402
from repdegen.reproduce.results.paper_rows import HEADER, all_rows  # noqa: E402


def known_tables(results: Path) -> list[str]:
    """The tables of ``conf/table/*.yaml``, and any rendered under ``results/tables/`` whose config is gone."""
    return sorted({p.stem for p in (REPO / "conf" / "table").glob("*.yaml")}
                  | {p.name for p in (results / "tables").glob("*") if p.is_dir()})


def _rows(args) -> tuple[list[str], list[str]]:
    tables = args.results / "tables"
    if not tables.is_dir():
        what = "has no tables/ folder" if args.results.is_dir() else "is not a directory"
        raise UserError(f"--results {args.results} {what}; expected a results directory holding tables/<table>/paper/ "
                        f"(the repository's results/, the default); pass that folder")
    if args.tables:
        known = known_tables(args.results)
        unknown = [n for n in args.tables if n not in known]
        if unknown:
            raise UserError(f"--tables {' '.join(unknown)}: not a table; expected table names (conf/table/*.yaml): "
                            f"{', '.join(known)}; pick from those")
    return args.tables or [], all_rows(tables, args.tables, args.all)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", nargs="*", help="table names (default: every table with a paper rendering)")
    ap.add_argument("--all", action="store_true", help="list the rows not run yet too")
    ap.add_argument("--results", type=Path, default=REPO / "results")
    args = ap.parse_args(argv)
    try:
        names, lines = _rows(args)
    except UserError as err:  # a bad argument, a corrupt rendering: one line, exit status 2
        report_user_error(err)
        return EXIT_USER_ERROR
    if not lines:
        print("paper_rows: no paper-scale row is rendered yet" + (f" in {', '.join(names)}" if args.tables else ""),
              file=sys.stderr)
        return 0
    print("\n".join(HEADER + lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
