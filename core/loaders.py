"""One loader per kind of file the project reads: each reads its file, checks its schema (the top-level type, the
required keys and their types) and returns what a plain ``json``/``yaml``/``OmegaConf``/``torch`` read returns. A
file that is not what its writer writes raises :class:`BadFile` (a :class:`~repdegen.core.errors.CorruptFile`), whose message
names the file, what is wrong (the key, expected against found) and the fix. A missing file is the caller's to handle
(``FileNotFoundError``, as a plain read raises it).

=========================  ==================================  ===============================================
kind                       loader                              written by
=========================  ==================================  ===============================================
``result.json``            :func:`load_run_record`             ``repdegen.reproduce.train``
(:mod:`repdegen.reproduce.runs.ledger`)
``.pt`` checkpoint/weights :func:`load_checkpoint`             :mod:`repdegen.reproduce.engine.checkpoint`
``.pt`` tensor             :func:`load_tensor_file`            ``vocab_counts.pt``, ``init_embedding.pt``
``cell.yaml``              :func:`load_cell_yaml`              :func:`repdegen.reproduce.runs.launch.write_cell_config`
``cells.json``             :func:`load_cells_json`             :func:`repdegen.reproduce.results.table_render.render`
``claims.json``            :func:`load_claims_json`            :func:`repdegen.reproduce.results.table_render.render`
``table.csv``              :func:`load_table_csv`              :func:`repdegen.reproduce.results.table_render.render`
``bench/*/*.json``         :func:`load_bench_json`             ``scripts/bench.py``
``registration.json``      :func:`load_registration`           :mod:`repdegen.reproduce.runs.registration`
``.hydra/overrides.yaml``  :func:`load_overrides`              Hydra, for each job of a sweep
``failure.json``           :func:`load_failure_note`           :func:`repdegen.reproduce.errors.write_failure_note`
=========================  ==================================  ===============================================
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from repdegen.core.errors import CorruptFile

# the status of a run record (result.json) whose run finished (repdegen.reproduce.runs.ledger re-exports it)
STATUS_COMPLETE = "complete"


class BadFile(CorruptFile):
    """A file of ours that is not what its writer writes; ``why`` says what is wrong."""

    def __init__(self, path, what: str, why: str, expected: str, fix: str):
        super().__init__(path, f"{path}: not a {what} ({why}); expected {expected}; {fix}")
        self.why = why


class CorruptRecord(BadFile):
    """A ``result.json`` that is not the JSON object ``repdegen.reproduce.train`` writes (truncated, edited)."""

    def __init__(self, path: Path, why: str, fix: str):
        super().__init__(path, "valid run record", why, "the JSON object repdegen.reproduce.train writes", fix)


# ---- the shared helpers: read a JSON / YAML document, check its keys ------------------------------------
_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
               bool: "true/false", type(None): "null"}


def _name(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def _found(value) -> str:
    for t, name in _TYPE_NAMES.items():
        if type(value) is t:
            return name
    return f"a {type(value).__name__}"


def read_document(path: Path, fmt: str, top: type, error: Callable[[str], CorruptFile]) -> Any:
    """The document in ``path`` (``fmt``: "json", "yaml" or "omegaconf"), checked to be a ``top`` (dict or list; for
    "omegaconf" a DictConfig, as ``OmegaConf.load`` returns it); ``error(why)`` is raised, naming the file, when it
    cannot be read as one. An empty YAML file is an empty ``top``."""
    kind = "JSON" if fmt == "json" else "YAML"
    try:
        if fmt == "json":
            data = json.loads(Path(path).read_text())
        elif fmt == "yaml":
            import yaml

            data = yaml.safe_load(Path(path).read_text())
            data = top() if data is None else data
        else:
            from omegaconf import DictConfig, OmegaConf

            data = OmegaConf.load(path)
            if not isinstance(data, DictConfig):
                raise error("a YAML list, not a mapping")
            return data
    except json.JSONDecodeError as err:
        raise error(f"invalid JSON at line {err.lineno} column {err.colno}: {err.msg}, truncated?") from None
    except UnicodeDecodeError:
        raise error("not UTF-8 text") from None
    except CorruptFile:
        raise
    except Exception as err:  # noqa: BLE001 - yaml's and OmegaConf's parse errors (OmegaConf: OSError for a scalar)
        if isinstance(err, OSError) and err.errno is not None:  # missing, unreadable: the caller's
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise error(f"invalid YAML ({type(err).__name__}: {first[:160]}), truncated?") from None
    if not isinstance(data, top):
        found = _found(data).split(" ", 1)[-1]
        raise error(f"a {kind} {found}, not {_name(top) if fmt == 'json' else 'a mapping' if top is dict else 'a list'}")
    return data


def check_keys(data: dict, required: dict, error: Callable[[str], CorruptFile], optional: dict | None = None,
               where: str = "") -> None:
    """Each ``required`` key of ``data`` there and of its type(s); each ``optional`` one of its type when there."""
    for keys, need in ((required, True), (optional or {}, False)):
        for key, types in keys.items():
            if key not in data:
                if need:
                    raise error(f"no key {where}{key!r}; expected {_name(types)}")
                continue
            value = data[key]
            types_t = types if isinstance(types, tuple) else (types,)
            if not isinstance(value, types_t) or (isinstance(value, bool) and bool not in types_t):
                raise error(f"the key {where}{key!r} is {_found(value)}; expected {_name(types)}")


def _json_object(path, what: str, expected: str, fix: str, required: dict, optional: dict | None = None,
                 error_type=BadFile) -> dict:
    def error(why: str) -> CorruptFile:
        return error_type(path, what, why, expected, fix)

    data = read_document(path, "json", dict, error)
    check_keys(data, required, error, optional)
    return data


# ---- run records ------------------------------------------------------------------------------------------
FIX_RECORD = "restore it from a copy, or train the run again (move its directory aside first)"
RECORD_KEYS = {"config_hash": str, "status": str, "config": dict}
RECORD_OPTIONAL = {"label": str, "history": list, "metrics": dict, "started": str}


def load_run_record(path: Path, fix: str = FIX_RECORD) -> dict:
    """A run's ``result.json``: an object with ``config_hash`` (string), ``status`` (string) and ``config``
    (object), and, when there, ``label``/``started`` strings, a ``history`` list and a ``metrics`` object."""
    def error(why: str) -> CorruptFile:
        return CorruptRecord(path, why, fix)

    record = read_document(path, "json", dict, error)
    check_keys(record, RECORD_KEYS, error, RECORD_OPTIONAL)
    return record


# ---- torch files ------------------------------------------------------------------------------------------
def _torch_load(path: Path, what: str, fix: str, **kwargs) -> Any:
    import torch

    try:
        return torch.load(path, **kwargs)
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - pickle, zip and EOF errors of a damaged file
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CorruptFile(path, f"{path} cannot be read as a {what} ({type(err).__name__}: {why[:160]}); expected a "
                                f"complete file written by repdegen.reproduce.train (a full disk or an unfinished copy "
                                f"truncates it); {fix}") from None


def load_checkpoint(path: Path, what: str, fix: str, map_location="cpu") -> dict:
    """A checkpoint (``checkpoint.pt``) or weights file (``best.pt``, ``last.pt``, ``averaged.pt``): a dict whose
    ``model`` is a state dict (and whose ``objective``, when there, is one too)."""
    blob = _torch_load(path, what, fix, map_location=map_location, weights_only=False)

    def error(why: str) -> CorruptFile:
        return CorruptFile(path, f"{path} is not a {what} of repdegen.reproduce.train ({why}); expected a dict with the model "
                                 f"weights under 'model'; {fix}")

    if not isinstance(blob, dict):
        raise error(f"a {type(blob).__name__}, not a dict")
    check_keys(blob, {"model": dict}, error, {"objective": dict})
    return blob


def check_torch_file(path: Path, what: str, fix: str) -> None:
    """A cheap look at a checkpoint before anything is written: a torch file is a zip archive whose
    directory is at its end, so a truncated one fails here (:class:`CorruptFile`, naming it, and ``fix``)."""
    import zipfile

    try:
        with zipfile.ZipFile(path):
            pass
    except (zipfile.BadZipFile, EOFError, ValueError) as err:
        raise CorruptFile(path, f"{path} cannot be read as a {what} ({err}: truncated or corrupt; a full disk or an "
                                f"unfinished copy does that); {fix}") from None


def load_tensor_file(path: Path, what: str, fix: str, **kwargs) -> Any:
    """A tensor saved alone (``vocab_counts.pt``, ``init_embedding.pt``), read as ``torch.load(path, **kwargs)``."""
    import torch

    blob = _torch_load(path, what, fix, **kwargs)
    if not isinstance(blob, torch.Tensor):
        raise CorruptFile(path, f"{path} is not a {what} (a {type(blob).__name__}, not a tensor); expected the "
                                f"tensor repdegen.reproduce.train saves; {fix}")
    return blob


# ---- a table cell's config --------------------------------------------------------------------------------
CELL_KEYS = {"dataset": dict, "model": dict, "objective": dict, "trainer": dict}


def load_cell_yaml(path: Path, fix: str | None = None):
    """A cell's ``cell.yaml`` as ``OmegaConf.load`` reads it (a DictConfig, not resolved): a mapping whose
    ``dataset``, ``model``, ``objective`` and ``trainer`` are mappings."""
    from omegaconf import OmegaConf

    fix = fix or (f"run the table again to write it anew (repdegen table ...), or move {Path(path).parent} "
                  f"aside")

    def error(why: str) -> CorruptFile:
        return BadFile(path, "cell config", why, "the finalized training config repdegen.reproduce.runs.tables writes", fix)

    cfg = read_document(path, "omegaconf", dict, error)
    check_keys(OmegaConf.to_container(cfg, resolve=False), CELL_KEYS, error)
    return cfg


# ---- a rendered table's cells.json and claims.json ----------------------------------------------------------
FIX_RENDERING = "render the table again (repdegen table table=<table> scale=<scale> render_only=true)"


def load_cells_json(path: Path, fix: str = FIX_RENDERING) -> dict:
    """A rendered table's ``cells.json``: an object with a ``cells`` list of objects; ``command`` a string,
    ``meta`` and ``figures`` objects, when there."""
    data = _json_object(path, "rendered table's cells.json", "the JSON object repdegen.reproduce.runs.tables writes", fix,
                        {"cells": list}, {"command": (str, type(None)), "meta": dict, "figures": dict})
    for i, cell in enumerate(data["cells"]):
        if not isinstance(cell, dict):
            raise BadFile(path, "rendered table's cells.json", f"cells[{i}] is {_found(cell)}; expected an object",
                          "the JSON object repdegen.reproduce.runs.tables writes", fix)
    return data


def rendering_fix(path: Path) -> str:
    """:data:`FIX_RENDERING` for a file of a rendering, ``<tables_dir>/<table>/<scale>/<file>``: its table and scale
    filled in, or restoring the committed file from git."""
    path = Path(path)
    return (f"render the table again (repdegen table table={path.parent.parent.name} "
            f"scale={path.parent.name} render_only=true) or restore the file from git (git checkout -- {path})")


def load_claims_json(path: Path, fix: str = FIX_RENDERING) -> dict:
    """A rendered table's ``claims.json``: an object with a ``claims`` list of objects, each with its ``text``."""
    expected = "the JSON object repdegen.reproduce.runs.tables writes"
    data = _json_object(path, "rendered table's claims.json", expected, fix, {"claims": list}, {"seeds": list})
    for i, claim in enumerate(data["claims"]):
        def error(why: str) -> CorruptFile:
            return BadFile(path, "rendered table's claims.json", why, expected, fix)

        if not isinstance(claim, dict):
            raise error(f"claims[{i}] is {_found(claim)}; expected an object")
        check_keys(claim, {"text": str}, error, where=f"claims[{i}].")
    return data


