"""Run one experiment.

    python -m reproduce.train model=vd_lstm_medium dataset=ptb objective=real
    python -m reproduce.train experiment=inan2017/medium objective=real scale=smoke
    python -m reproduce.train experiment=gao2019/awd_lstm_wt2 objective=cosreg objective.gamma=1

The run lives in ``<paths.runs_dir>/<config hash>/``. A run already complete there is reported, not
repeated; an interrupted one continues with ``trainer.resume=true``.

On several devices (:mod:`reproduce.engine.distributed`; the batch settings are global, so the result and
the config hash do not depend on the number of ranks):

    torchrun --standalone --nproc_per_node=4 -m reproduce.train experiment=yu2022/gpt2_wt103 objective=agg
    srun --ntasks-per-node=4 --gpus-per-task=1 python -m reproduce.train experiment=... trainer.resume=true

Exit status (:mod:`reproduce.errors`): 0 complete (or already complete); 2 a user error (a bad config
value, Hydra's composition errors included; missing or corrupt data, records or checkpoints; a read-only
or full disk; the run being trained by another process); 3 (:data:`EXIT_PREEMPTED`) stopped by
SIGUSR1/SIGTERM (or ``trainer.stop_after_updates``) after writing a checkpoint -- the job is requeued
under SLURM, elsewhere run the command again with ``trainer.resume=true``; 1 anything else (a crash, a
diverged run).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import math
import sys
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from core.files import atomic_torch_save, remove_stale_temps
from core.provenance import command_line, git_commit, hardware
from data import kinds as data_kinds
from losses import build_objective
from models import build_model, resolve_tie
from reproduce.engine import distributed as dist
from reproduce.engine.checkpoint import CORRUPT_CHECKPOINT_FIX
from reproduce.engine.loggers import make_logger
from reproduce.engine.tasks import check_world_size
from reproduce.engine.trainer import Trainer
from reproduce.errors import (
    EXIT_PREEMPTED,
    ConfigError,
    Preempted,
    SimulatedInterrupt,
    TrainingDiverged,
    UserError,
    exit_on_user_error,
    mark_task_started,
    write_failure_note,
)
from reproduce.runs.ledger import STATUS_COMPLETE, CorruptRecord, Ledger, RunLocked, check_torch_file
from reproduce.settings.config import hydra_choices, register_all
from reproduce.settings.resolve import RunSpec, as_spec, record_job_spec, resolve

register_all()

# `python -m reproduce.train` exits with EXIT_PREEMPTED (3) when a preemption signal (or
# trainer.stop_after_updates) stopped the run after its checkpoint: run it again to continue
STATUS_PREEMPTED = "preempted"


def load_any_corpus(dataset_cfg, cache_dir, verbose: bool = True):
    """The corpus of any dataset kind (data/kinds.py): the token streams of a language-modelling corpus, the pairs of
    a translation corpus."""
    return data_kinds.load(dataset_cfg, cache_dir, verbose=verbose)


def uses_cuda(name: str) -> bool:
    """Whether ``trainer.device=name`` trains on CUDA devices."""
    return name == "cuda" or (name == "auto" and torch.cuda.is_available())


def _load_corpus_quiet_off_main(cfg):
    """The corpus; ranks other than 0 load it without repeating rank 0's messages."""
    if dist.is_main():
        return load_any_corpus(cfg.dataset, cfg.paths.cache_dir)
    with contextlib.redirect_stdout(io.StringIO()):
        return load_any_corpus(cfg.dataset, cfg.paths.cache_dir, verbose=False)


