"""Regenerate paper tables: run the cells that are missing from the ledger, then render.

    repdegen table table=inan2017_t1 scale=smoke
    repdegen table table=all scale=lite                  # every table, on all local GPUs
    repdegen table table=yu2022_t1,yu2022_t3 scale=lite  # a list
    repdegen table table=gao2019_t1 scale=lite trainer.device=cuda   # any training-config
                                                                               # override goes to every cell
    repdegen table table=all scale=paper hydra/launcher=submitit_slurm hydra.launcher.partition=gpu
    make reproduce-table TABLE=inan2017_t1 SCALE=lite

A table (``conf/table/<name>.yaml``) lists rows; a row names an experiment preset plus overrides
and carries the paper's numbers. Each row becomes a cell: the config ``repdegen.reproduce.train`` would
compose from ``experiment=<row.experiment> scale=<scale> <row.overrides>``. Cells whose config hash
is complete in the ledger are not run again; unfinished ones resume from their checkpoint; a failed
cell is reported with its log path and does not stop the others; the exit status is 0 only when
every cell completed (1: some did not; 2: a user error, nothing run; 130: interrupted; see
``repdegen.reproduce.errors``). A cell another process is training is shown as running elsewhere and waited
for. Cells shared by several tables run once. How cells run (a process per cell on
the local GPUs or CPU, DDP for large cells, SLURM through submitit) is ``repdegen.reproduce.runs.launch``
(``launch.*`` keys). Output: ``<paths.tables_dir>/<table>/<scale>/`` (``table.md``, ``table.csv``,
``table.tex``, ``cells.json``, and ``curves.png``: validation PPL per epoch of every cell, plus
the embedding figures).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from repdegen.core.provenance import git_commit, only_results_changed
from repdegen.reproduce.results.table_render import render_latest
from repdegen.reproduce.runs.archive import (
    ARCHIVE_DIR,
    restore_records,
    restored_from,
)
from repdegen.reproduce.runs.cells import Cell, expand_cells, seeds_at, selected_cells
from repdegen.reproduce.runs.launch import LaunchConfig, jobs_for, validate_launch
from repdegen.reproduce.runs.ledger import STATUS_COMPLETE, Ledger
from repdegen.reproduce.runs.slurm import make_scheduler
from repdegen.reproduce.runs.status import _fmt_seconds
from repdegen.reproduce.runs.trained import analysis_values, run_analyses


def run_cells(cells: list[Cell], ledger: Ledger, app: DictConfig | None = None,
              tables_of: dict[str, list[str]] | None = None) -> dict[str, str]:
    """Run every cell not complete in the ledger (``repdegen.reproduce.runs.launch``); return {hash: status}."""
    launch = app.launch if app is not None else OmegaConf.structured(LaunchConfig)
    # first: a repairing ledger moves corrupt records aside, so their cells count as not run
    status = {c.config_hash: STATUS_COMPLETE for c in cells if ledger.is_complete(c.config_hash)}
    jobs = jobs_for(cells, ledger.root, tables_of)
    print(f"repdegen: {len(cells)} cells, {len(cells) - len(jobs)} already complete, {len(jobs)} to run", flush=True)
    if not jobs:
        return status
    output_dir = Path(app.paths.output_dir) if app is not None else ledger.root.parent
    scheduler = make_scheduler(jobs, launch, output_dir, progress=bool(app.progress) if app is not None else False)
    status.update(scheduler.run())
    failed = [j for j in jobs if j.status != STATUS_COMPLETE]
    for job in failed:
        if job.status == "elsewhere":
            print(f"repdegen: running elsewhere (not failed): {job.label} [{job.config_hash}] is being trained by "
                  f"{job.holder or 'another process'}; run the same command when it is done to render it",
                  file=sys.stderr, flush=True)
            continue
        print(f"repdegen: {job.status}: {job.label} [{job.config_hash}] -- log: {job.log_path}", file=sys.stderr, flush=True)
    return status


def bench_dir(app: DictConfig) -> Path:
    """The benchmark files a plan reads: ``plan_bench_dir``, else results/bench beside the tables, else the checkout's."""
    if app.get("plan_bench_dir"):
        return Path(app.plan_bench_dir)
    beside = Path(app.paths.tables_dir).parent / "bench"
    if beside.is_dir():
        return beside
    from repdegen.reproduce.settings.config import CONF_DIR

    return CONF_DIR.parent / "results" / "bench"


def run_table(app: DictConfig) -> int:
    """Run what is missing and render; return the number of cells that did not complete."""
    return run_tables([app])


