"""Experiment loggers: ``logger=none`` (default) or ``logger=wandb``.

wandb runs offline by default (``logger.mode=offline``; ``wandb sync`` uploads later) and is never
needed by the tests. One wandb run per repdegen run, grouped by ``logger.group``.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf


class WandbLogger:
    def __init__(self, cfg, run_dir: Path, name: str):
        import wandb

        self._wandb = wandb
        config = OmegaConf.to_container(cfg, resolve=True)
        config.pop("_finalized", None)
        self.run = wandb.init(
            project=cfg.logger.project,
            group=cfg.logger.group,
            name=name,
            mode=cfg.logger.mode,
            dir=str(run_dir),
            config=config,
            reinit=True,
        )

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self) -> None:
        self.run.finish()


def make_logger(cfg, run_dir: Path, name: str):
    if cfg.logger.name == "none":
        return None
    if cfg.logger.name == "wandb":
        return WandbLogger(cfg, run_dir, name)
    raise ValueError(cfg.logger.name)
