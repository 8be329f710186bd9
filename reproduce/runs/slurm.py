"""Cells on a SLURM cluster: one submitit job per cell (``tasks_per_node`` = the cell's GPUs), its parameters from
Hydra's submitit launcher config (``hydra/launcher=submitit_slurm`` and its ``hydra.launcher.*`` keys), so they are
set the way every Hydra user sets them (:mod:`repdegen.reproduce.runs.launch` picks it for ``launch.backend=auto``
when that launcher is chosen); :func:`make_scheduler` picks the scheduler of ``launch.backend``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from repdegen.reproduce.errors import EXIT_ELSEWHERE, EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED
from repdegen.reproduce.runs.cell_progress import Job, Progress
from repdegen.reproduce.runs.launch import BACKENDS, EXIT_NAMES, InlineScheduler, LocalScheduler, run_cell
from tqdm import tqdm

SUBMITIT_KEYS = {  # Hydra submitit launcher field -> submitit slurm_* parameter
    "partition": "slurm_partition", "qos": "slurm_qos", "comment": "slurm_comment", "constraint": "slurm_constraint",
    "exclude": "slurm_exclude", "account": "slurm_account", "gres": "slurm_gres", "mem_per_gpu": "slurm_mem_per_gpu",
    "mem_per_cpu": "slurm_mem_per_cpu", "max_num_timeout": "slurm_max_num_timeout",
    "additional_parameters": "slurm_additional_parameters", "array_parallelism": "slurm_array_parallelism",
    "setup": "slurm_setup", "srun_args": "slurm_srun_args", "signal_delay_s": "slurm_signal_delay_s",
}
SUBMITIT_COMMON = ("timeout_min", "cpus_per_task", "mem_gb", "nodes", "name", "stderr_to_stdout")


def hydra_launcher_params() -> dict | None:
    """The ``hydra.launcher`` config when it is a submitit launcher, else None."""
    try:
        from hydra.core.hydra_config import HydraConfig

        launcher = HydraConfig.get().launcher
    except (ValueError, ImportError):
        return None
    target = str(launcher.get("_target_", ""))
    if "submitit" not in target.lower():
        return None
    params = OmegaConf.to_container(launcher, resolve=True)
    params["_cluster"] = "local" if "LocalLauncher" in target else "slurm"
    return params


class CellJobFunction:
    """The picklable callable submitit runs on each task of a cell's job. Requeue on timeout is done
    by the trainer's own SIGUSR1 handler (checkpoint, then ``scontrol requeue``), which replaces
    submitit's; the requeued job runs this again and resumes from the checkpoint."""

    def __init__(self, cfg_path: str):
        self.cfg_path = cfg_path

    def __call__(self) -> int:
        code = run_cell(Path(self.cfg_path))
        if code not in (EXIT_OK, EXIT_PREEMPTED, EXIT_ELSEWHERE):
            raise RuntimeError(f"cell {self.cfg_path} ended with exit status {code} ({EXIT_NAMES.get(code, 'failed')}); "
                               f"see this job's log")
        return code


class SubmititScheduler:
    """One submitit job per cell (``tasks_per_node`` = the cell's GPUs on one node; a cell with more
    GPUs than ``gpus_per_node`` spans ``ceil(gpus / gpus_per_node)`` nodes)."""

    def __init__(self, jobs: list[Job], launch, params: dict, folder: Path, progress: bool = True):
        self.jobs, self.launch, self.params, self.folder = jobs, launch, dict(params), Path(folder)
        self.progress_enabled = progress

    def executor(self, job: Job):
        import submitit

        p = self.params
        cluster = p.get("_cluster", "slurm")
        ex = submitit.AutoExecutor(folder=str(self.folder / "%j"), cluster=None if cluster == "slurm" else cluster)
        per_node = int(p.get("gpus_per_node") or max(job.gpus, 1))
        nodes = max(1, -(-job.gpus // per_node))
        tasks = min(job.gpus, per_node) if job.gpus > 0 else 1
        kwargs: dict[str, Any] = {k: p[k] for k in SUBMITIT_COMMON if p.get(k) is not None}
        kwargs.update(nodes=nodes, tasks_per_node=tasks, name=f"repdegen-{job.config_hash}")
        if cluster == "slurm":
            kwargs["gpus_per_node"] = tasks
            kwargs.update({v: p[k] for k, v in SUBMITIT_KEYS.items() if p.get(k) not in (None, {}, [])})
        ex.update_parameters(**kwargs)
        return ex

    def run(self) -> dict[str, str]:
        progress = Progress(self.jobs, len(self.jobs), self.progress_enabled)
        submitted = {}
        try:
            for job in self.jobs:
                sjob = self.executor(job).submit(CellJobFunction(str(job.cfg_path)))
                job.status, job.started = "running", time.time()
                submitted[job.config_hash] = sjob
                progress.event(job, f"submitted as job {sjob.job_id}")
                job.log_path = Path(str(sjob.paths.stdout))
            if not self.launch.wait:
                tqdm.write(f"repdegen: {len(submitted)} job(s) submitted; rerun the same command when they are done "
                           f"to render the tables (finished cells are not run again)")
                return {j.config_hash: j.status for j in self.jobs}
            while any(j.status == "running" for j in self.jobs):
                time.sleep(float(self.launch.poll_seconds))
                for job in self.jobs:
                    sjob = submitted[job.config_hash]
                    if job.status != "running" or not sjob.done():
                        continue
                    try:
                        code = sjob.result()
                    except Exception as err:  # noqa: BLE001 - the job's own error, reported with its log
                        code = EXIT_FAILED
                        tqdm.write(f"repdegen: job {sjob.job_id} failed: {str(err).strip().splitlines()[-1]}")
                    LocalScheduler._finish(job, code)
                    progress.event(job, EXIT_NAMES.get(code, "failed"))
                progress.refresh()
        finally:
            progress.close()
        return {j.config_hash: j.status for j in self.jobs}


# ---- one cell in one process -----------------------------------------------------------------------


def make_scheduler(jobs: list[Job], launch, output_dir: Path, progress: bool = True):
    """The scheduler of ``launch.backend``: ``local`` (a process per cell on this machine's CPU or GPUs), ``inline``
    (in this process), ``slurm`` (a submitit job per cell), ``auto`` (slurm when Hydra's launcher is submitit's)."""
    backend = launch.backend
    params = hydra_launcher_params()
    if backend == "auto":
        backend = "slurm" if params is not None else "local"
    if backend == "local":
        return LocalScheduler(jobs, launch, progress)
    if backend == "inline":
        return InlineScheduler(jobs, launch, progress)
    if backend == "slurm":
        if params is None:
            params = {"_cluster": "slurm"}
        return SubmititScheduler(jobs, launch, params, Path(output_dir) / "submitit", progress)
    from repdegen.reproduce.errors import ConfigError

    raise ConfigError(f"launch.backend={backend!r} is not one of {', '.join(BACKENDS)}; set launch.backend=local")
