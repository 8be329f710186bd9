"""The stages a run goes through, composed by :meth:`repdegen.reproduce.engine.trainer.Trainer.fit` from its epoch loop:

* **train**: epochs until ``max_epochs``, ``max_updates`` or early stopping; the best-validation weights
  (``best.pt``); NT-ASGD's switch to averaging (:func:`repdegen.reproduce.engine.optim.nonmonotone_trigger`); the last weights and
  those of the last ``average_last`` epochs for checkpoint averaging, or with ``trainer.save_interval_updates`` = N
  those after every N-th update (the last ``average_last`` of them, :meth:`Stages.keep_interval_checkpoint`);
* **retrain** (Inan et al. 2017, footnote 5: "Small models were re-trained by initializing to their final
  configuration from the first training session"): with ``trainer.retrain_sessions`` = K > 0, K more train stages,
  each from the previous session's best weights (kept as ``best_session<n>.pt``) with the schedule restarted: epoch
  1's learning rate and decay, a fresh optimizer, early stopping counted anew against the session's own best
  (:func:`epochs_since_session_best`); the best weights kept start at the loaded weights' loss, so a session that
  does not improve on them leaves ``best.pt`` as it was;
* **finetune** (AWD-LSTM's finetune.py): ASGD from the best model until the first non-monotone trigger
  (``best_finetune.pt``);
* **final**: valid/test PPL, the embedding's geometry and the task's extras (group PPL/Uniq, BLEU, word similarity)
  of the chosen weights (averaged, best or last), then of the finetuned weights, then the continuous cache pointer.

``RunState.stage`` says where a resumed run continues: train → trained (→ train of session 2 → trained ...) →
finetune → finetuned; ``RunState.session`` says which training session.
"""

from __future__ import annotations

import math
from pathlib import Path

from repdegen.analysis.metrics import embedding_metrics
from repdegen.core.loaders import load_tensor_file
from repdegen.reproduce.engine import distributed as dist
from repdegen.reproduce.engine.checkpoint import average_weights, drop_stale_interval_weights, interval_weights_name
from repdegen.reproduce.engine.optim import averaged_weights, nonmonotone_trigger

# the output embedding at initialisation, saved when a run starts (the drift metrics of analysis/geometry.py)
INIT_EMBEDDING = "init_embedding.pt"


def pending_name(name: str, stage: str, session: int, epoch: int) -> str:
    """``best.pt`` kept at train epoch 5 of session 1: ``best.pending-train-s1-e5.pt``."""
    stem = name[:-3] if name.endswith(".pt") else name
    return f"{stem}.pending-{stage}-s{session}-e{epoch}.pt"

def epochs_since_session_best(history: list[dict], session: int, val: float) -> int:
    """Early stopping's count: the epochs of this training session, the current one (validation NLL ``val``) last,
    since the session's own best (a strictly lower validation NLL than every earlier epoch of the session). Derived
    from the epoch records each time, so a resumed run counts the same. In session 1 it is the count against
    ``best_val``; in a re-training session (footnote 5) the count starts anew, as the official code's second run
    does (its best starts at 1e10): counted against the first session's best instead, a session whose schedule
    restarts at lr 1 would stop after ``early_stopping`` epochs, before its learning rate decays. The weights kept
    (``best.pt``) are still the best over all sessions (``keep_if_best``)."""
    best, since = math.inf, 0
    earlier = [r["valid_nll"] for r in history
               if r.get("stage") == "train" and r.get("session", 1) == session and "valid_nll" in r]
    for v in [*earlier, val]:
        if v < best:  # NaN: no improvement
            best, since = v, 0
        else:
            since += 1
    return since

def session_weights(session: int) -> str:
    """The best weights of a finished training session (``trainer.retrain_sessions``)."""
    return f"best_session{session}.pt"


