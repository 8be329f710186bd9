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
    assert paper_rows.main(["--results", str(tmp_path / "none")]) == 0
    assert "no paper-scale row is rendered yet" in capsys.readouterr().err
