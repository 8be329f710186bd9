"""Paper-scale run records kept with their table, so that a lost ledger does not lose a finished row.

A paper-scale cell takes hours to days and its rows are built over sessions and machines; the ledger
(``outputs/runs/``) is not committed and a work tree can be lost between sessions, and with it every record the
committed rendering was made from (the rendering is then frozen:
:func:`repdegen.reproduce.results.table_render.render_latest` never replaces it by one that lacks a complete cell).
So a paper-scale rendering also writes, beside its table::

    results/tables/<table>/paper/records/<config hash>/result.json          the cell's run record, as in the ledger
    results/tables/<table>/paper/records/<config hash>/analysis/*.json      its analyses (reproduce/runs/trained.py)
    results/tables/<table>/paper/records/<config hash>/svd_projection.npz   its output embedding on its top-2 singular
                                                                            directions and the training counts (what
                                                                            the SVD-projection figure draws)

(the small files of the run, never its checkpoints or weights), and ``restore=true`` copies them back into a ledger
that lacks them (:func:`restore_records`): the cell counts as complete, is not run again, and renders with the rows
trained since, its SVD-projection panel included. A restored run has no weights on this machine: analyses not archived
leave it out, and say so. A figure that can no longer draw a row it drew before (a record archived before the
projection was, a weights file lost with a work tree) is kept aside as drawn (:func:`keep_figure_aside`).

Restoring is asked for, never done on its own: on a fresh clone ``repdegen table table=<t> scale=paper``
trains every cell, as a user reproducing the table expects.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
from pathlib import Path

from repdegen.core.files import atomic_write_json
from repdegen.core.loaders import STATUS_COMPLETE, load_cells_json, load_checkpoint, load_run_record, load_tensor_file
from repdegen.reproduce.errors import CorruptFile, UserError

ARCHIVE_DIR = "records"
# scales whose renderings keep their cells' records (a lite or smoke cell is re-trained in minutes to an hour)
ARCHIVED_SCALES = ("paper",)
RESTORED_FILE = "restored.json"
PROJECTION_FILE = "svd_projection.npz"


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
            atomic_write_json(target, record, parents=True, compact=True)  # committed: per-epoch spectra, ~0.5 MB
            written.append(target)
        for src in sorted((Path(runs_dir) / h / "analysis").glob("*.json")):
            copy = dest / "analysis" / src.name
            data = _read_json(src)
            if data is not None and _read_json(copy) != data:
                atomic_write_json(copy, data, parents=True)
                written.append(copy)
        projection = ensure_projection(Path(runs_dir) / h, record)
        copy = dest / PROJECTION_FILE
        if projection is not None and (not copy.is_file() or copy.read_bytes() != projection.read_bytes()):
            old = read_projection(copy, None)
            if old is not None and old[2] != record.get("started"):  # another run of the cell: kept beside it
                copy.rename(dest / f"svd_projection.{str(old[2] or 'unknown').replace(':', '')}.npz")
            shutil.copyfile(projection, copy)
            written.append(copy)
    return written


# ---- the SVD projection of a run's output embedding, kept so that a restored record still draws its panel ---------
def output_embedding(run_dir: Path, record: dict):
    """(the output embedding W, the training counts) of the complete run ``record`` of ``run_dir`` from its files on
    this machine; None when they are not here (a corrupt one: a warning, and None: a figure renders without it)."""
    import torch

    run = Path(run_dir)
    if record.get("recovered"):  # rebuilt from a rendering: its weights are gone; any here are a retrain's
        return None
    weights = run / ((record.get("metrics") or {}).get("final") or {}).get("weights", "best.pt")
    if not weights.is_file() or not (run / "vocab_counts.pt").is_file():
        return None
    try:
        state = load_checkpoint(weights, "weights file", "the table renders without its figure")["model"]
        counts = load_tensor_file(run / "vocab_counts.pt", "vocabulary counts file", "the table renders without its figure")
    except CorruptFile as err:
        print(f"repdegen: warning: {err}", file=sys.stderr, flush=True)
        return None
    tied = ((record.get("config") or {}).get("model") or {}).get("tie_weights", True)
    w = "embedding.weight" if tied or "output_weight" not in state else "output_weight"
    return state[w], torch.as_tensor(counts)


def read_projection(path: Path, started):
    """(the projection (N, 2) as :class:`repdegen.analysis.embedding_figures.Projected`, the training counts, the run's start
    time) kept at ``path``; None when there is none, it is of another run (``started`` given and not its start) or
    it cannot be read (a warning: a figure renders without it)."""
    import numpy as np
    from repdegen.analysis.embedding_figures import Projected

    path = Path(path)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            coords, counts, at = f["coords"], f["counts"], str(f["started"])
        if coords.ndim != 2 or coords.shape[1] != 2 or counts.shape != (coords.shape[0],):
            raise ValueError(f"coords of shape {coords.shape} and counts of shape {counts.shape}; expected (N, 2) and (N,)")
    except (OSError, ValueError, KeyError) as err:
        print(f"repdegen: warning: {path}: not a readable SVD projection ({err}); the figure renders without it; "
              f"restore it from git (git checkout -- {path}) or delete it", file=sys.stderr, flush=True)
        return None
    if started is not None and at != started:
        return None
    return Projected(coords.astype("float64")), counts, at


def ensure_projection(run_dir: Path, record: dict) -> Path | None:
    """``run_dir/svd_projection.npz`` for the run ``record``: the one there when it is of this run (restored with the
    record), else computed from the weights when they are here (:func:`repdegen.analysis.embedding_figures.svd_projection`,
    the figure's own projection, in float32); None when neither is."""
    import numpy as np
    from repdegen.analysis.embedding_figures import svd_projection

    path = Path(run_dir) / PROJECTION_FILE
    if read_projection(path, record.get("started")) is not None:
        return path
    found = output_embedding(run_dir, record)
    if found is None:
        return None
    weight, counts = found
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    np.savez_compressed(tmp, coords=svd_projection(weight).astype(np.float32), counts=counts.numpy().astype(np.int64),
                        started=np.str_(record.get("started") or ""))
    os.replace(tmp, path)
    return path


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
        if (src / PROJECTION_FILE).is_file():
            run.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / PROJECTION_FILE, run / PROJECTION_FILE)
        atomic_write_json(run / RESTORED_FILE, {"from": str(src), "at": dt.datetime.now().isoformat(timespec="seconds")},
                          parents=True)
        atomic_write_json(run / "result.json", record, parents=True)  # last: the run counts as complete from here
        restored.append(cell.config_hash)
        log(f"repdegen: {cell.label} [{cell.config_hash}]: restored its run record from {src} (trained "
            f"{record.get('started', '?')}); complete, not run again" + (
                "" if (src / PROJECTION_FILE).is_file() else "; its weights are not on this machine, so figures that "
                "need them leave it out"))
    return restored


