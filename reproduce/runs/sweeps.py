"""Aggregate a Hydra multirun (a sweep) into a table and one plot per metric.

    repdegen aggregate outputs/multirun/2026-01-31/12-00-00
    repdegen aggregate DIR1 DIR2 --out results/sweeps/agg_alpha --metrics test_ppl,uniq,isotropy
    repdegen aggregate DIR --stage cache          # AWD-LSTM: the cache-pointer stage's PPL

Each job folder of a multirun (``DIR/<job num>/``) holds ``.hydra/overrides.yaml``: what the job was asked for.
A sweep is a list of cells like a table: each job's overrides are composed as ``repdegen.reproduce.train`` composes them
(``repdegen.reproduce.settings.resolve.resolve``), and its run is found in the ledger by config hash. The swept keys are the
overrides whose value differs between the jobs; ``seed`` is a replicate, not a swept key (``--replicate``). Keys
that do not change the experiment (``paths``, ``trainer.progress``..., see
:data:`repdegen.reproduce.settings.config.HASH_EXCLUDED`)
and ``hydra.*`` are never swept keys. Jobs are grouped by their swept values; per group: the number of runs and the
mean and sample standard deviation (ddof = 1; none for a single run) of each metric of the ledger's
``result.json`` (``metrics.<stage>``). Written to ``--out`` (default: the first DIR):

* ``aggregate.md``    the table, by the tables' renderer (``repdegen.reproduce.results.render``; ours only, mean±sd), the jobs
that
  are not complete, and every job
* ``aggregate.csv``   one row per swept value: n, seeds, ``<metric>_mean``, ``<metric>_std``
* ``aggregate.json``  the same plus each run's values, config hashes and job folders
* ``aggregate_<metric>.png``  the metric against the swept value, error bars = std over seeds
  (:func:`repdegen.analysis.sweep_figures.plot_sweep_metric`; Yu et al. 2022 Fig. 5)

A job whose ledger run is missing or not ``complete`` is listed with the reason (its ``failure.json`` when it
raised, the ledger record's error), never dropped silently. Two jobs of the same ledger run (same config hash, e.g.
a sweep run again into a new folder) count once.

:class:`AggregateCallback` runs the same aggregation when a multirun ends (``hydra/callbacks=aggregate``).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repdegen.core.files import output_problem
from repdegen.reproduce.errors import FAILURE_NOTE, UserError, exit_on_user_error, write_failure_note
from repdegen.reproduce.settings.config import HASH_EXCLUDED

DEFAULT_METRICS = ("valid_ppl", "test_ppl", "isotropy")
# added to the defaults when some run has them (Yu et al. 2022 Fig. 5 plots PPL, Uniq and I(W))
OPTIONAL_METRICS = ("ppl_frequent", "ppl_medium", "ppl_rare", "uniq", "bleu")
DEFAULT_REPLICATES = ("seed",)
OUTPUT_NAMES = ("aggregate.md", "aggregate.csv", "aggregate.json")


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
# grouping and statistics
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


def _lookup(record: dict, stage: str, metric: str):
    node: Any = record.get("metrics", {}).get(stage, {})
    for part in metric.split("."):
        if not isinstance(node, dict) or part not in node:
            node = None
            break
        node = node[part]
    if node is None and metric in record and not isinstance(record[metric], dict):
        node = record[metric]  # e.g. wall_time_s
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return float(node)


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof = 1); std None for one value, both None for none."""
    n = len(values)
    if n == 0:
        return None, None
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
    if not all(math.isfinite(v) for v in values):
        return mean, math.nan
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def choose_metrics(jobs: Sequence[Job], stage: str, requested: Sequence[str] | None) -> list[str]:
    complete = [j for j in jobs if j.status == "complete" and j.superseded_by is None]
    present = lambda m: any(_lookup(j.record, stage, m) is not None for j in complete)  # noqa: E731
    if not requested:
        return [m for m in DEFAULT_METRICS if present(m) or not complete] + [m for m in OPTIONAL_METRICS if present(m)]
    missing = [m for m in requested if not present(m)]
    if missing and complete:
        available = sorted({k for j in complete for k, v in j.record["metrics"][stage].items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)})
        raise AggregateError(
            f"--metrics {','.join(missing)}: no complete run has {'it' if len(missing) == 1 else 'them'} in "
            f"metrics.{stage}; expected some of: {', '.join(available)} (or another stage with --stage)")
    return list(requested)


