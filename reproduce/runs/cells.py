"""A table's cells: the table config's schema (``conf/table/<name>.yaml``), and its expansion into cells, one Hydra
composition each (:func:`expand_cells`): the config ``repdegen train experiment=<row.experiment> scale=<scale>
<row.overrides>`` would compose, with the seeds the table states at that scale. Cells shared by rows (or tables) are
one cell."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from repdegen.reproduce.errors import (
    ConfigError,
    UserError,
)
from repdegen.reproduce.results.claims import Claim, validate_claims
from repdegen.reproduce.runs.launch import LaunchConfig
from repdegen.reproduce.settings.config import CONF_DIR, register_all
from repdegen.reproduce.settings.resolve import compose, resolve
from repdegen.reproduce.settings.schema import PathsConfig, ScaleConfig


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
    # a generated row of a sweep (repdegen.reproduce.runs.sweeps): its value of each swept key
    sweep_values: dict[str, Any] = field(default_factory=dict)


@dataclass
class FigureCurve:
    label: str = MISSING
    # the rows of the curve's points ("<group> / <label>", or a label that is unique), in any order
    rows: list[str] = field(default_factory=list)


@dataclass
class FigurePanel:
    """One panel of a figure table (Inan 2017 Fig. 1): ``metric`` against the config key ``x`` of each row's cells
    (``objective.beta``), a curve per ``curves`` entry (mean ± sd over its seeds, each seed a dot), the rows' paper
    numbers as open markers; ``random_level``: the expected subspace distance of two random subspaces of the cells'
    embedding size in the vocabulary's dimensions, sqrt(1 - k / |V|), as a dotted line."""

    title: str = MISSING
    x: str = MISSING
    metric: str = MISSING
    curves: list[FigureCurve] = field(default_factory=list)
    random_level: bool = False


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
    # a figure's panels, drawn from the rows (figure.png and figure.json beside the table)
    panels: list[FigurePanel] = field(default_factory=list)
    # a sweep's table (generated rows, repdegen.reproduce.runs.sweeps): the swept keys, whose values the rows hold;
    # rendered with one figure per column against the first of them
    swept: list[str] = field(default_factory=list)


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
    # true: list every cell with its state and estimated cost (tokens, throughput, device-hours) and stop: nothing
    # runs (reproduce/runs/plan.py); markdown: one summary row per table instead. plan_device: h100, h200, a100, l4,
    # cpu... (None: the device here)
    plan: Any = False
    plan_device: str | None = None
    # where the benchmark JSON files are (scripts/bench.py's; None: results/bench beside paths.tables_dir, else the
    # checkout's results/bench)
    plan_bench_dir: str | None = None
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
    validate_panels(app.table)
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
            for panel in app.table.get("panels") or []:
                x = OmegaConf.select(cfg, panel.x, default=None)
                if i in panel_rows(app.table, panel) and (isinstance(x, bool) or not isinstance(x, (int, float))):
                    raise ConfigError(f"table {app.table.name}: panel {panel.title!r} has x: {panel.x}, which is not a "
                                      f"numeric key of the config of row {row.label!r} (it is {x!r}); expected a number "
                                      f"such as objective.beta")
            if h in cells:
                cells[h].rows.append(i)
            else:
                label = f"{row.experiment} {' '.join(row.overrides + at_scale + with_seed)}".strip()
                cells[h] = Cell([i], label, cfg, h, seed, row.experiment, overrides)
    return list(cells.values())


def panel_rows(table, panel) -> set[int]:
    """The indices of the rows a figure panel draws."""
    from repdegen.reproduce.results.claims import resolve_row

    return {resolve_row(table, ref, f"panel {panel.title!r}") for curve in panel.curves for ref in curve.rows}


def validate_panels(table) -> None:
    """A figure panel's rows are rows of the table and its metric is one of the table's columns."""
    from repdegen.reproduce.results.claims import resolve_row

    for panel in table.get("panels") or []:
        if panel.metric not in table.columns:
            raise ConfigError(f"table {table.name}: panel {panel.title!r} draws {panel.metric!r}, which is not a column; "
                              f"expected one of {', '.join(table.columns)}")
        for curve in panel.curves:
            for ref in curve.rows:
                resolve_row(table, ref, f"panel {panel.title!r}, curve {curve.label!r}")


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


def all_table_names(conf_dirs: Sequence[Path] = ()) -> list[str]:
    """The tables of ``conf/table/`` and of the other config folders ``conf_dirs`` (a user's own, on Hydra's search
    path: :func:`repdegen.reproduce.table.searchpath_dirs`)."""
    from repdegen.reproduce.settings.config import CONF_DIR

    return sorted({p.stem for root in (CONF_DIR, *conf_dirs) for p in (Path(root) / "table").glob("*.yaml")})


def parse_table_names(value: str, conf_dirs: Sequence[Path] = ()) -> list[str]:
    """``all``, one name, or a comma-separated list (``a,b`` or ``[a,b]``), of the tables :func:`all_table_names`
    finds."""
    names = [v.strip() for v in value.strip().strip("[]").split(",") if v.strip()]
    known = all_table_names(conf_dirs)
    if names == ["all"]:
        return known
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError(f"table={value!r}: {', '.join(unknown) or 'no table'} is not a table; "
                          f"expected `all`, one of {', '.join(known)}, or a comma-separated list of them")
    return names


# top-level keys of the training config: command-line arguments naming them go to every cell