def pick_device(name: str) -> torch.device:
    """``trainer.device``: auto (CUDA if available), cuda or cpu; under a launcher, a rank's CUDA device
    is ``cuda:LOCAL_RANK`` (``cuda:0`` when SLURM shows each task one GPU)."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is available; use trainer.device=auto or cpu")
    if uses_cuda(name):
        return torch.device("cuda", dist.device_index()) if dist.is_distributed() else torch.device("cuda")
    return torch.device("cpu")


def _compact(record: dict) -> dict:
    """Round long spectra in per-epoch records (5 significant digits keep result.json small)."""
    out = dict(record)
    if "singular_values" in out:
        out["singular_values"] = [float(f"{x:.5g}") for x in out["singular_values"]]
    return out


def plain_config(cfg: DictConfig) -> dict:
    container = OmegaConf.to_container(cfg, resolve=True)
    container.pop("_finalized", None)
    return container


def run_label(cfg: DictConfig) -> str:
    exp = cfg.choices.get("experiment") if cfg.choices else None
    base = exp if exp and exp != "null" else f"{cfg.model.name}/{cfg.dataset.name}"
    return f"{base}/{cfg.objective.name}"


class RunLockedError(ConfigError):
    """The run is being trained by another live process (``reproduce.runs.launch`` reports it as running
    elsewhere, not as failed)."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


def train(run: RunSpec | DictConfig) -> dict:
    """Run (or finish, or look up) the experiment ``run`` describes (a :class:`RunSpec`; a composed config is
    resolved to one first); return its ledger record.

    The run's directory is locked while it trains (:meth:`Ledger.lock`): a second process asking
    for the same config gets a clear error instead of writing over the first one's checkpoints.
    Under torchrun or srun every rank calls this; rank 0 holds the lock and writes the ledger.
    """
    spec = as_spec(run)
    cfg, h = spec.cfg, spec.config_hash
    dist.init_distributed(use_cuda=uses_cuda(cfg.trainer.device))
    check_world_size(cfg, dist.world_size())
    ledger = Ledger(cfg.paths.runs_dir, repair=True)

    def lock(stack: contextlib.ExitStack) -> None:
        try:
            stack.enter_context(ledger.lock(h))
        except RunLocked as err:
            raise RunLockedError(
                f"{err}. Wait for it to finish (a complete run is reused, not repeated), or stop that process first",
                err.holder) from None
        # temporary files of a write this run's last process was killed in (a full disk, kill -9)
        removed = remove_stale_temps(ledger.run_dir(h))
        if removed:
            print(f"repdegen: removed {len(removed)} temporary file(s) an interrupted write left in "
                  f"{ledger.run_dir(h)}: {', '.join(p.name for p in removed)}", flush=True)

    # from here on SIGUSR1/SIGTERM only ask for a stop at the next update boundary (after a checkpoint)
    with contextlib.ExitStack() as stack, dist.preemption_signals():
        dist.run_on_main(lambda: lock(stack))
        return _train(cfg, h, ledger)


def _preflight(cfg: DictConfig, h: str, ledger: Ledger, resume: bool) -> dict | None:
    """Rank 0's look at the ledger before any work: the record of a complete run (not run again), an
    error for an unfinished run without ``resume``, else the previous record to continue (or None)."""
    run_dir = ledger.run_dir(h)
    checkpoint = run_dir / "checkpoint.pt"
    try:
        previous = Ledger(ledger.root).load(h)
    except CorruptRecord as err:
        if checkpoint.is_file() and not resume:  # change nothing; say how to go on
            raise CorruptRecord(err.path, err.why, f"continue the run with trainer.resume=true (its record is then "
                                                   f"moved aside, kept, and written anew from {checkpoint.name}), or "
                                                   f"restore the file") from None
        previous = ledger.load(h)  # the repairing ledger: moved aside, with a warning
    if previous is not None and previous.get("status") == STATUS_COMPLETE:
        print(f"repdegen: {run_label(cfg)} [{h}] is already complete in {run_dir}; not running it again")
        return previous
    if checkpoint.is_file() and resume:  # a truncated checkpoint is reported before anything is written
        check_torch_file(checkpoint, "checkpoint", CORRUPT_CHECKPOINT_FIX.format(path=checkpoint))
    if checkpoint.is_file() and not resume:
        raise ConfigError(
            f"{run_dir} holds an unfinished run of this exact config (last checkpoint {checkpoint}). "
            f"Continue it with trainer.resume=true, or move that directory away to start over"
        )
    if previous is not None and not checkpoint.is_file():
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        (run_dir / "result.json").rename(run_dir / f"result.{previous.get('status', 'old')}-{stamp}.json")
        previous = None
    run_dir.mkdir(parents=True, exist_ok=True)
    return previous