@dataclass
class Row:
    """One swept value (a tuple over the swept keys) and its runs."""

    values: dict[str, Any]
    jobs: list[Job] = field(default_factory=list)
    stats: dict[str, dict] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.jobs)

    @property
    def seeds(self) -> list:
        return [j.seed for j in self.jobs]


def group_rows(jobs: Sequence[Job], keys: Sequence[str], metrics: Sequence[str], stage: str) -> list[Row]:
    groups: dict[tuple, Row] = {}
    for job in jobs:
        if job.status != "complete" or job.superseded_by is not None:
            continue
        ident = tuple(_norm(job.value(k)) for k in keys)
        groups.setdefault(ident, Row(values=dict(zip(keys, ident)))).jobs.append(job)
    rows = [groups[k] for k in sorted(groups, key=lambda t: tuple(_order(v) for v in t))]
    for row in rows:
        row.jobs.sort(key=lambda j: (_order(_norm(j.seed)), str(j.dir)))
        for m in metrics:
            vals = [_lookup(j.record, stage, m) for j in row.jobs]
            present = [v for v in vals if v is not None]
            mean, std = mean_std(present)
            row.stats[m] = {"mean": mean, "std": std, "n": len(present), "values": vals}
    return rows


# --------------------------------------------------------------------------------------------------
# the aggregate
# --------------------------------------------------------------------------------------------------
@dataclass
class Aggregate:
    sweep_dirs: list[Path]
    stage: str
    swept: list[str]
    replicates: list[str]
    metrics: list[str]
    rows: list[Row]
    jobs: list[Job]
    fixed: dict[str, Any]
    optuna: dict | None = None

    @property
    def not_complete(self) -> list[Job]:
        return [j for j in self.jobs if j.status != "complete" and j.superseded_by is None]

    @property
    def duplicates(self) -> list[Job]:
        return [j for j in self.jobs if j.status == "complete" and j.superseded_by is not None]


def aggregate(sweep_dirs: Sequence[str | Path], metrics: Sequence[str] | None = None, stage: str = "final",
              replicates: Sequence[str] = DEFAULT_REPLICATES, runs_dir: str | Path | None = None) -> Aggregate:
    """Read the jobs of one or more multirun folders and summarise them per swept value (no files written)."""
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
    return Aggregate(sweep_dirs=dirs, stage=stage, swept=keys, replicates=list(replicates), metrics=chosen,
                     rows=group_rows(jobs, keys, chosen, stage), jobs=jobs, fixed=fixed, optuna=optuna)


def _metric_label(metric: str) -> str:
    from repdegen.reproduce.results.metrics import label

    return label(metric)


def _one_line(text: str | None) -> str:
    return " ".join(text.split()) if text else "no reason recorded"


def _meta(agg: Aggregate) -> dict:
    from repdegen.core.provenance import hardware_summary, uncommitted_note
    from repdegen.reproduce.runs.status import _fmt_seconds

    complete = [j for j in agg.jobs if j.record is not None and j.status == "complete" and j.superseded_by is None]
    labels = sorted({j.record.get("label", "?") for j in complete})
    scales = sorted({str(j.record.get("scale", "?")) for j in complete})
    gits = [j.record.get("git") or {} for j in complete]
    commits = sorted({g.get("commit", "unknown")[:10] + uncommitted_note(g) for g in gits})
    wall = sum(float(j.record.get("wall_time_s", 0.0)) for j in complete)
    hardware = sorted({hardware_summary(j.record["hardware"]) for j in complete if j.record.get("hardware")})
    return {"labels": labels, "scales": scales, "commits": commits, "wall_time_s": wall,
            "wall_time": _fmt_seconds(wall), "hardware": "; ".join(hardware) or "n/a",
            "git": {"commit": "+".join(sorted({g.get("commit", "unknown") for g in gits})) or "?",
                    "dirty": any(g.get("dirty") for g in gits)}}


def rendered_rows(agg: Aggregate):
    """The sweep as the tables' rows (``repdegen.reproduce.results.render.RenderedRow``): one per swept value (labelled by the
    values,
    "0.03" or "0.03 / agg" for two swept keys), ours = the mean over its runs, ± the sample sd, the config hashes of
    its runs."""
    from repdegen.reproduce.results.render import RenderedRow

    rows = []
    for row in agg.rows:
        label = " / ".join(show(v) for v in row.values.values()) or "all runs"
        rows.append(RenderedRow(
            label=label, group=None, paper={}, ours={m: row.stats[m]["mean"] for m in agg.metrics}, status="complete",
            config_hash="+".join(j.config_hash for j in row.jobs if j.config_hash),
            extra={"sd": {m: row.stats[m]["std"] for m in agg.metrics}, "n_seeds": row.n, "n_done": row.n}))
    return rows


