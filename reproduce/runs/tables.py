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

import datetime as dt
import json
import math
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from repdegen.analysis.figures import plot_validation_curves
from repdegen.core.files import atomic_write_bytes, atomic_write_json
from repdegen.core.loaders import load_cells_json
from repdegen.core.provenance import command_line, git_commit, hardware_summary, only_results_changed
from repdegen.reproduce.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USER_ERROR,
    ConfigError,
    CorruptFile,
    UserError,
    exit_on_user_error,
    report_user_error,
)
from repdegen.reproduce.results.claims import Claim, validate_claims
from repdegen.reproduce.results.render import RenderedRow, to_csv, to_latex, to_markdown
from repdegen.reproduce.runs.archive import (
    ARCHIVE_DIR,
    ARCHIVED_SCALES,
    archive_records,
    archived_records,
    ensure_projection,
    keep_figure_aside,
    read_projection,
    restore_records,
    restored_from,
    svd_caption,
)
from repdegen.reproduce.runs.launch import LaunchConfig, _fmt_seconds, jobs_for, make_scheduler, validate_launch
from repdegen.reproduce.runs.ledger import STATUS_COMPLETE, Ledger
from repdegen.reproduce.runs.trained import ANALYSIS_METRICS, analysis_values, run_analyses
from repdegen.reproduce.settings.config import CONF_DIR, PathsConfig, ScaleConfig, register_all
from repdegen.reproduce.settings.resolve import compose, resolve

SCALE_NOTES = {
    "paper": "the papers' hyperparameters",
    "lite": "the claims on a 2-core CPU in <= 60 min a table: the rows the claims need, small budgets, fixed seeds",
    "smoke": "minutes on a CPU: widths x0.1, 1 epoch on 30k tokens (3k sentence pairs), 5k evaluation tokens (100 pairs); "
             "checks plumbing, not numbers",
}


@dataclass
class TableRow:
    label: str = MISSING
    # None: a row of other work, shown with the paper's number only
    experiment: str | None = None
    overrides: list[str] = field(default_factory=list)
    # which stage of the run the numbers come from: final | finetune | cache | session<n> (a training session before
    # trainer.retrain_sessions re-trained it)
    stage: str = "final"
    paper: dict[str, Any] = field(default_factory=dict)
    group: str | None = None
    note: str | None = None
    # extra overrides at one scale only, e.g. {lite: [dataset=multi30k_en_de]}: the lite/smoke cells
    # of the WMT14 tables train on Multi30k
    scale_overrides: dict[str, list[str]] = field(default_factory=dict)
    # the scales this row runs at (None: every scale); at the others it shows the paper's numbers only
    # ("paper only at lite"): a lite table runs the rows its claims need
    scales: list[str] | None = None
    # the row this one is compared with at smoke/lite (None: the table's baseline)
    baseline: str | None = None


@dataclass
class TableAnalyses:
    # greedy continuations of the first N 50-token test prefixes by 100 tokens (0: none): cont_uniq_mean, cont_uniq_total
    continuations: int = 0


@dataclass
class TableConfig:
    name: str = MISSING
    title: str = MISSING
    source: str = MISSING
    columns: list[str] = field(default_factory=lambda: ["valid_ppl", "test_ppl"])
    rows: list[TableRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # the paper's findings as checks over the rows (reproduce/results/claims.py)
    claims: list[Claim] = field(default_factory=list)
    # the row the others are compared with at smoke/lite (a label is looked up in each row's group first)
    baseline: str | None = None
    # seeds per scale, fixed before any run ({lite: [1, 2, 3]}); a scale not listed runs the preset's seed
    seeds: dict[str, list[int]] = field(default_factory=dict)
    # what differs from the paper at a scale, beyond what the cells' configs say (shown in the header)
    differences: dict[str, str] = field(default_factory=dict)
    # a figure's points as rows (Inan 2017 Fig. 1): the paper prints no number for most of them, so rows may have none
    figure: bool = False
    # analyses of the trained cells that the columns or claims read besides the runs' records, computed once per run
    # after it completes (reproduce/runs/trained.py): {continuations: 500} (Yu Tables 5/15: cont_uniq_mean)
    analyses: TableAnalyses = field(default_factory=lambda: TableAnalyses())


@dataclass
class TableAppConfig:
    table: TableConfig = MISSING
    # the scale the cells run at (scale=<paper|lite|smoke>: conf/scale/<name>.yaml); what that file sets for a run
    # (trainer, dataset, optim) lands beside it here, unused: each cell composes its scale again
    scale: ScaleConfig = MISSING
    trainer: Any = None
    dataset: Any = None
    optim: Any = None
    paths: PathsConfig = field(default_factory=PathsConfig)
    # overrides of the training config for every cell. On the command line, arguments that name the
    # training config's keys (trainer.device=cuda, dataset.data_dir=..., logger=wandb) land here.
    overrides: list[str] = field(default_factory=list)
    # run only these rows' cells ("<group> / <label>", or a label that is unique); the table still renders every row
    # from the ledger ("–" for a cell not run). E.g. rows='["Small (200 units) / VD-LSTM"]'. None: every row
    rows: list[str] | None = None
    # render from the ledger without running anything
    render_only: bool = False
    # first copy into the ledger the paper-scale run records committed with the tables (results/tables/<t>/paper/
    # records/) of cells the ledger lacks (a work tree, ledger included, lost between sessions): they count as
    # complete and are not trained again (reproduce/runs/archive.py). Off: a fresh clone trains every cell
    restore: bool = False
    # pre-register the table's claims and cells at this scale (results/tables/<t>/<scale>/registration.json) and
    # stop: commit that file before the cells run (reproduce/runs/registration.py); a run registers them too
    register_only: bool = False
    # how the cells run: reproduce/runs/launch.py
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    # the scheduler's progress bar (one line per event is always printed)
    progress: bool = True


def register_table_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(group="table", name="schema_table", node=TableConfig)
    cs.store(name="table_app_base", node=TableAppConfig)


register_all()
register_table_configs()


@dataclass
class Cell:
    rows: list[int]
    label: str
    cfg: DictConfig
    config_hash: str
    # the seed this cell runs (None: the preset's)
    seed: int | None = None
    # what composes it: repdegen.reproduce.train experiment=<experiment> <overrides> (the first row's)
    experiment: str | None = None
    overrides: list[str] = field(default_factory=list)


def scale_names() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "scale").glob("*.yaml"))