def restored_from(run_dir: Path) -> str | None:
    """Where a restored run's record came from (None: the run trained in this ledger)."""
    data = _read_json(Path(run_dir) / RESTORED_FILE)
    return str(data.get("from")) if isinstance(data, dict) and data.get("from") else None


SVD_CAPTION = ("Output embeddings on their top-2 singular directions, by frequency group, on the same axes (Gao Figs 1, "
               "2a; Yu Figs 1, 3): ")


def svd_caption(shown: list[str]) -> str:
    """The rendering's caption of ``svd_projection.png``: what it is, then the panels drawn ("; " between them)."""
    return SVD_CAPTION + "; ".join(shown)


def _git_last_commit(path: Path) -> str:
    import subprocess

    try:
        path = Path(path).resolve()
        return subprocess.run(["git", "log", "-1", "--format=%H", "--", path.name], capture_output=True, text=True,
                              cwd=path.parent, check=True).stdout.strip() or "uncommitted"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def keep_figure_aside(out: Path, shown: list[str], log=print) -> Path | None:
    """Before ``out/svd_projection.png`` is drawn again with the panels ``shown``: when the one there drew a panel
    that ``shown`` lacks (a row whose weights were lost with a work tree before its projection was kept, or whose
    record was recovered), move it, as it was drawn, to ``out/records/figures-<its last commit>/`` with its caption
    in ``captions.json`` (what :func:`repdegen.reproduce.results.report.kept_figures` shows); the folder, or None when
    nothing is lost. A figure already kept there is never overwritten."""
    png = Path(out) / "svd_projection.png"
    if not png.is_file() or not (Path(out) / "cells.json").is_file():
        return None
    try:
        caption = (load_cells_json(Path(out) / "cells.json").get("figures") or {}).get("svd_projection")
    except UserError:  # an unreadable rendering: nothing says what its figure shows; the figure is drawn again
        return None
    if not isinstance(caption, str) or not caption.startswith(SVD_CAPTION):
        return None
    drew = caption.removeprefix(SVD_CAPTION).split("; ")
    lost = [p for p in drew if p not in shown]
    if not lost:
        return None
    at = _git_last_commit(png)[:10]
    folder = Path(out) / ARCHIVE_DIR / f"figures-{at}"
    k = 1
    while (folder / png.name).exists():
        k += 1
        folder = Path(out) / ARCHIVE_DIR / f"figures-{at}-{k}"
    folder.mkdir(parents=True, exist_ok=True)
    captions = _read_json(folder / "captions.json")
    captions = captions if isinstance(captions, dict) else {}
    atomic_write_json(folder / "captions.json", captions | {"svd_projection": caption})
    png.rename(folder / png.name)
    log(f"repdegen: {png} drew {'; '.join(lost)}, which this rendering cannot draw (no weights and no kept projection "
        f"on this machine): kept, as drawn, in {folder}/")
    return folder


# ---- records lost before renderings kept them ------------------------------------------------------------------
RECOVERED_LOST = ("the per-epoch history (learning curves), the geometry and traces recorded while training, the "
                  "metrics the table does not show, and the weights (figures that need them)")