class Stages:
    """The stages of :meth:`repdegen.reproduce.engine.trainer.Trainer.fit`, as the trainer's own methods (the
    :class:`~repdegen.reproduce.engine.trainer.Trainer` is a ``Stages``): they read its state (``self.state``), its
    settings (``self.t``, ``self.o``) and its epoch loop (``run_epoch``, ``evaluate``, ``end_epoch``)."""

    def keep_if_best(self, val: float, best: float, name: str) -> bool:
        """Save the weights validation saw (ASGD's averages, if averaging) when ``val`` beats ``best``: under a pending
        name (:func:`pending_name`) that the epoch's checkpoint names and that replaces ``name`` once the checkpoint is
        written (``Trainer.promote_pending``)."""
        if not val < best:  # NaN: never a new best (it would make every later epoch "better")
            return False
        s = self.state
        pending = pending_name(name, s.stage, s.session, s.epoch + 1)
        with averaged_weights(self.params, self.optimizer):
            self.save_weights(pending)
        s.pending_weights[name] = pending
        return True

    def keep_for_averaging(self, epoch: int) -> None:
        """The last weights (``last.pt``), and those of the last ``average_last`` epochs (unless interval checkpoints
        are averaged instead: ``trainer.save_interval_updates``)."""
        t, s = self.t, self.state
        if t.final_weights == "last" or t.average_last > 1:
            self.save_weights("last.pt")
        if t.average_last > 1 and not t.get("save_interval_updates"):
            self.save_weights(f"epoch{epoch}.pt")
            s.saved_epochs.append(epoch)
            while len(s.saved_epochs) > t.average_last:
                old = self.run_dir / f"epoch{s.saved_epochs.pop(0)}.pt"
                if self.is_main:
                    old.unlink(missing_ok=True)

    def interval_checkpoint_due(self) -> bool:
        """Whether the update just counted ends an interval of ``trainer.save_interval_updates`` (train stage only:
        the averaged weights are the training run's; finetuning starts from the best weights)."""
        n = self.t.get("save_interval_updates")
        return bool(n) and self.state.stage == "train" and self.state.updates % n == 0

    def keep_interval_checkpoint(self, progress: dict) -> None:
        """fairseq's ``--save-interval-updates`` with ``--keep-interval-updates``: the weights after this update
        (``update<u>.pt``) join those kept for averaging, the last ``average_last`` (``RunState.saved_updates``), and
        the run's checkpoint is written at the same update (a mid-epoch one: ``progress``, the epoch's progress so far),
        as fairseq writes ``checkpoint_last.pt`` with each interval checkpoint. A run stopped anywhere resumes from a
        checkpoint whose state names exactly the interval files it had kept; files it does not name (rotated out, or
        written after that checkpoint) are deleted once it is written, here and on a resume
        (``Trainer.load_checkpoint``), so at most ``average_last`` + 1 are ever on disk."""
        t, s = self.t, self.state
        self.save_weights(interval_weights_name(s.updates))
        s.saved_updates = [*s.saved_updates, s.updates][-t.average_last:]
        self.save_checkpoint(mid_epoch=progress)
        drop_stale_interval_weights(self.run_dir, s.saved_updates)

    def train_objective_stops(self, loss: float, epoch: int) -> bool:
        """``trainer.early_stopping_on=train``: count the epochs since the mean training objective last fell by at least
        ``early_stopping_min_delta`` (relative) below the best that counted; True once more than ``early_stopping`` have
        passed. False (and nothing counted) under ``early_stopping_on=valid``."""
        s, t = self.state, self.t
        if t.get("early_stopping_on", "valid") != "train":
            return False
        best = s.best_train_loss
        # "at least min_delta below the best", also for an objective below 0 (J_tot at its float noise floor)
        bar = best - t.get("early_stopping_min_delta", 0.0) * abs(best) if math.isfinite(best) else best
        if loss < bar:  # NaN: no improvement
            s.best_train_loss, s.epochs_since_train_best = loss, 0
        else:
            s.epochs_since_train_best += 1
        if t.early_stopping is None or s.epochs_since_train_best <= t.early_stopping:
            return False
        self.print(f"[train epoch {epoch:3d}] early stop: {s.epochs_since_train_best} epochs without a training objective "
                 f"{100 * t.get('early_stopping_min_delta', 0.0):g} % below its best ({s.best_train_loss:.5g})")
        return True

    def train_stage(self) -> None:
        s, t, o = self.state, self.t, self.o
        while s.stage == "train" and s.epoch < t.max_epochs:
            epoch = s.epoch + 1
            record = self.run_epoch(epoch)
            val = record["valid_nll"]
            if self.keep_if_best(val, s.best_val, "best.pt"):
                s.best_val, s.best_epoch = val, epoch
            s.epochs_since_best = epochs_since_session_best(s.history, s.session, val)
            if o.name == "ntasgd" and s.optimizer_name == "sgd":
                if nonmonotone_trigger(s.val_history, val, o.nonmono):
                    self.print(f"[train epoch {epoch:3d}] switching to ASGD (validation stopped improving)")
                    s.optimizer_name, s.asgd_epoch = "asgd", epoch
                    self.optimizer = self.make_optimizer("asgd")
                s.val_history.append(val)
            s.epoch = epoch
            self.keep_for_averaging(epoch)
            if self.train_objective_stops(record["train_loss"], epoch):
                s.stopped_early = True
            elif t.get("early_stopping_on", "valid") == "valid" and t.early_stopping is not None \
                    and s.epochs_since_best > t.early_stopping:
                self.print(f"[train epoch {epoch:3d}] early stop: {s.epochs_since_best} epochs without improvement")
                s.stopped_early = True
            if not self.updates_left():
                self.print(f"[train epoch {epoch:3d}] reached trainer.max_updates={t.max_updates}")
            if s.stopped_early or epoch >= t.max_epochs or not self.updates_left():
                s.stage = "trained"
            self.end_epoch(record)
        if s.stage == "train":  # max_epochs reached on resume with nothing left to do
            s.stage = "trained"

    def start_next_session(self) -> None:
        """Footnote 5 of Inan et al. (2017): a new training session from the last session's best weights, the schedule
        restarted. Safe to repeat after a stop: the finished session's weights are copied once, and the new session
        always starts from that copy (a ``best.pt`` that a stopped new session overwrote is not used)."""
        s = self.state
        done = session_weights(s.session)
        if not (self.run_dir / done).exists():
            self.load_weights("best.pt")
            self.save_weights(done)
        self.load_weights(done)
        self.save_weights("best.pt")
        s.session += 1
        s.stage, s.epoch, s.best_epoch, s.epochs_since_best, s.stopped_early = "train", 0, 0, 0, False
        s.best_train_loss, s.epochs_since_train_best = math.inf, 0
        s.val_history = []
        s.best_val = self.evaluate("valid")["nll"]
        s.optimizer_name = self.first_optimizer_name()
        self.optimizer = self.make_optimizer(s.optimizer_name)
        self.print(f"repdegen: training session {s.session} of {self.t.retrain_sessions + 1} from {done} "
                 f"(valid PPL {math.exp(s.best_val):.2f}); the schedule starts over")

    def finetune_stage(self) -> None:
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
            record = self.run_epoch(epoch)
            val = record["valid_nll"]
            if self.keep_if_best(val, s.stage_best_val, "best_finetune.pt"):
                s.stage_best_val = val
            s.epoch = epoch
            if nonmonotone_trigger(s.val_history, val, o.nonmono):
                self.print(f"[finetune epoch {epoch:3d}] done: validation stopped improving")
                s.stage = "finetuned"
            s.val_history.append(val)
            if epoch >= t.finetune_epochs:
                s.stage = "finetuned"
            self.end_epoch(record)
        s.stage = "finetuned"

    def final_weights(self) -> str:
        """The weights the final metrics come from: the average of the last ``average_last`` epochs, or of the last
        ``average_last`` interval checkpoints with ``trainer.save_interval_updates`` (fairseq's
        scripts/average_checkpoints.py, ``--num-epoch-checkpoints`` / ``--num-update-checkpoints``: the plain mean of
        each tensor), else (averaging off, or fewer than two kept) the best-validation or the last weights."""
        t, s = self.t, self.state
        if t.get("save_interval_updates"):
            names = [interval_weights_name(u) for u in s.saved_updates]
        else:
            names = [f"epoch{e}.pt" for e in s.saved_epochs]
        if t.average_last > 1 and len(names) > 1:
            if self.is_main:
                average_weights([self.run_dir / n for n in names], self.run_dir / "averaged.pt")
            dist.barrier()
            self.print(f"repdegen: evaluating the average of {', '.join(names)}")
            return "averaged.pt"
        return "last.pt" if t.final_weights == "last" else "best.pt"

    def final_metrics(self, weights: str) -> dict:
        """Valid/test PPL (on every rank: reduced over the ranks), the embedding's geometry and the task's extras
        (rank 0 only: group PPL/Uniq, BLEU, word similarity) of the weights ``weights``."""
        self.load_weights(weights)
        val, test = self.evaluate("valid"), self.evaluate("test")
        metrics = {"valid_ppl": val["ppl"], "test_ppl": test["ppl"], "valid_nll": val["nll"], "test_nll": test["nll"],
                   "weights": weights}
        metrics.update(embedding_metrics(self.model.output_embedding, spectrum=True))
        if self.is_main:
            from repdegen.analysis.geometry import final_geometry

            init = self.run_dir / INIT_EMBEDDING
            init_weight = load_tensor_file(init, "initial embedding file", f"move {init.name} aside: the geometry against "
                                           f"the initial embedding is then left out") if init.is_file() else None
            counts, specials = self.task.train_counts(), self.task.special_ids()
            metrics.update(final_geometry(self.model.output_embedding, metrics["singular_values"], counts, specials,
                                          init_weight))
            if init_weight is not None:  # Gao Sec. 1: the never-seen rows' mean drift against the hidden states
                from repdegen.analysis.evaluate import frac_negative
                from repdegen.analysis.geometry import mean_unseen_drift

                drift = mean_unseen_drift(self.model.output_embedding, init_weight, counts, specials)
                if drift is not None:
                    with self.autocast():
                        metrics["frac_h_neg_drift_unseen"] = frac_negative(self.task.valid_hidden_states(self.model), drift)
            with self.autocast():
                metrics.update(self.task.final_extras(self.model, self.run_dir, Path(weights).stem))
        return metrics

    def cache_metrics(self) -> dict:
        """Valid/test PPL with Grave et al.'s continuous cache pointer (``trainer.cache``)."""
        from repdegen.analysis.cache_pointer import evaluate_cache

        c = self.t.cache
        out = {}
        for split in ("valid", "test"):
            r = evaluate_cache(self.model, self.corpus.split(split), c.window, c.theta, c.lambdah, c.bptt, self.device)
            out[f"{split}_ppl"], out[f"{split}_nll"] = r["ppl"], r["nll"]
        return out

    def run_stages(self) -> dict:
        """Train (or continue) to the end; the metrics of each stage (rank 0's, on every rank)."""
        if self.state.stage == "train":
            self.train_stage()
        sessions = self.t.get("retrain_sessions", 0) + 1
        while self.state.stage == "trained" and self.state.session < sessions:
            self.start_next_session()
            self.train_stage()
        if self.t.finetune_epochs > 0 and self.state.stage in ("trained", "finetune"):
            self.finetune_stage()  # before the metrics below load other weights: a resumed finetune goes on from its own
        stages = {}
        if sessions > 1:  # each earlier session's own result (Inan 2017 Table 1 small: footnote 5's effect)
            for n in range(1, sessions):
                stages[f"session{n}"] = self.final_metrics(session_weights(n))
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
