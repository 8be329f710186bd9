"""Pre-registration: a table's claims, margins, seeds and cells are fixed before its cells run, and a rendering can tell.

``repdegen.reproduce.table`` (and ``register_only=true``, which runs nothing) records, before it launches any cell, in
``<tables_dir>/<table>/<scale>/registration.json``:

- each claim's **definition hash** (its text, checks with their stated margins, scales, n/a reasons and the
  table's seeds at that scale), when it was first registered, and the commit it was registered at;
- each cell's **config hash** (which carries its budget), with its row labels and seed, when first registered.

Entries are only ever added. A rendering judges each decided verdict against them: a claim whose current
definition was not registered, or was registered after one of its cells *started*, or a cell that was not
registered before it started, renders as "⚠ changed after run", with no ✓/✗/≈, until those cells run again.
A cell whose config changed after it ran (a budget edit) is a different cell (its hash changed): the claim
waits for it (–), and the rendering says the registered cell with the old config is there.

Times are the machine's local ISO times (what a run record's ``started`` holds), compared as such.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
from pathlib import Path

from repdegen.core.files import atomic_write_json
from repdegen.reproduce.results.claims import stated_margin

FILE = "registration.json"


def claim_hash(claim, seeds: list, scale: str | None = None, analyses=None) -> str:
    """The hash of what a claim's verdict at ``scale`` depends on besides the cells: its text, its checks (with the
    stated margins, defaults resolved), whether it is meaningful at that scale (its ``scales``, its n/a reason there)
    and the seeds it is judged over; for a claim on metrics of the table's ``analyses`` (reproduce/runs/trained.py),
    their settings (e.g. how many continuations). An n/a reason at another scale is not part of it: editing lite's
    reason does not touch a paper verdict."""
    from repdegen.reproduce.runs.trained import analyses_read

    checks = []
    for c in claim.checks:
        rel, ab = stated_margin(c)
        checks.append({"metric": c.metric, "row": c.row, "relation": c.relation, "than": c.get("than"),
                       "value": c.get("value"), "margin": rel, "margin_abs": ab})
    na = dict(claim.get("na") or {})
    if scale is None:
        meaningful, reason = list(claim.get("scales") or []) or None, na or None
    else:
        meaningful, reason = (not claim.get("scales") or scale in claim.scales), na.get(scale)
    spec = {"text": claim.text, "checks": checks, "meaningful": meaningful, "na": reason, "seeds": [s for s in seeds]}
    read = analyses_read([c["metric"] for c in checks], analyses)
    if read:  # only then: the hashes of the claims registered before analyses existed stay as they were
        spec["analyses"] = read
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def row_name(row) -> str:
    """``"<group> / <label>"``, or the label of a row without a group."""
    return f"{row.group} / {row.label}" if row.get("group") else row.label


def now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


def path_of(tables_dir, table: str, scale: str) -> Path:
    return Path(tables_dir) / table / scale / FILE


def load(path: Path) -> dict:
    """The registration at ``path`` (an empty one when there is none); a file that is not one is an error that
    names it."""
    from repdegen.core.loaders import load_registration
    from repdegen.reproduce.errors import UserError

    if not path.exists():
        return {"claims": {}, "cells": {}}
    try:
        return load_registration(path)
    except OSError as err:  # a folder, unreadable
        raise UserError(f"{path}: not a registration file ({err}); expected the JSON object repdegen.reproduce.table writes; "
                        f"restore it from git (git checkout -- {path})") from None


def register(tables_dir, table, scale: str, seeds: list, cells, commit: dict) -> tuple[int, int]:
    """Add the table's claims (as defined now) and ``cells`` (objects with ``config_hash``, ``rows``, ``seed``)
    to its registration at ``scale``, each only if not there yet; return (new claims, new cells).

    Serialized by an exclusive ``flock`` beside the file (two lanes may run rows of one table)."""
    path = path_of(tables_dir, table.name, scale)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = load(path)
        data.update(table=table.name, scale=scale)
        t = now()
        new_claims = new_cells = 0
        for claim in table.get("claims") or []:
            h = claim_hash(claim, seeds, scale, table.get("analyses"))
            if h not in data["claims"]:
                data["claims"][h] = {"text": claim.text, "registered": t, "commit": commit.get("commit"),
                                     "dirty": bool(commit.get("dirty"))}
                new_claims += 1
        for cell in cells:
            if cell.config_hash not in data["cells"]:
                data["cells"][cell.config_hash] = {"rows": [row_name(table.rows[i]) for i in cell.rows],
                                                   "seed": cell.seed, "registered": t, "commit": commit.get("commit")}
                new_cells += 1
        if new_claims or new_cells:
            atomic_write_json(path, data)
        return new_claims, new_cells
    finally:
        os.close(fd)


def judge(claim, seeds: list, registration: dict, needed: list[tuple[str, str | None, str]], scale: str | None = None,
          analyses=None) -> str:
    """Why a decided verdict at ``scale`` is not a pre-registered one ("" when it is). ``needed``: (config hash, the
    run's ``started`` time -- for a claim on analysis metrics only, when the analysis was computed --, a name for
    messages) of each cell the verdict read."""
    entry = registration.get("claims", {}).get(claim_hash(claim, seeds, scale, analyses))
    if entry is None:
        return ("changed after run: this definition of the claim (its checks, margins, scales or the seeds) was not "
                "registered before its cells ran")
    for h, started, name in needed:
        if started is None:
            return f"changed after run: the run {name} [{h}] records no start time"
        if started < entry["registered"]:
            return (f"changed after run: the claim as defined now was registered {entry['registered']}, after "
                    f"{name} [{h}] started ({started})")
        cell = registration.get("cells", {}).get(h)
        if cell is None or started < cell["registered"]:
            return f"changed after run: the cell {name} [{h}] was not registered before it started ({started})"
    return ""


def replaced_cells(registration: dict, rows: set[str], seed, current: str) -> list[str]:
    """Registered cells of the same rows and seed as the cell ``current`` but with another config hash: a config
    (budget) edited after they were registered."""
    return [h for h, c in registration.get("cells", {}).items()
            if h != current and c.get("seed") == seed and rows & set(c.get("rows") or [])]
