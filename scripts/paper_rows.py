"""The paper-scale rows rendered so far, one line each: paper vs ours for every metric the table has (valid and test
PPL, ...), Δ %, and each cell's provenance (epochs per training session, wall time, hardware, commit) from the
rendering's ``cells.json`` (renderings before the provenance existed say "–"). Reads ``results/tables/*/paper/``
only: what issue 27's closing note and a session note report.

    python scripts/paper_rows.py [--tables inan2017_t1 inan2016_t1 ...] [--all]   # --all: rows not run yet too
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core.errors import UserError  # noqa: E402
from core.loaders import BadFile, check_keys, load_cells_json, load_table_csv, rendering_fix  # noqa: E402
from reproduce.errors import EXIT_USER_ERROR, report_user_error  # noqa: E402


def _float(x: str) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def rows_of(table_dir: Path, include_missing: bool = False) -> list[str]:
    """Markdown table lines for one rendering (``<table>/paper``)."""
    csv_path, cells_path = table_dir / "table.csv", table_dir / "cells.json"
    if not csv_path.is_file():
        return []
    cells = load_cells_json(cells_path, rendering_fix(cells_path))["cells"] if cells_path.is_file() else []

    def error(why: str) -> BadFile:
        return BadFile(cells_path, "rendered table's cells.json", why, "the JSON object reproduce.runs.tables writes",
                       rendering_fix(cells_path))

    provenance = {}
    for i, c in enumerate(cells):  # what is read of each cell: its hash and provenance (epochs a list)
        check_keys(c, {}, error, {"config_hash": str, "provenance": (dict, type(None))}, where=f"cells[{i}].")
        check_keys(c.get("provenance") or {}, {}, error, {"epochs": (list, type(None))}, where=f"cells[{i}].provenance.")
        provenance[c.get("config_hash")] = c.get("provenance") or {}
    lines = []
    for row in load_table_csv(csv_path, rendering_fix(csv_path)):
        if row["status"] != "complete" and not include_missing:
            continue
        metrics = sorted({k[: -len("_paper")] for k in row if k.endswith("_paper") and "_vs_base" not in k})
        parts = []
        for m in metrics:
            paper, ours = _float(row.get(f"{m}_paper")), _float(row.get(f"{m}_ours"))
            if paper is None and ours is None:
                continue
            delta = f" ({(ours - paper) / paper:+.2%})" if paper and ours is not None else ""
            parts.append(f"{m} {paper if paper is not None else '–'} vs "
                         f"{f'{ours:.2f}' if ours is not None else '–'}{delta}")
        p = provenance.get(row["config_hash"].split("+")[0], {})
        epochs = " + ".join(map(str, p.get("epochs") or [])) or "–"
        label = f"{row['group']} / {row['label']}" if row.get("group") else row["label"]
        lines.append(f"| {table_dir.parent.name} | {label} | {'; '.join(parts) or '–'} | {epochs} | "
                     f"{p.get('wall_time', '–')} | {p.get('hardware', '–')} | {p.get('commit', '–')} |")
    return lines


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
    names = args.tables or sorted(p.parent.parent.name for p in tables.glob("*/paper/table.csv"))
    lines = []
    for name in names:
        lines += rows_of(tables / name / "paper", args.all)
    return names, lines


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
    print("| table | row | paper vs ours | epochs (per session) | wall time | hardware | commit |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
