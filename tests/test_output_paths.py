"""Output paths (``--out``, ``--plot``, ``--out-dir``) are checked before any work, by one rule
(:func:`repdegen.core.files.output_problem`): each bad kind is one line naming the path, what was expected and the fix,
and nothing is created or overwritten."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from repdegen.core import files
from repdegen.core.files import output_problem

REPO = Path(__file__).resolve().parents[1]


def test_each_kind_of_output_path_by_hand(tmp_path):
    existing = tmp_path / "earlier.json"
    existing.write_text("{}")
    assert output_problem(tmp_path / "new.json", "--out") is None
    assert output_problem(tmp_path / "a" / "b" / "c.png", "--plot") is None  # folders made later, by the writer
    assert not (tmp_path / "a").exists()  # the check creates nothing
    assert output_problem(existing, "--plot") is None  # a figure may be drawn again
    assert "earlier.json exists; expected a new path" in output_problem(existing, "--out", overwrite=False)
    assert f"--out {tmp_path} is a folder; expected the path of a file" in output_problem(tmp_path, "--out")
    assert f"{existing} is a file, not a folder" in output_problem(existing / "x" / "y.json", "--out")
    assert output_problem(tmp_path / "new_folder", "--out", folder=True) is None
    assert f"--out {existing} is a file; expected a folder" in output_problem(existing, "--out", folder=True)


def test_a_folder_nobody_can_write_in(tmp_path, monkeypatch):
    """As root the permission bits do not stop a write, so the refusal is simulated where the check asks the disk."""
    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(files.tempfile, "TemporaryFile", refuse)
    why = output_problem(tmp_path / "sub" / "c.png", "--plot")
    assert why == (f"--plot {tmp_path / 'sub' / 'c.png'}: cannot create a file in {tmp_path} (Read-only file "
                   f"system); expected a writable folder: make it writable, or pass a path in another folder")


def test_the_entry_points_refuse_before_working(tmp_path, capsys):
    from repdegen.reproduce import aggregate
    from repdegen.reproduce.runs import status

    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    (tmp_path / "runs").mkdir()
    with pytest.raises(SystemExit) as stop:
        status.main(["--runs-dir", str(tmp_path / "runs"), "--plot", str(blocker / "c.png")])
    assert stop.value.code == 2 and f"{blocker} is a file, not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        aggregate.parse_args([str(tmp_path), "--out", str(blocker)])
    assert stop.value.code == 2 and f"--out {blocker} is a file; expected a folder" in capsys.readouterr().err