def seeds_at(table, scale: str) -> list[int | None]:
    """The seeds a table runs at a scale: its ``seeds.<scale>``, else the preset's own (None)."""
    return list((table.get("seeds") or {}).get(scale) or [None])


def runs_at(row, scale: str) -> bool:
    return row.experiment is not None and (row.get("scales") is None or scale in row.scales)


def compose_cell(experiment: str, overrides: list[str]) -> DictConfig:
    """The config ``repdegen.reproduce.train experiment=... <overrides>`` would run, before it is finalized (the preset's
    files for its objective and scale included; the overrides win over them):
    :func:`repdegen.reproduce.settings.resolve.compose`."""
    return compose([f"experiment={experiment}", *overrides])[0]


def expand_cells(app: DictConfig, memo: dict | None = None) -> list[Cell]:
    """The table's cells at its scale, one Hydra composition each; rows that differ in values only share their
    defaults tree (``memo``: :func:`repdegen.reproduce.settings.resolve.resolve`; one for this call when not given)."""
    memo = {} if memo is None else memo
    paths = [f"paths.{k}={v}" for k, v in OmegaConf.to_container(app.paths, resolve=True).items()]
    extra = list(app.overrides)
    validate_claims(app.table, scale_names())
    cells: dict[str, Cell] = {}
    for i, row in enumerate(app.table.rows):
        if not runs_at(row, app.scale.name):
            continue
        at_scale = list(row.scale_overrides.get(app.scale.name, []))
        # a table's cells share a wandb group (logger.* is not in the config hash); a logger.group given
        # on the command line (in extra) wins
        group = f"logger.group={app.table.name}/{app.scale.name}"
        for seed in seeds_at(app.table, app.scale.name):
            with_seed = [] if seed is None else [f"seed={seed}"]
            overrides = [f"scale={app.scale.name}", *row.overrides, *at_scale, *with_seed, group, *extra, *paths]
            try:
                spec = resolve([f"experiment={row.experiment}", *overrides], memo=memo)
            except UserError:
                raise
            except Exception as err:  # a composition error names the bad row, not just the key
                from repdegen.reproduce.errors import as_user_error, condense_hydra_error

                where = f"{row.experiment} {' '.join(row.overrides + at_scale + with_seed)}"
                what = as_user_error(err) or condense_hydra_error(err)
                raise UserError(f"table {app.table.name}, row {row.label!r} ({where}): {what}") from None
            cfg, h = spec.cfg, spec.config_hash
            if h in cells:
                cells[h].rows.append(i)
            else:
                label = f"{row.experiment} {' '.join(row.overrides + at_scale + with_seed)}".strip()
                cells[h] = Cell([i], label, cfg, h, seed, row.experiment, overrides)
    return list(cells.values())


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


def run_label_of(rows, indices: list[int]) -> str:
    """A run shared by several rows is named by what their labels have in common
    ("AWD-LSTM (w.o. finetune)", "AWD-LSTM + cache" -> "AWD-LSTM")."""
    labels = [rows[i].label for i in indices]
    if len(labels) == 1:
        return labels[0]
    common = os.path.commonprefix(labels).rstrip(" (+-")
    return common or labels[0]


def _cell_values(record: dict, stage: str) -> dict[str, float | None]:
    """A complete cell's numbers at a row's stage: every metric the stage recorded, and ``params``."""
    from repdegen.analysis.record_metrics import derived_metrics

    recorded = record["metrics"].get(stage, {})
    values = {k: v for k, v in recorded.items() if isinstance(v, (int, float))}
    values["params"] = record["parameters"]["total"] / 1e6
    for k, v in derived_metrics(record, recorded).items():
        values.setdefault(k, v)
    return values


def _row_status(statuses: list[str]) -> str:
    if all(s == STATUS_COMPLETE for s in statuses):
        return STATUS_COMPLETE
    for worst in ("failed", "running", "interrupted", "preempted", "missing"):
        if worst in statuses:
            return worst
    return next(s for s in statuses if s != STATUS_COMPLETE)


