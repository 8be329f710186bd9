"""The one training loop: SGD, Adam or NT-ASGD; truncated BPTT carrying the state across segments;
per-epoch validation; early stopping; AWD-LSTM's finetune stage; an atomic checkpoint after every
epoch from which ``trainer.resume=true`` continues to the same result (bit-identical on CPU).

Schedules (``optim``): epochs ``1..decay_after_epoch`` at ``lr``, then ``lr * lr_decay**(e - k)``.
NT-ASGD (Merity et al. 2018, as awd-lstm-lm/main.py): SGD until the validation loss is worse than
the best of all but the last ``nonmono`` evaluations, then ``torch.optim.ASGD(t0=0, lambd=0)``;
from then on validation (and the saved best model) uses the averaged weights. Finetune (as
finetune.py): restart ASGD from the best model and stop at the first non-monotone trigger.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from analysis.metrics import embedding_metrics
from reproduce.errors import UserError
from reproduce.ledger import atomic_torch_save
from reproduce.tasks import make_task

# never "rare" for frequency-aware objectives (AGG): the specials of BPE vocabularies and word corpora
SPECIAL_SYMBOLS = ("<pad>", "<s>", "</s>", "<unk>", "<eos>")
TRACE_UPDATES = 1000


class TrainingDiverged(UserError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class SimulatedInterrupt(Exception):
    """Raised after ``trainer.stop_after_epochs`` epochs (tests of kill-and-resume)."""


@dataclass
class RunState:
    """Everything besides weights and optimizer state that a checkpoint must restore."""

    stage: str = "train"  # train | finetune | done
    epoch: int = 0  # last completed epoch of the current stage
    best_val: float = math.inf
    best_epoch: int = 0
    val_history: list[float] = field(default_factory=list)  # NT-ASGD / finetune trigger
    optimizer_name: str = "sgd"
    asgd_epoch: int | None = None
    epochs_since_best: int = 0
    stopped_early: bool = False
    history: list[dict] = field(default_factory=list)
    train_seconds: float = 0.0
    stage_best_val: float = math.inf  # finetune's own best (starts at the loaded model's loss)
    updates: int = 0  # optimizer updates so far (all stages)
    saved_epochs: list[int] = field(default_factory=list)  # epoch weights kept for averaging
    # per-update traces of the objective's logs over the first TRACE_UPDATES updates (AGG's rare
    # group size: Yu Fig. 4): {name: [[update, value], ...]}
    trace: dict = field(default_factory=dict)


def use_bf16(precision: str, device: torch.device) -> bool:
    if precision == "auto":
        return device.type == "cuda" and torch.cuda.is_bf16_supported()
    return precision == "bf16"


def average_weights(paths: list[Path], out: Path) -> None:
    """Element-wise mean of the model (and objective) tensors saved in ``paths`` (fairseq's
    scripts/average_checkpoints.py); integer buffers are taken from the last file."""
    blobs = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]
    averaged = {}
    for part in ("model", "objective"):
        merged = {}
        for key, last in blobs[-1][part].items():
            if torch.is_floating_point(last):
                merged[key] = sum(b[part][key].double() for b in blobs).div(len(blobs)).to(last.dtype)
            else:
                merged[key] = last
        averaged[part] = merged
    atomic_torch_save(out, averaged)


def nonmonotone_trigger(history: list[float], value: float, nonmono: int) -> bool:
    """Merity et al. (2018)'s rule: ``value`` is worse than the best of all but the last ``nonmono``
    earlier validation losses (``history``)."""
    return len(history) > nonmono and value > min(history[: len(history) - nonmono])


def _uses_averaging(optimizer) -> bool:
    return isinstance(optimizer, torch.optim.ASGD)


@contextlib.contextmanager
def averaged_weights(params, optimizer):
    """Swap ASGD's running averages into the parameters for the duration of the block."""
    if not _uses_averaging(optimizer):
        yield
        return
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            ax = optimizer.state.get(p, {}).get("ax")
            if ax is not None:
                p.copy_(ax)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


