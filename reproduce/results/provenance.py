"""A rendered cell's provenance: the commits its record was trained on (each, when it resumed across code changes),
whether the tree was dirty, the hardware, the wall time, and the command that trains the table's cells again."""

from __future__ import annotations

import json
from pathlib import Path

from repdegen.core.errors import CorruptFile
from repdegen.core.loaders import load_cells_json
from repdegen.core.provenance import git_commit, hardware_summary, only_results_changed
from repdegen.reproduce.runs.ledger import STATUS_COMPLETE
from repdegen.reproduce.runs.status import _fmt_seconds


def records_git(records: list[dict]) -> dict:
    """The commit a table's header names: the one its cells trained at (several: all of them, short) and whether any
    of them trained with uncommitted changes; the work tree's own commit only while no cell is complete. The flag
    comes from the cells' records, never from the tree that renders them (a clean re-render of a cell trained on a
    dirty tree must still say so)."""
    if not records:
        return git_commit()
    gits = [g for r in records for g in record_gits(r)]
    commits = sorted({str(g.get("commit", "unknown")) for g in gits})
    commit = commits[0] if len(commits) == 1 else "+".join(c[:10] for c in commits)
    out = {"commit": commit, "dirty": any(bool(g.get("dirty")) for g in gits)}
    changed = sorted({str(p) for g in gits if g.get("dirty") for p in (g.get("changed") or ["?"])})
    if out["dirty"] and "?" not in changed:  # every dirty start says which files: keep them for the note
        out["changed"] = changed
    return out


def unchanged_generated(path: Path, record: dict) -> str | None:
    """The ``generated`` time of the rendering whose cells.json is at ``path`` when ``record`` (a new cells.json)
    is the same in everything else; None when it differs, or there is none. A re-render of a table nothing changed
    in (a lane's step over a complete cell, ``make rerender``) then leaves its files as they are: no diff that is
    only a timestamp. "Generated" is the time the rendering last changed."""
    try:
        old = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    stamp = old.get("meta", {}).get("generated") if isinstance(old, dict) and isinstance(old.get("meta"), dict) else None
    if not isinstance(stamp, str) or not stamp:
        return None
    same = json.loads(json.dumps({**record, "meta": {**record["meta"], "generated": stamp}}))
    return stamp if same == old else None


def record_gits(record: dict) -> list[dict]:
    """The commits a cell ran at, in the order of its (re)starts, each once (``starts``; a record from before that
    list: its one ``git``)."""
    out: list[dict] = []
    for g in [s.get("git") or {} for s in record.get("starts") or []] or [record.get("git") or {}]:
        if g not in out:
            out.append(g)
    return out


def _dirty_suffix(git: dict) -> str:
    return "" if not git.get("dirty") else "+dirty (results/ only)" if only_results_changed(git) else "+dirty"


def cell_provenance(record: dict) -> dict:
    """What a rendered number needs beside it, from a complete cell's record: its row, seed and config, the
    training epochs of each session (footnote 5's retraining is a second session), wall time, hardware, commit
    and start time."""
    sessions: dict[int, int] = {}
    for h in record.get("history") or []:
        if h.get("stage", "train") == "train":
            sessions[int(h.get("session", 1))] = sessions.get(int(h.get("session", 1)), 0) + 1
    commit = ", ".join(str(g.get("commit", "unknown"))[:10] + _dirty_suffix(g) for g in record_gits(record))
    recovered = record.get("recovered") or {}
    epochs = [sessions[k] for k in sorted(sessions)] or list(recovered.get("epochs") or [])
    out = {"recovered": f"{recovered.get('from')} at {str(recovered.get('commit'))[:10]}",
           "recovered_figures": recovered.get("figures")} if recovered else {}
    return out | {"row": record.get("_row_label"), "seed": record.get("_seed"), "config_hash": record.get("config_hash"),
            "epochs": epochs, "wall_time": _fmt_seconds(record.get("wall_time_s", 0.0)),
            "wall_time_s": record.get("wall_time_s"),
            "hardware": hardware_summary(record["hardware"]) if record.get("hardware") else "n/a",
            "commit": commit, "started": record.get("started")}


def training_command(cells_json: Path) -> str | None:
    """The command that trained a rendered table's cells, as its cells.json says (None: none yet)."""
    try:
        command = load_cells_json(cells_json).get("command")
    except (OSError, CorruptFile):
        return None
    return command if isinstance(command, str) and command and "render_only=true" not in command else None


def complete_hashes(cells_json: Path) -> set[str]:
    """The complete cells of a rendered table (its ``cells.json``; none when there is no readable one)."""
    try:
        cells = load_cells_json(cells_json)["cells"]
    except (OSError, CorruptFile):
        return set()
    return {c["config_hash"] for c in cells if c.get("status") == STATUS_COMPLETE and c.get("config_hash")}