def collect_rows(app: DictConfig, cells: list[Cell], ledger: Ledger,
                 run_status: dict[str, str] | None = None) -> tuple[list[RenderedRow], list[dict]]:
    """One rendered row per table row (the mean over its seeds, with their sd and per-seed values in
    ``extra["seeds"]``), and the ledger records of the complete cells (once each)."""
    by_row: dict[int, list[Cell]] = {}
    for c in cells:
        for i in c.rows:
            by_row.setdefault(i, []).append(c)
    rows, records, seen = [], [], set()
    scale = app.scale.name
    for i, row in enumerate(app.table.rows):
        paper = {k: (float(v) if v is not None else None) for k, v in (row.paper or {}).items()}
        row_cells = by_row.get(i)
        if not row_cells:
            status = "paper-only" if row.experiment is None else "not-at-scale"
            rows.append(RenderedRow(row.label, row.group, paper, {}, status, row.note, extra={"scale": scale}))
            continue
        per_seed: dict = {}
        statuses = []
        for cell in row_cells:
            record = ledger.load(cell.config_hash)
            status = "missing" if record is None else record.get("status", "missing")
            if record is None and (run_status or {}).get(cell.config_hash) == "failed":
                status = "failed"
            statuses.append(status)
            per_seed[cell.seed] = None
            if record is not None and status == STATUS_COMPLETE:
                per_seed[cell.seed] = _cell_values(record, row.stage)
                analysed, when = analysis_values(ledger.run_dir(cell.config_hash), app.table.get("analyses"))
                per_seed[cell.seed].update(analysed)
                if cell.config_hash not in seen:
                    seen.add(cell.config_hash)
                    label = run_label_of(app.table.rows, cell.rows)
                    records.append(dict(record, _row_label=label, _row_group=row.group, _seed=cell.seed,
                                        _first_seed=cell.seed == row_cells[0].seed, _analysed=when,
                                        _rows=list(cell.rows)))
        done = [v for v in per_seed.values() if v is not None]
        ours: dict[str, float | None] = {}
        sd: dict[str, float | None] = {}
        for col in app.table.columns:
            vals = [v[col] for v in done if v.get(col) is not None and math.isfinite(v[col])]
            ours[col] = statistics.fmean(vals) if vals else None
            sd[col] = statistics.stdev(vals) if len(vals) > 1 else None
        hashes = "+".join(c.config_hash for c in row_cells)
        rows.append(RenderedRow(row.label, row.group, paper, ours, _row_status(statuses), row.note, hashes,
                                extra={"seeds": per_seed, "sd": sd, "n_seeds": len(row_cells), "n_done": len(done),
                                       "scale": scale}))
    return rows, records


def attach_baselines(table, rows: list[RenderedRow]) -> None:
    """Each run row's baseline row (``extra["baseline"]``: its index), for the smoke/lite view."""
    from repdegen.reproduce.results.claims import resolve_row

    for i, row in enumerate(table.rows):
        ref = row.get("baseline") or table.get("baseline")
        if ref and row.experiment:
            j = resolve_row(table, ref, f"the baseline of row {row.label!r}", row.get("group"))
            if j != i:
                rows[i].extra["baseline"] = j


def claim_inputs(table, rows: list[RenderedRow]) -> tuple[dict[int, dict], dict[int, dict]]:
    """(ours, paper) for repdegen.reproduce.results.claims.evaluate_claims: ours[row][seed] = metrics or None."""
    ours = {i: r.extra.get("seeds", {}) for i, r in enumerate(rows)}
    paper = {i: dict(r.paper) for i, r in enumerate(rows)}
    add_gains(rows, ours, paper)
    return ours, paper


GAIN_METRICS = ("valid_ppl", "test_ppl")


def add_gains(rows: list[RenderedRow], ours: dict[int, dict], paper: dict[int, dict]) -> None:
    """``<metric>_gain`` = 1 − metric(row) / metric(its baseline row), per seed (ours) and on the paper's numbers; 0 for
    the baseline row itself (Inan et al. 2017: "most of the improvement" from RE alone)."""
    def gain(a, b):
        ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (a, b)) and b
        return 1.0 - a / b if ok else None

    for i, r in enumerate(rows):
        j = r.extra.get("baseline", i if r.extra.get("seeds") else None)
        if j is None:
            continue
        for m in GAIN_METRICS:
            p = gain(paper[i].get(m), paper[j].get(m))
            if p is not None:
                paper[i][f"{m}_gain"] = p
            for seed, values in ours.get(i, {}).items():
                base = ours.get(j, {}).get(seed)
                if values is not None and base is not None:
                    g = gain(values.get(m), base.get(m))
                    values[f"{m}_gain"] = float("nan") if g is None else g


