"""Run many cells: on the local GPUs (one per GPU, large cells as one DDP job), on the CPU one at a
time, or on a SLURM cluster through submitit.

    repdegen table table=all scale=lite                       # every local GPU
    repdegen table table=all scale=paper launch.gpus=[0,1,2,3]
    repdegen table table=all scale=paper hydra/launcher=submitit_slurm \\
        hydra.launcher.partition=gpu hydra.launcher.timeout_min=4320      # one SLURM job per cell

A cell is one training config (``repdegen.reproduce.runs.cells.Cell``). Each cell runs in its own process, so a
crash, an out-of-memory kill or a bug in one cell cannot take the others down:

    python -m repdegen.reproduce.runs.launch <runs_dir>/<hash>/cell.yaml               # one process
    torchrun --standalone --nproc_per_node=K -m repdegen.reproduce.runs.launch <cell.yaml>   # trainer.gpus = K > 1

Its output goes to ``<runs_dir>/<hash>/train.log`` (appended, one header line per attempt). The exit
status of that process says what happened (:data:`EXIT_OK`, ...). A cell is always started
with ``trainer.resume=true``: an interrupted cell continues from its last checkpoint.

Scheduling (:class:`LocalScheduler`): cells wait in order; a cell that wants ``trainer.gpus`` = K
starts as soon as K GPUs are free (at most the number of GPUs there are, so the same table also runs
on a smaller machine: the batch settings are global, so fewer ranks train the same model). Without
GPUs, ``launch.parallel`` cells (default 1) run at a time on the CPU. Ctrl-C stops every cell (each
writes a checkpoint at its next update, see ``repdegen.reproduce.engine.trainer``) and the same command later
continues where they were.

SLURM (:class:`repdegen.reproduce.runs.slurm.SubmititScheduler`): one submitit job per cell, ``tasks_per_node`` = the cell's GPUs;
the cluster parameters come from Hydra's submitit launcher config (``hydra/launcher=submitit_slurm``
and its ``hydra.launcher.*`` keys), so they are set the way every Hydra user sets them. A job that
reaches its time limit gets SIGUSR1, checkpoints and requeues itself (``repdegen.reproduce.engine.distributed``).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from repdegen.reproduce.errors import EXIT_ELSEWHERE, EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, EXIT_USER_ERROR
from repdegen.reproduce.runs.cell_progress import Job, Progress
from repdegen.reproduce.runs.ledger import STATUS_COMPLETE, Ledger
from tqdm import tqdm

# what each exit status of `python -m repdegen.reproduce.runs.launch <cell.yaml>` means for its cell (repdegen.reproduce.errors)
EXIT_NAMES = {EXIT_OK: "complete", EXIT_FAILED: "failed", EXIT_USER_ERROR: "failed (user error)",
              EXIT_PREEMPTED: "interrupted", EXIT_ELSEWHERE: "running elsewhere"}


@dataclass
class LaunchConfig:
    """How ``repdegen.reproduce.table`` runs the cells it has to run.

    ``backend``: ``auto`` (``slurm`` when ``hydra/launcher`` is a submitit launcher, else ``local``),
    ``local`` (a process per cell on this machine), ``slurm`` (submitit) or ``inline`` (in this
    process, one after another: no isolation; for debugging).
    """

    backend: str = "auto"
    # local GPU ids to use, one slot each; an id given k times is k slots on that GPU (small cells side by side on
    # one GPU: launch.gpus=[0,0,0]; a cell wanting several GPUs still gets distinct ones); None: every visible GPU
    gpus: list[int] | None = None
    # cells at a time without GPUs. With N > 1 each cell gets cores // N threads (OMP_NUM_THREADS, unless
    # that is set already): on a 2-core CPU, launch.parallel=2 runs two one-thread cells, which together
    # train faster than one two-thread cell (results/NOTES.md, gao2019_t1 at lite), while two two-thread
    # cells on two cores stall each other
    parallel: int = 1
    # cells with trainer.gpus > 1 run under torchrun (DDP); false: give them one GPU each
    ddp: bool = True
    # slurm: wait for the jobs and render (true), or submit and return (rerun later to render)
    wait: bool = True
    poll_seconds: float = 5.0
    # seconds a stopped cell gets to write its checkpoint after SIGTERM before it is killed
    grace_seconds: float = 120.0


def write_cell_config(cfg: DictConfig, config_hash: str, runs_dir: str | Path) -> Path:
    """``<runs_dir>/<hash>/cell.yaml``: the finalized training config the cell's process runs
    (:func:`repdegen.reproduce.settings.resolve.write_cell`)."""
    from repdegen.reproduce.settings.resolve import RunSpec, write_cell

    return write_cell(RunSpec(cfg, config_hash), runs_dir)


def visible_gpus(requested: list[int] | None) -> list[int]:
    """The GPU ids to schedule on (indices as this process sees them)."""
    try:
        import torch

        n = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no CUDA runtime at all
        n = 0
    if requested is None:
        return list(range(n))
    bad = [g for g in requested if not 0 <= g < n]
    if bad:
        from repdegen.reproduce.errors import ConfigError

        raise ConfigError(f"launch.gpus={list(requested)} names GPU(s) {bad}, but this machine shows {n} "
                          f"GPU(s) (ids 0..{n - 1}); pass ids from that range, or leave launch.gpus unset for all")
    return list(requested)


def take_distinct(free: list[int], need: int) -> tuple[list[int], list[int]]:
    """``need`` distinct GPU ids from the free slots ``free`` (an id listed k times is k slots), those with the most
    free slots first (cells spread over the GPUs: [0,0,1,1] gives 0, then 1), ties to the lower id; and the slots
    left: (ids in increasing order, rest). The caller checks that ``free`` holds ``need`` distinct ids."""
    counts = Counter(free)
    ids = sorted(sorted(counts, key=lambda g: (-counts[g], g))[:need])
    rest = list(free)
    for g in ids:
        rest.remove(g)
    return ids, rest


def cell_command(job: Job, gpu_ids: list[int], ddp: bool) -> list[str]:
    if ddp and len(gpu_ids) > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={len(gpu_ids)}",
                "-m", "repdegen.reproduce.runs.launch", str(job.cfg_path)]
    return [sys.executable, "-m", "repdegen.reproduce.runs.launch", str(job.cfg_path)]


def cpu_threads_per_cell(parallel: int) -> int:
    """Threads for each of ``parallel`` CPU cells running at once: this process's cores shared out."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, parallel))


