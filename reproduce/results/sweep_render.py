"""A sweep's aggregate written out (:func:`write`): ``aggregate.md`` (by the tables' renderer, ours only,
mean ± sd), ``aggregate.csv``, ``aggregate.json`` and one plot per metric against the swept value
(``aggregate_<metric>.png``). The aggregate itself is :func:`repdegen.reproduce.runs.sweeps.aggregate`."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Sequence
from pathlib import Path

from repdegen.reproduce.errors import FAILURE_NOTE, UserError, write_failure_note
from repdegen.reproduce.runs.sweeps import (
    DEFAULT_REPLICATES,
    OUTPUT_NAMES,
    Aggregate,
    AggregateError,
    _norm,
    _order,
    aggregate,
    show,
)


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
