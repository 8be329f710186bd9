"""The compute table: for every committed rendering (table x scale), its cells, the wall time they took as run and the
hardware, and an estimate for ``TABLE=all`` per scale (cells shared by several tables counted once).

    python scripts/compute_table.py                  # Markdown on stdout
    python scripts/compute_table.py --out docs/compute.md
    python scripts/compute_table.py --check          # exit 1 if docs/compute.md's per-rendering rows are stale

Reads ``results/tables/<table>/<scale>/cells.json`` (committed: the cells, the rendering's summed wall time and
hardware) and, where the run ledger holds them, each cell's ``outputs/runs/<hash>/result.json`` (its own wall time:
what lets a cell shared by two tables count once). Nothing is trained or timed here: every number is a recorded
wall time of a real run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCALES = ("smoke", "lite", "paper")
START, END = "<!-- compute-table: scripts/compute_table.py -->", "<!-- /compute-table -->"  # where the table goes


def parse_duration(text: str | None) -> float | None:
    """"2h38m" / "1m31s" / "0m44s" -> seconds (the renderings' wall-time format)."""
    if not text:
        return None
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text.strip())
    if not m or not any(m.groups()):
        return None
    h, mi, s = (int(g or 0) for g in m.groups())
    return 3600 * h + 60 * mi + s


def fmt(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{max(minutes, 1)} min"


def collect(results: Path, runs: Path) -> list[dict]:
    rows = []
    for cells_json in sorted(results.glob("tables/*/*/cells.json")):
        data = json.loads(cells_json.read_text())
        meta = data.get("meta") or {}
        scale = cells_json.parent.name
        if scale not in SCALES:
            continue
        cells = {c["config_hash"]: c for c in data.get("cells", []) if c.get("config_hash")}
        complete = [h for h, c in cells.items() if c.get("status") == "complete"]
        per_cell = {}
        for h in complete:
            record = runs / h / "result.json"
            if record.is_file():
                per_cell[h] = float(json.loads(record.read_text()).get("wall_time_s") or 0.0)
        rows.append({"table": cells_json.parent.parent.name, "scale": scale, "cells": len(cells),
                     "complete": len(complete), "hashes": complete, "seeds": meta.get("seeds") or [],
                     "hardware": meta.get("hardware", "–"),
                     "wall_s": parse_duration(meta.get("wall_time")), "per_cell": per_cell})
    return rows


def all_tables_time(rows: list[dict]) -> tuple[float, bool]:
    """(seconds, estimated): the distinct cells of ``rows`` summed once each; a cell without its own wall time in the
    ledger counts at the mean cell time of the first row that lists it (its rendering's sum / its complete cells)."""
    seen: dict[str, float] = {}
    estimated = False
    for r in rows:
        mean = (r["wall_s"] or 0.0) / r["complete"] if r["complete"] else 0.0
        for h in r["hashes"]:
            if h in seen:
                continue
            if h in r["per_cell"]:
                seen[h] = r["per_cell"][h]
            else:
                seen[h], estimated = mean, True
    return sum(seen.values()), estimated


def markdown(rows: list[dict]) -> str:
    lines = ["| table | scale | cells complete / listed | seeds | wall time of the cells, as run (sum) "
             "| at `launch.parallel=2` (sum / 2) | hardware |", "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (SCALES.index(r["scale"]), r["table"])):
        half = None if r["wall_s"] is None else r["wall_s"] / 2
        lines.append(f"| `{r['table']}` | `{r['scale']}` | {r['complete']} / {r['cells']} | "
                     f"{', '.join(map(str, r['seeds'])) or 'preset'} | {fmt(r['wall_s'])} | {fmt(half)} | {r['hardware']} |")
    lines += ["", "`TABLE=all` per scale, from these recordings: a cell shared by several tables (the same config hash "
              "in their `cells.json`) counted once, at its own wall time where the ledger holds it, otherwise at the mean "
              "cell time of the first rendering that lists it (an estimate: marked ~):", "",
              "| scale | tables rendered | distinct cells | wall time, one lane (sum) | at `launch.parallel=2` |",
              "|---|---|---|---|---|"]
    for scale in SCALES:
        at = sorted((r for r in rows if r["scale"] == scale), key=lambda r: r["table"])
        if not at:
            continue
        total, estimated = all_tables_time(at)
        mark = "~" if estimated else ""
        lines.append(f"| `{scale}` | {len(at)} | {len({h for r in at for h in r['hashes']})} | {mark}{fmt(total)} | "
                     f"{mark}{fmt(total / 2)} |")
    return "\n".join(lines) + "\n"


def rendering_rows(markdown_text: str) -> list[str]:
    """The per-rendering rows of a compute table (its first table: one line per committed table x scale). They come
    from the committed ``cells.json`` alone, unlike the ``TABLE=all`` estimates below them (which read the ledger
    where it holds a cell), so a clean clone can check them."""
    out = []
    for line in markdown_text.split("\n\n", 1)[0].splitlines():
        if line.startswith("| `"):
            out.append(line)
    return out


def stale_rows(doc_text: str, rows: list[dict]) -> tuple[list[str], list[str]]:
    """(missing from the doc, in the doc but not rendered): the per-rendering rows that differ."""
    documented = rendering_rows(doc_text.split(START, 1)[1].lstrip("\n"))
    rendered = rendering_rows(markdown(rows))
    return [r for r in rendered if r not in documented], [r for r in documented if r not in rendered]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=str(ROOT / "results"))
    parser.add_argument("--runs", default=str(ROOT / "outputs" / "runs"))
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--out", default=None, help="write into this Markdown file, between its compute-table markers")
    mode.add_argument("--check", nargs="?", const=str(ROOT / "docs" / "compute.md"), default=None, metavar="FILE",
                        help="check that FILE's (default docs/compute.md) per-rendering rows match results/; exit 1 "
                             "and name the rows if not")
    args = parser.parse_args(argv)
    rows = collect(Path(args.results), Path(args.runs))
    doc = Path(args.check or args.out) if (args.check or args.out) else None
    text = doc.read_text() if doc is not None and doc.is_file() else ""
    if doc is not None and (START not in text or END not in text):
        what = "no" if doc.is_file() else "no such file, so no"
        print(f"repdegen: error: {doc}: {what} {START} ... {END} markers; add them where the table goes (the "
              f"default is docs/compute.md)", file=sys.stderr)
        return 2
    if args.check is not None:
        missing, extra = stale_rows(text, rows)
        if not (missing or extra):
            print(f"repdegen: {args.check}: the compute table matches results/")
            return 0
        print(f"repdegen: {args.check}'s compute table is stale (results/ changed since it was written):",
              file=sys.stderr)
        for r in missing:
            print(f"  rendered, not in the doc: {r}", file=sys.stderr)
        for r in extra:
            print(f"  in the doc, not rendered: {r}", file=sys.stderr)
        print(f"  fix: python scripts/compute_table.py --out {args.check}", file=sys.stderr)
        return 1
    table = markdown(rows)
    if args.out is None:
        sys.stdout.write(table)
        return 0
    head, rest = text.split(START, 1)
    doc.write_text(f"{head}{START}\n{table}{END}{rest.split(END, 1)[1]}")
    print(f"repdegen: wrote the compute table into {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
