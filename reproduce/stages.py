"""The stages a run goes through, composed by :meth:`reproduce.trainer.Trainer.fit` from its epoch loop:

* **train**: epochs until ``max_epochs``, ``max_updates`` or early stopping; the best-validation weights
  (``best.pt``); NT-ASGD's switch to averaging (:func:`reproduce.optim.nonmonotone_trigger`); the last weights and
  those of the last ``average_last`` epochs for checkpoint averaging;
* **finetune** (AWD-LSTM's finetune.py): ASGD from the best model until the first non-monotone trigger
  (``best_finetune.pt``);
* **final**: valid/test PPL, the embedding's geometry and the task's extras (group PPL/Uniq, BLEU, word similarity)
  of the chosen weights (averaged, best or last), then of the finetuned weights, then the continuous cache pointer.

``RunState.stage`` says where a resumed run continues: train → trained → finetune → finetuned.
"""

from __future__ import annotations

from pathlib import Path

from analysis.metrics import embedding_metrics
from reproduce import distributed as dist
from reproduce.checkpoint import average_weights
from reproduce.optim import averaged_weights, nonmonotone_trigger


def keep_if_best(tr, val: float, best: float, name: str) -> bool:
    """Save the weights validation saw (ASGD's averages, if averaging) when ``val`` beats ``best``."""
    if val >= best:
        return False
    with averaged_weights(tr.params, tr.optimizer):
        tr.save_weights(name)
    return True


def keep_for_averaging(tr, epoch: int) -> None:
    """The last weights (``last.pt``), and those of the last ``average_last`` epochs."""
    t, s = tr.t, tr.state
    if t.final_weights == "last" or t.average_last > 1:
        tr.save_weights("last.pt")
    if t.average_last > 1:
        tr.save_weights(f"epoch{epoch}.pt")
        s.saved_epochs.append(epoch)
        while len(s.saved_epochs) > t.average_last:
            old = tr.run_dir / f"epoch{s.saved_epochs.pop(0)}.pt"
            if tr.is_main:
                old.unlink(missing_ok=True)


def train_stage(tr) -> None:
    s, t, o = tr.state, tr.t, tr.o
    while s.stage == "train" and s.epoch < t.max_epochs:
        epoch = s.epoch + 1
        record = tr.run_epoch(epoch)
        val = record["valid_nll"]
        if keep_if_best(tr, val, s.best_val, "best.pt"):
            s.best_val, s.best_epoch, s.epochs_since_best = val, epoch, 0
        else:
            s.epochs_since_best += 1
        if o.name == "ntasgd" and s.optimizer_name == "sgd":
            if nonmonotone_trigger(s.val_history, val, o.nonmono):
                tr.print(f"[train epoch {epoch:3d}] switching to ASGD (validation stopped improving)")
                s.optimizer_name, s.asgd_epoch = "asgd", epoch
                tr.optimizer = tr.make_optimizer("asgd")
            s.val_history.append(val)
        s.epoch = epoch
        keep_for_averaging(tr, epoch)
        if t.early_stopping is not None and s.epochs_since_best > t.early_stopping:
            tr.print(f"[train epoch {epoch:3d}] early stop: {s.epochs_since_best} epochs without improvement")
            s.stopped_early = True
        if not tr.updates_left():
            tr.print(f"[train epoch {epoch:3d}] reached trainer.max_updates={t.max_updates}")
        if s.stopped_early or epoch >= t.max_epochs or not tr.updates_left():
            s.stage = "trained"
        tr.end_epoch(record)
    if s.stage == "train":  # max_epochs reached on resume with nothing left to do
        s.stage = "trained"


def finetune_stage(tr) -> None:
    """AWD-LSTM's finetune.py: ASGD from the best model until the first non-monotone trigger."""
    s, t, o = tr.state, tr.t, tr.o
    if s.stage == "trained":
        tr.load_weights("best.pt")
        s.stage, s.epoch, s.val_history = "finetune", 0, []
        s.stage_best_val = tr.evaluate("valid")["nll"]
        s.optimizer_name = "asgd"
        tr.optimizer = tr.make_optimizer("asgd")
        tr.save_weights("best_finetune.pt")
    while s.stage == "finetune" and s.epoch < t.finetune_epochs:
        epoch = s.epoch + 1
        record = tr.run_epoch(epoch)
        val = record["valid_nll"]
        if keep_if_best(tr, val, s.stage_best_val, "best_finetune.pt"):
            s.stage_best_val = val
        s.epoch = epoch
        if nonmonotone_trigger(s.val_history, val, o.nonmono):
            tr.print(f"[finetune epoch {epoch:3d}] done: validation stopped improving")
            s.stage = "finetuned"
        s.val_history.append(val)
        if epoch >= t.finetune_epochs:
            s.stage = "finetuned"
        tr.end_epoch(record)
    s.stage = "finetuned"


def final_weights(tr) -> str:
    """The weights the final metrics come from: the average of the last ``average_last`` epochs
    (fairseq's average_checkpoints), else the best-validation or the last weights."""
    t, s = tr.t, tr.state
    if t.average_last > 1 and len(s.saved_epochs) > 1:
        names = [f"epoch{e}.pt" for e in s.saved_epochs]
        if tr.is_main:
            average_weights([tr.run_dir / n for n in names], tr.run_dir / "averaged.pt")
        dist.barrier()
        tr.print(f"repdegen: evaluating the average of {', '.join(names)}")
        return "averaged.pt"
    return "last.pt" if t.final_weights == "last" else "best.pt"


def final_metrics(tr, weights: str) -> dict:
    """Valid/test PPL (on every rank: reduced over the ranks), the embedding's geometry and the task's extras
    (rank 0 only: group PPL/Uniq, BLEU, word similarity) of the weights ``weights``."""
    tr.load_weights(weights)
    val, test = tr.evaluate("valid"), tr.evaluate("test")
    metrics = {"valid_ppl": val["ppl"], "test_ppl": test["ppl"], "valid_nll": val["nll"], "test_nll": test["nll"],
               "weights": weights}
    metrics.update(embedding_metrics(tr.model.output_embedding, spectrum=True))
    if tr.is_main:
        with tr.autocast():
            metrics.update(tr.task.final_extras(tr.model, tr.run_dir, Path(weights).stem))
    return metrics


def cache_metrics(tr) -> dict:
    """Valid/test PPL with Grave et al.'s continuous cache pointer (``trainer.cache``)."""
    from analysis.cache_pointer import evaluate_cache

    c = tr.t.cache
    out = {}
    for split in ("valid", "test"):
        r = evaluate_cache(tr.model, tr.corpus.split(split), c.window, c.theta, c.lambdah, c.bptt, tr.device)
        out[f"{split}_ppl"], out[f"{split}_nll"] = r["ppl"], r["nll"]
    return out


def run_stages(tr) -> dict:
    """Train (or continue) to the end; the metrics of each stage (rank 0's, on every rank)."""
    if tr.state.stage == "train":
        train_stage(tr)
    stages = {}
    if tr.t.finetune_epochs > 0 and tr.state.stage in ("trained", "finetune"):
        finetune_stage(tr)
    stages["final"] = final_metrics(tr, final_weights(tr))
    last = "best.pt"
    if tr.t.finetune_epochs > 0:
        stages["finetune"] = final_metrics(tr, "best_finetune.pt")
        last = "best_finetune.pt"
    if tr.t.cache.enabled:
        tr.load_weights(last)
        if tr.is_main:
            stages["cache"] = cache_metrics(tr)
    return dist.broadcast_object(stages)