def to_json(agg: Aggregate, figures: Sequence[Path] = ()) -> dict:
    return {
        "sweep_dirs": [str(d) for d in agg.sweep_dirs],
        "generated": dt.datetime.now().isoformat(timespec="seconds"),
        "stage": agg.stage,
        "swept": agg.swept,
        "replicates": agg.replicates,
        "metrics": agg.metrics,
        "fixed": {k: list(v) if isinstance(v, tuple) else v for k, v in agg.fixed.items()},
        **_meta(agg),
        "rows": [{
            "values": {k: list(v) if isinstance(v, tuple) else v for k, v in row.values.items()},
            "n": row.n,
            "seeds": row.seeds,
            "config_hashes": [j.config_hash for j in row.jobs],
            "job_dirs": [str(j.dir) for j in row.jobs],
            "metrics": row.stats,
        } for row in agg.rows],
        "not_complete": [{"job_dir": str(j.dir), "status": j.status, "reason": j.reason, "config_hash": j.config_hash,
                          "overrides": j.overrides} for j in agg.not_complete],
        "duplicates": [{"job_dir": str(j.dir), "same_run_as": str(j.superseded_by)} for j in agg.duplicates],
        "jobs": [{"job_dir": str(j.dir), "status": j.status, "config_hash": j.config_hash, "seed": j.seed,
                  "values": {k: show(_norm(j.value(k))) for k in agg.swept},
                  "superseded_by": str(j.superseded_by) if j.superseded_by else None} for j in agg.jobs],
        "optuna": agg.optuna,
        "figures": [str(Path(f).name) for f in figures],
    }


def to_csv(agg: Aggregate) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*(agg.swept or ["all"]), "n", "seeds", *(f"{m}_{s}" for m in agg.metrics for s in ("mean", "std"))])
    for row in agg.rows:
        cells = [show(v) for v in row.values.values()] or ["all"]
        stats = []
        for m in agg.metrics:
            for s in ("mean", "std"):
                v = row.stats[m][s]
                stats.append("" if v is None else repr(v))
        w.writerow([*cells, row.n, " ".join(str(s) for s in row.seeds), *stats])
    return buf.getvalue()


def to_markdown(agg: Aggregate, figures: Sequence[Path] = ()) -> str:
    """The sweep's table through the tables' renderer (``repdegen.reproduce.results.render.to_markdown``, our numbers only), then
    the
    jobs that are not complete, the Optuna study, the figures and every job."""
    from repdegen.reproduce.results.render import to_markdown as render_table

    meta = _meta(agg)
    swept = ", ".join(f"`{k}`" for k in agg.swept) or "nothing (every job has the same overrides apart from the seed)"
    seeds = sorted({j.seed for r in agg.rows for j in r.jobs}, key=lambda v: _order(_norm(v)))
    header = {
        "source": f"runs {', '.join(meta['labels']) or 'none complete'}, from the sweep folder(s) "
                  + ", ".join(f"`{d}`" for d in agg.sweep_dirs),
        "scale": ", ".join(meta["scales"]) or "?",
        "scale_note": f"metrics of stage `{agg.stage}` of each run's `result.json`; replicates: {', '.join(agg.replicates)}",
        "git": meta["git"], "hardware": meta["hardware"],
        "wall_time": meta["wall_time"], "generated": dt.datetime.now().isoformat(timespec="seconds"), "seeds": seeds}
    notes = ["Ours: the mean over the runs of each value ± the sample sd (ddof 1); one number where there is one run."]
    if agg.fixed:
        notes.append("Same in every job: " + " ".join(f"`{k}={show(_norm(v))}`" for k, v in agg.fixed.items()) + ".")
    body = render_table(f"Sweep over {swept}", agg.metrics, rendered_rows(agg), header, notes, paper=False,
                        first_column=" / ".join(agg.swept) or "Runs")
    lines = [body.rstrip("\n").replace("## ", "# ", 1)]
    if not agg.rows:
        lines.append("\n(no complete run)")
    lines += ["", "## Not complete", ""]
    if agg.not_complete:
        lines += [f"- `{j.dir}` ({' '.join(j.overrides)}): **{j.status}**"
                  + (f" [{j.config_hash}]" if j.config_hash else "") + f": {_one_line(j.reason)}"
                  for j in agg.not_complete]
    else:
        lines.append("None: every job is complete.")
    if agg.duplicates:
        lines += ["", f"{len(agg.duplicates)} job(s) ran the same ledger run as another job and are counted once: "
                  + ", ".join(f"`{j.dir}` (= `{j.superseded_by}`)" for j in agg.duplicates) + "."]
    if agg.optuna:
        best = agg.optuna.get("best_params") or {}
        value = agg.optuna.get("best_value")
        lines += ["", "## Optuna", "", f"Best value (what the jobs returned: the final validation PPL) "
                  f"{value if not isinstance(value, float) else f'{value:.4g}'} at "
                  + " ".join(f"`{k}={show(_norm(v))}`" for k, v in best.items()) + f" (`{agg.optuna['file']}`)."]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{Path(f).stem}]({Path(f).name})" for f in figures]
    lines += ["", "## Jobs", "", "| job | " + " | ".join([*agg.swept, "seed", "status", "config hash"]) + " |",
              "|" + "---|" * (len(agg.swept) + 4)]
    for j in agg.jobs:
        status = j.status + (" (counted once)" if j.superseded_by and j.status == "complete" else
                             " (superseded)" if j.superseded_by else "")
        seed = "–" if j.seed is None else show(_norm(j.seed))
        h = f"`{j.config_hash}`" if j.config_hash else "–"
        values = [show(_norm(j.value(k))) for k in agg.swept]
        lines.append("| " + " | ".join([f"`{j.dir}`", *values, seed, status, h]) + " |")
    return "\n".join(lines) + "\n"