class Trainer:
    def __init__(self, cfg, model, objective, corpus, run_dir: Path, device: torch.device, logger=None):
        self.cfg = cfg
        self.t = cfg.trainer
        self.o = cfg.optim
        self.model = model
        self.objective = objective
        self.corpus = corpus
        self.run_dir = Path(run_dir)
        self.device = device
        self.logger = logger
        self.params = [p for p in list(model.parameters()) + list(objective.parameters()) if p.requires_grad]
        self.task = make_task(cfg, corpus, model, device)
        if hasattr(objective, "setup"):
            specials = [corpus.vocab.stoi[s] for s in SPECIAL_SYMBOLS if s in corpus.vocab.stoi]
            objective.setup(updates_per_epoch=self.task.updates_per_epoch(), special_ids=specials,
                            train_counts=corpus.vocab.counts, model=model)
        self.state = RunState(optimizer_name="sgd" if self.o.name == "ntasgd" else self.o.name)
        self.optimizer = self.make_optimizer(self.state.optimizer_name)
        self.on_epoch_end = None  # callback(record) used by train.py to update result.json

    # ---------------------------------------------------------------------------------------------
    def make_optimizer(self, name: str):
        o = self.o
        if name == "sgd":
            return torch.optim.SGD(self.params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
        if name == "adam":
            opt_cls = torch.optim.AdamW if o.decoupled_weight_decay else torch.optim.Adam
            fused = self.device.type == "cuda"  # one kernel for the whole update on GPUs
            return opt_cls(self.params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, fused=fused)
        if name == "asgd":
            return torch.optim.ASGD(self.params, lr=o.lr, t0=0, lambd=0.0, weight_decay=o.weight_decay)
        raise ValueError(name)

    def lr_for_epoch(self, epoch: int) -> float:
        if self.state.stage == "finetune" or self.state.optimizer_name == "asgd":
            return self.o.lr
        return self.o.lr * self.o.lr_decay ** max(epoch - self.o.decay_after_epoch, 0)

    def lr_for_update(self, update: int) -> float:
        """fairseq's inverse_sqrt: linear warm-up from warmup_init_lr over warmup_updates, then
        lr * sqrt(warmup_updates / update); ``update`` = optimizer updates done so far."""
        o = self.o
        if update < o.warmup_updates:
            return o.warmup_init_lr + update * (o.lr - o.warmup_init_lr) / o.warmup_updates
        return o.lr * math.sqrt(o.warmup_updates / max(update, 1))

    def current_lr(self, epoch: int) -> float:
        if self.o.schedule == "inverse_sqrt" and self.state.optimizer_name == "adam":
            return self.lr_for_update(self.state.updates)
        return self.lr_for_epoch(epoch)

    def autocast(self):
        """bf16 autocast on the forward pass and the loss (``trainer.precision=bf16``)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=use_bf16(self.t.precision, self.device))

    # ---------------------------------------------------------------------------------------------
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    def save_checkpoint(self) -> None:
        atomic_torch_save(
            self.checkpoint_path(),
            {
                "run_state": asdict(self.state),
                "model": self.model.state_dict(),
                "objective": self.objective.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "rng_torch": torch.get_rng_state(),
                "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "rng_task": self.task.rng_state(),
            },
        )

    def load_checkpoint(self) -> bool:
        path = self.checkpoint_path()
        if not path.is_file():
            return False
        ckpt = torch.load(path, map_location=self.device, weights_only=False)
        self.state = RunState(**ckpt["run_state"])
        self.model.load_state_dict(ckpt["model"])
        self.objective.load_state_dict(ckpt["objective"])
        self.optimizer = self.make_optimizer(self.state.optimizer_name)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng_torch"])
        if ckpt["rng_cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ckpt["rng_cuda"])
        self.task.set_rng_state(ckpt["rng_task"])
        return True

    def save_weights(self, name: str) -> None:
        atomic_torch_save(self.run_dir / name, {"model": self.model.state_dict(), "objective": self.objective.state_dict()})

    def load_weights(self, name: str) -> None:
        blob = torch.load(self.run_dir / name, map_location=self.device, weights_only=False)
        self.model.load_state_dict(blob["model"])
        self.objective.load_state_dict(blob["objective"])

    # ---------------------------------------------------------------------------------------------
    def _updates_left(self) -> bool:
        return self.t.max_updates is None or self.state.updates < self.t.max_updates

    def train_epoch(self, epoch: int) -> dict:
        t, model, objective, task = self.t, self.model, self.objective, self.task
        model.train()
        objective.train()
        batches = task.train_batches(epoch, self.state.stage)
        groups = [batches[k : k + t.update_freq] for k in range(0, len(batches), t.update_freq)]
        task.begin_epoch(model)
        # accumulated on the device; read (one host sync) only every `check_every` updates
        nll_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        n_tok, start, check_every, done = 0, time.time(), 10, 0
        lr = self.current_lr(epoch)
        desc = f"{self.state.stage} epoch {epoch}"
        bar = tqdm(groups, desc=desc, disable=not t.progress, leave=False, dynamic_ncols=True, mininterval=1.0)
        for step, group in enumerate(bar):
            if not self._updates_left():
                break
            opt = self.optimizer
            lr = self.current_lr(epoch)
            step_lr = lr * task.lr_scale(group[0])
            for param_group in opt.param_groups:
                param_group["lr"] = step_lr
            opt.zero_grad(set_to_none=True)
            # gradient accumulation: each micro-batch's mean loss weighted by its share of the
            # update's target tokens, so the update's gradient is that of the mean over all of them
            sizes = [task.n_targets(b) for b in group]
            total = sum(sizes)
            for b, size in zip(group, sizes):
                with self.autocast():
                    loss, b_nll_sum, b_tok = task.loss(model, objective, b, self.state.updates)
                finite &= torch.isfinite(loss.detach())
                (loss * (size / total) if len(group) > 1 else loss).backward()
                nll_sum += b_nll_sum
                n_tok += b_tok
            if self.o.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(self.params, self.o.clip_grad_norm)
            opt.step()
            if self.state.updates < TRACE_UPDATES and "rare_count" in getattr(task, "last_logs", {}):
                value = float(task.last_logs["rare_count"])  # a host sync, for the first updates only
                self.state.trace.setdefault("rare_count", []).append([self.state.updates, value])
            if hasattr(objective, "after_update"):
                objective.after_update(model, self.state.updates)
            self.state.updates += 1
            done += 1
            if step % check_every == 0 or step == len(groups) - 1:
                if not bool(finite):  # checkpoints are written only at epoch ends: the last one is good
                    raise TrainingDiverged(
                        f"the training loss became NaN or infinite at {desc}, by update {step + 1}/{len(groups)} "
                        f"(lr={step_lr:g}). The last good checkpoint (after epoch {self.state.epoch} of stage "
                        f"{self.state.stage!r}) is kept at {self.checkpoint_path()}. Lower optim.lr or set "
                        f"optim.clip_grad_norm, then rerun with trainer.resume=true"
                    )
                if t.progress:
                    mean = nll_sum.item() / max(n_tok, 1)
                    bar.set_postfix(loss=f"{mean:.3f}", ppl=f"{math.exp(min(mean, 50)):.1f}",
                                    tok_s=f"{n_tok / max(time.time() - start, 1e-9):.0f}", lr=f"{lr:.3g}")
        if not bool(finite):
            raise TrainingDiverged(f"the training loss became NaN or infinite at {desc}; lower optim.lr")
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        seconds = time.time() - start
        mean = nll_sum.item() / max(n_tok, 1)
        return {"train_nll": mean, "train_ppl": math.exp(min(mean, 700)), "lr": lr, "updates": self.state.updates,
                "epoch_updates": done, "tokens_per_s": n_tok / max(seconds, 1e-9), "epoch_seconds": seconds}

    def evaluate(self, split: str, batch_size: int | None = None) -> dict:
        with self.autocast():
            return self.task.evaluate(self.model, split, batch_size)

    def validate(self) -> dict:
        """Validation PPL and the output embedding's geometry (and test PPL with trainer.test_every_epoch)."""
        with averaged_weights(self.params, self.optimizer):
            val = self.evaluate("valid")
            metrics = {"valid_nll": val["nll"], "valid_ppl": val["ppl"]}
            if self.t.test_every_epoch:
                test = self.evaluate("test")
                metrics.update(test_nll=test["nll"], test_ppl=test["ppl"])
            metrics.update(embedding_metrics(self.model.output_embedding, spectrum=self.t.spectrum))
            metrics.update(self.task.group_geometry(self.model))
        return metrics

    # ---------------------------------------------------------------------------------------------
    def _end_epoch(self, record: dict) -> None:
        self.state.history.append(record)
        self.save_checkpoint()
        if self.on_epoch_end is not None:
            self.on_epoch_end(self.state)
        if self.logger is not None:
            self.logger.log({k: v for k, v in record.items() if not isinstance(v, list)}, step=len(self.state.history))
        brief = " | ".join(f"{k} {record[k]:.2f}" for k in ("train_ppl", "valid_ppl") if k in record)
        print(f"[{record['stage']} epoch {record['epoch']:3d}] {brief} | I(W) {record['isotropy']:.3g} "
              f"| mean cos {record['mean_cos']:.3f} | lr {record['lr']:g} | {record['epoch_seconds']:.0f}s", flush=True)
        done = sum(1 for r in self.state.history)
        if self.t.stop_after_epochs is not None and done >= self.t.stop_after_epochs:
            raise SimulatedInterrupt(f"stopped after {done} epochs (trainer.stop_after_epochs)")

    def _epoch(self, epoch: int) -> dict:
        """Train one epoch of the current stage and validate: the epoch's record."""
        record = {"stage": self.state.stage, "epoch": epoch, **self.train_epoch(epoch)}
        record.update(self.validate())
        self.state.train_seconds += record["epoch_seconds"]
        return record

    def _keep_if_best(self, val: float, best: float, name: str) -> bool:
        """Save the weights validation saw (ASGD's averages, if averaging) when ``val`` beats ``best``."""
        if val >= best:
            return False
        with averaged_weights(self.params, self.optimizer):
            self.save_weights(name)
        return True

    def _train_stage(self) -> None:
        s, t, o = self.state, self.t, self.o
        while s.stage == "train" and s.epoch < t.max_epochs:
            epoch = s.epoch + 1
            record = self._epoch(epoch)
            val = record["valid_nll"]
            if self._keep_if_best(val, s.best_val, "best.pt"):
                s.best_val, s.best_epoch, s.epochs_since_best = val, epoch, 0
            else:
                s.epochs_since_best += 1
            if o.name == "ntasgd" and s.optimizer_name == "sgd":
                if nonmonotone_trigger(s.val_history, val, o.nonmono):
                    print(f"[train epoch {epoch:3d}] switching to ASGD (validation stopped improving)", flush=True)
                    s.optimizer_name, s.asgd_epoch = "asgd", epoch
                    self.optimizer = self.make_optimizer("asgd")
                s.val_history.append(val)
            s.epoch = epoch
            self._keep_for_averaging(epoch)
            if t.early_stopping is not None and s.epochs_since_best > t.early_stopping:
                print(f"[train epoch {epoch:3d}] early stop: {s.epochs_since_best} epochs without improvement", flush=True)
                s.stopped_early = True
            if not self._updates_left():
                print(f"[train epoch {epoch:3d}] reached trainer.max_updates={t.max_updates}", flush=True)
            if s.stopped_early or epoch >= t.max_epochs or not self._updates_left():
                s.stage = "trained"
            self._end_epoch(record)
        if s.stage == "train":  # max_epochs reached on resume with nothing left to do
            s.stage = "trained"

    def _keep_for_averaging(self, epoch: int) -> None:
        """The last weights (``last.pt``), and those of the last ``average_last`` epochs."""
        t, s = self.t, self.state
        if t.final_weights == "last" or t.average_last > 1:
            self.save_weights("last.pt")
        if t.average_last > 1:
            self.save_weights(f"epoch{epoch}.pt")
            s.saved_epochs.append(epoch)
            while len(s.saved_epochs) > t.average_last:
                (self.run_dir / f"epoch{s.saved_epochs.pop(0)}.pt").unlink(missing_ok=True)

    def final_weights(self) -> str:
        """The weights the final metrics come from: the average of the last ``average_last`` epochs
        (fairseq's average_checkpoints), else the best-validation or the last weights."""
        t, s = self.t, self.state
        if t.average_last > 1 and len(s.saved_epochs) > 1:
            names = [f"epoch{e}.pt" for e in s.saved_epochs]
            average_weights([self.run_dir / n for n in names], self.run_dir / "averaged.pt")
            print(f"repdegen: evaluating the average of {', '.join(names)}", flush=True)
            return "averaged.pt"
        return "last.pt" if t.final_weights == "last" else "best.pt"

    def _finetune_stage(self) -> None:
        """AWD-LSTM's finetune.py: ASGD from the best model until the first non-monotone trigger."""
        s, t, o = self.state, self.t, self.o
        if s.stage == "trained":
            self.load_weights("best.pt")
            s.stage, s.epoch, s.val_history = "finetune", 0, []
            s.stage_best_val = self.evaluate("valid")["nll"]
            s.optimizer_name = "asgd"
            self.optimizer = self.make_optimizer("asgd")
            self.save_weights("best_finetune.pt")
        while s.stage == "finetune" and s.epoch < t.finetune_epochs:
            epoch = s.epoch + 1
            record = self._epoch(epoch)
            val = record["valid_nll"]
            if self._keep_if_best(val, s.stage_best_val, "best_finetune.pt"):
                s.stage_best_val = val
            s.epoch = epoch
            if nonmonotone_trigger(s.val_history, val, o.nonmono):
                print(f"[finetune epoch {epoch:3d}] done: validation stopped improving", flush=True)
                s.stage = "finetuned"
            s.val_history.append(val)
            if epoch >= t.finetune_epochs:
                s.stage = "finetuned"
            self._end_epoch(record)
        s.stage = "finetuned"

    def final_metrics(self, weights: str) -> dict:
        self.load_weights(weights)
        val, test = self.evaluate("valid"), self.evaluate("test")
        metrics = {"valid_ppl": val["ppl"], "test_ppl": test["ppl"], "valid_nll": val["nll"], "test_nll": test["nll"],
                   "weights": weights}
        metrics.update(embedding_metrics(self.model.output_embedding, spectrum=True))
        with self.autocast():
            metrics.update(self.task.final_extras(self.model, self.run_dir, Path(weights).stem))
        return metrics

    def cache_metrics(self) -> dict:
        from analysis.cache_pointer import evaluate_cache

        c = self.t.cache
        out = {}
        for split in ("valid", "test"):
            r = evaluate_cache(self.model, self.corpus.split(split), c.window, c.theta, c.lambdah, c.bptt, self.device)
            out[f"{split}_ppl"], out[f"{split}_nll"] = r["ppl"], r["nll"]
        return out

    def fit(self) -> dict:
        """Train (or continue) to the end; return the metrics of each stage."""
        if self.state.stage == "train":
            self._train_stage()
        stages = {}
        if self.t.finetune_epochs > 0:
            if self.state.stage in ("trained", "finetune"):
                self._finetune_stage()
        stages["final"] = self.final_metrics(self.final_weights())
        last = "best.pt"
        if self.t.finetune_epochs > 0:
            stages["finetune"] = self.final_metrics("best_finetune.pt")
            last = "best_finetune.pt"
        if self.t.cache.enabled:
            self.load_weights(last)
            stages["cache"] = self.cache_metrics()
        return stages
