"""A sweep written out (:func:`run`): its generated table (:func:`repdegen.reproduce.runs.sweeps.sweep_table`) through
the tables' own collecting and rendering (:mod:`repdegen.reproduce.results.table_render`): ``table.md`` (ours only,
mean ± sd per swept value, the jobs not complete and why), ``table.csv``, ``table.tex``, ``cells.json`` (every cell
and every job), the learning curves and one figure per metric against the swept value (``sweep_<metric>.png``).
:class:`AggregateCallback` runs it when a multirun ends."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from repdegen.reproduce.errors import FAILURE_NOTE, UserError, write_failure_note
from repdegen.reproduce.runs.sweeps import DEFAULT_REPLICATES, AggregateError, Sweep, _norm, show, sweep_table


def _jobs(sweep: Sweep) -> dict:
    """What ``cells.json`` keeps of the sweep beside the table's cells: its folders, keys and every job."""
    return {"sweep": {
        "dirs": [str(d) for d in sweep.sweep_dirs], "stage": sweep.stage, "swept": sweep.swept,
        "replicates": sweep.replicates, "metrics": sweep.metrics,
        "fixed": {k: list(v) if isinstance(v, tuple) else v for k, v in sweep.fixed.items()}, "optuna": sweep.optuna,
        "jobs": [{"job_dir": str(j.dir), "status": j.status, "reason": j.reason, "config_hash": j.config_hash,
                  "seed": j.seed, "overrides": j.overrides, "values": {k: show(_norm(j.value(k))) for k in sweep.swept},
                  "superseded_by": str(j.superseded_by) if j.superseded_by else None} for j in sweep.jobs]}}


def run(sweep_dirs: Sequence[str | Path], out: str | Path | None = None, metrics: Sequence[str] | None = None,
        stage: str = "final", replicates: Sequence[str] = DEFAULT_REPLICATES, runs_dir: str | Path | None = None,
        require_complete: bool = True) -> Sweep:
    """Generate the sweep's table and render it into ``out`` (default: the first sweep folder); print a summary.
    With ``require_complete``, an AggregateError after writing when no job is complete (the table says why)."""
    from omegaconf import OmegaConf
    from repdegen.reproduce.results.table_render import collect_rows, render
    from repdegen.reproduce.runs.ledger import Ledger

    sweep = sweep_table(sweep_dirs, metrics, stage, replicates, runs_dir)
    out_dir = Path(out) if out else Path(sweep_dirs[0])
    ledger_dir = sweep.runs_dir or out_dir
    app = OmegaConf.create({"table": sweep.table, "scale": {"name": sweep.scale}, "render_only": False,
                            "paths": {"tables_dir": str(out_dir), "runs_dir": str(ledger_dir)}})
    ledger = Ledger(ledger_dir)
    rows, records = collect_rows(app, sweep.cells, ledger)
    render(app, rows, records, ledger, out=out_dir, extra=_jobs(sweep))
    print(f"repdegen: aggregated {len(sweep.complete)} complete run(s) over {', '.join(sweep.swept) or 'no swept key'} "
          f"({len(rows)} value(s)) -> {out_dir / 'table.md'}")
    for j in sweep.not_complete:
        print(f"repdegen: warning: job {j.dir} is {j.status}: {' '.join((j.reason or 'no reason recorded').split())}")
    if require_complete and not sweep.complete:
        raise AggregateError(
            f"none of the {len(sweep.jobs)} job(s) in {', '.join(map(str, sweep.sweep_dirs))} is complete (reasons in "
            f"{out_dir / 'table.md'}); expected at least one finished run: fix the failures and run the sweep again "
            f"(complete runs are reused from the ledger, not repeated)")
    return sweep


try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover - hydra is a dependency
    _HydraCallback = object


class AggregateCallback(_HydraCallback):
    """Renders a multirun's table when it ends (conf/hydra/callbacks/aggregate.yaml; enable it with
    ``hydra/callbacks=aggregate`` on any ``-m`` command line). A job that raises (rather than exiting)
    gets a ``failure.json`` with the error, so the table says why.

    Hydra calls ``on_multirun_end`` only when every job succeeded (its sweeper re-raises a job's error
    first); after a failed sweep run ``repdegen aggregate <sweep dir>``, which ``make sweep-*`` does for you."""

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
