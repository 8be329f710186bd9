"""The one training loop: SGD, Adam or NT-ASGD; truncated BPTT carrying the state across segments;
per-epoch validation; early stopping; AWD-LSTM's finetune stage; an atomic checkpoint after every
epoch from which ``trainer.resume=true`` continues to the same result (bit-identical on CPU).

Preemption: SIGUSR1/SIGTERM (see :mod:`reproduce.distributed`) or ``trainer.stop_after_updates``
stop the run at the next optimizer-update boundary with a *mid-epoch* checkpoint (the updates done in
the epoch, its partial sums, the draw of its batches, the RNG states, the recurrent state carried
across BPTT segments), from which ``trainer.resume=true`` continues exactly; :class:`Preempted` ends
the run.

Distributed data parallel (``torchrun``/``srun``, one process per device): the config's batch is the
*global* batch and every micro-batch is sharded over the ranks by the task (LM: columns ``r::W`` of
the BPTT stream; translation: sentences ``r::W`` of each bucket), so the same config trains the same
model at any world size. Gradients are synchronised by ``torch.nn.parallel.DistributedDataParallel``
around :class:`TrainStep` (model and objective in one module: the loss is formed by the objective
from the model's hidden states), bucketed and overlapping the backward pass, with ``no_sync`` on all
but the last micro-batch of an update. DDP averages over the ranks; each rank backpropagates its
shard's mean loss times (its shard's target tokens / the update's target tokens on all ranks) x the
world size, so the average is the single-process gradient of the same global micro-batches. A rank
whose shard of the last micro-batch is empty (a translation bucket with fewer sentences than ranks)
still joins the all-reduce with a zero loss over every parameter. Every rank holds the same weights and the
same optimizer state; metrics are reduced as (sum, count), so every rank takes the same decisions
(early stopping, NT-ASGD, best weights); rank 0 alone prints, writes files and runs the final
extras (group metrics, BLEU) while the others wait.

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

from analysis.metrics import embedding_metrics
from core.files import atomic_torch_save
from reproduce import distributed as dist
from reproduce.errors import UserError
from reproduce.ledger import load_torch_file
from reproduce.progress import progress_bar
from reproduce.tasks import make_task

# what to do about a checkpoint that cannot be read (reproduce.train says it before a resume, the trainer on load)
CORRUPT_CHECKPOINT_FIX = ("move it aside (mv {path} {path}.bad) and run the same command again to start this run over "
                          "(its record is kept), or restore the file from a copy")

# never "rare" for frequency-aware objectives (AGG): the specials of BPE vocabularies and word corpora
SPECIAL_SYMBOLS = ("<pad>", "<s>", "</s>", "<unk>", "<eos>")
TRACE_UPDATES = 1000


class TrainingDiverged(UserError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class SimulatedInterrupt(Exception):
    """Raised after ``trainer.stop_after_epochs`` epochs (tests of kill-and-resume)."""


class Preempted(Exception):
    """SIGUSR1/SIGTERM (or ``trainer.stop_after_updates``) stopped the run after a checkpoint was
    written; ``trainer.resume=true`` continues it exactly."""


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


class TrainStep(torch.nn.Module):
    """Model and objective as one module, whose forward is the task's loss of one micro-batch: what
    ``DistributedDataParallel`` wraps. ``always_loss``: for a rank whose shard is empty, a zero loss
    over every parameter instead of None, so that it joins the gradient all-reduce."""

    def __init__(self, model, objective, task):
        super().__init__()
        self.model, self.objective = model, objective
        self.task = task  # not a module: its state (the carried recurrent state) is the trainer's

    def forward(self, batch, update: int, always_loss: bool = False):
        loss, nll_sum, n_tok = self.task.loss(self.model, self.objective, batch, update)
        if loss is None and always_loss:
            loss = sum(p.reshape(-1)[0] * 0.0 for p in self.parameters() if p.requires_grad)
        return loss, nll_sum, n_tok


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
        self.is_main = dist.is_main()  # rank 0: prints, progress bars, files
        self.params = [p for p in list(model.parameters()) + list(objective.parameters()) if p.requires_grad]
        self.task = make_task(cfg, corpus, model, device)
        # trainer.compile: the model's forward compiled (torch.compile); the loss and the optimizer stay eager
        self.forward_model = torch.compile(model, backend=self.t.compile_backend) if self.t.compile else model
        self.ddp = None
        if dist.is_distributed():
            from torch.nn.parallel import DistributedDataParallel

            ids = [device.index if device.index is not None else dist.device_index()] if device.type == "cuda" else None
            self.ddp = DistributedDataParallel(TrainStep(self.forward_model, objective, self.task), device_ids=ids,
                                               broadcast_buffers=False)
        if hasattr(objective, "setup"):
            specials = [corpus.vocab.stoi[s] for s in SPECIAL_SYMBOLS if s in corpus.vocab.stoi]
            objective.setup(updates_per_epoch=self.task.updates_per_epoch(), special_ids=specials,
                            train_counts=corpus.vocab.counts, model=model)
        self.state = RunState(optimizer_name="sgd" if self.o.name == "ntasgd" else self.o.name)
        self.optimizer = self.make_optimizer(self.state.optimizer_name)
        self.on_epoch_end = None  # callback(state), on rank 0, used by train.py to update result.json
        self._mid_epoch: dict | None = None  # a mid-epoch checkpoint's progress, for train_epoch to continue

    def print(self, *args) -> None:
        dist.print_main(*args, flush=True)

    @property
    def resumes_mid_epoch(self) -> bool:
        """Whether the loaded checkpoint was written in the middle of an epoch (a preemption)."""
        return self._mid_epoch is not None

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

    @staticmethod
    def _rng_states() -> dict:
        return {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}

    def save_checkpoint(self, mid_epoch: dict | None = None) -> None:
        """Every rank calls it (each rank's RNG state, and its share of the recurrent state of a
        mid-epoch checkpoint, are gathered); rank 0 writes the file; all ranks leave together."""
        rng_ranks = dist.all_gather_object(self._rng_states())
        if mid_epoch is not None:
            mid_epoch = dict(mid_epoch, carried_state=dist.all_gather_object(self.task.carried_state()))
        if self.is_main:
            atomic_torch_save(
                self.checkpoint_path(),
                {
                    "run_state": asdict(self.state),
                    "model": self.model.state_dict(),
                    "objective": self.objective.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "rng_ranks": rng_ranks,  # [rank 0's {torch, cuda}, rank 1's, ...]
                    "rng_task": self.task.rng_state(),  # the same on every rank
                    "mid_epoch": mid_epoch,  # None at an epoch boundary
                },
            )
        dist.barrier()

    def load_checkpoint(self) -> bool:
        path = self.checkpoint_path()
        if not path.is_file():
            return False
        ckpt = load_torch_file(path, "checkpoint", CORRUPT_CHECKPOINT_FIX.format(path=path), map_location=self.device)
        self.state = RunState(**ckpt["run_state"])
        self.model.load_state_dict(ckpt["model"])
        self.objective.load_state_dict(ckpt["objective"])
        self.optimizer = self.make_optimizer(self.state.optimizer_name)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        # checkpoints written before distributed training held rank 0's state only
        rng_ranks = ckpt.get("rng_ranks") or [{"torch": ckpt["rng_torch"], "cuda": ckpt["rng_cuda"]}]
        rank, world = dist.rank(), dist.world_size()
        if len(rng_ranks) != world:
            self.print(f"repdegen: note: {path} was written by {len(rng_ranks)} rank(s) and is resumed by {world}: the "
                       f"data and the updates continue exactly, the dropout masks differ from an uninterrupted run")
        if rank < len(rng_ranks):
            torch.set_rng_state(rng_ranks[rank]["torch"].cpu())
            if rng_ranks[rank]["cuda"] is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all([s.cpu() for s in rng_ranks[rank]["cuda"]])
        else:  # a rank the checkpoint did not have: its own stream, as at the start of a run
            torch.manual_seed(self.cfg.seed + rank)
        self.task.set_rng_state(ckpt["rng_task"])
        self._mid_epoch = ckpt.get("mid_epoch")
        return True

    def save_weights(self, name: str) -> None:
        if self.is_main:
            atomic_torch_save(self.run_dir / name, {"model": self.model.state_dict(), "objective": self.objective.state_dict()})
        dist.barrier()  # the other ranks may read it next

    def load_weights(self, name: str) -> None:
        path = self.run_dir / name
        blob = load_torch_file(path, "weights file", f"move the run directory {self.run_dir} aside and run the same "
                               f"command again to train it over, or restore {name} from a copy",
                               map_location=self.device)
        self.model.load_state_dict(blob["model"])
        self.objective.load_state_dict(blob["objective"])

    # ---------------------------------------------------------------------------------------------
    def _updates_left(self) -> bool:
        return self.t.max_updates is None or self.state.updates < self.t.max_updates

    def _take_mid_epoch(self, epoch: int) -> dict | None:
        """The progress of a mid-epoch checkpoint in (stage, ``epoch``), once."""
        mid, self._mid_epoch = self._mid_epoch, None
        if mid is None:
            return None
        if (mid["stage"], mid["epoch"]) != (self.state.stage, epoch):
            raise RuntimeError(f"the mid-epoch checkpoint is in {mid['stage']} epoch {mid['epoch']}, "
                               f"but training continues in {self.state.stage} epoch {epoch}")
        return mid

    def _stop_requested(self) -> str | None:
        """Why the run stops at this update boundary (None: it goes on); the same answer on every rank."""
        if self.t.stop_after_updates is not None and self.state.updates == self.t.stop_after_updates:
            return f"trainer.stop_after_updates={self.t.stop_after_updates}"
        if dist.any_rank(dist.preempt_requested()):
            return "a preemption signal (SIGUSR1/SIGTERM)"
        return None

    def train_update(self, group: list, step_lr: float) -> tuple[torch.Tensor, torch.Tensor, int]:
        """One optimizer update over the micro-batches ``group`` at learning rate ``step_lr``: zero the
        gradients, backward every micro-batch's loss weighted by its share of the update's target
        tokens (so the gradient is that of the mean over all of them; under DDP each rank holds a
        shard of every micro-batch and the share counts all ranks' tokens), synchronise the ranks, add
        the objective's once-per-update penalty, clip, step, trace, and ``objective.after_update``.
        Returns (all losses finite, as a device bool; the summed NLL, on the device; target tokens);
        the caller counts the update (``state.updates``). ``scripts/bench.py`` times this function."""
        model, objective, task, opt = self.model, self.objective, self.task, self.optimizer
        for param_group in opt.param_groups:
            param_group["lr"] = step_lr
        opt.zero_grad(set_to_none=True)
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        nll_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        n_tok = 0
        total = sum(task.n_targets(b) for b in group)
        world = dist.world_size()
        for k, b in enumerate(group):
            last = k == len(group) - 1
            # DDP: accumulate locally, all-reduce during the last micro-batch's backward
            sync = contextlib.nullcontext() if self.ddp is None or last else self.ddp.no_sync()
            with sync:
                with self.autocast():
                    if self.ddp is None:
                        loss, b_nll_sum, b_tok = task.loss(self.forward_model, objective, b, self.state.updates)
                    else:
                        loss, b_nll_sum, b_tok = self.ddp(b, self.state.updates, last)
                if loss is None:  # this rank's shard of the micro-batch is empty
                    continue
                weight = b_tok / total * world  # DDP averages over the ranks
                (loss if weight == 1.0 else loss * weight).backward()
            if b_tok:
                finite &= torch.isfinite(loss.detach())
                nll_sum += b_nll_sum
                n_tok += b_tok
        objective.update_penalty(model, self.state.updates)  # after the all-reduce: every rank adds the same term once
        if self.o.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.o.clip_grad_norm)
        opt.step()
        if self.state.updates < TRACE_UPDATES:
            logs = getattr(task, "last_logs", {})
            for name in objective.traces:
                if name in logs:  # a host sync, for the first updates only
                    self.state.trace.setdefault(name, []).append([self.state.updates, float(logs[name])])
        objective.after_update(model, self.state.updates)
        return finite, nll_sum, n_tok

    def train_epoch(self, epoch: int) -> dict:
        t, model, objective, task = self.t, self.model, self.objective, self.task
        model.train()
        objective.train()
        resume = self._take_mid_epoch(epoch)
        if resume is not None:  # draw the epoch's batches again from the RNG state they were drawn with
            task.set_rng_state(resume["rng_task_epoch"])
        rng_task_epoch = task.rng_state()
        batches = task.train_batches(epoch, self.state.stage)
        groups = [batches[k : k + t.update_freq] for k in range(0, len(batches), t.update_freq)]
        task.begin_epoch(model)
        # accumulated on the device; read (one host sync) only every `check_every` updates
        nll_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        n_tok, first, done, seconds_before, check_every = 0, 0, 0, 0.0, 10
        lr = self.current_lr(epoch)
        if resume is not None:
            first, done, lr, seconds_before = resume["groups_done"], resume["epoch_updates"], resume["lr"], resume["seconds"]
            if dist.is_main():  # the epoch's sums so far (over all ranks) continue on rank 0
                nll_sum.fill_(resume["nll_sum"])
                n_tok = resume["n_tok"]
            task.restore_carried_state(resume["carried_state"])
        start = time.time()
        desc = f"{self.state.stage} epoch {epoch}"
        bar = progress_bar(total=len(groups), initial=first, desc=desc, disable=not (t.progress and self.is_main),
                           unit="update", leave=False, dynamic_ncols=True, mininterval=1.0)
        for step in range(first, len(groups)):
            if not self._updates_left():
                break
            group = groups[step]
            lr = self.current_lr(epoch)
            step_lr = lr * task.lr_scale(group[0])
            b_finite, b_nll_sum, b_tok = self.train_update(group, step_lr)
            finite &= b_finite
            nll_sum += b_nll_sum
            n_tok += b_tok
            self.state.updates += 1
            done += 1
            bar.update(1)
            if step % check_every == 0 or step == len(groups) - 1:
                self._check_finite(finite, desc, step, len(groups), step_lr)
                if t.progress and self.is_main:
                    mean = nll_sum.item() / max(n_tok, 1)
                    bar.set_postfix(loss=f"{mean:.3f}", ppl=f"{math.exp(min(mean, 50)):.1f}",
                                    tok_s=f"{n_tok / max(time.time() - start, 1e-9):.0f}", lr=f"{lr:.3g}")
            why = self._stop_requested()
            if why is not None:
                bar.close()
                self._check_finite(finite, desc, step, len(groups), step_lr)  # never checkpoint a diverged run
                nll_total, tok_total = dist.sum_over_ranks(nll_sum.item(), n_tok)
                self.save_checkpoint(mid_epoch={
                    "stage": self.state.stage, "epoch": epoch, "groups_done": step + 1, "epoch_updates": done,
                    "nll_sum": nll_total, "n_tok": int(tok_total), "lr": lr, "rng_task_epoch": rng_task_epoch,
                    "seconds": seconds_before + time.time() - start})
                raise Preempted(f"stopped by {why} after update {step + 1}/{len(groups)} of {desc} ({self.state.updates} "
                                f"updates in all); continue with trainer.resume=true from {self.checkpoint_path()}")
        bar.close()
        if dist.any_rank(not bool(finite)):
            raise TrainingDiverged(f"the training loss became NaN or infinite at {desc}; lower optim.lr")
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        seconds = seconds_before + time.time() - start
        nll_total, tok_total = dist.sum_over_ranks(nll_sum.item(), n_tok)
        mean = nll_total / max(tok_total, 1)
        return {"train_nll": mean, "train_ppl": math.exp(min(mean, 700)), "lr": lr, "updates": self.state.updates,
                "epoch_updates": done, "tokens_per_s": tok_total / max(seconds, 1e-9), "epoch_seconds": seconds}

    def _check_finite(self, finite: torch.Tensor, desc: str, step: int, n_steps: int, step_lr: float) -> None:
        """TrainingDiverged (on every rank) if any rank's loss was NaN or infinite; checkpoints are
        written only at epoch ends and preemptions, after this check: the last one is good."""
        if dist.any_rank(not bool(finite)):
            raise TrainingDiverged(
                f"the training loss became NaN or infinite at {desc}, by update {step + 1}/{n_steps} "
                f"(lr={step_lr:g}). The last good checkpoint (after epoch {self.state.epoch} of stage "
                f"{self.state.stage!r}) is kept at {self.checkpoint_path()}. Lower optim.lr or set "
                f"optim.clip_grad_norm, then rerun with trainer.resume=true"
            )

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
        if self.is_main and self.on_epoch_end is not None:
            self.on_epoch_end(self.state)
        if self.is_main and self.logger is not None:
            self.logger.log({k: v for k, v in record.items() if not isinstance(v, list)}, step=len(self.state.history))
        brief = " | ".join(f"{k} {record[k]:.2f}" for k in ("train_ppl", "valid_ppl") if k in record)
        self.print(f"[{record['stage']} epoch {record['epoch']:3d}] {brief} | I(W) {record['isotropy']:.3g} "
                   f"| mean cos {record['mean_cos']:.3f} | lr {record['lr']:g} | {record['epoch_seconds']:.0f}s")
        done = sum(1 for r in self.state.history)
        if self.t.stop_after_epochs is not None and done >= self.t.stop_after_epochs:
            raise SimulatedInterrupt(f"stopped after {done} epochs (trainer.stop_after_epochs)")
        if dist.any_rank(dist.preempt_requested()):  # a signal during validation: this epoch's checkpoint will do
            raise Preempted(f"stopped by a preemption signal (SIGUSR1/SIGTERM) after {record['stage']} epoch "
                            f"{record['epoch']}; continue with trainer.resume=true from {self.checkpoint_path()}")

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
                    self.print(f"[train epoch {epoch:3d}] switching to ASGD (validation stopped improving)")
                    s.optimizer_name, s.asgd_epoch = "asgd", epoch
                    self.optimizer = self.make_optimizer("asgd")
                s.val_history.append(val)
            s.epoch = epoch
            self._keep_for_averaging(epoch)
            if t.early_stopping is not None and s.epochs_since_best > t.early_stopping:
                self.print(f"[train epoch {epoch:3d}] early stop: {s.epochs_since_best} epochs without improvement")
                s.stopped_early = True
            if not self._updates_left():
                self.print(f"[train epoch {epoch:3d}] reached trainer.max_updates={t.max_updates}")
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
                old = self.run_dir / f"epoch{s.saved_epochs.pop(0)}.pt"
                if self.is_main:
                    old.unlink(missing_ok=True)

    def final_weights(self) -> str:
        """The weights the final metrics come from: the average of the last ``average_last`` epochs
        (fairseq's average_checkpoints), else the best-validation or the last weights."""
        t, s = self.t, self.state
        if t.average_last > 1 and len(s.saved_epochs) > 1:
            names = [f"epoch{e}.pt" for e in s.saved_epochs]
            if self.is_main:
                average_weights([self.run_dir / n for n in names], self.run_dir / "averaged.pt")
            dist.barrier()
            self.print(f"repdegen: evaluating the average of {', '.join(names)}")
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
                self.print(f"[finetune epoch {epoch:3d}] done: validation stopped improving")
                s.stage = "finetuned"
            s.val_history.append(val)
            if epoch >= t.finetune_epochs:
                s.stage = "finetuned"
            self._end_epoch(record)
        s.stage = "finetuned"

    def final_metrics(self, weights: str) -> dict:
        """Valid/test PPL (on every rank: reduced over the ranks), the embedding's geometry and the
        task's extras (rank 0 only: group PPL/Uniq, BLEU, word similarity) of the weights ``weights``."""
        self.load_weights(weights)
        val, test = self.evaluate("valid"), self.evaluate("test")
        metrics = {"valid_ppl": val["ppl"], "test_ppl": test["ppl"], "valid_nll": val["nll"], "test_nll": test["nll"],
                   "weights": weights}
        metrics.update(embedding_metrics(self.model.output_embedding, spectrum=True))
        if self.is_main:
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
        """Train (or continue) to the end; return the metrics of each stage (rank 0's, on every rank)."""
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
            if self.is_main:
                stages["cache"] = self.cache_metrics()
        return dist.broadcast_object(stages)