def render_embedding_figures(records: list[dict], runs_dir: Path, out: Path, title: str) -> dict[str, str]:
    """The papers' embedding figures for the cells of a table, next to it; {file name: caption} of those written.

    A row is keyed by (group, label) (two rows "MLE" of different groups are two rows), named "group / label" in
    the figures when the rows shown are of more than one group, and has one colour in every figure. A row run with
    several seeds is drawn as the mean over its seeds with a min–max band (``records``: every seed's record).

    * ``singular_values.png``: normalised singular values of each row's final output embedding (Gao Fig. 2(b),
      Yu Fig. 3(c));
    * ``geometry_over_training.png``: I(W), I(W) of the rare and frequent groups and the rare-frequent mean cosine
      at every evaluation (Yu Fig. 2), and AL's target entropy where rows record it, one panel each in a grid;
    * the traces of an objective, e.g. ``rare_group_size.png``: AGG's rare group size over the first updates (Yu
      Fig. 4);
    * ``svd_projection.png``: each row's output embedding (its lowest seed whose weights, or whose projection kept
      with its record, are here) projected on its top-2 singular directions, coloured by frequency group, one panel
      per row on the same axis limits (Gao Figs 1(a), 2(a); Yu Figs 1, 3). The per-row ``svd_<k>.png`` of earlier
      renderings are removed; one that drew a row this one cannot is kept aside as drawn
      (:func:`repdegen.reproduce.runs.archive.keep_figure_aside`).
    """
    from repdegen.analysis.embedding_figures import plot_metric_over_training, plot_singular_values, plot_svd_projections
    from repdegen.analysis.figures import Seeds, row_colors, row_name
    from repdegen.losses import OBJECTIVES
    from repdegen.reproduce.results.metrics import label as metric_label

    rows: dict[tuple[str | None, str], list[dict]] = {}
    for r in records:
        rows.setdefault((r.get("_row_group"), r["_row_label"]), []).append(r)
    for seeds in rows.values():
        seeds.sort(key=lambda r: (r.get("_seed") is None, r.get("_seed") or 0))
    with_group = len({g for g, _ in rows}) > 1
    name = {key: row_name(key[0], key[1], with_group) for key in rows}
    colors = {name[key]: c for key, c in row_colors(list(rows)).items()}
    groups = [g for g, _ in rows if g]
    if groups and not with_group:  # one group: the title says which
        title = f"{title}, {groups[0]}"
    seeds = sorted({r["_seed"] for r in records if r.get("_seed") is not None})
    over = f" (line: mean over seeds {', '.join(map(str, seeds))}; band: min–max)" if len(seeds) > 1 else ""
    written: dict[str, str] = {}
    spectra = {name[key]: Seeds(r["metrics"]["final"]["singular_values"] for r in rs
                                if r["metrics"].get("final", {}).get("singular_values"))
               for key, rs in rows.items()}
    spectra = {n: s for n, s in spectra.items() if s}
    if spectra:
        plot_singular_values(spectra, out / "singular_values.png", f"Singular values of the output embedding W — {title}",
                             colors=colors)
        written["singular_values.png"] = ("Normalised singular values of each row's output embedding (Gao Fig. 2b, Yu "
                                          f"Fig. 3c){over}")
    keys = [k for k in ("isotropy", "isotropy_rare", "isotropy_frequent", "cos_rare_frequent", "al_target_entropy")
            if any(k in h for r in records for h in r.get("history", []))]
    if keys:
        histories = {name[key]: Seeds([dict(h, step=h.get("updates", i + 1)) for i, h in enumerate(r.get("history", []))]
                                      for r in rs) for key, rs in rows.items()}
        plot_metric_over_training(histories, keys, out / "geometry_over_training.png",
                                  f"Embedding geometry during training — {title}", x_key="step", colors=colors,
                                  labels={k: metric_label(k) for k in keys}, x_label="training updates")
        written["geometry_over_training.png"] = ("Embedding geometry of each row at every evaluation: "
                                                 f"{', '.join(metric_label(k) for k in keys)} (Yu Fig. 2){over}")
    for trace, (filename, what) in sorted({k: v for cls in OBJECTIVES.classes() for k, v in cls.traces.items()}.items()):
        traces = {name[key]: Seeds([{"step": s, trace: v} for s, v in r["trace"][trace]] for r in rs
                                   if r.get("trace", {}).get(trace))
                  for key, rs in rows.items()}
        traces = {n: t for n, t in traces.items() if t}
        if traces:
            plot_metric_over_training(traces, trace, out / filename, f"{what} over the first updates — {title}",
                                      x_key="step", colors=colors, labels={trace: what}, x_label="training updates")
            written[filename] = f"{what} over the first updates of each row that records it (Yu Fig. 4){over}"
    panels, shown = {}, []
    for key, rs in rows.items():
        for r in rs:  # the lowest seed whose weights, or whose kept projection, are on this machine
            # the projection kept beside the run (computed once from its weights: the archive copies the same file)
            kept = ensure_projection(runs_dir / r["config_hash"], r)
            kept = read_projection(kept, r.get("started")) if kept is not None else None
            found = kept[:2] if kept is not None else None
            if found is None:
                continue  # neither is on this machine: the table still renders
            seed = f" — seed {r['_seed']}" if r.get("_seed") is not None else ""
            panels[f"{name[key]}{seed}"] = found
            shown.append(name[key] + (f" (seed {r['_seed']})" if r.get("_seed") is not None else ""))
            break
    keep_figure_aside(out, shown)  # the figure there drew a row this one cannot: kept as it was drawn
    if panels:
        plot_svd_projections(panels, out / "svd_projection.png",
                             f"Output embedding on its top-2 singular directions, one seed per row — {title}",
                             max_points=20000)
        for old in out.glob("svd_*.png"):  # the per-row files of earlier renderings (svd_1.png, ...): replaced
            if old.stem[4:].isdigit():
                old.unlink()
        written["svd_projection.png"] = svd_caption(shown)
    return written


