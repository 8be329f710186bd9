"""``scripts/paper_rows.py``: the rendered paper rows with Δ % and each cell's provenance, from hand-made renderings."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import paper_rows  # noqa: E402


def test_rows_with_delta_and_provenance(tmp_path, capsys):
    d = tmp_path / "tables" / "t1" / "paper"
    d.mkdir(parents=True)
    (d / "table.csv").write_text(
        "group,label,status,config_hash,seeds,valid_ppl_paper,valid_ppl_ours,test_ppl_paper,test_ppl_ours,"
        "test_ppl_vs_base_paper\n"
        "Small,VD-LSTM,complete,aaaa,1,92.6,95.378,87.3,89.919,\n"
        "Small,VD-LSTM+AL,missing,bbbb,0,86.3,,82.9,,-4.4\n")
    (d / "cells.json").write_text(json.dumps({"cells": [
        {"config_hash": "aaaa", "provenance": {"epochs": [40, 12], "wall_time": "6h10m", "hardware": "CPU: X",
                                               "commit": "abc"}}]}))
    assert paper_rows.main(["--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # (95.378 - 92.6) / 92.6 = +3.0 %; (89.919 - 87.3) / 87.3 = +3.0 %
    assert ("| t1 | Small / VD-LSTM | test_ppl 87.3 vs 89.92 (+3.00%); valid_ppl 92.6 vs 95.38 (+3.00%) | 40 + 12 | "
            "6h10m | CPU: X | abc |") in out
    assert "VD-LSTM+AL" not in out
    assert paper_rows.main(["--results", str(tmp_path), "--all"]) == 0
    assert "| t1 | Small / VD-LSTM+AL | test_ppl 82.9 vs –; valid_ppl 86.3 vs – | – |" in capsys.readouterr().out
    assert paper_rows.main(["--results", str(tmp_path), "--tables", "inan2017_t1"]) == 0  # known, not rendered
    assert "no paper-scale row is rendered yet in inan2017_t1" in capsys.readouterr().err


def _one_line_error(capsys, *words):
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.startswith("repdegen: error: ") and captured.err.count("\n") == 1
    for w in words:
        assert w in captured.err
    return captured.err


def test_an_unknown_table_or_a_missing_results_folder_is_an_error(tmp_path, capsys):
    (tmp_path / "tables").mkdir()
    assert paper_rows.main(["--results", str(tmp_path), "--tables", "nope", "inan2017_t1"]) == 2
    _one_line_error(capsys, "--tables nope: not a table", "conf/table", "inan2017_t1, inan2017_t2", "yu2022_t1")
    for missing, what in ((tmp_path / "none", "is not a directory"), (tmp_path / "tables", "has no tables/ folder")):
        assert paper_rows.main(["--results", str(missing)]) == 2
        _one_line_error(capsys, f"--results {missing} {what}", "expected a results directory holding tables/")


def _rendering(tmp_path, cells: str | None, csv: str = "group,label,status,config_hash\nS,a,complete,aaaa\n"):
    d = tmp_path / "tables" / "t1" / "paper"
    d.mkdir(parents=True)
    (d / "table.csv").write_text(csv)
    if cells is not None:
        (d / "cells.json").write_text(cells)
    return d


def test_a_corrupt_rendering_is_one_line_naming_the_file_and_the_fix(tmp_path, capsys):
    """cells.json truncated, of another shape, or a cell's provenance of the wrong type; table.csv without a column the
    rows are read by, or with a row cut short: one line naming the file and how to render it again, exit status 2."""
    fix = "repdegen table table=t1 scale=paper render_only=true"
    good = '{"cells": [{"config_hash": "aaaa", "provenance": {"epochs": [3]}}]}'
    cases = [('{"cells": [{"config_hash": "aa', None, "invalid JSON"),
             ('[1, 2]', None, "a JSON list, not an object"),
             ('{"cells": [{"config_hash": "aaaa", "provenance": "3 epochs"}]}', None,
              "the key cells[0].'provenance' is a string"),
             ('{"cells": [{"config_hash": "aaaa", "provenance": {"epochs": 3}}]}', None,
              "the key cells[0].provenance.'epochs' is an integer"),
             (good, "group,label,config_hash\nS,a,aaaa\n", "no column 'status'"),
             (good, "group,label,status,config_hash\nS,a,compl", "row 1 has 3 fields, the header 4")]
    for i, (cells, csv, why) in enumerate(cases):
        root = tmp_path / str(i)
        d = _rendering(root, cells, *([csv] if csv else []))
        name = "cells.json" if csv is None else "table.csv"
        assert paper_rows.main(["--results", str(root)]) == 2, why
        _one_line_error(capsys, f"{d / name}: not a rendered table's {name} ({why}", fix, f"git checkout -- {d / name}")
    d = _rendering(tmp_path / "ok", good)  # the good one renders
    assert paper_rows.main(["--results", str(d.parents[2])]) == 0
    assert "| t1 | S / a | – | 3 |" in capsys.readouterr().out
