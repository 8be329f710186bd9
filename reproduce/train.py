"""Run one experiment.

    repdegen train model=vd_lstm_medium dataset=ptb objective=real
    repdegen train experiment=inan2017/medium objective=real scale=smoke
    repdegen train experiment=gao2019/awd_lstm_wt2 objective=cosreg objective.gamma=1

The run lives in ``<paths.runs_dir>/<config hash>/``. A run already complete there is reported, not
repeated; an interrupted one continues with ``trainer.resume=true``.

On several devices (:mod:`repdegen.reproduce.engine.distributed`; the batch settings are global, so the result and
the config hash do not depend on the number of ranks):

    torchrun --standalone --nproc_per_node=4 -m repdegen.reproduce.train experiment=yu2022/gpt2_wt103 objective=agg
    srun --ntasks-per-node=4 --gpus-per-task=1 repdegen train experiment=... trainer.resume=true

``--help`` is ``conf/hydra/help/train.yaml`` (Hydra's help, the config groups listed by
:func:`repdegen.reproduce.cli.config_groups_help`);
``--cfg job`` prints the config the run trains, resolved as ``repdegen.reproduce.describe`` resolves it
(:func:`repdegen.reproduce.cli.show_resolved_cfg`).

Exit status (:mod:`repdegen.reproduce.errors`): 0 complete (or already complete); 2 a user error (a bad config
value, Hydra's composition errors included; missing or corrupt data, records or checkpoints; a read-only
or full disk; the run being trained by another process); 3 (:data:`EXIT_PREEMPTED`) stopped by
SIGUSR1/SIGTERM (or ``trainer.stop_after_updates``) after writing a checkpoint -- the job is requeued
under SLURM, elsewhere run the command again with ``trainer.resume=true``; 1 anything else (a crash, a
diverged run).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from repdegen.reproduce.engine import distributed as dist
from repdegen.reproduce.errors import EXIT_PREEMPTED, UserError, exit_on_user_error, mark_task_started, write_failure_note

# one run, end to end (re-exported: `from repdegen.reproduce.train import train, load_any_corpus, ...` as before the split)
from repdegen.reproduce.runs.execute import (  # noqa: F401
    STATUS_PREEMPTED,
    RunLockedError,
    load_any_corpus,
    pick_device,
    plain_config,
    run_label,
    train,
    uses_cuda,
)
from repdegen.reproduce.settings.config import CONF_DIR, hydra_choices
from repdegen.reproduce.settings.resolve import RunSpec, record_job_spec, resolve


def resolve_app(app_cfg: DictConfig | None = None) -> RunSpec:
    """The spec of this Hydra app's overrides (:func:`repdegen.reproduce.settings.resolve.resolve`), the experiment's
    file for the scale included (e.g. Yu's GPT-2-medium preset trains the 6-layer LM on WikiText-2 BPE at lite); the
    command line wins."""
    hydra_cfg = HydraConfig.get()
    if app_cfg is not None:  # the app's own composition of its overrides, its group choices added
        OmegaConf.set_struct(app_cfg, False)
        app_cfg.choices = hydra_choices(hydra_cfg)
        OmegaConf.set_struct(app_cfg, True)
    spec = resolve(list(hydra_cfg.overrides.task), composed=app_cfg)
    if spec.preset:
        chosen = " ".join(f"{g}={spec.choices[g]}" for g in ("model", "dataset", "budget") if spec.choices.get(g))
        # on stderr: a note, and describe's stdout is its JSON alone
        dist.print_main(f"repdegen: experiment={spec.choices.get('experiment')} at scale={spec.cfg.scale.name}: "
                        f"conf/experiment_scale/{spec.choices['experiment_scale']}.yaml, {chosen} (`repdegen describe "
                        f"... sources=true` lists its values; the command line wins)", file=sys.stderr, flush=True)
    return spec


def in_multirun() -> bool:
    try:
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


def _train_in_multirun(app_cfg: DictConfig) -> dict:
    """One job of a sweep: a bad config or a diverged run fails this job only. The error is raised
    (Hydra's launcher records it and goes on with the other jobs, then reports it) instead of
    exiting the process, and the job's ``failure.json`` says why, for ``repdegen.reproduce.runs.sweeps``."""
    mark_task_started()
    try:
        spec = resolve_app(app_cfg)
        if dist.is_main():  # the job's hash, for repdegen.reproduce.runs.sweeps (it finds the job's run without composing again)
            record_job_spec(Path(HydraConfig.get().runtime.output_dir), spec)
        return train(spec)
    except UserError as err:
        print(f"repdegen: error: {err}", file=sys.stderr, flush=True)
        if dist.is_main():
            write_failure_note(Path(HydraConfig.get().runtime.output_dir), err)
        raise


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Returns the final validation PPL (the value a Hydra sweeper such as Optuna minimizes). A
    preempted run requeues its SLURM job (:func:`repdegen.reproduce.engine.distributed.requeue_if_slurm`) and exits
    with :data:`EXIT_PREEMPTED`."""
    try:
        if in_multirun():
            record = _train_in_multirun(cfg)
        else:
            record = exit_on_user_error(lambda app_cfg: train(resolve_app(app_cfg)))(cfg)
    finally:
        dist.teardown()
    if record.get("status") == STATUS_PREEMPTED:
        dist.requeue_if_slurm()
        sys.exit(EXIT_PREEMPTED)
    final = record.get("metrics", {}).get("final", {})
    return float(final["valid_ppl"]) if "valid_ppl" in final else None


def cli() -> None:
    """``repdegen train``: this command's entry (``python -m repdegen.reproduce.train`` runs the same)."""
    from repdegen.reproduce.errors import install_hydra_error_handler

    install_hydra_error_handler()
    from repdegen.reproduce.cli import show_resolved_cfg, use_app_help

    use_app_help("train")
    if not show_resolved_cfg():
        main()


if __name__ == "__main__":
    cli()
