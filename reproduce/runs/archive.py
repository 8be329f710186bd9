"""Paper-scale run records kept with their table, so that a lost ledger does not lose a finished row.

A paper-scale cell takes hours to days and its rows are built over sessions and machines; the ledger
(``outputs/runs/``) is not committed and a work tree can be lost between sessions, and with it every record the
committed rendering was made from (the rendering is then frozen: :func:`reproduce.runs.tables.render_latest` never
replaces it by one that lacks a complete cell). So a paper-scale rendering also writes, beside its table::

    results/tables/<table>/paper/records/<config hash>/result.json          the cell's run record, as in the ledger
    results/tables/<table>/paper/records/<config hash>/analysis/*.json      its analyses (reproduce/runs/trained.py)

(the small JSON files of the run, never its checkpoints or weights), and ``restore=true`` copies them back into a ledger
that lacks them (:func:`restore_records`): the cell counts as complete, is not run again, and renders with the rows
trained since. A restored run has no weights on this machine: the figures that need them (the SVD projection) and
analyses not archived leave it out, and say so.

Restoring is asked for, never done on its own: on a fresh clone ``python -m reproduce.table table=<t> scale=paper``
trains every cell, as a user reproducing the table expects.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from core.files import atomic_write_json
from core.loaders import STATUS_COMPLETE, load_run_record
from reproduce.errors import UserError

ARCHIVE_DIR = "records"
# scales whose renderings keep their cells' records (a lite or smoke cell is re-trained in minutes to an hour)
ARCHIVED_SCALES = ("paper",)
RESTORED_FILE = "restored.json"


def archive_path(table_out: Path, config_hash: str) -> Path:
    return Path(table_out) / ARCHIVE_DIR / config_hash


def _plain(record: dict) -> dict:
    """The ledger's record of a rendered one (the rendering adds ``_``-prefixed keys)."""
    return {k: v for k, v in record.items() if not k.startswith("_")}


def archive_records(table_out: Path, records: list[dict], runs_dir: Path) -> list[Path]:
    """Write each complete record of a rendering (and its run's analyses) under ``table_out/records/``; the paths
    written. An archived record of another run of the same cell (another start time: the cell was trained again after
    a ledger was lost) is kept beside it, renamed ``result.<its start>.json``, never overwritten."""
    written = []
    for rendered in records:
        record = _plain(rendered)
        h = str(record["config_hash"])
        if record.get("status") != STATUS_COMPLETE:
            continue
        dest = archive_path(table_out, h)
        target = dest / "result.json"
        old = _read_json(target)
        if old != record:
            if old is not None and old.get("started") != record.get("started"):
                stamp = str(old.get("started") or "unknown").replace(":", "")
                target.rename(dest / f"result.{stamp}.json")
            atomic_write_json(target, record, parents=True)
            written.append(target)
        for src in sorted((Path(runs_dir) / h / "analysis").glob("*.json")):
            copy = dest / "analysis" / src.name
            data = _read_json(src)
            if data is not None and _read_json(copy) != data:
                atomic_write_json(copy, data, parents=True)
                written.append(copy)
    return written


def _read_json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def archived_records(tables_dir: Path) -> dict[str, Path]:
    """{config hash: its archived record's directory} over every table and scale under ``tables_dir`` (a cell shared
    by two tables is the same run: either copy serves)."""
    found: dict[str, Path] = {}
    for path in sorted(Path(tables_dir).glob(f"*/*/{ARCHIVE_DIR}/*/result.json")):
        found.setdefault(path.parent.name, path.parent)
    return found


def restore_records(tables_dir: Path, runs_dir: Path, cells: list, log=print) -> list[str]:
    """Copy into the ledger the archived record of each of ``cells`` (objects with ``config_hash`` and ``label``) that
    the ledger does not hold; the hashes restored. A cell the ledger holds in any state (complete, or partial and
    resumable) is left as it is. An archived record that is not a complete record of that very cell is an error that
    names the file, before anything is copied."""
    archive = archived_records(tables_dir)
    todo = []
    for cell in cells:
        h = cell.config_hash
        if h not in archive or (Path(runs_dir) / h / "result.json").exists():
            continue
        src = archive[h] / "result.json"
        fix = f"restore it from git (git checkout -- {src}), or delete {archive[h]} and train the cell again"
        record = load_run_record(src, fix)  # a CorruptFile (a UserError) naming the file and the fix
        if record["config_hash"] != h or record["status"] != STATUS_COMPLETE:
            raise UserError(f"{src}: an archived run record must be a complete run of the cell it is filed under "
                            f"({h}); it holds config_hash={record['config_hash']!r}, status={record['status']!r}; {fix}")
        todo.append((cell, archive[h], record))
    restored = []
    for cell, src, record in todo:
        run = Path(runs_dir) / cell.config_hash
        for f in sorted((src / "analysis").glob("*.json")):
            data = _read_json(f)
            if data is not None:
                atomic_write_json(run / "analysis" / f.name, data, parents=True)
        atomic_write_json(run / RESTORED_FILE, {"from": str(src), "at": dt.datetime.now().isoformat(timespec="seconds")},
                          parents=True)
        atomic_write_json(run / "result.json", record, parents=True)  # last: the run counts as complete from here
        restored.append(cell.config_hash)
        log(f"repdegen: {cell.label} [{cell.config_hash}]: restored its run record from {src} (trained "
            f"{record.get('started', '?')}); complete, not run again; its weights are not on this machine, so figures "
            f"that need them leave it out")
    return restored


def restored_from(run_dir: Path) -> str | None:
    """Where a restored run's record came from (None: the run trained in this ledger)."""
    data = _read_json(Path(run_dir) / RESTORED_FILE)
    return str(data.get("from")) if isinstance(data, dict) and data.get("from") else None
