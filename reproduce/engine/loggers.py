"""Experiment loggers: ``logger=none`` (default) or ``logger=wandb``.

``logger=wandb`` makes one wandb run per repdegen run (``repdegen.reproduce.train``, or a cell of a table):

* grouped by ``logger.group`` (default: ``<experiment>/<scale>``, or ``<model>/<dataset>/<scale>``
  without an experiment preset; ``repdegen.reproduce.table`` sets ``<table>/<scale>``), ``job_type`` = the
  objective (``mle``, ``cosreg``, ``agg``...), tagged ``scale=``, ``objective=``, ``experiment=``...;
* the resolved config flattened to dot keys (``optim.lr``, ``objective.gamma``) plus ``config_hash``;
* every epoch's record (``valid_ppl``, ``train_ppl``, ``isotropy``, ``mean_cos``, ``lr``...) at step =
  the number of epochs so far (the trainer calls :meth:`WandbLogger.log`);
* at the end (:meth:`WandbLogger.log_final`): the final metrics in the run summary (other stages as
  ``finetune/test_ppl``, ``cache/test_ppl``) and the output embedding's SVD projection and singular
  values as ``wandb.Image`` (``figures/svd_projection``, ``figures/singular_values``).

:func:`log_table` opens one more run (``job_type=table``) for a rendered table: the table as a
``wandb.Table`` (paper, ours and the difference per metric) and the table's PNGs.

Modes (``logger.mode``): ``offline`` (default; the run is written under ``<run dir>/wandb/`` and
``wandb sync <that dir>`` uploads it later, so no network or account is needed while training),
``online``, ``disabled`` (wandb's no-op run; for tests). See ``docs/wandb.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

# the epoch record fields that are not metrics
_NOT_METRICS = ("stage",)


def flatten(tree: Mapping, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}``; lists and scalars are leaves; an empty mapping
    is kept as ``{}`` so that its key is not lost."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name, sep))
        else:
            out[name] = dict(value) if isinstance(value, Mapping) else value
    return out


def scalars(metrics: Mapping) -> dict[str, Any]:
    """The entries of ``metrics`` wandb can chart or show: numbers, booleans and strings (no lists, no None)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (bool, int, float, str)) and k not in _NOT_METRICS}


def _reinit(wandb) -> Any:
    """``reinit`` that finishes a previous run of this process: a string since wandb 0.19 (the boolean
    is deprecated there), ``True`` before."""
    try:
        major, minor = (int(x) for x in str(wandb.__version__).split(".")[:2])
    except (AttributeError, ValueError):
        return "finish_previous"
    return "finish_previous" if (major, minor) >= (0, 19) else True


def default_group(cfg) -> str:
    """``logger.group``, else ``<experiment>/<scale>`` (``<model>/<dataset>/<scale>`` without a preset):
    the runs that differ only in objective and seed share a group."""
    if cfg.logger.get("group"):
        return str(cfg.logger.group)
    choices = cfg.get("choices") or {}
    exp = choices.get("experiment")
    base = exp if exp and exp != "null" else f"{cfg.model.name}/{cfg.dataset.name}"
    return f"{base}/{cfg.scale.name}"


def run_tags(cfg) -> list[str]:
    choices = cfg.get("choices") or {}
    tags = [f"scale={cfg.scale.name}", f"objective={cfg.objective.name}", f"model={cfg.model.name}",
            f"dataset={cfg.dataset.name}"]
    if choices.get("experiment") and choices["experiment"] != "null":
        tags.append(f"experiment={choices['experiment']}")
    return [t[:64] for t in tags]  # wandb's limit on a tag


class WandbLogger:
    """One wandb run for one repdegen run; see the module docstring."""

    def __init__(self, cfg, run_dir: Path, name: str):
        import wandb

        self._wandb = wandb
        self.run_dir = Path(run_dir)
        self.mode = str(cfg.logger.mode)
        self.name = name
        config = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
        self.config = {"config_hash": self.run_dir.name, **flatten(config)}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=cfg.logger.project,
            group=default_group(cfg),
            job_type=str(cfg.objective.name),
            name=name,
            tags=run_tags(cfg),
            mode=self.mode,
            dir=str(self.run_dir),
            config=self.config,
            reinit=_reinit(wandb),
        )
        self._finished = False

    def log(self, metrics: dict, step: int) -> None:
        """One epoch's record (the trainer passes it without its list-valued entries)."""
        self.run.log(scalars(metrics), step=step)

    def log_final(self, record: Mapping, output_embedding, counts) -> list[Path]:
        """The run's final metrics into the summary, and its embedding figures as images.

        ``record``: the ledger record (or any mapping with ``metrics`` = {stage: metrics}); the
        ``final`` stage's scalars go in as they are (``test_ppl``), other stages' under their name
        (``finetune/test_ppl``). ``output_embedding``: the (V, d) output embedding the final metrics
        were computed with; ``counts``: the training count per type (frequency groups). The PNGs are
        written to ``<run dir>/figures/`` and returned (none with ``mode=disabled``); a figure that
        fails is reported and skipped, so logging never costs a finished run its result.
        """
        summary: dict[str, Any] = {}
        for stage, metrics in (record.get("metrics") or {}).items():
            for key, value in scalars(metrics).items():
                summary[key if stage == "final" else f"{stage}/{key}"] = value
        if record.get("parameters", {}).get("total") is not None:
            summary["parameters"] = record["parameters"]["total"]
        for key in ("wall_time_s", "status", "config_hash"):
            if record.get(key) is not None:
                summary[key] = record[key]
        for key, value in summary.items():
            self.run.summary[key] = value
        if self.mode == "disabled":
            return []
        from repdegen.analysis.embedding_figures import plot_singular_values, plot_svd_projection

        out = self.run_dir / "figures"
        label = str(record.get("label") or self.name)
        try:
            weight = output_embedding.detach().float().cpu()
            paths = [
                plot_svd_projection(weight, counts, out / "svd_projection.png", label, max_points=20000),
                plot_singular_values({label: weight}, out / "singular_values.png", f"Singular values of W — {label}"),
            ]
            self.run.log({f"figures/{p.stem}": self._wandb.Image(str(p), caption=label) for p in paths})
        except Exception as err:  # a figure must never cost a finished run its result
            print(f"repdegen: warning: wandb figures of {label} not logged: {type(err).__name__}: {err}", flush=True)
            return []
        return paths

    def finish(self, exit_code: int | None = None) -> None:
        if not self._finished:
            self._finished = True
            if exit_code is None:
                self.run.finish()
            else:
                self.run.finish(exit_code=exit_code)


