"""A table's cells as jobs (:class:`Job`: its config, log, GPUs and status) and their progress while they run: one
bar over the cells, each running cell's epoch, validation PPL and time left from its ledger record, and one line per
cell that ends (complete, failed, preempted)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from repdegen.core.loaders import load_run_record
from repdegen.reproduce.engine.progress import is_terminal
from repdegen.reproduce.errors import CorruptFile
from repdegen.reproduce.runs.status import _fmt_seconds, epoch_facts, progress_left, progress_where
from tqdm import tqdm


@dataclass
class Job:
    """One cell to run: its config file, log and wanted GPUs."""

    config_hash: str
    label: str
    cfg_path: Path
    log_path: Path
    gpus: int = 1
    tables: list[str] = field(default_factory=list)
    status: str = "waiting"  # waiting | running | complete | failed | interrupted | elsewhere
    holder: str | None = None  # elsewhere: the process that holds the run's lock
    returncode: int | None = None
    started: float | None = None
    finished: float | None = None


def epoch_progress(record: dict) -> str | None:
    """One line on a running cell from its ``result.json`` (rewritten after every epoch): the epoch it finished, of
    how many, its validation PPL, the time an epoch takes and the time left at most (every epoch up to
    ``trainer.max_epochs`` in every training session, then finetuning's; early stopping may end it sooner). None
    before the first epoch."""
    f = epoch_facts(record)
    if f is None:
        return None
    valid = f", valid PPL {f['valid_ppl']:.2f}" if f["valid_ppl"] is not None else ""
    return f"{progress_where(f, ' of session ')}{valid} | {_fmt_seconds(f['epoch_seconds'])} an epoch | {progress_left(f)}"


class Progress:
    """Cells done / running / failed with an ETA: a tqdm bar on a terminal, plus one line per event
    (start, finish, failure with its log path) that a log file keeps."""

    def __init__(self, jobs: list[Job], slots: int, enabled: bool = True):
        self.jobs, self.slots = jobs, max(1, slots)
        self.start = time.time()
        self.seen: dict[str, int] = {}  # config hash -> mtime of the result.json last reported (watch)
        # the bar on a terminal only: in a log the event lines below say it all, without redraws
        self.bar = tqdm(total=len(jobs), desc="cells", unit="cell", disable=not enabled or not jobs or not is_terminal(),
                        dynamic_ncols=True, leave=True)

    def eta(self) -> str:
        # cells that trained to the end here: a quick exit (a bad setting, a stop, a cell trained elsewhere) says
        # nothing of how long the others take
        done = [j for j in self.jobs if j.status == "complete" and j.finished is not None and j.started is not None]
        if not done:
            return "?"
        mean = sum(j.finished - j.started for j in done) / len(done)
        waiting = sum(1 for j in self.jobs if j.status == "waiting")
        running = [j for j in self.jobs if j.status == "running"]
        left_running = sum(max(mean - (time.time() - j.started), 0.0) for j in running)
        return _fmt_seconds((waiting * mean + left_running) / self.slots)

    def counts(self) -> dict[str, int]:
        out = {"complete": 0, "running": 0, "failed": 0, "waiting": 0, "interrupted": 0, "elsewhere": 0}
        for j in self.jobs:
            out[j.status] = out.get(j.status, 0) + 1
        return out

    def refresh(self) -> None:
        c = self.counts()
        elsewhere = f" | elsewhere {c['elsewhere']}" if c["elsewhere"] else ""
        self.bar.set_postfix_str(f"done {c['complete']} | running {c['running']} | failed {c['failed']}{elsewhere} | "
                                 f"ETA {self.eta()}")

    def event(self, job: Job, what: str) -> None:
        c = self.counts()
        elsewhere = f", {c['elsewhere']} running elsewhere" if c["elsewhere"] else ""
        line = (f"repdegen: [{c['complete'] + c['failed']}/{len(self.jobs)} done, {c['running']} running{elsewhere}] "
                f"{what}: {job.label} [{job.config_hash}]")
        if job.status == "failed":
            line += f" -- log: {job.log_path}"
            reason = last_error_line(job.log_path)
            if reason:  # the cell's own one-line error (a user error: a missing corpus, a bad value) on the console
                line += f"\n    {reason}"
        elif job.status == "elsewhere":
            line += f" -- by {job.holder or 'another process'}"
        tqdm.write(line, file=sys.stdout)
        sys.stdout.flush()
        if job.status in ("complete", "failed"):
            self.bar.update(1)
        self.refresh()

    def watch(self, job: Job) -> None:
        """A line when a running cell finishes an epoch (its result.json changed): epoch, valid PPL, ETA."""
        path = Path(job.cfg_path).parent / "result.json"
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            return
        if self.seen.get(job.config_hash) == stamp:
            return
        self.seen[job.config_hash] = stamp
        try:
            line = epoch_progress(load_run_record(path))
        except (OSError, CorruptFile, ValueError, KeyError, TypeError):  # not a record yet: next time
            return
        if line:
            tqdm.write(f"repdegen:   {job.label} [{job.config_hash}]: {line}", file=sys.stdout)
            sys.stdout.flush()

    def close(self) -> None:
        self.bar.close()


def last_error_line(log_path: Path, tail_bytes: int = 65536) -> str | None:
    """The last ``repdegen: error:`` line of a cell's log (None: none, or no log)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("repdegen: error:")]
    return lines[-1] if lines else None
