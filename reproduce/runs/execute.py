"""One run, end to end: :func:`train` trains (or finishes, or looks up) the run a :class:`RunSpec` describes, in the
ledger (``<paths.runs_dir>/<config hash>/``), locked against a second process, resumable, under any launcher. The
entry points call it: ``repdegen train`` (its Hydra app resolves the spec), a table cell's process
(:mod:`repdegen.reproduce.runs.launch`, which reads the spec its table wrote), a sweep's jobs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import math
import re
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from repdegen.core.files import atomic_torch_save, remove_stale_temps
from repdegen.core.malloc import keep_freed_memory
from repdegen.core.provenance import command_line, git_commit, hardware
from repdegen.data import kinds as data_kinds
from repdegen.losses import build_objective
from repdegen.models import build_model, resolve_tie
from repdegen.reproduce.engine import distributed as dist
from repdegen.reproduce.engine.checkpoint import CORRUPT_CHECKPOINT_FIX
from repdegen.reproduce.engine.loggers import make_logger
from repdegen.reproduce.engine.tasks import check_world_size
from repdegen.reproduce.engine.trainer import Trainer
from repdegen.reproduce.errors import ConfigError, Preempted, SimulatedInterrupt, TrainingDiverged
from repdegen.reproduce.runs.ledger import STATUS_COMPLETE, CorruptRecord, Ledger, RunLocked, check_torch_file
from repdegen.reproduce.settings.config import register_all
from repdegen.reproduce.settings.resolve import RunSpec, as_spec

register_all()

# `repdegen train` exits with EXIT_PREEMPTED (3) when a preemption signal (or
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
    return container


def run_label(cfg: DictConfig) -> str:
    exp = cfg.choices.get("experiment") if cfg.choices else None
    base = exp if exp and exp != "null" else f"{cfg.model.name}/{cfg.dataset.name}"
    return f"{base}/{cfg.objective.name}"


class RunLockedError(ConfigError):
    """The run is being trained by another live process (``repdegen.reproduce.runs.launch`` reports it as running
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
    pick_device(cfg.trainer.device)  # a device that is not there: an error before the run's directory is made
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
        if previous.get("history") or previous.get("metrics"):  # kept beside the new run, never overwritten
            stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            (run_dir / "result.json").rename(run_dir / f"result.{previous.get('status', 'old')}-{stamp}.json")
        else:  # the record a start writes before its first epoch (stopped before any checkpoint): nothing in it
            (run_dir / "result.json").unlink()
        previous = None
    if not checkpoint.is_file():
        set_aside_earlier_sessions(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return previous


def set_aside_earlier_sessions(run_dir: Path) -> list[Path]:
    """A run that starts over (no checkpoint) next to the session weights of an earlier start
    (``best_session<n>.pt``, trainer.retrain_sessions): renamed ``best_session<n>.earlier-<time>.pt``, so the new
    run's next session starts from its own best weights, not from the earlier start's. The new names."""
    found = [p for p in Path(run_dir).glob("best_session*.pt") if re.fullmatch(r"best_session\d+\.pt", p.name)]
    if not found:
        return []
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    moved = []
    for p in sorted(found):
        target = p.with_name(f"{p.stem}.earlier-{stamp}.pt")
        p.rename(target)
        moved.append(target)
    print(f"repdegen: {run_dir} starts over: the session weights of its earlier start are kept aside as "
          f"{', '.join(t.name for t in moved)}", flush=True)
    return moved


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
    if device.type == "cpu":  # before the big buffers, and recorded in the hardware below (core/malloc.py)
        keep_freed_memory()
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
    # every (re)start of the cell with the code and machine it ran on: "git" and "hardware" below are the latest
    # start's, so a cell resumed at another commit keeps where its earlier epochs ran (records from before this
    # list began with their last start, whose time is not known)
    starts = list(previous.get("starts") or [{"git": previous.get("git"), "hardware": previous.get("hardware")}]) \
        if previous else []
    starts.append({"at": dt.datetime.now().isoformat(timespec="seconds"), "git": git_commit(),
                   "hardware": hardware(device), "from": "the start"})
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
        "git": starts[-1]["git"],
        "hardware": starts[-1]["hardware"],
        "starts": starts,
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
        starts[-1]["from"] = f"after {trainer.state.stage} epoch {trainer.state.epoch}{mid}"
        dist.print_main(f"repdegen: resuming {record['label']} [{h}] after {trainer.state.stage} epoch "
                        f"{trainer.state.epoch}{mid}, {trainer.state.updates} updates")
    ranks = f", {dist.world_size()} ranks" if dist.is_distributed() else ""
    dist.print_main(f"repdegen: {record['label']} [{h}] -> {run_dir} ({n_params:,} parameters, device {device}{ranks})",
                    flush=True)
    update(trainer.state)  # the record from the start, so `repdegen.reproduce.status` lists the run before its first epoch ends
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
