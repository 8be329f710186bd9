"""One process per device: torchrun, SLURM's srun, or a plain single process (DINO's init_distributed_mode).

    torchrun --standalone --nproc_per_node=4 -m repdegen.reproduce.train experiment=...        # one node
    srun --ntasks-per-node=4 --gpus-per-task=1 repdegen train experiment=...  # SLURM

:func:`init_distributed` reads the launcher's environment: torchrun's ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` (and its ``MASTER_ADDR``/``MASTER_PORT``), else SLURM's ``SLURM_PROCID``,
``SLURM_NTASKS``, ``SLURM_LOCALID`` (``MASTER_ADDR``: the first host of ``SLURM_JOB_NODELIST`` by
``scontrol show hostnames``; ``MASTER_PORT``: 10000 + job id mod 20000, when they are not set), else a
plain single process with no process group at all (so one process is exactly today's code path). A
world of size 1 under a launcher is a plain single process too.

Two process groups: the default one (``nccl`` when the run uses CUDA, each rank on ``cuda:LOCAL_RANK``;
``gloo`` on the CPU) carries the gradients; a ``gloo`` group carries the control plane -- the host-side
flags, metric sums and pickled objects (:func:`sum_over_ranks`, :func:`any_rank`,
:func:`broadcast_object`, :func:`all_gather_object`), so they never wait on a GPU stream.

Preemption: :func:`preemption_signals` turns SIGUSR1 (SLURM's warning before the time limit, e.g.
``sbatch --signal=USR1@120`` or submitit's default) and SIGTERM (``scancel``, a scheduler stopping the
job, torchrun forwarding its own SIGTERM) into a flag; the trainer checks it at every optimizer-update
boundary (all ranks agree through :func:`any_rank`), writes a mid-epoch checkpoint and stops; the entry
point then calls :func:`requeue_if_slurm` and exits with ``repdegen.reproduce.train.EXIT_PREEMPTED``. On SLURM,
start the ranks with ``srun`` (one task per GPU), not torchrun: torchrun's agent process does not
handle SIGUSR1 and dies of it. A signal that arrives while no update is running (validation, the
final evaluation, BLEU) is acted on at the end of the epoch or not at all.

Collectives may wait :data:`COLLECTIVE_TIMEOUT` (rank 0 alone runs the final extras); a rank that
crashes ends the job through its launcher (torchrun and srun stop the other ranks).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import pickle
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from repdegen.reproduce.errors import ConfigError, UserError

# a rank may wait this long in a collective, e.g. while rank 0 alone runs beam search for BLEU or
# trains the BPE model of a corpus the others then read from the cache
COLLECTIVE_TIMEOUT = dt.timedelta(hours=2)
PREEMPTION_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: ``backend`` is None for a plain single process (no process group)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str = "none"  # none | torchrun | slurm
    backend: str | None = None
    device_index: int = 0  # this rank's CUDA device (LOCAL_RANK, or 0 when the task sees one GPU)


_INFO = DistInfo()
_CONTROL_GROUP = None  # gloo group for host-side collectives
_PREEMPT_REQUESTED = False


# ---- setup ------------------------------------------------------------------------------------------
def first_slurm_host(nodelist: str) -> str:
    """The first host name of a SLURM node list (``node[01-04]`` -> ``node01``), by ``scontrol``."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        raise ConfigError(
            f"SLURM_JOB_NODELIST={nodelist!r}: `scontrol show hostnames` failed ({err}); set MASTER_ADDR to the "
            f"first node's host name (and MASTER_PORT) in the job script"
        ) from None
    hosts = out.stdout.split()
    if not hosts:
        raise ConfigError(f"`scontrol show hostnames {nodelist}` printed no host; set MASTER_ADDR in the job script")
    return hosts[0]