def paper_short(source: str) -> str:
    """"Inan, Khosravi & Socher (2017), Tying word vectors ..., Table 1" -> "Inan, Khosravi & Socher (2017), Table 1"."""
    import re

    m = re.match(r"^(.*?\(\d{4}\))", source)
    table = re.search(r"(Table\s+\S+)\s*$", source)
    return ", ".join(x for x in (m.group(1) if m else source, table.group(1) if table else "") if x)


def scale_differences(records: list[dict]) -> str:
    """What the cells of a table ran, in a line per distinct setting (corpus, vocabulary, model, budget),
    read from their records: the header of a smoke/lite table says how it differs from the paper."""
    described = []
    for r in records:
        cfg, corpus = r.get("config", {}), r.get("corpus", {}) or {}
        d, m, t = cfg.get("dataset", {}), cfg.get("model", {}), cfg.get("trainer", {})
        parts = [str(d.get("name", "?"))]
        used, total = (corpus.get("used_tokens") or {}).get("train"), (corpus.get("tokens") or {}).get("train")
        if used and total and used < total:
            parts.append(f"the first {used:,} of {total:,} training tokens")
        elif d.get("train_pairs"):
            parts.append(f"the first {d['train_pairs']:,} training pairs")
        if corpus.get("vocab_size"):
            parts.append(f"vocabulary {corpus['vocab_size']:,}")
        width = next((f"{k} {m[k]}" for k in ("hidden_size", "d_model", "embedding_size") if m.get(k)), "")
        parts.append(f"model {m.get('name', '?')}" + (f" ({width})" if width else ""))
        budget = f"{t.get('max_epochs')} epochs" + (f", at most {t['max_updates']:,} updates" if t.get("max_updates") else "")
        parts.append(budget)
        text = ", ".join(parts)
        if text not in described:
            described.append(text)
    return "; ".join(described)


def judge_registration(app: DictConfig, verdicts: list, rows: list[RenderedRow], records: list[dict],
                       ledger: Ledger | None = None) -> None:
    """Mark each verdict that is not a pre-registered one (``Verdict.registration``, rendered ⚠): its claim's
    definition or a cell it read was registered after the cell started, or a cell it waits for replaces a
    registered cell that ran with another config (reproduce/runs/registration.py)."""
    from repdegen.reproduce.results.claims import NA, UNDECIDED, resolve_row, shown_state
    from repdegen.reproduce.runs import registration

    t, scale = app.table, app.scale.name
    reg = registration.load(registration.path_of(app.paths.tables_dir, t.name, scale))
    started = {r["config_hash"]: r.get("started") for r in records}
    analysed = {r["config_hash"]: r.get("_analysed") for r in records}
    analysis_only = {m for names in ANALYSIS_METRICS.values() for m in names}
    seeds = seeds_at(t, scale)
    for v in verdicts:
        if shown_state(v) == NA:
            continue
        # a claim on analysis metrics only waits for the analysis, not the training: registered before it is computed
        when = analysed if {c.metric for c in v.claim.checks} <= analysis_only else started
        idx = sorted({resolve_row(t, c.row, "a claim") for c in v.claim.checks}
                     | {resolve_row(t, c.than, "a claim") for c in v.claim.checks if c.get("than") is not None})
        cells = [(i, s, h) for i in idx
                 for s, h in zip(rows[i].extra.get("seeds", {}), (rows[i].config_hash or "").split("+")) if h]
        if v.state != UNDECIDED:
            needed = [(h, when.get(h), f"{registration.row_name(t.rows[i])} (seed {s})") for i, s, h in cells]
            v.registration = registration.judge(v.claim, seeds, reg, needed, scale, t.get("analyses"))
            continue
        for i, s, h in cells:
            if ledger is None or rows[i].extra["seeds"].get(s) is not None:
                continue
            ran = [o for o in registration.replaced_cells(reg, {registration.row_name(t.rows[i])}, s, h)
                   if ledger.is_complete(o)]
            if ran:
                v.registration = (f"changed after run: the config of {registration.row_name(t.rows[i])} (seed {s}) "
                                  f"changed after its registered cell [{ran[0]}] ran; the cell as configured now [{h}] "
                                  f"has not run")
                break


def paper_valid_lines(rows, records: list[dict], scale: str) -> dict[tuple[str | None, str], float]:
    """{(group, label) as the curves name a run: the paper's validation PPL} for the curves at paper scale (at lite
    and smoke, budgets that are not the paper's, none). A run serves the rows of its cell (``_rows``: their indices
    in ``rows``); the number is that of its final-stage rows (not the first-session, finetuning or cache rows, other
    stages of the same run), when they print one and agree."""
    out = {}
    for r in records if scale == "paper" else []:
        values = {float(rows[i].paper["valid_ppl"]) for i in r.get("_rows", [])
                  if rows[i].get("stage", "final") == "final" and (rows[i].paper or {}).get("valid_ppl") is not None}
        if len(values) == 1:
            out[(r["_row_group"], r["_row_label"])] = values.pop()
    return out