def plot(agg: Aggregate, out_dir: Path) -> list[Path]:
    """One PNG per metric: the metric against the first numeric swept key, one curve per value of the
    other swept keys; rows where that key is not set are drawn as horizontal lines (e.g. an MLE baseline)."""
    from repdegen.analysis.sweep_figures import SweepSeries, plot_sweep_metric

    if not agg.rows:
        return []
    numeric = [k for k in agg.swept
               if all(isinstance(r.values[k], float) or r.values[k] is None for r in agg.rows)
               and any(isinstance(r.values[k], float) for r in agg.rows)]
    x_key = numeric[0] if numeric else (agg.swept[0] if agg.swept else None)
    others = [k for k in agg.swept if k != x_key]
    categories = None
    if x_key is not None and x_key not in numeric:  # a categorical key (e.g. objective=mle,agg): positions 0, 1...
        names = sorted({show(r.values[x_key]) for r in agg.rows})
        categories = {float(i): n for i, n in enumerate(names)}
        position = {n: float(i) for i, n in enumerate(names)}
    seeds = sorted({r.n for r in agg.rows})
    n_note = f"n = {seeds[0]}" if len(seeds) == 1 else f"n = {seeds[0]}-{seeds[-1]}"
    meta = _meta(agg)
    what = "one run per value" if seeds == [1] else f"mean ± std over seeds ({n_note})"
    figures = []
    for metric in agg.metrics:
        by_series: dict[str, SweepSeries] = {}
        for row in agg.rows:
            label = ", ".join(f"{k}={show(row.values[k])}" for k in others)
            s = by_series.setdefault(label, SweepSeries(label=label))
            stat = row.stats[metric]
            if stat["mean"] is None:
                continue
            x = None if x_key is None else row.values[x_key]
            if categories is not None:
                x = position[show(x)]
            if x is None and x_key is not None:
                s.baseline = (stat["mean"], stat["std"])
                continue
            s.x.append(0.0 if x is None else x)
            s.mean.append(stat["mean"])
            s.std.append(stat["std"])
        title = f"{', '.join(meta['labels'])} ({', '.join(meta['scales'])}): {what}"
        name = "aggregate_" + "".join(c if c.isalnum() or c in "._-" else "_" for c in metric) + ".png"
        figures.append(plot_sweep_metric(list(by_series.values()), out_dir / name, _metric_label(metric),
                                         x_key or "all runs", title, categories=categories))
    return figures


def write(agg: Aggregate, out_dir: str | Path) -> list[Path]:
    """Write aggregate.md / .csv / .json and the figures into ``out_dir``; return the paths written."""
    from repdegen.core.files import atomic_write_bytes

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = plot(agg, out_dir)
    texts = {"aggregate.md": to_markdown(agg, figures), "aggregate.csv": to_csv(agg),
             "aggregate.json": json.dumps(to_json(agg, figures), indent=2) + "\n"}
    for name, text in texts.items():
        atomic_write_bytes(out_dir / name, lambda f, t=text: f.write(t.encode()))
    return [out_dir / n for n in OUTPUT_NAMES] + figures


