"""A sweep (a Hydra multirun) read as a generated table: its jobs, the swept keys, one row per swept value.

    repdegen aggregate outputs/multirun/2026-01-31/12-00-00
    repdegen aggregate DIR1 DIR2 --out results/sweeps/agg_alpha --metrics test_ppl,uniq,isotropy
    repdegen aggregate DIR --stage cache          # AWD-LSTM: the cache-pointer stage's PPL

Each job folder of a multirun (``DIR/<job num>/``) holds ``.hydra/overrides.yaml``: what the job was asked for, and
the spec the job recorded (its config hash and ledger); a job from before jobs recorded it is composed as
``repdegen.reproduce.train`` composes it (``repdegen.reproduce.settings.resolve.resolve``). The swept keys are the
overrides whose value differs between the jobs; ``seed`` is a replicate, not a swept key (``--replicate``). Keys that
do not change the experiment (``paths``, ``trainer.progress``..., see
:data:`repdegen.reproduce.settings.config.HASH_EXCLUDED`) and ``hydra.*`` are never swept keys.

:func:`sweep_table` turns the jobs into a table (``repdegen.reproduce.runs.cells.TableConfig``) whose rows are
generated, one per swept value (``rows[i].sweep_values``), and whose cells are the jobs' runs: the tables' own collecting
and rendering (``repdegen.reproduce.results.table_render``) write it, with a figure per metric against the swept
value (:mod:`repdegen.reproduce.results.sweep_render`). A job whose ledger run is missing or not ``complete`` is
listed in the table's notes with the reason (its ``failure.json`` when it raised, the ledger record's error), never
dropped silently. Two jobs of the same ledger run (same config hash, e.g. a sweep run again into a new folder) count
once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repdegen.reproduce.errors import FAILURE_NOTE, UserError
from repdegen.reproduce.settings.config import HASH_EXCLUDED

DEFAULT_METRICS = ("valid_ppl", "test_ppl", "isotropy")
# added to the defaults when some run has them (Yu et al. 2022 Fig. 5 plots PPL, Uniq and I(W))
OPTIONAL_METRICS = ("ppl_frequent", "ppl_medium", "ppl_rare", "uniq", "bleu")
DEFAULT_REPLICATES = ("seed",)


class AggregateError(UserError):
    """A sweep directory that cannot be aggregated."""


# --------------------------------------------------------------------------------------------------
# jobs
# --------------------------------------------------------------------------------------------------
@dataclass
class Job:
    """One Hydra job of a multirun and, when it got that far, its ledger record."""

    dir: Path
    overrides: list[str]
    params: dict[str, Any]  # override key -> value (typed by Hydra's parser), hydra.* left out
    status: str = "incomplete"  # complete | failed | interrupted | running | incomplete | missing
    reason: str | None = None
    config_hash: str | None = None
    record: dict | None = None
    superseded_by: Path | None = None
    runs_dir: Path | None = None  # the ledger its run is in

    def value(self, key: str):
        """The job's value of an override key: from its command line, else (a preset set it, or the default)
        from its ledger record: the resolved config for a config path, the Hydra choice for a config group.
        None when neither has it."""
        if key in self.params or self.record is None:
            return self.params.get(key)
        choices = self.record.get("choices") or {}
        if key in choices:
            return choices[key]
        node: Any = self.record.get("config", {})
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return None if isinstance(node, (dict, list)) else node

    @property
    def seed(self):
        if self.record is not None:
            return self.record.get("config", {}).get("seed")
        return self.params.get("seed")


def _job_sort_key(path: Path):
    return (str(path.parent), int(path.name) if path.name.isdigit() else math.inf, path.name)


def find_job_dirs(sweep_dir: Path) -> list[Path]:
    """The job folders under ``sweep_dir`` (any depth): those holding ``.hydra/overrides.yaml``."""
    return sorted((p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml")), key=_job_sort_key)


def parse_overrides(lines: Sequence[str]) -> dict[str, Any]:
    """``{key: value}`` of a job's overrides; Hydra's own keys and groups (``hydra.*``, ``hydra/*``) and
    deletions (``~key``) are left out. Values are typed as Hydra types them (``1e-3`` -> 0.001)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out: dict[str, Any] = {}
    for o in OverridesParser.create().parse_overrides(list(lines)):
        key = o.key_or_group + (f"@{o.package}" if o.package else "")
        if key == "hydra" or key.startswith(("hydra.", "hydra/")) or o.is_delete():
            continue
        value = o.value()
        out[key] = tuple(value) if isinstance(value, list) else value
    return out


def _job_runs_dir(job_dir: Path, cfg) -> Path:
    """The ledger the job wrote to: its ``paths.runs_dir``, relative to the folder it was started from."""
    from omegaconf import OmegaConf

    runs = Path(cfg.paths.runs_dir)
    hydra_yaml = job_dir / ".hydra" / "hydra.yaml"
    if not runs.is_absolute() and hydra_yaml.is_file():
        runs = Path(OmegaConf.load(hydra_yaml).hydra.runtime.cwd) / runs
    return runs


def compose_job(job_dir: Path, overrides: Sequence[str], runs_dir: Path | None) -> tuple[str, Path]:
    """(config hash, ledger folder) of a job that did not record its spec (a sweep run before jobs did): its
    overrides resolved as ``repdegen.reproduce.train`` resolves them (:func:`repdegen.reproduce.settings.resolve.resolve`), so
    its run is
    found in the ledger by hash like a table's cells. Raises what composition raises."""
    from repdegen.reproduce.settings.resolve import resolve

    spec = resolve(list(overrides))
    cfg, h = spec.cfg, spec.config_hash
    return h, (Path(runs_dir) if runs_dir else _job_runs_dir(job_dir, cfg))


def _recorded_spec(job_dir: Path) -> dict | None:
    """The spec a job recorded (``repdegen.reproduce.settings.resolve.record_job_spec``), or None for an older job."""
    from repdegen.core.loaders import load_job_spec
    from repdegen.reproduce.settings.resolve import JOB_SPEC

    path = job_dir / JOB_SPEC
    return load_job_spec(path) if path.is_file() else None


def load_job(job_dir: Path, stage: str, runs_dir: Path | None = None) -> Job:
    """Read one job folder: its overrides, the ledger run they compose to (by config hash), and why it failed
    when it did (its failure note, else the ledger record's error)."""
    from repdegen.core.loaders import load_failure_note, load_overrides, load_run_record

    overrides = load_overrides(job_dir / ".hydra" / "overrides.yaml")
    job = Job(dir=job_dir, overrides=[str(o) for o in overrides], params=parse_overrides(overrides))
    note = job_dir / FAILURE_NOTE
    failure = load_failure_note(note) if note.is_file() else {}
    recorded = _recorded_spec(job_dir)
    try:
        if recorded:  # the job recorded its spec (repdegen.reproduce.train writes it): nothing to compose
            job.config_hash, runs = recorded["config_hash"], Path(runs_dir or recorded["runs_dir"])
        else:  # a sweep run before jobs recorded their spec
            job.config_hash, runs = compose_job(job_dir, job.overrides, runs_dir)
    except Exception as err:  # noqa: BLE001 - a job whose config no longer composes is listed with the reason
        job.status = "failed" if failure else "missing"
        job.reason = failure.get("error") or f"its overrides do not compose to a config here: {err}"
        return job
    job.runs_dir = runs
    result = runs / job.config_hash / "result.json"
    if not result.is_file():
        job.status = "failed" if failure else "missing"
        job.reason = failure.get("error") or (
            f"no ledger run {job.config_hash} in {runs}: the job did not start training, or was stopped before its "
            f"first record (see {job_dir} and the sweep's console output); pass --runs-dir if the ledger moved")
        return job
    job.record = load_run_record(result, "restore it from a copy, or pass --runs-dir of the ledger the sweep wrote")
    status = job.record.get("status", "incomplete")
    if status == "complete" and stage not in job.record.get("metrics", {}):
        job.status = "incomplete"
        job.reason = (f"its record has no stage {stage!r} (stages: {', '.join(job.record.get('metrics', {})) or 'none'}); "
                      f"choose one with --stage")
        return job
    if status == "complete":
        job.status, job.reason = "complete", None
        return job
    job.status = "failed" if failure else status
    job.reason = job.record.get("error") or failure.get("error") or (
        f"the ledger run is {status!r}: it is still training, or it was stopped (see its console output)")
    return job


def load_jobs(sweep_dirs: Sequence[Path], stage: str = "final", runs_dir: Path | None = None) -> list[Job]:
    jobs: list[Job] = []
    for d in sweep_dirs:
        d = Path(d)
        if not d.is_dir():
            raise AggregateError(
                f"sweep directory {d} does not exist; expected the folder of a Hydra multirun (the sweep output "
                f"dir Hydra prints, by default outputs/multirun/<date>/<time>): check the path")
        found = find_job_dirs(d)
        if not found:
            raise AggregateError(
                f"{d} holds no Hydra jobs (no <job>/.hydra/overrides.yaml below it); expected the folder of a "
                f"multirun (repdegen train -m ..., or make sweep-alpha / sweep-gamma): pass that folder, "
                f"not its parent's parent or a ledger run folder (outputs/runs/<hash>)")
        jobs.extend(load_job(j, stage, runs_dir) for j in found)
    # the same ledger run reached from two jobs counts once; a failed job run again successfully is superseded
    complete_by_hash: dict[str, Job] = {}
    for job in jobs:
        if job.status == "complete" and job.config_hash:
            first = complete_by_hash.setdefault(job.config_hash, job)
            if first is not job:
                job.superseded_by = first.dir
    for job in jobs:
        if job.status != "complete" and job.config_hash in complete_by_hash:
            job.superseded_by = complete_by_hash[job.config_hash].dir
    return jobs


# --------------------------------------------------------------------------------------------------
# swept keys and values
# --------------------------------------------------------------------------------------------------
def _run_control(key: str) -> bool:
    bare = key.lstrip("+~").split("@")[0]
    return any(bare == k or bare.startswith(k + ".") for k in HASH_EXCLUDED)


def swept_keys(jobs: Sequence[Job], replicates: Sequence[str] = DEFAULT_REPLICATES) -> list[str]:
    """Override keys whose value differs between the jobs (a key missing from a job counts as a value),
    in the order they first appear; replicate keys and run-control keys left out."""
    keys: list[str] = []
    for job in jobs:
        keys.extend(k for k in job.params if k not in keys)
    varying = []
    for k in keys:
        if k in replicates or _run_control(k):
            continue
        if len({_norm(job.value(k)) for job in jobs}) > 1:
            varying.append(k)
    return varying


def _norm(value):
    """A value as a group identity: numbers as floats (so 1, 1.0 and 1e0 are one group)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    return value if isinstance(value, (str, tuple)) else str(value)


def _order(value):
    if value is None:
        return (0, 0.0, "")
    if isinstance(value, float):
        return (1, value, "")
    return (2, 0.0, str(value))


def show(value) -> str:
    """A swept value as the table shows it: ``0.03``, ``1e-05``, ``agg``; ``(not set)`` where a job has no override."""
    if value is None:
        return "(not set)"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "[" + ",".join(show(_norm(v)) for v in value) + "]"
    return str(value)


def _has(record: dict, stage: str, metric: str) -> bool:
    value = record.get("metrics", {}).get(stage, {}).get(metric)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def choose_metrics(jobs: Sequence[Job], stage: str, requested: Sequence[str] | None) -> list[str]:
    complete = [j for j in jobs if j.status == "complete" and j.superseded_by is None]
    present = lambda m: any(_has(j.record, stage, m) for j in complete)  # noqa: E731
    if not requested:
        return [m for m in DEFAULT_METRICS if present(m) or not complete] + [m for m in OPTIONAL_METRICS if present(m)]
    missing = [m for m in requested if not present(m)]
    if missing and complete:
        available = sorted({k for j in complete for k in j.record["metrics"][stage] if _has(j.record, stage, k)})
        raise AggregateError(
            f"--metrics {','.join(missing)}: no complete run has {'it' if len(missing) == 1 else 'them'} in "
            f"metrics.{stage}; expected some of: {', '.join(available)} (or another stage with --stage)")
    return list(requested)


# --------------------------------------------------------------------------------------------------
# the sweep as a generated table
# --------------------------------------------------------------------------------------------------
@dataclass
class Sweep:
    """A multirun read as a table whose rows are generated: one row per swept value (``table.rows[i].sweep_values``), its
    cells the jobs' runs (by config hash), rendered by the tables' own pipeline
    (:func:`repdegen.reproduce.results.table_render.collect_rows` and ``render``)."""

    sweep_dirs: list[Path]
    stage: str
    swept: list[str]
    replicates: list[str]
    metrics: list[str]
    jobs: list[Job]
    fixed: dict[str, Any]
    table: Any  # DictConfig of repdegen.reproduce.runs.cells.TableConfig
    cells: list  # repdegen.reproduce.runs.cells.Cell
    runs_dir: Path | None
    optuna: dict | None = None

    @property
    def not_complete(self) -> list[Job]:
        return [j for j in self.jobs if j.status != "complete" and j.superseded_by is None]

    @property
    def duplicates(self) -> list[Job]:
        return [j for j in self.jobs if j.status == "complete" and j.superseded_by is not None]

    @property
    def scale(self) -> str:
        return _scale(self.jobs)

    @property
    def complete(self) -> list[Job]:
        return [j for j in self.jobs if j.status == "complete" and j.superseded_by is None]


def _scale(jobs: Sequence[Job]) -> str:
    """The scale the complete runs ran at ("smoke", or "lite+smoke" for a mix)."""
    return "+".join(sorted({str(j.record.get("scale", "?")) for j in jobs if j.record and j.status == "complete"})) or "none"


def _literal(value):
    """A text kept as written in the generated table's config (OmegaConf would resolve a ``${...}`` in it)."""
    if isinstance(value, str):
        return value.replace("${", "\\${")
    if isinstance(value, list):
        return [_literal(v) for v in value]
    return value


def _notes(sweep_dirs: Sequence[Path], stage: str, replicates: Sequence[str], fixed: dict, live: list[Job],
           optuna: dict | None, metrics: Sequence[str] = ()) -> list[str]:
    notes = [f"Runs of the sweep folder(s) {', '.join(f'`{d}`' for d in sweep_dirs)}: the metrics of stage `{stage}` of "
             f"each run's `result.json`; one row per swept value, ours = the mean over its runs ± the sample sd "
             f"(ddof 1; replicates: {', '.join(replicates) or 'none'})."]
    notes.append("Figures beside this file: `sweep_<metric>.png` (each metric against the swept value, error bars: the "
                 "sd over the runs), `curves.png` (validation PPL per epoch) and the embedding figures.")
    if fixed:
        notes.append("Same in every job: " + " ".join(f"`{k}={show(_norm(v))}`" for k, v in fixed.items()) + ".")
    for j in live:
        if j.status != "complete":
            reason = " ".join((j.reason or "no reason recorded").split())
            notes.append(f"Not complete: job `{j.dir}` ({' '.join(j.overrides)}) is **{j.status}**"
                         + (f" [{j.config_hash}]" if j.config_hash else "") + f": {reason}")
            continue
        odd = [f"{m} = {v}" for m in metrics if _has(j.record, stage, m)
               and not math.isfinite(v := j.record["metrics"][stage][m])]
        if odd:  # a table's mean is over the finite values of its runs
            notes.append(f"Not finite: job `{j.dir}` [{j.config_hash}] has {', '.join(odd)}; its value's mean and sd "
                         f"are over the other runs")
    if optuna:
        best, value = optuna.get("best_params") or {}, optuna.get("best_value")
        notes.append(f"Optuna: best value (what the jobs returned: the final validation PPL) "
                     f"{value if not isinstance(value, float) else f'{value:.4g}'} at "
                     + " ".join(f"`{k}={show(_norm(v))}`" for k, v in best.items()) + f" (`{optuna['file']}`).")
    return notes


def sweep_table(sweep_dirs: Sequence[str | Path], metrics: Sequence[str] | None = None, stage: str = "final",
                replicates: Sequence[str] = DEFAULT_REPLICATES, runs_dir: str | Path | None = None) -> Sweep:
    """Read the jobs of one or more multirun folders and generate their table (nothing is written)."""
    from omegaconf import OmegaConf
    from repdegen.reproduce.runs.cells import Cell, TableConfig

    dirs = [Path(d) for d in sweep_dirs]
    if not dirs:
        raise AggregateError("no sweep directory given; expected one or more multirun folders: "
                             "repdegen aggregate outputs/multirun/<date>/<time>")
    jobs = load_jobs(dirs, stage, Path(runs_dir) if runs_dir else None)
    finished = [j.record for j in jobs if j.record is not None and j.record.get("status") == "complete"]
    if finished and not any(stage in r.get("metrics", {}) for r in finished):
        stages = sorted({s for r in finished for s in r.get("metrics", {})})
        raise AggregateError(f"--stage {stage}: no complete run has metrics for it; expected one of: {', '.join(stages)}")
    live = [j for j in jobs if j.superseded_by is None]
    keys = swept_keys(live, replicates)
    chosen = choose_metrics(jobs, stage, metrics)
    fixed = {k: v for k, v in live[0].params.items()
             if k not in keys and k not in replicates and not _run_control(k)
             and all(_norm(j.value(k)) == _norm(v) for j in live)} if live else {}
    optuna = None
    for d in dirs:
        path = d / "optimization_results.yaml"
        if path.is_file():
            import yaml

            optuna = {"file": str(path), **(yaml.safe_load(path.read_text()) or {})}
    done = [j for j in live if j.status == "complete"]
    ledgers = sorted({str(Path(j.runs_dir).resolve()) for j in done})
    if len(ledgers) > 1:
        raise AggregateError(f"the complete jobs ran in {len(ledgers)} ledgers ({', '.join(ledgers)}); expected one: "
                             f"copy their runs into one and pass it with --runs-dir")
    # a value's row holds every job that got a config hash: its unfinished runs show as "(k/n seeds)"
    groups: dict[tuple, list[Job]] = {}
    for job in (j for j in live if j.config_hash):
        groups.setdefault(tuple(_norm(job.value(k)) for k in keys), []).append(job)
    rows, cells, numbered = [], [], False
    for i, ident in enumerate(sorted(groups, key=lambda t: tuple(_order(v) for v in t))):
        values = dict(zip(keys, ident))
        rows.append({"label": _literal(" / ".join(show(v) for v in ident) or "all runs"), "stage": stage,
                     "sweep_values": {k: _literal(list(v) if isinstance(v, tuple) else v) for k, v in values.items()}})
        # the runs of a value are told apart by their seed; with other replicate keys, numbered 1, 2, ...
        by_seed = list(replicates) == ["seed"] and len({j.seed for j in groups[ident]}) == len(groups[ident])
        numbered |= not by_seed
        for k, job in enumerate(sorted(groups[ident], key=lambda j: (_order(_norm(j.seed)), str(j.dir))), 1):
            cells.append(Cell([i], rows[-1]["label"], None, job.config_hash, job.seed if by_seed else k))
    # run numbers are not seeds: then the header names none (cells.json keeps each job's own seed)
    seeds = [] if numbered else sorted({c.seed for c in cells if c.seed is not None})
    notes = _notes(dirs, stage, replicates, fixed, live, optuna, chosen)
    if numbered:
        notes.insert(1, "The runs of a value are numbered 1, 2, ... (replicates other than the seed, or two runs of one "
                        "seed); each job's own seed is in cells.json.")
    what = ", ".join(f"`{k}`" for k in keys) or "nothing (every job has the same overrides apart from the replicates)"
    labels = sorted({j.record.get("label", "?") for j in done})
    table = OmegaConf.merge(OmegaConf.structured(TableConfig), {
        "name": "sweep", "title": _literal(f"Sweep over {what}"),
        "source": _literal(f"runs {', '.join(labels) or 'none complete'}"), "columns": chosen, "rows": rows,
        "notes": [_literal(n) for n in notes],
        "swept": keys, "seeds": {_scale(done): seeds}})
    return Sweep(dirs, stage, keys, list(replicates), chosen, jobs, fixed, table, cells,
                 Path(ledgers[0]) if ledgers else None, optuna)