def render(app: DictConfig, rows: list[RenderedRow], records: list[dict], ledger: Ledger | None = None) -> Path:
    from repdegen.reproduce.results.claims import (
        claims_console,
        claims_csv,
        claims_latex,
        claims_markdown,
        evaluate_claims,
        summary_line,
        verdict_record,
    )

    t = app.table
    scale = app.scale.name
    hw = sorted({hardware_summary(r["hardware"]) for r in records}) or ["n/a"]
    git = records_git(records)
    seeds = seeds_at(t, scale)
    relative = scale != "paper"
    meta = {
        "title": t.title,
        "source": t.source,
        "scale": scale,
        "scale_note": SCALE_NOTES.get(scale, ""),
        "git": git,
        "hardware": "; ".join(hw),
        "wall_time": _fmt_seconds(sum(r.get("wall_time_s", 0.0) for r in records)),
        "generated": dt.datetime.now().isoformat(timespec="seconds"),
        "seeds": [s for s in seeds if s is not None],
    }
    if relative:
        ran = scale_differences(records)
        meta["differences"] = " ".join(x for x in (f"Ours ran: {ran}." if ran else "", t.differences.get(scale, "")) if x)
    out = Path(app.paths.tables_dir) / t.name / scale
    columns = list(t.columns)
    notes = list(t.notes)
    signatures = sorted({r["metrics"].get("final", {}).get("bleu_signature") for r in records} - {None})
    if signatures:
        meta["bleu_signature"] = signatures
        notes.append("SacreBLEU signature: " + "; ".join(f"`{sig}`" for sig in signatures))
    attach_baselines(t, rows)
    ours, paper = claim_inputs(t, rows)
    verdicts = evaluate_claims(t, ours, seeds, paper, scale)
    judge_registration(app, verdicts, rows, records, ledger)
    claims_md = claims_markdown(verdicts, paper_short(t.source), scale, seeds)
    # at paper scale each cell's provenance: its rows are built one by one, over sessions and machines
    provenance = [cell_provenance(r) for r in records] if scale in ARCHIVED_SCALES else []
    markdown = to_markdown(t.title, columns, rows, meta, notes, relative=relative, claims=claims_md, cells=provenance)
    latex = to_latex(t.title, columns, rows, meta, relative=relative, claims=claims_latex(verdicts, scale))
    atomic_write_bytes(out / "table.csv", lambda f: f.write(to_csv(columns, rows).encode()))
    atomic_write_bytes(out / "claims.csv", lambda f: f.write(claims_csv(verdicts, scale).encode()))
    # a row is (group, label); its seeds are one line (their mean) and a min-max band; at paper scale the paper's
    # validation PPL of each row is a line across its panel (a lite budget is not the paper's: no target there)
    targets = paper_valid_lines(t.rows, records, scale)
    curves = plot_validation_curves([(r["_row_label"], r["_row_group"], r["history"]) for r in records],
                                    out / "curves.png", f"{t.title} — scale {scale}", show_train=scale == "paper",
                                    targets=targets)
    figures = render_embedding_figures(records, Path(app.paths.runs_dir), out, f"{paper_short(t.source)}, scale {scale}")
    ran = sorted({r["_seed"] for r in records if r.get("_seed") is not None})
    # {figure's file stem: caption}, in the order to show them (reproduce/results/report.py embeds them)
    figure_captions = ({"curves": "Validation perplexity per epoch of each row" + (
        f" (line: mean over seeds {', '.join(map(str, ran))}; band: min–max)" if len(ran) > 1 else "") + (
        "; dotted across: the paper's validation PPL of the row" if targets else "")} if curves else {})
    figure_captions |= {Path(f).stem: caption for f, caption in figures.items()}
    cells_out = []
    for r in rows:
        for seed, h in zip(r.extra.get("seeds", {}), (r.config_hash or "").split("+")):
            if h:
                cells_out.append({"label": r.label, "seed": seed, "status": r.status if r.extra["seeds"][seed] is None
                                  else STATUS_COMPLETE, "config_hash": h, "run_dir": str(Path(app.paths.runs_dir) / h)})
        if not r.config_hash:
            cells_out.append({"label": r.label, "status": r.status, "config_hash": None, "run_dir": None})
    # cells.json's `command` is the one that trains the cells (the one to rerun); a render-only pass keeps
    # the training command already there and says in `rendered_by` how this rendering was made
    this_command = command_line(_ORIGINAL_ARGV or None)
    by_hash = {p["config_hash"]: p for p in provenance}
    for c in cells_out:
        if c.get("config_hash") in by_hash:
            c["provenance"] = {k: v for k, v in by_hash[c["config_hash"]].items() if k not in ("row", "config_hash")}
    cells_record = {"table": t.name, "scale": scale, "command": this_command,
                    "meta": meta, "cells": cells_out, "figures": figure_captions}
    if app.render_only:
        default = f"repdegen table table={t.name} scale={scale}"
        cells_record["command"] = training_command(out / "cells.json") or default
        cells_record["rendered_by"] = this_command
    kept = unchanged_generated(out / "cells.json", cells_record)
    if kept:  # the same rendering as the one there: keep its time, so the files stay as they are (nothing to commit)
        markdown, latex = markdown.replace(meta["generated"], kept), latex.replace(meta["generated"], kept)
        meta["generated"] = kept
    atomic_write_bytes(out / "table.md", lambda f: f.write(markdown.encode()))
    atomic_write_bytes(out / "table.tex", lambda f: f.write(latex.encode()))
    atomic_write_json(out / "cells.json", cells_record)
    if scale in ARCHIVED_SCALES:  # the records this rendering was made from, committed with it (reproduce/runs/archive.py)
        archived = archive_records(out, records, Path(app.paths.runs_dir))
        if archived:
            print(f"repdegen: kept {len(archived)} run record file(s) of complete cells under {out / ARCHIVE_DIR}/ "
                  f"(commit them with the table: restore=true brings them back into a lost ledger)")
    atomic_write_json(out / "claims.json", {"table": t.name, "title": t.title, "scale": scale,
                                            "seeds": meta["seeds"], "claims": [verdict_record(v) for v in verdicts]})
    print(markdown)
    print(f"repdegen: wrote {out}/table.{{md,csv,tex}}, claims.{{json,csv}}, curves.png" + "".join(f", {f}" for f in figures))
    if verdicts:
        print(claims_console(verdicts, paper_short(t.source), scale, seeds))
        print(summary_line(verdicts, t.name, scale))
    return out


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