TABLE_CSV_COLUMNS = ("label", "status", "config_hash")


def load_table_csv(path: Path, fix: str = FIX_RENDERING) -> list[dict]:
    """A rendered table's ``table.csv`` as ``csv.DictReader`` rows: a header with the ``label``, ``status`` and
    ``config_hash`` columns, and every row as many fields as the header."""
    import csv

    expected = f"the CSV repdegen.reproduce.runs.tables writes, with the columns {', '.join(TABLE_CSV_COLUMNS)}"

    def error(why: str) -> CorruptFile:
        return BadFile(path, "rendered table's table.csv", why, expected, fix)

    try:
        with Path(path).open(newline="") as f:
            lines = list(csv.reader(f))
    except UnicodeDecodeError:
        raise error("not UTF-8 text") from None
    except csv.Error as err:
        raise error(f"not CSV ({err})") from None
    header = lines[0] if lines else []
    missing = [c for c in TABLE_CSV_COLUMNS if c not in header]
    if missing:
        raise error(f"no column {', '.join(map(repr, missing))} in the header {header!r}")
    rows = [fields for fields in lines[1:] if fields]  # blank lines are no rows (as csv.DictReader reads them)
    for n, fields in enumerate(rows, 1):
        if len(fields) != len(header):
            raise error(f"row {n} has {len(fields)} fields, the header {len(header)}; truncated?")
    return [dict(zip(header, fields)) for fields in rows]