def make_logger(cfg, run_dir: Path, name: str):
    """``None`` for ``logger=none`` (nothing is imported or written), a :class:`WandbLogger` for ``logger=wandb``."""
    if cfg.logger.name == "none":
        return None
    if cfg.logger.name == "wandb":
        return WandbLogger(cfg, run_dir, name)
    raise ValueError(f"logger.name={cfg.logger.name!r} is not one of none, wandb; set logger=none or logger=wandb")


def _table_cell(value):
    """A wandb.Table cell: a finite float, or None (wandb shows an empty cell)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return float(value)


def table_rows(rendered_rows, columns: list[str]) -> tuple[list[str], list[list]]:
    """The columns and rows of a rendered table for ``wandb.Table``: group, label, status, config
    hash, then ``<metric>/paper``, ``<metric>/ours``, ``<metric>/delta`` (ours - paper) per metric."""
    head = ["group", "label", "status", "config_hash"]
    for c in columns:
        head += [f"{c}/paper", f"{c}/ours", f"{c}/delta"]
    data = []
    for r in rendered_rows:
        line = [r.group or "", r.label, r.status, r.config_hash or ""]
        for c in columns:
            p, o = _table_cell(r.paper.get(c)), _table_cell(r.ours.get(c))
            line += [p, o, (o - p) if p is not None and o is not None else None]
        data.append(line)
    return head, data


def log_table(table_name: str, scale: str, rendered_rows, columns: list[str], out_dir: Path, *,
              logger_cfg: Mapping | None = None, wandb_dir: str | Path | None = None):
    """One wandb run (``job_type=table``, name ``<table>/<scale>``) holding a rendered table.

    Logs the table as a ``wandb.Table`` under ``table`` (see :func:`table_rows`), every PNG in
    ``out_dir`` (``curves.png``, ``singular_values.png``, ``svd_<k>.png``...) as ``figures/<name>``,
    and saves ``table.md``, ``table.csv`` and ``table.tex`` with the run. ``logger_cfg``: the cells'
    ``logger`` config (project, mode, group; default project ``repdegen``, offline, group
    ``<table>/<scale>``, the group ``repdegen.reproduce.table`` gives the cells); ``wandb_dir``: where the
    offline run is written (``<wandb_dir>/wandb/``; default the current directory). Returns the run.
    """
    import wandb

    cfg = dict(logger_cfg or {})
    mode = str(cfg.get("mode") or "offline")
    out_dir = Path(out_dir)
    wandb_dir = Path(wandb_dir) if wandb_dir is not None else Path.cwd()
    wandb_dir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=cfg.get("project") or "repdegen",
        group=cfg.get("group") or f"{table_name}/{scale}",
        job_type="table",
        name=f"{table_name}/{scale}",
        tags=[f"scale={scale}", f"table={table_name}"],
        mode=mode,
        dir=str(wandb_dir),
        config={"table": table_name, "scale": scale, "columns": list(columns)},
        reinit=_reinit(wandb),
    )
    head, data = table_rows(rendered_rows, list(columns))
    payload: dict[str, Any] = {"table": wandb.Table(columns=head, data=data)}
    if mode != "disabled":
        for png in sorted(out_dir.glob("*.png")):
            payload[f"figures/{png.stem}"] = wandb.Image(str(png), caption=f"{table_name} ({scale}): {png.stem}")
    run.log(payload)
    run.summary["cells_complete"] = sum(1 for r in rendered_rows if r.status == "complete")
    run.summary["cells"] = sum(1 for r in rendered_rows if r.status != "paper-only")
    if mode != "disabled":
        for name in ("table.md", "table.csv", "table.tex"):
            if (out_dir / name).is_file():
                run.save(str(out_dir / name), base_path=str(out_dir), policy="now")
    run.finish()
    return run
