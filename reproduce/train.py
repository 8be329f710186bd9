"""Run one experiment.

    python -m reproduce.train model=vd_lstm_medium dataset=ptb objective=real
    python -m reproduce.train experiment=inan2017/medium objective=real scale=smoke
    python -m reproduce.train experiment=gao2019/awd_lstm_wt2 objective=cosreg objective.gamma=1

The run lives in ``<paths.runs_dir>/<config hash>/``. A run already complete there is reported, not
repeated; an interrupted one continues with ``trainer.resume=true``.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from data.corpus import load_corpus
from losses import build_objective
from models import build_model, resolve_tie
from reproduce.config import config_hash, finalize, register_all
from reproduce.errors import ConfigError, exit_on_user_error
from reproduce.ledger import STATUS_COMPLETE, Ledger, RunLocked, atomic_write_json
from reproduce.loggers import make_logger
from reproduce.provenance import command_line, git_commit, hardware
from reproduce.trainer import SimulatedInterrupt, Trainer, TrainingDiverged

register_all()


def load_any_corpus(dataset_cfg, cache_dir):
    """The word/BPE token streams of a language-modelling corpus, or the pairs of a translation corpus."""
    if dataset_cfg.kind == "translation":
        from data.translation import load_parallel_corpus

        return load_parallel_corpus(dataset_cfg, cache_dir)
    return load_corpus(dataset_cfg, cache_dir)


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is available; use trainer.device=auto or cpu")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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


def train(cfg: DictConfig) -> dict:
    """Run (or finish, or look up) the experiment ``cfg`` describes; return its ledger record.

    The run's directory is locked while it trains (:meth:`Ledger.lock`): a second process asking
    for the same config gets a clear error instead of writing over the first one's checkpoints.
    """
    cfg = finalize(cfg)
    h = config_hash(cfg)
    ledger = Ledger(cfg.paths.runs_dir)
    try:
        with ledger.lock(h):
            return _train(cfg, h, ledger)
    except RunLocked as err:
        raise ConfigError(
            f"{err}. Wait for it to finish (a complete run is reused, not repeated), or stop that process first"
        ) from None


def _train(cfg: DictConfig, h: str, ledger: Ledger) -> dict:
    run_dir = ledger.run_dir(h)
    previous = ledger.load(h)
    if previous is not None and previous.get("status") == STATUS_COMPLETE:
        print(f"repdegen: {run_label(cfg)} [{h}] is already complete in {run_dir}; not running it again")
        return previous
    checkpoint = run_dir / "checkpoint.pt"
    if checkpoint.is_file() and not cfg.trainer.resume:
        raise ConfigError(
            f"{run_dir} holds an unfinished run of this exact config (last checkpoint {checkpoint}). "
            f"Continue it with trainer.resume=true, or move that directory away to start over"
        )
    if previous is not None and not checkpoint.is_file():
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        (run_dir / "result.json").rename(run_dir / f"result.{previous.get('status', 'old')}-{stamp}.json")
        previous = None
    run_dir.mkdir(parents=True, exist_ok=True)

    start_wall = time.time()
    prior_wall = float(previous.get("wall_time_s", 0.0)) if previous else 0.0
    started = previous.get("started") if previous else dt.datetime.now().isoformat(timespec="seconds")
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.trainer.device)
    corpus = load_any_corpus(cfg.dataset, cfg.paths.cache_dir)
    tie = resolve_tie(cfg.model, cfg.objective)
    model = build_model(cfg.model, len(corpus.vocab), tie).to(device)
    objective = build_objective(cfg.objective, len(corpus.vocab), cfg.trainer.label_smoothing).to(device)
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
    if getattr(corpus, "tokenizer", None) is not None:  # the run directory alone can translate/decode
        corpus.tokenizer.save(run_dir / "bpe.model")
    torch.save(corpus.vocab.counts.clone(), run_dir / "vocab_counts.pt")  # frequency groups for the figures
    logger = make_logger(cfg, run_dir, record["label"])
    trainer = Trainer(cfg, model, objective, corpus, run_dir, device, logger)

    def update(state) -> None:
        record["history"] = [_compact(r) for r in state.history]
        if state.trace:
            record["trace"] = state.trace
        record["wall_time_s"] = prior_wall + time.time() - start_wall
        ledger.write(h, record)

    trainer.on_epoch_end = update
    if cfg.trainer.resume and trainer.load_checkpoint():
        print(f"repdegen: resuming {record['label']} [{h}] after {trainer.state.stage} epoch {trainer.state.epoch}")
    print(f"repdegen: {record['label']} [{h}] -> {run_dir} ({n_params:,} parameters, device {device})", flush=True)
    try:
        stages = trainer.fit()
    except TrainingDiverged as err:
        record.update(status="failed", error=str(err))
        update(trainer.state)
        raise
    except SimulatedInterrupt:
        record["status"] = "interrupted"
        update(trainer.state)
        return record
    finally:
        if logger is not None:
            logger.finish()
    record["metrics"] = stages
    record["status"] = STATUS_COMPLETE
    record["stopped_early"] = trainer.state.stopped_early
    record["asgd_epoch"] = trainer.state.asgd_epoch
    record["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    update(trainer.state)
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


def hydra_choices() -> dict:
    try:
        choices = HydraConfig.get().runtime.choices
    except ValueError:
        return {}
    return {k: str(v) for k, v in choices.items() if not k.startswith("hydra/") and v is not None}


def write_job_pointer(record: dict) -> None:
    """``run.json`` in the Hydra job's output directory: which ledger run this job was, so a
    multirun directory can be aggregated (``python -m reproduce.aggregate DIR``)."""
    try:
        out = HydraConfig.get().runtime.output_dir
    except ValueError:
        return
    atomic_write_json(Path(out) / "run.json", {
        "config_hash": record.get("config_hash"), "status": record.get("status"),
        "run_dir": str(Path(record["config"]["paths"]["runs_dir"]).resolve() / record["config_hash"]),
        "label": record.get("label"),
    })


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Returns the final validation PPL (the value a Hydra sweeper such as Optuna minimizes)."""
    cfg.choices = hydra_choices()
    record = exit_on_user_error(train)(cfg)
    write_job_pointer(record)
    final = record.get("metrics", {}).get("final", {})
    return float(final["valid_ppl"]) if "valid_ppl" in final else None


if __name__ == "__main__":
    main()