def run(sweep_dirs: Sequence[str | Path], out: str | Path | None = None, metrics: Sequence[str] | None = None,
        stage: str = "final", replicates: Sequence[str] = DEFAULT_REPLICATES, runs_dir: str | Path | None = None,
        require_complete: bool = True) -> Aggregate:
    """Aggregate and write; print a summary. With ``require_complete``, an AggregateError after writing
    when no job is complete (the report still lists why)."""
    agg = aggregate(sweep_dirs, metrics, stage, replicates, runs_dir)
    out_dir = Path(out) if out else Path(sweep_dirs[0])
    written = write(agg, out_dir)
    n_done = sum(r.n for r in agg.rows)
    print(f"repdegen: aggregated {n_done} complete run(s) over {', '.join(agg.swept) or 'no swept key'} "
          f"({len(agg.rows)} value(s)) -> {out_dir / 'aggregate.md'} (+ .csv, .json, {len(written) - 3} figure(s))")
    for j in agg.not_complete:
        print(f"repdegen: warning: job {j.dir} is {j.status}: {_one_line(j.reason)}")
    if require_complete and not agg.rows:
        raise AggregateError(
            f"none of the {len(agg.jobs)} job(s) in {', '.join(map(str, agg.sweep_dirs))} is complete (reasons in "
            f"{out_dir / 'aggregate.md'}); expected at least one finished run: fix the failures and run the sweep again "
            f"(complete runs are reused from the ledger, not repeated)")
    return agg


# --------------------------------------------------------------------------------------------------
# Hydra callback
# --------------------------------------------------------------------------------------------------
try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover - hydra is a dependency
    _HydraCallback = object


class AggregateCallback(_HydraCallback):
    """Aggregates a multirun when it ends (conf/hydra/callbacks/aggregate.yaml; enable it with
    ``hydra/callbacks=aggregate`` on any ``-m`` command line). A job that raises (rather than exiting)
    gets a ``failure.json`` with the error, so the aggregate says why.

    Hydra calls ``on_multirun_end`` only when every job succeeded (its sweeper re-raises a job's error
    first); after a failed sweep run ``repdegen aggregate <sweep dir>``, which ``make
    sweep-*`` does for you."""

    def __init__(self, metrics: Sequence[str] | None = None, stage: str = "final",
                 replicates: Sequence[str] = DEFAULT_REPLICATES, out: str | None = None):
        self.metrics = list(metrics) if metrics else None
        self.stage = stage
        self.replicates = list(replicates)
        self.out = out

    def on_job_end(self, config, job_return, **kwargs) -> None:
        from hydra.core.utils import JobStatus

        if job_return.status != JobStatus.FAILED:
            return
        try:
            out_dir = Path(config.hydra.runtime.output_dir)
        except Exception:
            return
        if not (out_dir / FAILURE_NOTE).is_file():
            write_failure_note(out_dir, job_return._return_value)

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            run([sweep_dir], self.out, self.metrics, self.stage, self.replicates)
        except UserError as err:
            print(f"repdegen: warning: could not aggregate {sweep_dir}: {err}")


# --------------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------------
def _comma_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="repdegen aggregate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", metavar="DIR", help="Hydra multirun folder(s) (hydra.sweep.dir)")
    p.add_argument("--out", help="where to write aggregate.* and the figures (default: the first DIR)")
    p.add_argument("--metrics", type=_comma_list, default=None,
                   help=f"comma-separated metrics of result.json's metrics.<stage> (default: {', '.join(DEFAULT_METRICS)}, "
                        f"plus {', '.join(OPTIONAL_METRICS)} where present)")
    p.add_argument("--stage", default="final", help="which stage's metrics: final (default), finetune, cache...")
    p.add_argument("--replicate", type=_comma_list, default=list(DEFAULT_REPLICATES),
                   help="comma-separated keys that are replicates, not swept values (default: seed)")
    p.add_argument("--runs-dir", help="the ledger folder to read runs from, when it moved since the sweep")
    args = p.parse_args(argv)
    problem = output_problem(args.out, "--out", folder=True) if args.out else None
    if problem:
        p.error(problem)
    return args


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    run(args.dirs, args.out, args.metrics, args.stage, args.replicate, args.runs_dir)