def render_latest(app: DictConfig, cells: list[Cell], ledger: Ledger,
                  run_status: dict[str, str] | None = None) -> tuple[Path, list[RenderedRow]] | None:
    """Render ``app``'s table from the ledger as it stands now; (output directory, rows), or None when
    it was not rendered.

    Renders of one table and scale are serialized (an exclusive ``flock`` on ``.render.lock`` in the
    output directory), and the ledger is read inside that lock, so of two processes rendering the same
    table the later one sees at least what the earlier one saw. A rendering is never replaced by one that
    lacks a complete cell it holds (a less complete one, or one from a ledger that lost that cell's record
    while gaining others): it is left as it is, with a line that names the lacking cells and how to merge."""
    import fcntl

    out = Path(app.paths.tables_dir) / app.table.name / app.scale.name
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / ".render.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        rows, records = collect_rows(app, cells, ledger, run_status)
        ours = {r["config_hash"] for r in records}
        # the cells of the table as it is now (a cell whose config changed since is another cell: not counted)
        there = complete_hashes(out / "cells.json") & {c.config_hash for c in cells}
        lacking = there - ours
        # cells the ledger holds unfinished (restore=true skips them)
        held = {h for h in lacking if ledger is not None and (ledger.run_dir(h) / "result.json").exists()}
        kept = (lacking - held) & set(archived_records(Path(app.paths.tables_dir)))
        restore = (f"repdegen table table={app.table.name} scale={app.scale.name} render_only=true "
                   f"restore=true")
        if there > ours:
            print(f"repdegen: {out} already holds a more complete rendering ({len(there)}/{len(cells)} cells complete, "
                  f"this one {len(ours)}/{len(cells)}); left it as it is" + (
                      f". The ledger lacks {len(kept)} of its cells whose run records are committed with the tables: "
                      f"to bring them back, {restore}" if kept else "") + (
                      f". The ledger holds unfinished runs of {', '.join(sorted(held))}: they render when they finish "
                      f"(repdegen status)" if held else ""))
            return None
        if lacking:  # this one adds cells but would drop results the rendering holds: keep it, say how to merge
            names = [f"{c.label}" + (f" seed {c.seed}" if c.seed is not None else "") + f" [{c.config_hash}]"
                     for c in cells if c.config_hash in lacking]
            where = f" {ledger.root}" if ledger else ""
            how = []
            if kept:
                how.append(f"bring back the {len(kept)} committed with the tables ({restore})")
            if held:
                how.append(f"let the unfinished run(s) the ledger holds of {', '.join(sorted(held))} finish (python -m "
                           f"repdegen.reproduce.status), or move their run directories away and render with restore=true")
            if lacking - kept - held:
                how.append(f"run the lacking cells again (repdegen table table={app.table.name} "
                           f"scale={app.scale.name} rows=[...]) or copy their run records back into the ledger, then "
                           f"render again (render_only=true)")
            print(f"repdegen: {out} holds {len(lacking)} complete cell(s) that the ledger{where} lacks "
                  f"({'; '.join(names) or ', '.join(sorted(lacking))}), so it was left as it is (rendering now "
                  f"would drop their results). The cells of this run are safe in the ledger; to render them with the "
                  f"others, " + "; for the rest, ".join(how))
            return None
        return render(app, rows, records, ledger), rows
    finally:
        os.close(fd)


def selected_cells(app: DictConfig, cells: list[Cell]) -> list[Cell]:
    """The cells of the rows ``app.rows`` names (every cell when it is unset); a name that is not a row is an error
    that lists the rows, and a row that does not run at this scale is one that says so."""
    if app.get("rows") is None:
        return cells
    from repdegen.reproduce.results.claims import resolve_row

    wanted = {resolve_row(app.table, str(ref), "rows=") for ref in app.rows}
    idle = [app.table.rows[i].label for i in sorted(wanted) if not runs_at(app.table.rows[i], app.scale.name)]
    if idle:
        raise ConfigError(f"rows=: {', '.join(map(repr, idle))} of table {app.table.name}: not run at "
                          f"scale={app.scale.name} (see the row's scales: in conf/table/{app.table.name}.yaml)")
    return [c for c in cells if wanted & set(c.rows)]


