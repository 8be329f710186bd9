"""The paper-scale rows rendered so far, one line each: paper vs ours for every metric the table has (valid and test
PPL, ...), Δ %, and each cell's provenance (epochs per training session, wall time, hardware, commit) from the
rendering's ``cells.json`` (renderings before the provenance existed say "–"). Reads ``results/tables/*/paper/``
only: what issue 27's closing note and a session note report.

    python scripts/paper_rows.py [--tables inan2017_t1 inan2016_t1 ...] [--all]   # --all: rows not run yet too
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
    cells = json.loads(cells_path.read_text()).get("cells", []) if cells_path.is_file() else []
    provenance = {c.get("config_hash"): c.get("provenance") or {} for c in cells}
    lines = []
    with csv_path.open() as f:
        for row in csv.DictReader(f):
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", nargs="*", help="table names (default: every table with a paper rendering)")
    ap.add_argument("--all", action="store_true", help="list the rows not run yet too")
    ap.add_argument("--results", type=Path, default=REPO / "results")
    args = ap.parse_args(argv)
    names = args.tables or sorted(p.parent.parent.name for p in (args.results / "tables").glob("*/paper/table.csv"))
    lines = []
    for name in names:
        lines += rows_of(args.results / "tables" / name / "paper", args.all)
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
