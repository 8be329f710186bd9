"""scripts/compute_table.py: TABLE=all counts a cell shared by two renderings once, from their cells.json hashes,
with or without the run ledger (hand-made renderings)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import compute_table  # noqa: E402


def _rendering(results: Path, table: str, hashes: list[str], wall: str):
    d = results / "tables" / table / "lite"
    d.mkdir(parents=True)
    cells = [{"label": f"r{i}", "status": "complete", "config_hash": h} for i, h in enumerate(hashes)]
    d.joinpath("cells.json").write_text(json.dumps({"meta": {"wall_time": wall, "seeds": [1], "hardware": "cpu"},
                                                   "cells": cells}))


def test_shared_cell_counted_once_without_and_with_the_ledger(tmp_path):
    results, runs = tmp_path / "results", tmp_path / "runs"
    _rendering(results, "a", ["h1", "h2"], "1h0m0s")  # 2 cells, 30 min each on average
    _rendering(results, "b", ["h2", "h3", "h4"], "1h30m0s")  # h2 shared; 30 min each on average
    rows = compute_table.collect(results, runs)
    total, estimated = compute_table.all_tables_time(rows)
    # without a ledger: h1, h2 at a's mean (1800 s), h3, h4 at b's mean (1800 s): 4 distinct cells, 2 h, estimated
    assert (total, estimated) == (4 * 1800.0, True)
    md = compute_table.markdown(rows)
    assert "| `lite` | 2 | 4 | ~2 h 00 min | ~1 h 00 min |" in md
    for h, s in {"h1": 600, "h2": 3000, "h3": 1200, "h4": 1500}.items():
        (runs / h).mkdir(parents=True)
        (runs / h / "result.json").write_text(json.dumps({"wall_time_s": s}))
    total, estimated = compute_table.all_tables_time(compute_table.collect(results, runs))
    assert (total, estimated) == (600 + 3000 + 1200 + 1500.0, False)