# ---- a benchmark of scripts/bench.py ----------------------------------------------------------------------------
def load_bench_json(path: Path) -> dict:
    """A JSON file of ``results/bench/`` (``scripts/bench.py`` writes them): an object; when there, a ``results`` list
    of objects whose step times, tokens/s, memory and MFU are numbers (or null), ``git`` (its ``commit`` a string) and
    ``hardware`` objects, ``note``, ``command`` and ``torch`` strings."""
    fix = f"run the benchmark again (its command is in the file's 'command'), or restore it from git (git checkout -- {path})"
    expected = "the JSON object scripts/bench.py writes"
    data = _json_object(path, "benchmark file", expected, fix, {},
                        {"results": list, "git": dict, "hardware": dict, "note": (str, type(None)),
                         "command": (str, type(None)), "torch": str})
    def error(why: str) -> CorruptFile:
        return BadFile(path, "benchmark file", why, expected, fix)

    check_keys(data.get("git") or {}, {}, error, {"commit": str}, where="git.")
    number = (int, float, type(None))
    for i, r in enumerate(data.get("results") or []):
        if not isinstance(r, dict):
            raise error(f"results[{i}] is {_found(r)}; expected an object")
        check_keys(r, {}, error, dict.fromkeys(BENCH_NUMBERS, number), where=f"results[{i}].")
    return data