class LocalScheduler:
    """Processes on this machine: GPUs handed out to cells as they free up; CPU cells ``parallel`` at a time."""

    def __init__(self, jobs: list[Job], launch: LaunchConfig | DictConfig, progress: bool = True):
        self.jobs, self.launch = jobs, launch
        self.gpus = visible_gpus(launch.gpus)
        self.slots = len(self.gpus) if self.gpus else int(launch.parallel)  # >= 1: validate_launch
        self.progress_enabled = progress

    def _wanted(self, job: Job) -> int:
        if not self.gpus:
            return 0
        return max(1, min(job.gpus if self.launch.ddp else 1, len(set(self.gpus))))

    def run(self) -> dict[str, str]:
        free = list(self.gpus)
        cpu_slots = self.slots if not self.gpus else 0
        running: dict[str, tuple[subprocess.Popen, list[int], Any]] = {}
        progress = Progress(self.jobs, self.slots, self.progress_enabled)
        waiting = list(self.jobs)
        try:
            while waiting or running:
                # start what fits, in order (a large cell waits for its GPUs; smaller ones behind it
                # may start meanwhile)
                for job in list(waiting):
                    if self._elsewhere(job, progress):
                        continue
                    need = self._wanted(job)
                    if self.gpus and need <= len(set(free)):
                        ids, free = take_distinct(free, need)
                    elif not self.gpus and cpu_slots > 0:
                        ids, cpu_slots = [], cpu_slots - 1
                    else:
                        continue
                    waiting.remove(job)
                    running[job.config_hash] = self._start(job, ids)
                    if ids and job.gpus > len(ids):
                        tqdm.write(f"repdegen: {job.label} asks for {job.gpus} GPUs; running it on {len(ids)} "
                                   f"(the batch is global, so the result is the same)")
                    progress.event(job, f"started on {'GPU ' + ','.join(map(str, ids)) if ids else 'CPU'}")
                only_elsewhere = waiting and all(j.status == "elsewhere" for j in waiting)
                time.sleep(float(self.launch.poll_seconds) if only_elsewhere and not running
                           else 0.2 if not running else min(1.0, float(self.launch.poll_seconds)))
                for h, (proc, ids, log) in list(running.items()):
                    if proc.poll() is None:
                        continue
                    log.close()
                    job = next(j for j in self.jobs if j.config_hash == h)
                    self._finish(job, proc.returncode)
                    del running[h]
                    if self.gpus:
                        free = sorted(free + ids)
                    else:
                        cpu_slots += 1
                    if job.status == "elsewhere":  # locked by another process after all: wait for it
                        waiting.append(job)
                        self._elsewhere(job, progress)
                        continue
                    progress.event(job, EXIT_NAMES.get(job.returncode, "failed"))
                for h in running:
                    progress.watch(next(j for j in self.jobs if j.config_hash == h))
                progress.refresh()
        except KeyboardInterrupt:
            tqdm.write(f"repdegen: interrupted: stopping {len(running)} running cell(s); each writes a checkpoint "
                       f"first (up to {self.launch.grace_seconds:.0f}s). Run the same command again to continue.")
            self._stop_all(running)
            raise
        finally:
            progress.close()
        return {j.config_hash: j.status for j in self.jobs}

    def _elsewhere(self, job: Job, progress: Progress) -> bool:
        """Whether another live process holds ``job``'s run lock (it trains that cell): such a cell is
        not started here, not failed and not done; it is waited for (a message once), and when the lock
        is released it is started here -- it is then complete (reported as such at once) or resumes
        from where the other process stopped."""
        holder = Ledger(job.cfg_path.parent.parent).holder(job.config_hash)
        if holder is None:
            if job.status == "elsewhere":
                job.status, job.holder = "waiting", None
            return False
        if job.status != "elsewhere" or job.holder != holder:
            job.status, job.holder = "elsewhere", holder
            progress.event(job, "running elsewhere; waiting for it (Ctrl-C stops waiting; what finishes is kept)")
        return True

    def _start(self, job: Job, gpu_ids: list[int]):
        env = dict(os.environ)
        if gpu_ids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(_physical_id(g)) for g in gpu_ids)
        elif not self.gpus and self.slots > 1 and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(cpu_threads_per_cell(self.slots))
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(job.log_path, "ab")
        header = (f"\n===== repdegen: {dt.datetime.now().isoformat(timespec='seconds')} {job.label} [{job.config_hash}] "
                  f"on {'GPU ' + ','.join(map(str, gpu_ids)) if gpu_ids else 'CPU'} =====\n")
        log.write(header.encode())
        log.flush()
        cmd = cell_command(job, gpu_ids, self.launch.ddp)
        # its own process group: Ctrl-C in the terminal reaches the scheduler only, which then stops
        # each cell with SIGTERM (a checkpoint first) rather than killing it mid-write
        # and it dies with this process: SIGTERM (checkpoint, exit 3) when the scheduler is killed, even by
        # SIGKILL, so no cell is orphaned; the next run of the same command resumes it
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=_die_with_parent())
        job.status, job.started = "running", time.time()
        return proc, gpu_ids, log

    @staticmethod
    def _finish(job: Job, code: int) -> None:
        if code == EXIT_ELSEWHERE:
            job.returncode, job.status = code, "elsewhere"
            return
        job.returncode, job.finished = code, time.time()
        job.status = "complete" if code == EXIT_OK else "interrupted" if code == EXIT_PREEMPTED else "failed"

    def _stop_all(self, running) -> None:
        for proc, _, _ in running.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + float(self.launch.grace_seconds)
        for h, (proc, _, log) in running.items():
            try:
                proc.wait(timeout=max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
            job = next(j for j in self.jobs if j.config_hash == h)
            self._finish(job, proc.returncode)


def _die_with_parent():
    """A ``preexec_fn`` that has the kernel send the child SIGTERM when this process dies (Linux
    ``PR_SET_PDEATHSIG``), or None where that is not available."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the call
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _physical_id(i: int) -> str:
    """GPU ``i`` as this process sees it, in terms of the parent's CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return str(i)
    ids = [x.strip() for x in visible.split(",") if x.strip()]
    return ids[i] if i < len(ids) else str(i)


class InlineScheduler:
    """In this process, one cell after another (``launch.backend=inline``): no isolation, for debugging."""

    def __init__(self, jobs: list[Job], launch, progress: bool = True):
        self.jobs, self.progress_enabled = jobs, progress

    def run(self) -> dict[str, str]:
        progress = Progress(self.jobs, 1, self.progress_enabled)
        try:
            for job in self.jobs:
                job.status, job.started = "running", time.time()
                progress.event(job, "started in this process")
                code = run_cell(job.cfg_path)
                LocalScheduler._finish(job, code)
                progress.event(job, EXIT_NAMES.get(code, "failed"))
        finally:
            progress.close()
        return {j.config_hash: j.status for j in self.jobs}


# ---- SLURM through submitit ---------------------------------------------------------------------------
def run_cell(cfg_path: Path) -> int:
    """Train the cell of ``cfg_path`` (resuming it); the exit status says how it ended."""
    import traceback

    from repdegen.reproduce.engine import distributed as dist
    from repdegen.reproduce.errors import as_user_error, report_user_error
    from repdegen.reproduce.runs.execute import RunLockedError, train
    from repdegen.reproduce.settings.resolve import read_cell

    try:
        if not Path(cfg_path).is_file():
            from repdegen.reproduce.errors import ConfigError

            raise ConfigError(f"{cfg_path} does not exist; expected a cell config <runs_dir>/<hash>/cell.yaml as "
                              f"repdegen.reproduce.runs.tables writes it: give its path, or run the table")
        record = train(read_cell(cfg_path))  # the spec the table resolved: not composed or finalized again
    except RunLockedError as err:
        print(f"repdegen: {err}", file=sys.stderr, flush=True)
        return EXIT_ELSEWHERE
    except Exception as err:  # noqa: BLE001 - logged with its traceback; the scheduler goes on with the others
        user = as_user_error(err)
        if user is not None:
            report_user_error(user)
            return EXIT_USER_ERROR
        traceback.print_exc()
        return EXIT_FAILED
    finally:
        dist.teardown()
    status = record.get("status")
    if status == STATUS_COMPLETE:
        return EXIT_OK
    if status in ("preempted", "interrupted"):
        if status == "preempted":
            dist.requeue_if_slurm()  # a SLURM job at its time limit: back in the queue, resumes from the checkpoint
        return EXIT_PREEMPTED
    return EXIT_FAILED


BACKENDS = ("auto", "local", "slurm", "inline")


def validate_launch(launch) -> None:
    """The ``launch`` settings in their domains, checked before anything is registered or run: one ConfigError
    naming the key, the value, what is expected and a value that fits."""
    from repdegen.reproduce.errors import ConfigError
    from repdegen.reproduce.settings.domains import check_domains

    if launch.backend not in BACKENDS:
        raise ConfigError(f"launch.backend={launch.backend!r} is not one of {', '.join(BACKENDS)}; set "
                          f"launch.backend=local (a process per cell here) or launch.backend=slurm")
    # the numbers in their declared domains (reproduce/settings/domains.py, the launch.* entries)
    tree = OmegaConf.to_container(launch, resolve=True) if isinstance(launch, DictConfig) else asdict(launch)
    check_domains({"launch": {k: v for k, v in tree.items() if k != "gpus"}}, sections=("launch",))
    for key in ("parallel", "poll_seconds", "grace_seconds"):
        if tree.get(key) is None:  # check_domains lets null through (an optional setting is off); these are not
            raise ConfigError(f"launch.{key} is null: expected a number; leave it unset for its default")
    gpus = tree.get("gpus")
    if gpus is not None and not (len(gpus) and all(isinstance(g, int) and not isinstance(g, bool) and g >= 0
                                                   for g in gpus)):
        raise ConfigError(f"launch.gpus={list(gpus)!r}: expected a non-empty list of GPU ids >= 0, one slot each (e.g. "
                          f"launch.gpus=[0,1]; [0,0,0]: three cells side by side on GPU 0), or null for every visible GPU")


def jobs_for(cells, runs_dir: str | Path, tables_of: dict[str, list[str]] | None = None) -> list[Job]:
    """A :class:`Job` for every cell not complete in the ledger, its config written next to its run."""
    ledger = Ledger(runs_dir)
    jobs = []
    for cell in cells:
        if ledger.is_complete(cell.config_hash):
            continue
        path = write_cell_config(cell.cfg, cell.config_hash, runs_dir)
        jobs.append(Job(cell.config_hash, cell.label, path, ledger.run_dir(cell.config_hash) / "train.log",
                        gpus=int(cell.cfg.trainer.get("gpus", 1) or 1),
                        tables=(tables_of or {}).get(cell.config_hash, [])))
    return jobs


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m repdegen.reproduce.runs.launch <runs_dir>/<hash>/cell.yaml", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    sys.exit(run_cell(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