def run_tables(apps: list[DictConfig]) -> int:
    """Expand the cells of every table, run the missing ones together (a cell shared by tables
    runs once), then render each table; return the number of cells that did not complete."""
    start = time.time()
    validate_launch(apps[0].launch)  # before anything is registered or run
    memo: dict = {}  # the tables' cells share their defaults trees
    expanded = [(app, expand_cells(app, memo)) for app in apps]
    if apps[0].plan:
        from repdegen.reproduce.runs.plan import plan_tables

        chosen = [(app, selected_cells(app, cells)) for app, cells in expanded]
        print(plan_tables(chosen, apps[0].plan_device, bench_dir(apps[0]), markdown=apps[0].plan == "markdown"),
              flush=True)
        return 0
    asked = [{c.config_hash: c for c in selected_cells(app, cells)} for app, cells in expanded]
    unique: dict[str, Cell] = {}
    tables_of: dict[str, list[str]] = {}
    for (app, _), chosen in zip(expanded, asked):
        for c in chosen.values():
            unique.setdefault(c.config_hash, c)
            tables_of.setdefault(c.config_hash, []).append(app.table.name)
    first = apps[0]
    if not first.render_only:
        register_tables(expanded)
        if first.register_only:
            return 0
    # a run repairs the ledger (a corrupt record is moved aside and its cell runs again); render_only
    # changes nothing: a corrupt record is an error before anything is written
    ledger = Ledger(first.paths.runs_dir, repair=not first.render_only)
    if first.restore:
        every = {c.config_hash: c for _, cells in expanded for c in cells}
        restored = restore_records(Path(first.paths.tables_dir), ledger.root, list(every.values()))
        print(f"repdegen: restore=true: {len(restored)} run record(s) restored into {ledger.root} from "
              f"{first.paths.tables_dir}/*/*/{ARCHIVE_DIR}/")
    if first.render_only:
        run_status: dict[str, str] = {}
        for h in unique:
            ledger.load(h)
    else:
        if len(apps) > 1:
            print(f"repdegen: {len(apps)} tables at scale {first.scale.name}: {', '.join(a.table.name for a in apps)}")
        run_status = run_cells(list(unique.values()), ledger, first, tables_of)
        for app, chosen in zip(apps, asked):
            analyse_cells(app, list(chosen.values()), ledger)
    not_done: set[str] = set()
    for (app, cells), chosen in zip(expanded, asked):
        rendered = render_latest(app, cells, ledger, run_status)
        if rendered is not None and cells and cells[0].cfg.logger.name == "wandb":  # one more wandb run: the table
            out, rows = rendered
            from repdegen.reproduce.engine.loggers import log_table

            log_table(app.table.name, app.scale.name, rows, list(app.table.columns), out,
                      logger_cfg=OmegaConf.to_container(cells[0].cfg.logger), wandb_dir=app.paths.output_dir)
        unfinished = {c.config_hash for c in cells if not ledger.is_complete(c.config_hash)}
        # the exit status counts the cells asked for (rows=): the rest stay "–" by request
        not_done |= unfinished & set(chosen)
        print(f"repdegen: table {app.table.name} at scale {app.scale.name}: {len(cells) - len(unfinished)}"
              f"/{len(cells)} cells complete ({time.time() - start:.0f}s)")
    if len(apps) > 1:
        print(f"repdegen: {len(apps)} tables, {len(unique)} distinct cells: {len(unique) - len(not_done)} complete, "
              f"{len(not_done)} not ({_fmt_seconds(time.time() - start)})")
    return len(not_done)


def analyse_cells(app: DictConfig, cells: list[Cell], ledger: Ledger) -> None:
    """The table's ``analyses`` of its complete cells that do not hold them yet (reproduce/runs/trained.py)."""
    analyses = app.table.get("analyses")
    todo = [c for c in cells if ledger.is_complete(c.config_hash)]
    if not analyses or not any(analyses.values()) or not todo:
        return
    start = time.time()
    for k, c in enumerate(todo, 1):
        run = ledger.run_dir(c.config_hash)
        source = restored_from(run)
        if source and analysis_values(run, analyses)[1] is None:
            print(f"repdegen: {app.table.name}: {c.label} [{c.config_hash}] was restored from {source} "
                  f"without its analyses, and its weights are not on this machine: its analysis columns stay empty "
                  f"(train the cell again to compute them)", flush=True)
            continue
        if run_analyses(ledger.run_dir(c.config_hash), analyses, device=_analysis_device(c.cfg)):
            eta = (time.time() - start) / k * (len(todo) - k)
            print(f"repdegen: {app.table.name}: analyses of {c.label} [{c.config_hash}] written ({k}/{len(todo)}, "
                  f"{_fmt_seconds(time.time() - start)} so far, ETA {_fmt_seconds(eta)})", flush=True)


def _analysis_device(cfg: DictConfig) -> str:
    from repdegen.reproduce.runs.execute import uses_cuda

    return "cuda" if uses_cuda(cfg.trainer.device) else "cpu"


def register_tables(expanded: list[tuple[DictConfig, list[Cell]]]) -> None:
    """Pre-register each table's claims and cells at its scale before anything runs (reproduce/runs/registration.py)."""
    from repdegen.reproduce.runs import registration

    commit = git_commit()
    for app, cells in expanded:
        new_claims, new_cells = registration.register(app.paths.tables_dir, app.table, app.scale.name,
                                                      seeds_at(app.table, app.scale.name), cells, commit)
        path = registration.path_of(app.paths.tables_dir, app.table.name, app.scale.name)
        print(f"repdegen: registered {new_claims} new claim definitions and {new_cells} new cells of {app.table.name} "
              f"at {app.scale.name} in {path} at commit {str(commit.get('commit'))[:10]}"
              f"{registration_note(commit, new_claims + new_cells)}", flush=True)


def registration_note(commit: dict, new: int) -> str:
    """What the registration line says of a dirty tree: a changed config must be committed with the registration it
    wrote; a tree dirty in rendered results only (an earlier step re-rendered a table) asks nothing of the user."""
    if not commit.get("dirty"):
        return ""
    if only_results_changed(commit):
        return " (uncommitted changes in results/ only" + ("; commit this file)" if new else ")")
    return " (uncommitted changes: commit the configs and this file)"