def run_table(app: DictConfig) -> int:
    """Run what is missing and render; return the number of cells that did not complete."""
    return run_tables([app])


def run_tables(apps: list[DictConfig]) -> int:
    """Expand the cells of every table, run the missing ones together (a cell shared by tables
    runs once), then render each table; return the number of cells that did not complete."""
    start = time.time()
    validate_launch(apps[0].launch)  # before anything is registered or run
    expanded = [(app, expand_cells(app)) for app in apps]
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


def all_table_names() -> list[str]:
    from repdegen.reproduce.settings.config import CONF_DIR

    return sorted(p.stem for p in (CONF_DIR / "table").glob("*.yaml"))


def parse_table_names(value: str) -> list[str]:
    """``all``, one name, or a comma-separated list (``a,b`` or ``[a,b]``)."""
    names = [v.strip() for v in value.strip().strip("[]").split(",") if v.strip()]
    known = all_table_names()
    if names == ["all"]:
        return known
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError(f"table={value!r}: {', '.join(unknown) or 'no table'} is not a table; "
                          f"expected `all`, one of {', '.join(known)}, or a comma-separated list of them")
    return names


# top-level keys of the training config: command-line arguments naming them go to every cell
CELL_KEYS = ("model", "dataset", "objective", "optim", "trainer", "logger", "seed")
_CELL_ARGS: list[str] = []
_ORIGINAL_ARGV: list[str] = []


def split_list(text: str) -> list[str]:
    """``a=1,b=[2,3],"c=d"`` -> ``['a=1', 'b=[2,3]', 'c=d']``: split at the commas outside brackets and
    quotes, and unquote quoted items."""
    items, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        cur += ch
    items.append(cur)
    out = []
    for item in (i.strip() for i in items):
        if len(item) >= 2 and item[0] == item[-1] and item[0] in "'\"":
            item = item[1:-1]
        if item:
            out.append(item)
    return out


def overrides_arg(arg: str) -> list[str] | None:
    """The training overrides of an ``overrides=[k=v,...]`` argument (the syntax ``conf/table_app.yaml``
    documents, which Hydra's grammar rejects unquoted); None for any other argument."""
    name, eq, value = arg.partition("=")
    if not eq or name.lstrip("+") != "overrides":
        return None
    value = value.strip()
    if not (value.startswith("[") and value.endswith("]")):
        return None
    return split_list(value[1:-1])


def split_cell_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split command-line overrides into the table app's own and those for every cell; a scale field
    (``scale.max_epochs=3``) goes to both, since the cells compose their own copy of the scale.
    ``overrides=[trainer.device=cpu,seed=2]`` (quoted or not) gives its items to every cell."""
    own, cell = [], []
    for arg in argv:
        listed = overrides_arg(arg)
        if listed is not None:
            cell.extend(listed)
            continue
        dotted = arg.lstrip("+~").split("=", 1)[0]
        key = dotted.split(".")[0]
        if key in CELL_KEYS:
            cell.append(arg)
        elif key == "scale" and "." in dotted:
            own.append(arg)
            cell.append(arg)
        else:
            own.append(arg)
    return own, cell


_TABLES: list[str] = []


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def compose_table_apps(app: DictConfig) -> list[DictConfig]:
    """The app of every table asked for: the one Hydra composed, and the others composed with the
    same command-line overrides."""
    from hydra.core.hydra_config import HydraConfig

    apps = [app]
    if len(_TABLES) > 1:
        task = [o for o in HydraConfig.get().overrides.task if not o.startswith("table=")]
        for name in _TABLES[1:]:
            other = hydra.compose(config_name="table_app", overrides=[*task, f"table={name}"])
            other.overrides = list(app.overrides)
            apps.append(other)
    return apps


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="table_app")
def _main(app: DictConfig) -> None:
    app.overrides = [*app.overrides, *_CELL_ARGS]
    failed = exit_on_user_error(lambda a: run_tables(compose_table_apps(a)))(app)
    if failed:
        sys.exit(EXIT_FAILED)


def main() -> None:
    _ORIGINAL_ARGV[:] = sys.argv
    own, cell = split_cell_args(sys.argv[1:])
    for k, arg in enumerate(own):  # table=all / table=a,b: Hydra composes the first, we the others
        if arg.startswith("table="):
            try:
                names = parse_table_names(arg.split("=", 1)[1])
            except ConfigError as err:
                report_user_error(err)
                sys.exit(EXIT_USER_ERROR)
            _TABLES[:] = names
            own[k] = f"table={names[0]}"
    _CELL_ARGS[:] = cell
    sys.argv[1:] = own
    # Ctrl-C and SIGTERM stop the cells gracefully (each checkpoints first), even when this process
    # was started with SIGINT ignored (a background job of a non-interactive shell)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    from repdegen.reproduce.errors import install_hydra_error_handler

    install_hydra_error_handler()
    try:
        _main()
    except KeyboardInterrupt:
        print("repdegen: interrupted; finished cells are in the ledger, and the same command continues the rest",
              file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