def _train(cfg: DictConfig, h: str, ledger: Ledger) -> dict:
    run_dir = ledger.run_dir(h)
    resume = bool(cfg.trainer.resume)
    if not resume and dist.slurm_restart_count() > 0:
        dist.print_main(f"repdegen: SLURM requeued this job (SLURM_RESTART_COUNT={dist.slurm_restart_count()}): "
                        f"resuming from the checkpoint as with trainer.resume=true", flush=True)
        resume = True
    previous = dist.run_on_main(lambda: _preflight(cfg, h, ledger, resume))
    if previous is not None and previous.get("status") == STATUS_COMPLETE:
        return previous
    main = dist.is_main()

    start_wall = time.time()
    prior_wall = float(previous.get("wall_time_s", 0.0)) if previous else 0.0
    started = previous.get("started") if previous else dt.datetime.now().isoformat(timespec="seconds")
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.trainer.device)
    # rank 0 first: it fills the corpus (and BPE) cache the others then read
    corpus = dist.main_first(lambda: _load_corpus_quiet_off_main(cfg))
    tie = resolve_tie(cfg.model, cfg.objective)
    model = build_model(cfg.model, len(corpus.vocab), tie).to(device)
    objective = build_objective(cfg.objective, len(corpus.vocab), cfg.trainer.label_smoothing).to(device)
    # the same initial weights on every rank (the same seed gives them; rank 0's are sent to be sure);
    # then each rank its own dropout stream (rank 0 keeps the single-process stream)
    dist.broadcast_parameters(model)
    dist.broadcast_parameters(objective)
    if dist.rank() > 0:
        torch.manual_seed(cfg.seed + dist.rank())
    n_params = sum(p.numel() for p in model.parameters())
    record = {
        "status": "running",
        "label": run_label(cfg),
        "config_hash": h,
        "scale": cfg.scale.name,
        "choices": dict(cfg.choices or {}),
        "command": command_line(),
        "config": plain_config(cfg),
        "parameters": {"total": n_params, "by_part": model.parameter_breakdown(), "tie_weights": tie},
        "corpus": corpus.provenance,
        "git": git_commit(),
        "hardware": hardware(device),
        "started": started,
        "history": [],
        "metrics": {},
    }
    if dist.is_distributed():
        record["distributed"] = {"world_size": dist.world_size(), "launcher": dist.info().launcher,
                                 "backend": dist.info().backend}
    logger = None
    if main:
        if getattr(corpus, "tokenizer", None) is not None:  # the run directory alone can translate/decode
            corpus.tokenizer.save(run_dir / "bpe.model")
        atomic_torch_save(run_dir / "vocab_counts.pt", corpus.vocab.counts.clone())  # frequency groups for the figures
        logger = make_logger(cfg, run_dir, record["label"])
    trainer = Trainer(cfg, model, objective, corpus, run_dir, device, logger)

    def update(state) -> None:
        """result.json, written by rank 0 only."""
        record["history"] = [_compact(r) for r in state.history]
        if state.trace:
            record["trace"] = state.trace
        record["wall_time_s"] = prior_wall + time.time() - start_wall
        if main:
            ledger.write(h, record)

    trainer.on_epoch_end = update
    if resume and trainer.load_checkpoint():
        mid = " (mid-epoch)" if trainer.resumes_mid_epoch else ""
        dist.print_main(f"repdegen: resuming {record['label']} [{h}] after {trainer.state.stage} epoch "
                        f"{trainer.state.epoch}{mid}, {trainer.state.updates} updates")
    ranks = f", {dist.world_size()} ranks" if dist.is_distributed() else ""
    dist.print_main(f"repdegen: {record['label']} [{h}] -> {run_dir} ({n_params:,} parameters, device {device}{ranks})",
                    flush=True)
    try:
        stages = trainer.fit()
        not_finite = [k for k, v in stages.items() if not math.isfinite(v["valid_ppl"])]
        if not_finite:  # a loss that stayed finite but a model that predicts nothing: the run diverged
            raise TrainingDiverged(
                f"the validation perplexity of stage(s) {', '.join(not_finite)} is not finite "
                f"({', '.join(str(stages[k]['valid_ppl']) for k in not_finite)}): the run diverged. Lower optim.lr "
                f"or set optim.clip_grad_norm, and run it again"
            )
        if logger is not None:  # before finish(): final metrics into the run summary, embedding figures as images
            logger.log_final(dict(record, metrics=stages, status=STATUS_COMPLETE), model.output_embedding,
                             corpus.vocab.counts)
    except TrainingDiverged as err:
        record.update(status="failed", error=str(err))
        update(trainer.state)
        raise
    except SimulatedInterrupt:
        record["status"] = "interrupted"
        update(trainer.state)
        return record
    except Preempted as stop:
        record.update(status=STATUS_PREEMPTED, preempted=str(stop))
        update(trainer.state)
        dist.print_main(f"repdegen: {stop}", flush=True)
        return record
    finally:
        if logger is not None:
            logger.finish()
    record["metrics"] = stages
    record["status"] = STATUS_COMPLETE
    record["stopped_early"] = trainer.state.stopped_early
    record["asgd_epoch"] = trainer.state.asgd_epoch
    record["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    record.pop("preempted", None)
    update(trainer.state)
    if not main:
        return record
    final = stages["final"]
    summary = ", ".join(f"{k} {v['valid_ppl']:.2f}/{v['test_ppl']:.2f}" for k, v in stages.items())
    bleu = f"; BLEU {final['bleu']:.2f} (tokenized {final['bleu_tok']:.2f})" if "bleu" in final else ""
    print(f"repdegen: done {record['label']} [{h}]: valid/test PPL {summary}{bleu}; I(W) {final['isotropy']:.3g}, "
          f"mean cos {final['mean_cos']:.3f}; {record['wall_time_s']:.0f}s", flush=True)
    if "bleu_signature" in final:
        print(f"repdegen: SacreBLEU signature: {final['bleu_signature']}", flush=True)
    if any(not math.isfinite(v["test_ppl"]) for v in stages.values()):
        print("repdegen: warning: a test perplexity is not finite")
    return record


def resolve_app(app_cfg: DictConfig | None = None) -> RunSpec:
    """The spec of this Hydra app's overrides (:func:`reproduce.settings.resolve.resolve`: the experiment preset's sections
    for the objective and scale included; e.g. Yu's GPT-2-medium preset trains the 6-layer LM on WikiText-2 BPE at
    lite); the command line wins."""
    hydra_cfg = HydraConfig.get()
    if app_cfg is not None:  # the app's own composition of its overrides, its group choices added
        OmegaConf.set_struct(app_cfg, False)
        app_cfg.choices = hydra_choices(hydra_cfg)
        OmegaConf.set_struct(app_cfg, True)
    spec = resolve(list(hydra_cfg.overrides.task), composed=app_cfg)
    if spec.preset:
        choices = [e for e in spec.preset if "." not in e.split("=", 1)[0]]
        n = len(spec.preset) - len(choices)
        what = " ".join(choices) + (" and " if choices and n else "") + (f"{n} value{'s' * (n != 1)}" if n else "")
        dist.print_main(f"repdegen: the preset {spec.choices.get('experiment')} at scale={spec.cfg.scale.name} with "
                        f"objective={spec.cfg.objective.name}: {what} from its sections (`python -m reproduce.describe "
                        f"... sources=true` lists them; the command line wins)", flush=True)
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
    exiting the process, and the job's ``failure.json`` says why, for ``reproduce.runs.sweeps``."""
    mark_task_started()
    try:
        spec = resolve_app(app_cfg)
        if dist.is_main():  # the job's hash, for reproduce.runs.sweeps (it finds the job's run without composing again)
            record_job_spec(Path(HydraConfig.get().runtime.output_dir), spec)
        return train(spec)
    except UserError as err:
        print(f"repdegen: error: {err}", file=sys.stderr, flush=True)
        if dist.is_main():
            write_failure_note(Path(HydraConfig.get().runtime.output_dir), err)
        raise


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Returns the final validation PPL (the value a Hydra sweeper such as Optuna minimizes). A
    preempted run requeues its SLURM job (:func:`reproduce.engine.distributed.requeue_if_slurm`) and exits
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


if __name__ == "__main__":
    from reproduce.errors import install_hydra_error_handler

    install_hydra_error_handler()
    main()
