"""Compare a ledger of cells run on another device (a lent GPU) with this machine's ledger, cell by cell
and claim by claim (issue 25, queue item 2).

Cells are matched by config hash (the device is not part of it, so the same command on a GPU and on the
CPU gives the same hash). Claims are compared from two renderings of the same tables: the committed CPU
ones (``results/tables/<t>/<scale>/claims.json``) and the device's, rendered here from its ledger with

    repdegen table table=<t,...> scale=lite render_only=true \
        paths.runs_dir=<device ledger> paths.tables_dir=<device tables>

Writes a markdown report (``--out``) and prints it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _fmt(x: float | None, places: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{places}f}"


def _pct(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0:
        return "–"
    return f"{100 * (b - a) / a:+.1f} %"


def cell_rows(tables: list[str], tables_cpu: Path, runs_cpu: Path, runs_dev: Path, scale: str) -> list[str]:
    lines = ["| table | row | seed | hash | valid PPL CPU | GPU | Δ | I(W) CPU | GPU | wall CPU (min) | GPU (min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    seen: set[str] = set()
    for t in tables:
        cells = (_load(tables_cpu / t / scale / "cells.json") or {}).get("cells", [])
        for c in cells:
            h = c.get("config_hash")
            if not h or h in seen:
                continue
            seen.add(h)
            cpu, dev = _load(runs_cpu / h / "result.json"), _load(runs_dev / h / "result.json")
            if cpu is None or dev is None:
                lines.append(f"| {t} | {c['label']} | {c['seed']} | `{h}` | {'–' if cpu is None else 'ok'} | "
                             f"{'not run' if dev is None else 'ok'} | | | | | |")
                continue
            fc, fd = cpu["metrics"]["final"], dev["metrics"]["final"]
            lines.append(
                f"| {t} | {c['label']} | {c['seed']} | `{h}` | {_fmt(fc.get('valid_ppl'))} | {_fmt(fd.get('valid_ppl'))} | "
                f"{_pct(fc.get('valid_ppl'), fd.get('valid_ppl'))} | {_fmt(fc.get('isotropy'), 3)} | "
                f"{_fmt(fd.get('isotropy'), 3)} | {_fmt(cpu.get('wall_time_s', 0) / 60)} | "
                f"{_fmt(dev.get('wall_time_s', 0) / 60, 2)} |")
    return lines


def claim_rows(tables: list[str], tables_cpu: Path, tables_dev: Path, scale: str) -> tuple[list[str], int, int]:
    lines = ["| table | claim | CPU | GPU | CPU: ours | GPU: ours |", "|---|---|---|---|---|---|"]
    same = differ = 0
    for t in tables:
        a = (_load(tables_cpu / t / scale / "claims.json") or {}).get("claims", [])
        b = {c["text"]: c for c in (_load(tables_dev / t / scale / "claims.json") or {}).get("claims", [])}
        for c in a:
            d = b.get(c["text"])
            if c.get("state") == "n/a" and (d is None or d.get("state") == "n/a"):
                continue
            mc, md = c.get("mark", "–"), (d or {}).get("mark", "–")
            same, differ = (same + 1, differ) if mc == md else (same, differ + 1)
            ours_c = "; ".join(k.get("ours", "") for k in c.get("checks", []))
            ours_d = "; ".join(k.get("ours", "") for k in (d or {}).get("checks", []))
            flag = "" if mc == md else " **differs**"
            lines.append(f"| {t} | {c['text']}{flag} | {mc} | {md} | {ours_c} | {ours_d} |")
    return lines, same, differ


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", nargs="+", required=True)
    p.add_argument("--scale", default="lite")
    p.add_argument("--runs-dev", type=Path, required=True, help="the device's ledger (result.json per hash)")
    p.add_argument("--tables-dev", type=Path, required=True, help="the device's renderings (claims.json)")
    p.add_argument("--runs-cpu", type=Path, default=Path("outputs/runs"))
    p.add_argument("--tables-cpu", type=Path, default=Path("results/tables"))
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    claims, same, differ = claim_rows(a.tables, a.tables_cpu, a.tables_dev, a.scale)
    text = "\n".join([
        f"## Claims: {same} same verdict, {differ} different", "", *claims, "",
        "## Cells", "", *cell_rows(a.tables, a.tables_cpu, a.runs_cpu, a.runs_dev, a.scale), ""])
    if a.out:
        a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