def launcher_env(environ: dict | None = None) -> dict | None:
    """``{rank, world_size, local_rank, launcher, master_addr, master_port}`` from torchrun's variables,
    else from SLURM's (``master_*`` None where the environment already has them), else None."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return {"rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]),
                "local_rank": int(env.get("LOCAL_RANK", 0)), "launcher": "torchrun",
                "master_addr": None, "master_port": None}
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world = int(env["SLURM_NTASKS"])
        addr = port = None
        if world > 1 and "MASTER_ADDR" not in env:
            addr = first_slurm_host(env["SLURM_JOB_NODELIST"])
        if world > 1 and "MASTER_PORT" not in env:
            port = str(10000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)
        return {"rank": int(env["SLURM_PROCID"]), "world_size": world, "local_rank": int(env.get("SLURM_LOCALID", 0)),
                "launcher": "slurm", "master_addr": addr, "master_port": port}
    return None


def init_distributed(use_cuda: bool) -> DistInfo:
    """Join the process group the launcher set up (idempotent: a second call returns the first's result).

    ``use_cuda``: the run trains on CUDA devices (backend ``nccl``, this rank on ``cuda:LOCAL_RANK``);
    otherwise ``gloo`` on the CPU. Without a launcher, or with a world of one, nothing is initialised.
    """
    global _INFO, _CONTROL_GROUP
    if dist.is_available() and dist.is_initialized():
        return _INFO
    env = launcher_env()
    if env is None or env["world_size"] == 1:
        _INFO = DistInfo(launcher=env["launcher"] if env else "none")
        return _INFO
    if not dist.is_available():
        raise ConfigError(f"{env['launcher']} started {env['world_size']} ranks but this PyTorch build has no "
                          f"torch.distributed; run one process or install a build with it")
    if env["master_addr"] is not None:
        os.environ["MASTER_ADDR"] = env["master_addr"]
    if env["master_port"] is not None:
        os.environ["MASTER_PORT"] = env["master_port"]
    backend = "nccl" if use_cuda else "gloo"
    device_id, index = None, 0
    if use_cuda:
        n = torch.cuda.device_count()
        # srun --gpus-per-task=1 shows each task its own GPU only; otherwise rank r of a node uses GPU r
        index = 0 if n == 1 else env["local_rank"]
        if index >= n:
            raise ConfigError(
                f"local rank {env['local_rank']} has no GPU: this process sees {n} CUDA device(s); start at most {n} "
                f"processes per node (torchrun --nproc_per_node={n}, srun --ntasks-per-node={n}) or train on the CPU "
                f"with trainer.device=cpu"
            )
        device_id = torch.device("cuda", index)
        torch.cuda.set_device(device_id)
    dist.init_process_group(backend, init_method="env://", rank=env["rank"], world_size=env["world_size"],
                            timeout=COLLECTIVE_TIMEOUT, device_id=device_id)
    _CONTROL_GROUP = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT) if backend != "gloo" else dist.group.WORLD
    _INFO = DistInfo(env["rank"], env["world_size"], env["local_rank"], env["launcher"], backend, index)
    return _INFO


def teardown() -> None:
    """Leave the process group (if any); :func:`rank` and friends keep answering for this process."""
    global _CONTROL_GROUP
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _CONTROL_GROUP = None


def info() -> DistInfo:
    return _INFO


def rank() -> int:
    return _INFO.rank


def world_size() -> int:
    return _INFO.world_size


def local_rank() -> int:
    return _INFO.local_rank


def device_index() -> int:
    """The CUDA device of this rank (``cuda:LOCAL_RANK``, or 0 for a task that sees one GPU)."""
    return _INFO.device_index


def is_main() -> bool:
    return _INFO.rank == 0


def is_distributed() -> bool:
    return _INFO.world_size > 1


def print_main(*args, **kwargs) -> None:
    """``print`` on rank 0 only (the others would repeat every line)."""
    if is_main():
        print(*args, **kwargs)


# ---- collectives (no-ops in a single process) --------------------------------------------------------
def barrier() -> None:
    if is_distributed():
        dist.barrier(group=_CONTROL_GROUP)


def sum_over_ranks(*values: float) -> list[float]:
    """Each value summed over the ranks (float64 on the control group): metric sums and counts."""
    if not is_distributed():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=_CONTROL_GROUP)
    return t.tolist()


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any rank."""
    if not is_distributed():
        return bool(flag)
    return sum_over_ranks(1.0 if flag else 0.0)[0] > 0


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects)."""
    if not is_distributed():
        return obj
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0, group=_CONTROL_GROUP)
    return box[0]


def all_gather_object(obj: Any) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank."""
    if not is_distributed():
        return [obj]
    out: list = [None] * world_size()
    dist.all_gather_object(out, obj, group=_CONTROL_GROUP)
    return out


