"""The one training loop: an optimizer update over micro-batches (:meth:`Trainer.train_update`), an epoch of them
with progress, divergence checks and preemption (:meth:`Trainer.train_epoch`), validation, and the epoch's
bookkeeping. Its pieces live beside it: optimizers and schedules in :mod:`repdegen.reproduce.engine.optim`, checkpoints, weights
and
RNG state in :mod:`repdegen.reproduce.engine.checkpoint`, the stages (train, finetune, final evaluation) in
:mod:`repdegen.reproduce.engine.stages`.
Objectives reach the loop through their hooks only (``setup``, ``update_penalty``, ``after_update``, ``traces``;
:class:`losses.Objective`): the loop names no objective.

Distributed data parallel (``torchrun``/``srun``, one process per device): the config's batch is the *global* batch
and every micro-batch is sharded over the ranks by the task, so the same config trains the same model at any world
size. ``DistributedDataParallel`` wraps :class:`TrainStep` (model and objective in one module), with ``no_sync`` on
all but the last micro-batch of an update; each rank backpropagates its shard's mean loss times (its shard's target
tokens / the update's target tokens on all ranks) x the world size, so DDP's average is the single-process gradient.
A rank whose shard of the last micro-batch is empty joins the all-reduce with a zero loss. Metrics are reduced as
(sum, count), so every rank takes the same decisions; rank 0 alone prints and writes files.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path

import torch
from repdegen.analysis.metrics import embedding_metrics
from repdegen.core.files import atomic_torch_save
from repdegen.core.malloc import keep_freed_memory
from repdegen.reproduce.engine import checkpoint as ckpt_io
from repdegen.reproduce.engine import distributed as dist
from repdegen.reproduce.engine import optim
from repdegen.reproduce.engine.checkpoint import RunState
from repdegen.reproduce.engine.progress import progress_bar
from repdegen.reproduce.engine.stages import INIT_EMBEDDING, Stages
from repdegen.reproduce.engine.tasks import geometry_trace_point, make_task
from repdegen.reproduce.errors import Preempted, SimulatedInterrupt, TrainingDiverged

# never "rare" for frequency-aware objectives (AGG): the specials of BPE vocabularies and word corpora
SPECIAL_SYMBOLS = ("<pad>", "<s>", "</s>", "<unk>", "<eos>")
TRACE_UPDATES = 1000


class Trainer(Stages):
    def __init__(self, cfg, model, objective, corpus, run_dir: Path, device: torch.device, logger=None):
        self.cfg, self.t, self.o = cfg, cfg.trainer, cfg.optim
        self.model, self.objective, self.corpus, self.logger = model, objective, corpus, logger
        self.run_dir, self.device = Path(run_dir), device
        if device.type == "cpu":  # freed buffers stay in the process: no page faults every update (core/malloc.py)
            keep_freed_memory()
        optim.check_bf16(self.t.precision, device, model)
        if device.type == "cuda" and not optim.use_bf16(self.t.precision, device):
            # fp32 means fp32: cuDNN (the LSTMs' kernel) runs in TF32 by default, PyTorch's own matmuls do not
            torch.backends.cudnn.allow_tf32 = False
        self.is_main = dist.is_main()  # rank 0: prints, progress bars, files
        self.params = [p for p in list(model.parameters()) + list(objective.parameters()) if p.requires_grad]
        self.task = make_task(cfg, corpus, model, device)
        # trainer.compile: the model's forward compiled (torch.compile); the loss and the optimizer stay eager
        # (compile_mode: torch.compile's mode; "default" passes none, which every backend accepts)
        mode = self.t.get("compile_mode", "default")
        self.forward_model = torch.compile(model, backend=self.t.compile_backend,
                                           mode=None if mode == "default" else mode) if self.t.compile else model
        self.ddp = dist.wrap_train_step(self.forward_model, objective, self.task, device)  # None: one process
        if hasattr(objective, "setup"):
            specials = [corpus.vocab.stoi[s] for s in SPECIAL_SYMBOLS if s in corpus.vocab.stoi]
            objective.setup(updates_per_epoch=self.task.updates_per_epoch(), special_ids=specials,
                            train_counts=corpus.vocab.counts, model=model)
        self.state = RunState(optimizer_name=self.first_optimizer_name())
        self.optimizer = self.make_optimizer(self.state.optimizer_name)
        self.save_init_embedding()
        self.on_epoch_end = None  # callback(state), on rank 0, used by train.py to update result.json
        self._mid_epoch: dict | None = None  # a mid-epoch checkpoint's progress, for train_epoch to continue

    def save_init_embedding(self) -> None:
        """The output embedding before any update (``INIT_EMBEDDING``), once, when the run starts: not on a resume
        (the weights there would be a rebuilt model's, not the run's), not over an existing file."""
        path = self.run_dir / INIT_EMBEDDING
        if self.is_main and not self.checkpoint_path().exists() and not path.exists():
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_torch_save(path, self.model.output_embedding.detach().float().cpu().clone())

    def print(self, *args) -> None:
        dist.print_main(*args, flush=True)

    @property
    def resumes_mid_epoch(self) -> bool:
        """Whether the loaded checkpoint was written in the middle of an epoch (a preemption)."""
        return self._mid_epoch is not None

    # ---------------------------------------------------------------------------------------------
    def first_optimizer_name(self) -> str:
        """The optimizer a training session starts with (NT-ASGD starts as SGD and switches later)."""
        return "sgd" if self.o.name == "ntasgd" else self.o.name

    def make_optimizer(self, name: str):
        return optim.make_optimizer(name, self.params, self.o, self.device)

    def current_lr(self, epoch: int) -> float:
        if self.o.schedule == "inverse_sqrt" and self.state.optimizer_name == "adam":
            return optim.lr_for_update(self.o, self.state.updates)
        return optim.lr_for_epoch(self.o, epoch, constant=self.state.stage == "finetune" or self.state.optimizer_name == "asgd")

    def autocast(self):
        """bf16 autocast on the forward pass and the loss (``trainer.precision=bf16``)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=optim.use_bf16(self.t.precision, self.device))

    def no_autocast(self):
        return torch.autocast(self.device.type, enabled=False)

    # ---------------------------------------------------------------------------------------------
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    def save_checkpoint(self, mid_epoch: dict | None = None) -> None:
        ckpt_io.save_checkpoint(self.checkpoint_path(), self.state, self.model, self.objective, self.optimizer, self.task,
                                mid_epoch)

    def load_checkpoint(self) -> bool:
        """Restore the run from its checkpoint (False: there is none)."""
        ckpt = ckpt_io.read_checkpoint(self.checkpoint_path(), self.device)
        if ckpt is None:
            return False
        self.state = RunState(**ckpt["run_state"])
        self.model.load_state_dict(ckpt["model"])
        self.objective.load_state_dict(ckpt["objective"])
        self.optimizer = self.make_optimizer(self.state.optimizer_name)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        ckpt_io.restore_rng(ckpt, self.cfg.seed, self.checkpoint_path())
        self.task.set_rng_state(ckpt["rng_task"])
        self._mid_epoch = ckpt.get("mid_epoch")
        self.promote_pending()
        ckpt_io.drop_stale_interval_weights(self.run_dir, self.state.saved_updates)
        return True

    def promote_pending(self) -> None:
        """Best weights kept this epoch (``RunState.pending_weights``), their epoch's checkpoint written: move them
        to their names (``best.pt``). On a resume, also drop any other pending file: the weights of an epoch whose
        checkpoint was never written (killed between the two), which the rerun of that epoch replaces."""
        named = dict(self.state.pending_weights)
        if self.is_main:
            for name, pending in named.items():
                if (self.run_dir / pending).is_file():
                    os.replace(self.run_dir / pending, self.run_dir / name)
            for stray in self.run_dir.glob("*.pending-*.pt"):
                stray.unlink(missing_ok=True)
        dist.barrier()
        self.state.pending_weights = {}

    def save_weights(self, name: str) -> None:
        ckpt_io.save_weights(self.run_dir, name, self.model, self.objective)

    def load_weights(self, name: str) -> None:
        ckpt_io.load_weights(self.run_dir, name, self.model, self.objective, self.device)

    # ---------------------------------------------------------------------------------------------
    def updates_left(self) -> bool:
        return self.t.max_updates is None or self.state.updates < self.t.max_updates

    def train_update(self, group: list, step_lr: float) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
        """One optimizer update over the micro-batches ``group`` at learning rate ``step_lr``: zero the
        gradients, backward every micro-batch's loss weighted by its share of the update's target
        tokens (so the gradient is that of the mean over all of them; under DDP each rank holds a
        shard of every micro-batch and the share counts all ranks' tokens), synchronise the ranks, add
        the objective's once-per-update penalty, clip, step, trace, and ``objective.after_update``.
        Returns (all losses finite, as a device bool; the summed NLL, on the device; target tokens; the objective's
        loss summed over the target tokens, on the device: each micro-batch's loss times its tokens, without the
        once-per-update penalty); the caller counts the update (``state.updates``). ``scripts/bench.py`` times this
        function."""
        model, objective, task, opt = self.model, self.objective, self.task, self.optimizer
        for param_group in opt.param_groups:
            param_group["lr"] = step_lr
        opt.zero_grad(set_to_none=True)
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        nll_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        n_tok = 0
        total = sum(task.n_targets(b) for b in group)
        world = dist.world_size()
        # one autocast context over every micro-batch of the update: autocast keeps its bf16 copies of the weights
        # until the outermost context exits, so they are cast once an update, not once a micro-batch (the weights do
        # not change in between: the same numbers); the backward passes run with autocast off, as before
        with self.autocast():
            for k, b in enumerate(group):
                last = k == len(group) - 1
                # DDP: accumulate locally, all-reduce during the last micro-batch's backward
                sync = contextlib.nullcontext() if self.ddp is None or last else self.ddp.no_sync()
                with sync:
                    if self.ddp is None:
                        loss, b_nll_sum, b_tok = task.loss(self.forward_model, objective, b, self.state.updates)
                    else:
                        loss, b_nll_sum, b_tok = self.ddp(b, self.state.updates, last)
                    if loss is None:  # this rank's shard of the micro-batch is empty
                        continue
                    with self.no_autocast():
                        weight = b_tok / total * world  # DDP averages over the ranks
                        (loss if weight == 1.0 else loss * weight).backward()
                if b_tok:
                    with self.no_autocast():
                        finite &= torch.isfinite(loss.detach())
                        nll_sum += b_nll_sum
                        loss_sum += loss.detach().double() * b_tok
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
        return finite, nll_sum, n_tok, loss_sum

    def train_epoch(self, epoch: int) -> dict:
        t, model, objective, task = self.t, self.model, self.objective, self.task
        model.train()
        objective.train()
        resume, self._mid_epoch = ckpt_io.mid_epoch_at(self._mid_epoch, self.state.stage, epoch), None
        if resume is not None:  # draw the epoch's batches again from the RNG state they were drawn with
            task.set_rng_state(resume["rng_task_epoch"])
        rng_task_epoch = task.rng_state()
        batches = task.train_batches(epoch, self.state.stage)
        groups = [batches[k : k + t.update_freq] for k in range(0, len(batches), t.update_freq)]
        task.begin_epoch(model)
        # accumulated on the device; read (one host sync) only every `check_every` updates
        nll_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)  # the objective's (train_loss)
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        n_tok, first, done, seconds_before, check_every = 0, 0, 0, 0.0, 10
        lr = self.current_lr(epoch)
        if resume is not None:
            first, done, lr, seconds_before = resume["groups_done"], resume["epoch_updates"], resume["lr"], resume["seconds"]
            if dist.is_main():  # the epoch's sums so far (over all ranks) continue on rank 0
                nll_sum.fill_(resume["nll_sum"])
                # a mid-epoch checkpoint written before train_loss existed: that epoch's train_loss is NaN
                loss_sum.fill_(resume.get("loss_sum", math.nan))
                n_tok = resume["n_tok"]
            task.restore_carried_state(resume["carried_state"])
        if self.state.updates == 0:
            self.trace_geometry()  # the initial weights: the trace's update 0
        start, n_tok_before = time.time(), n_tok  # tokens/s of this process's updates (after a mid-epoch resume too)
        desc = f"{self.state.stage} epoch {epoch}"

        def progress(step: int) -> dict:
            """The epoch's progress after its update ``step``, for a mid-epoch checkpoint (sums over all ranks)."""
            nll_total, tok_total, loss_total = dist.sum_over_ranks(nll_sum.item(), n_tok, loss_sum.item())
            return {"stage": self.state.stage, "epoch": epoch, "groups_done": step + 1, "epoch_updates": done,
                    "nll_sum": nll_total, "n_tok": int(tok_total), "loss_sum": loss_total, "lr": lr,
                    "rng_task_epoch": rng_task_epoch, "seconds": seconds_before + time.time() - start}

        bar = progress_bar(total=len(groups), initial=first, desc=desc, disable=not (t.progress and self.is_main),
                           unit="update", leave=False, dynamic_ncols=True, mininterval=1.0)
        for step in range(first, len(groups)):
            if not self.updates_left():
                break
            group = groups[step]
            lr = self.current_lr(epoch)
            step_lr = lr * task.lr_scale(group[0])
            b_finite, b_nll_sum, b_tok, b_loss_sum = self.train_update(group, step_lr)
            finite &= b_finite
            nll_sum += b_nll_sum
            loss_sum += b_loss_sum
            n_tok += b_tok
            self.state.updates += 1
            done += 1
            self.trace_geometry()
            bar.update(1)
            if step % check_every == 0 or step == len(groups) - 1:
                self._check_finite(finite, desc, step, len(groups), step_lr)
                if t.progress and self.is_main:
                    mean = nll_sum.item() / max(n_tok, 1)
                    bar.set_postfix(loss=f"{mean:.3f}", ppl=f"{math.exp(min(mean, 50)):.1f}",
                                    tok_s=f"{(n_tok - n_tok_before) / max(time.time() - start, 1e-9):.0f}", lr=f"{lr:.3g}")
            if self.interval_checkpoint_due():  # trainer.save_interval_updates (Stages.keep_interval_checkpoint)
                self._check_finite(finite, desc, step, len(groups), step_lr)  # never checkpoint a diverged run
                self.keep_interval_checkpoint(progress(step))
            why = dist.stop_reason(self.t.stop_after_updates, self.state.updates)
            if why is not None:
                bar.close()
                self._check_finite(finite, desc, step, len(groups), step_lr)  # never checkpoint a diverged run
                self.save_checkpoint(mid_epoch=progress(step))
                raise Preempted(f"stopped by {why} after update {step + 1}/{len(groups)} of {desc} ({self.state.updates} "
                                f"updates in all); continue with trainer.resume=true from {self.checkpoint_path()}")
        bar.close()
        if dist.any_rank(not bool(finite)):
            raise TrainingDiverged(f"the training loss became NaN or infinite at {desc}; lower optim.lr")
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        seconds = seconds_before + time.time() - start
        nll_total, tok_total, loss_total = dist.sum_over_ranks(nll_sum.item(), n_tok, loss_sum.item())
        mean = nll_total / max(tok_total, 1)
        return {"train_nll": mean, "train_ppl": math.exp(min(mean, 700)), "train_loss": loss_total / max(tok_total, 1),
                "lr": lr, "updates": self.state.updates,
                "epoch_updates": done, "tokens_per_s": tok_total / max(seconds, 1e-9), "epoch_seconds": seconds}

    def trace_geometry(self) -> None:
        """Yu et al. 2022 Fig. 1: at update 0 and every ``trainer.analysis.geometry_every`` updates (up to
        ``geometry_until``), each group's I(W) and the rare-frequent cosine into ``state.trace`` (``geom_*``), on
        the weights ``validate`` reads."""
        a = self.t.analysis
        u = self.state.updates
        if not a.geometry_every or (a.geometry_until is not None and u > a.geometry_until) or u % a.geometry_every:
            return
        trace = self.state.trace
        if trace.get("geom_isotropy_frequent") and trace["geom_isotropy_frequent"][-1][0] >= u:
            return  # recorded already (a resumed epoch's first update 0)
        with optim.averaged_weights(self.params, self.optimizer):
            point = geometry_trace_point(self.task, self.model)
        for name, value in point.items():
            if math.isfinite(value):  # an empty group has no I(W)
                trace.setdefault(name, []).append([u, float(value)])

    def _check_finite(self, finite: torch.Tensor, desc: str, step: int, n_steps: int, step_lr: float) -> None:
        """TrainingDiverged (on every rank) if any rank's loss was NaN or infinite; checkpoints are written only at
        epoch ends, preemptions and interval checkpoints (``trainer.save_interval_updates``), after this check: the last
        one is good."""
        if dist.any_rank(not bool(finite)):
            raise TrainingDiverged.at_update(desc, step, n_steps, step_lr, self.state, self.checkpoint_path())

    def evaluate(self, split: str, batch_size: int | None = None) -> dict:
        with self.autocast():
            return self.task.evaluate(self.model, split, batch_size)

    def validate(self) -> dict:
        """Validation PPL and the output embedding's geometry (and test PPL with trainer.test_every_epoch)."""
        with optim.averaged_weights(self.params, self.optimizer):
            val = self.evaluate("valid")
            metrics = {"valid_nll": val["nll"], "valid_ppl": val["ppl"]}
            if self.t.test_every_epoch:
                test = self.evaluate("test")
                metrics.update(test_nll=test["nll"], test_ppl=test["ppl"])
            metrics.update(embedding_metrics(self.model.output_embedding, spectrum=self.t.spectrum))
            metrics.update(self.task.group_geometry(self.model))
            with torch.no_grad():
                metrics.update(self.objective.epoch_metrics(self.model))
        return metrics

    # ---------------------------------------------------------------------------------------------
    def end_epoch(self, record: dict) -> None:
        """Record the epoch, checkpoint, report; stop here for a test's simulated kill or a preemption signal."""
        self.state.history.append(record)
        self.save_checkpoint()
        self.promote_pending()
        if self.is_main and self.on_epoch_end is not None:
            self.on_epoch_end(self.state)
        if self.is_main and self.logger is not None:
            self.logger.log({k: v for k, v in record.items() if not isinstance(v, list)}, step=len(self.state.history))
        brief = " | ".join(f"{k} {record[k]:.2f}" for k in ("train_ppl", "valid_ppl") if k in record)
        target = f" | H(y~) {record['al_target_entropy']:.3f}" if "al_target_entropy" in record else ""
        target += f" | d(L, W) {record['subspace_distance']:.3f}" if "subspace_distance" in record else ""
        self.print(f"[{record['stage']} epoch {record['epoch']:3d}] {brief} | I(W) {record['isotropy']:.3g} "
                   f"| mean cos {record['mean_cos']:.3f}{target} | lr {record['lr']:g} | {record['epoch_seconds']:.0f}s")
        done = len(self.state.history)
        if self.t.stop_after_epochs is not None and done >= self.t.stop_after_epochs:
            raise SimulatedInterrupt(f"stopped after {done} epochs (trainer.stop_after_epochs)")
        if dist.any_rank(dist.preempt_requested()):  # a signal during validation: this epoch's checkpoint will do
            raise Preempted(f"stopped by a preemption signal (SIGUSR1/SIGTERM) after {record['stage']} epoch "
                            f"{record['epoch']}; continue with trainer.resume=true from {self.checkpoint_path()}")

    def run_epoch(self, epoch: int) -> dict:
        """Train one epoch of the current stage and validate: the epoch's record."""
        record = {"stage": self.state.stage, "epoch": epoch, **self.train_epoch(epoch)}
        if self.t.get("retrain_sessions", 0) > 0:
            record["session"] = self.state.session
        start = time.time()
        record.update(self.validate())
        record["valid_seconds"] = time.time() - start  # the epoch's evaluation (scripts/epoch_vs_bench.py)
        self.state.train_seconds += record["epoch_seconds"]
        return record

    def fit(self) -> dict:
        """Train (or continue) through the stages to the end (:mod:`repdegen.reproduce.engine.stages`); each stage's
        final metrics."""
        return self.run_stages()
