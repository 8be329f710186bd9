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


def test_check_names_a_stale_row_and_passes_a_fresh_one(tmp_path, capsys):
    results, runs = tmp_path / "results", tmp_path / "runs"
    _rendering(results, "a", ["h1", "h2"], "1h0m0s")
    doc = tmp_path / "compute.md"
    doc.write_text("# compute\n\n<!-- compute-table: scripts/compute_table.py -->\n<!-- /compute-table -->\ntail\n")
    argv = ["--results", str(results), "--runs", str(runs)]
    assert compute_table.main(argv + ["--check", str(doc)]) == 1  # the empty table lacks rendering a
    assert compute_table.main(argv + ["--out", str(doc)]) == 0
    assert doc.read_text().endswith("<!-- /compute-table -->\ntail\n")
    assert compute_table.main(argv + ["--check", str(doc)]) == 0
    # a third cell completes in rendering a (1 h 30 min in all): the doc's row "2 / 2 ... 1 h 00 min" is stale
    cells_json = results / "tables" / "a" / "lite" / "cells.json"
    cells = [{"label": f"r{i}", "status": "complete", "config_hash": f"h{i}"} for i in (1, 2, 3)]
    cells_json.write_text(json.dumps({"meta": {"wall_time": "1h30m0s", "seeds": [1], "hardware": "cpu"},
                                      "cells": cells}))
    capsys.readouterr()
    assert compute_table.main(argv + ["--check", str(doc)]) == 1
    err = capsys.readouterr().err
    assert "| `a` | `lite` | 3 / 3 | 1 | 1 h 30 min | 45 min | cpu |" in err  # rendered, not in the doc
    assert "| `a` | `lite` | 2 / 2 | 1 | 1 h 00 min | 30 min | cpu |" in err  # in the doc, not rendered
    assert "--out" in err
    doc.write_text("# no markers\n")
    assert compute_table.main(argv + ["--check", str(doc)]) == 2
    assert "no <!-- compute-table" in capsys.readouterr().err
    assert compute_table.main(argv + ["--check", str(tmp_path / "missing.md")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_committed_compute_doc_matches_the_committed_renderings():
    """docs/compute.md's per-rendering rows are what results/tables/*/*/cells.json give (the ledger plays no part in
    them): regenerate with `python scripts/compute_table.py --out docs/compute.md` after committing a rendering."""
    root = Path(__file__).resolve().parents[1]
    missing, extra = compute_table.stale_rows((root / "docs" / "compute.md").read_text(),
                                              compute_table.collect(root / "results", root / "no-ledger"))
    assert (missing, extra) == ([], [])
