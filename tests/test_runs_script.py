"""scripts/runs.py: the ledger listing and the side-by-side validation curves of a diagnostic."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import runs  # noqa: E402


def write_run(root: Path, h: str, label: str, valid: list[float], final: dict | None = None) -> None:
    d = root / h
    d.mkdir(parents=True)
    history = [{"stage": "train", "epoch": i + 1, "valid_ppl": v, "isotropy": 0.9 - 0.1 * i, "mean_cos": 0.01 * i}
               for i, v in enumerate(valid)]
    record = {"config_hash": h, "config": {}, "label": label, "scale": "lite", "status": "complete", "history": history,
              "metrics": {"final": final or {}}, "wall_time_s": 61.4}
    (d / "result.json").write_text(json.dumps(record))


def test_lists_every_run_and_plots_their_curves(tmp_path, capsys):
    write_run(tmp_path / "runs", "aaaa1111", "inan2017/small/mle", [480.0, 320.0, 260.0], {"test_ppl": 251.25})
    write_run(tmp_path / "runs", "bbbb2222", "inan2017/small/real", [740.0, 550.0])
    out_png = tmp_path / "diag" / "curves.png"
    runs.main([str(tmp_path / "runs"), "--plot", str(out_png)])
    lines = capsys.readouterr().out.splitlines()
    first = lines[1].split()
    # the last epoch's values stand in where the run has no final metrics
    assert first == ["aaaa1111", "inan2017/small/mle", "lite", "complete", "3", "260.00", "251.25", "0.700", "0.0200",
                     "61s"]
    assert lines[2].split()[4:9] == ["2", "550.00", "-", "0.800", "0.0100"]
    assert out_png.is_file() and out_png.stat().st_size > 1000 and f"wrote {out_png}" in lines[-1]
    # one run directory works as well as a ledger
    runs.main([str(tmp_path / "runs" / "bbbb2222")])
    assert "bbbb2222" in capsys.readouterr().out


def test_a_missing_ledger_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="does not exist; pass a ledger"):
        runs.main([str(tmp_path / "nowhere")])