# the numbers of each benchmark result (a number or null)
BENCH_NUMBERS = ("step_time_s", "tokens_per_s", "peak_mem_gb", "mfu", "step_time_vs_mle", "tokens_per_update")


# ---- a trained run's analyses (reproduce/runs/trained.py) --------------------------------------------------------
def load_continuations(path: Path) -> dict:
    """A run's ``analysis/continuations_<n>.json``: an object with ``mean_uniq`` (number), ``uniq_total`` and ``n``
    (integers) and the ``computed`` time (string)."""
    return _json_object(path, "continuations analysis", "the JSON object a table's analyses write",
                        "delete it (the table computes it again from the run's weights)",
                        {"mean_uniq": (int, float), "uniq_total": int, "n": int, "computed": str},
                        {"examples": list, "weights": str, "commit": dict, "seconds": (int, float), "uniq": list})


# ---- pre-registration ---------------------------------------------------------------------------------------
def load_registration(path: Path) -> dict:
    """A table's ``registration.json``: an object whose ``claims`` and ``cells`` are objects."""
    fix = (f"it records when the table's claims and cells were fixed; restore it from git (git checkout -- {path}) "
           f"rather than deleting it: without it every verdict renders as changed after run")
    return _json_object(path, "registration file", "the JSON object repdegen.reproduce.table writes", fix,
                        {"claims": dict, "cells": dict})


# ---- a sweep's job folder ------------------------------------------------------------------------------------
def load_overrides(path: Path) -> list:
    """A Hydra job's ``.hydra/overrides.yaml``: a YAML list of override strings (an empty file: none)."""
    fix = f"restore it, or move the job folder {Path(path).parent.parent} out of the sweep"

    def error(why: str) -> CorruptFile:
        return BadFile(path, "Hydra overrides file", why, "the YAML list of overrides Hydra writes", fix)

    overrides = read_document(path, "yaml", list, error)
    for i, o in enumerate(overrides):
        if not isinstance(o, str):
            raise error(f"item {i} is {_found(o)}; expected a string such as key=value")
    return overrides


def load_failure_note(path: Path) -> dict:
    """A sweep job's ``failure.json``: an object with the ``error`` (string) the job raised."""
    return _json_object(path, "job failure note", "the JSON object the sweep callback writes",
                        "delete it (it only says why the job failed), or restore it", {"error": str},
                        {"status": str})


def load_job_spec(path: Path) -> dict:
    """A sweep job's ``run_spec.json`` (:func:`repdegen.reproduce.settings.resolve.record_job_spec`): an object with the run's
    ``config_hash`` and its ledger folder ``runs_dir``."""
    return _json_object(path, "job spec", "the JSON object repdegen.reproduce.train writes for each job of a sweep",
                        "delete it to find the job's run by composing its overrides again", {"config_hash": str,
                                                                                             "runs_dir": str},
                        {"overrides": list})
