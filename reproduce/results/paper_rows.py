"""The paper-scale rows rendered so far: paper vs ours for every metric a row has (valid and test PPL, ...), Δ %, and
each cell's provenance (epochs per training session, wall time, hardware, commit), read from the renderings under
``results/tables/<table>/paper/`` (``table.csv`` and ``cells.json``; renderings before the provenance existed say
"–"). ``scripts/paper_rows.py`` prints them; ``repdegen.reproduce.report`` puts them on the front page of ``results/``."""

from __future__ import annotations

from pathlib import Path

from repdegen.core.loaders import STATUS_COMPLETE, BadFile, check_keys, load_cells_json, load_table_csv, rendering_fix

HEADER = ["| table | row | paper vs ours | epochs (per session) | wall time | hardware | commit |",
          "|---|---|---|---|---|---|---|"]


def _float(x) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def rows_of(table_dir: Path, include_missing: bool = False) -> list[str]:
    """Markdown table lines (under ``HEADER``) for one rendering (``<table>/paper``); complete rows only unless
    ``include_missing``. A corrupt ``table.csv`` or ``cells.json`` raises ``BadFile`` naming it and the fix."""
    csv_path, cells_path = table_dir / "table.csv", table_dir / "cells.json"
    if not csv_path.is_file():
        return []
    cells = load_cells_json(cells_path, rendering_fix(cells_path))["cells"] if cells_path.is_file() else []

    def error(why: str) -> BadFile:
        return BadFile(cells_path, "rendered table's cells.json", why, "the JSON object repdegen.reproduce.runs.tables writes",
                       rendering_fix(cells_path))

    provenance = {}
    for i, c in enumerate(cells):  # what is read of each cell: its hash and provenance (epochs a list)
        check_keys(c, {}, error, {"config_hash": str, "provenance": (dict, type(None))}, where=f"cells[{i}].")
        check_keys(c.get("provenance") or {}, {}, error, {"epochs": (list, type(None))}, where=f"cells[{i}].provenance.")
        provenance[c.get("config_hash")] = c.get("provenance") or {}
    lines = []
    for row in load_table_csv(csv_path, rendering_fix(csv_path)):
        if row["status"] != STATUS_COMPLETE and not include_missing:
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


def all_rows(tables_dir: Path, names: list[str] | None = None, include_missing: bool = False) -> list[str]:
    """``rows_of`` over the named tables (default: every table with a paper rendering), in name order."""
    names = names or sorted(p.parent.parent.name for p in Path(tables_dir).glob("*/paper/table.csv"))
    return [line for name in names for line in rows_of(Path(tables_dir) / name / "paper", include_missing)]