@torch.no_grad()
def broadcast_parameters(module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank (the same seed already gives the same init; this
    makes it certain)."""
    if not is_distributed():
        return
    for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, src=0)


def _error_payload(err: UserError) -> tuple[str, bytes]:
    return "error", pickle.dumps(err)


def run_on_main(fn: Callable[[], Any]) -> Any:
    """``fn()`` on rank 0 only; its result -- or the :class:`UserError` it raised -- on every rank."""
    if not is_distributed():
        return fn()
    outcome = None
    if is_main():
        try:
            outcome = ("ok", fn())
        except UserError as err:
            outcome = _error_payload(err)
            broadcast_object(outcome)
            raise
    outcome = broadcast_object(outcome)
    if outcome[0] == "error":
        raise pickle.loads(outcome[1])
    return outcome[1]


def main_first(fn: Callable[[], Any]) -> Any:
    """``fn()`` on rank 0, then on the others (e.g. a loader that fills a cache the others then read);
    a :class:`UserError` on rank 0 is raised on every rank."""
    if not is_distributed():
        return fn()
    if is_main():
        try:
            result = fn()
        except UserError as err:
            broadcast_object(_error_payload(err))
            raise
        broadcast_object(("ok", None))
        return result
    outcome = broadcast_object(None)
    if outcome[0] == "error":
        raise pickle.loads(outcome[1])
    return fn()


# ---- preemption -------------------------------------------------------------------------------------
def _on_preemption_signal(signum, frame) -> None:
    global _PREEMPT_REQUESTED
    _PREEMPT_REQUESTED = True


def preempt_requested() -> bool:
    """Whether SIGUSR1 or SIGTERM arrived in this process (inside :func:`preemption_signals`)."""
    return _PREEMPT_REQUESTED


def stop_reason(stop_after_updates: int | None, updates: int) -> str | None:
    """Why a run stops at this update boundary (None: it goes on); the same answer on every rank."""
    if stop_after_updates is not None and updates == stop_after_updates:
        return f"trainer.stop_after_updates={stop_after_updates}"
    if any_rank(preempt_requested()):
        return "a preemption signal (SIGUSR1/SIGTERM)"
    return None


@contextlib.contextmanager
def preemption_signals():
    """While the block runs, SIGUSR1 and SIGTERM only set the flag :func:`preempt_requested` reads
    (cleared on entry); the previous handlers come back afterwards. Signal handlers can only be set
    from the main thread: elsewhere the signals keep their handlers, and a note says so."""
    global _PREEMPT_REQUESTED
    _PREEMPT_REQUESTED = False
    if threading.current_thread() is not threading.main_thread():
        print_main("repdegen: note: not in the main thread; SIGUSR1/SIGTERM will not checkpoint the run")
        yield
        return
    previous = {s: signal.signal(s, _on_preemption_signal) for s in PREEMPTION_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _PREEMPT_REQUESTED = False


def slurm_restart_count() -> int:
    """How often SLURM has requeued this job (0 outside SLURM or on the first attempt)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def requeue_if_slurm() -> bool:
    """Put this SLURM job back in the queue (``scontrol requeue $SLURM_JOB_ID``) after a preemption.

    Called by the entry point once the run has written its checkpoint. Only rank 0 asks (the job is
    requeued once, with all its tasks). SLURM then starts the same job script again, with
    ``SLURM_RESTART_COUNT`` >= 1: ``repdegen.reproduce.train`` resumes a requeued job's run from its checkpoint
    without ``trainer.resume=true``. Needs ``--requeue`` to be allowed on the cluster (``sbatch
    --requeue`` or ``JobRequeue=1``). Returns whether a requeue was requested; outside SLURM (no
    ``SLURM_JOB_ID``) it does nothing.
    """
    job = os.environ.get("SLURM_JOB_ID")
    if not job or not is_main():
        return False
    out = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"repdegen: `scontrol requeue {job}` failed ({out.stderr.strip() or out.returncode}); resubmit the job "
              f"(it resumes from its checkpoint with trainer.resume=true)", flush=True)
        return False
    print(f"repdegen: SLURM job {job} requeued; it resumes from the checkpoint", flush=True)
    return True


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


def wrap_train_step(model, objective, task, device: torch.device):
    """``DistributedDataParallel`` around :class:`TrainStep` when this process is one of several ranks, else None.
    Gradients are bucketed and all-reduced during the backward pass (``no_sync`` on all but the last micro-batch)."""
    if not is_distributed():
        return None
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index if device.index is not None else device_index()] if device.type == "cuda" else None
    return DistributedDataParallel(TrainStep(model, objective, task), device_ids=ids, broadcast_buffers=False)
