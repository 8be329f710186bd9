"""What a run writes to resume and to evaluate: the checkpoint (weights, optimizer, :class:`RunState`, every rank's
RNG state, and for a preemption or an interval checkpoint the mid-epoch progress), weight files (``best.pt``,
``last.pt``, ``epoch<k>.pt``, ``update<u>.pt``) and their average. Every file is written atomically
(:mod:`repdegen.core.files`); every rank calls the writers (they gather the ranks' RNG states and meet at a barrier),
rank 0 writes.

A *mid-epoch* checkpoint (SIGUSR1/SIGTERM or ``trainer.stop_after_updates``, see
:mod:`repdegen.reproduce.engine.distributed`; and every ``trainer.save_interval_updates`` updates) holds the updates
done in the epoch, its partial sums, the RNG state its batches were drawn with and the recurrent state carried across
BPTT segments, from which ``trainer.resume=true`` continues exactly (bit-identical on a CPU).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from repdegen.core.files import atomic_torch_save
from repdegen.core.loaders import load_checkpoint
from repdegen.reproduce.engine import distributed as dist

# what to do about a checkpoint that cannot be read (repdegen.reproduce.train says it before a resume, the trainer on load)
CORRUPT_CHECKPOINT_FIX = ("move it aside (mv {path} {path}.bad) and run the same command again to start this run over "
                          "(its record is kept), or restore the file from a copy")


@dataclass
class RunState:
    """Everything besides weights and optimizer state that a checkpoint must restore."""

    stage: str = "train"  # train | trained | finetune | finetuned
    session: int = 1  # the training session (trainer.retrain_sessions: 2, 3, ... restart from the previous best)
    epoch: int = 0  # last completed epoch of the current stage
    best_val: float = math.inf
    best_epoch: int = 0
    val_history: list[float] = field(default_factory=list)  # NT-ASGD / finetune trigger
    optimizer_name: str = "sgd"
    asgd_epoch: int | None = None
    epochs_since_best: int = 0
    # trainer.early_stopping_on=train: the lowest epoch-mean training objective that counted as an improvement, and
    # the epochs since it
    best_train_loss: float = math.inf
    epochs_since_train_best: int = 0
    stopped_early: bool = False
    history: list[dict] = field(default_factory=list)
    train_seconds: float = 0.0
    stage_best_val: float = math.inf  # finetune's own best (starts at the loaded model's loss)
    updates: int = 0  # optimizer updates so far (all stages)
    saved_epochs: list[int] = field(default_factory=list)  # epoch weights kept for averaging
    # trainer.save_interval_updates: the update counts whose weights (interval_weights_name) are kept for averaging
    saved_updates: list[int] = field(default_factory=list)
    # per-update traces of the objective's logs over the first updates (``Objective.traces``, e.g. AGG's rare
    # group size: Yu Fig. 4): {name: [[update, value], ...]}
    trace: dict = field(default_factory=dict)
    # best weights kept this epoch, written under a pending name until the epoch's checkpoint is written: {name: the
    # pending file} (Trainer.keep_if_best; Trainer.promote_pending). A run killed between the two resumes from the
    # previous checkpoint, whose state does not name the pending file: it is dropped, and best.pt stays the weights
    # of the epoch the state calls best (on a GPU the rerun epoch may not validate the same)
    pending_weights: dict = field(default_factory=dict)


def rng_states() -> dict:
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def save_checkpoint(path: Path, state: RunState, model, objective, optimizer, task, mid_epoch: dict | None = None) -> None:
    """Every rank calls it (each rank's RNG state, and its share of the recurrent state of a mid-epoch checkpoint,
    are gathered); rank 0 writes the file; all ranks leave together."""
    rng_ranks = dist.all_gather_object(rng_states())
    if mid_epoch is not None:
        mid_epoch = dict(mid_epoch, carried_state=dist.all_gather_object(task.carried_state()))
    if dist.is_main():
        atomic_torch_save(path, {
            "run_state": asdict(state),
            "model": model.state_dict(),
            "objective": objective.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng_ranks": rng_ranks,  # [rank 0's {torch, cuda}, rank 1's, ...]
            "rng_task": task.rng_state(),  # the same on every rank
            "mid_epoch": mid_epoch,  # None at an epoch boundary
        })
    dist.barrier()


def read_checkpoint(path: Path, device: torch.device) -> dict | None:
    """The checkpoint at ``path`` (None: there is none); a corrupt one is a user error naming the fix."""
    if not path.is_file():
        return None
    return load_checkpoint(path, "checkpoint", CORRUPT_CHECKPOINT_FIX.format(path=path), map_location=device)


def restore_rng(ckpt: dict, seed: int, path: Path) -> None:
    """This rank's RNG state from the checkpoint (a rank it did not have starts its own stream, as a new run)."""
    # checkpoints written before distributed training held rank 0's state only
    rng_ranks = ckpt.get("rng_ranks") or [{"torch": ckpt["rng_torch"], "cuda": ckpt["rng_cuda"]}]
    rank, world = dist.rank(), dist.world_size()
    if len(rng_ranks) != world:
        dist.print_main(f"repdegen: note: {path} was written by {len(rng_ranks)} rank(s) and is resumed by {world}: the "
                        f"data and the updates continue exactly, the dropout masks differ from an uninterrupted run",
                        flush=True)
    if rank < len(rng_ranks):
        torch.set_rng_state(rng_ranks[rank]["torch"].cpu())
        if rng_ranks[rank]["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in rng_ranks[rank]["cuda"]])
    else:
        torch.manual_seed(seed + rank)


def save_weights(run_dir: Path, name: str, model, objective) -> None:
    if dist.is_main():
        atomic_torch_save(Path(run_dir) / name, {"model": model.state_dict(), "objective": objective.state_dict()})
    dist.barrier()  # the other ranks may read it next


def load_weights(run_dir: Path, name: str, model, objective, device: torch.device) -> None:
    blob = load_checkpoint(Path(run_dir) / name, "weights file", f"move the run directory {run_dir} aside and run the "
                           f"same command again to train it over, or restore {name} from a copy", map_location=device)
    model.load_state_dict(blob["model"])
    objective.load_state_dict(blob["objective"])


def average_weights(paths: list[Path], out: Path) -> None:
    """Element-wise mean of the model (and objective) tensors saved in ``paths`` (fairseq's
    scripts/average_checkpoints.py); integer buffers are taken from the last file."""
    blobs = [load_checkpoint(p, "weights file", f"restore {p.name} from a copy, or train the run again (move {p.parent} "
                             f"aside first)") for p in paths]
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


def interval_weights_name(updates: int) -> str:
    """The weights after optimizer update ``updates``, kept for averaging (``trainer.save_interval_updates``)."""
    return f"update{updates}.pt"


def drop_stale_interval_weights(run_dir: Path, kept: list[int]) -> None:
    """Delete the interval weights in ``run_dir`` that the run's state no longer names (``kept``: its
    ``saved_updates``): those rotated out of the last ``average_last``, and those written after the checkpoint a
    resumed run starts from (the resumed run writes them again). Rank 0 only; call it once the checkpoint whose state
    is ``kept`` is written, so every file that checkpoint names stays."""
    if not dist.is_main():
        return
    names = {interval_weights_name(u) for u in kept}
    for path in Path(run_dir).glob("update*.pt"):
        if re.fullmatch(r"update\d+\.pt", path.name) and path.name not in names:
            path.unlink(missing_ok=True)


def mid_epoch_at(mid: dict | None, stage: str, epoch: int) -> dict | None:
    """A loaded mid-epoch checkpoint's progress, checked to be in (``stage``, ``epoch``) where training goes on."""
    if mid is not None and (mid["stage"], mid["epoch"]) != (stage, epoch):
        raise RuntimeError(f"the mid-epoch checkpoint is in {mid['stage']} epoch {mid['epoch']}, "
                           f"but training continues in {stage} epoch {epoch}")
    return mid
