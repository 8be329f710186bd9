"""The results store: one directory per experiment, named by its config hash.

    <runs_dir>/<hash>/result.json     resolved config, hash, metric history, final metrics, parameter
                                      count, commit, hardware, wall time, status
    <runs_dir>/<hash>/checkpoint.pt   last completed epoch (for trainer.resume=true)
    <runs_dir>/<hash>/best.pt         weights with the best validation loss

Every file is written to a temporary name in the same directory and renamed over the old one
(:mod:`repdegen.core.files`), so a reader (or a killed writer) never sees half a file. A process training a run holds an exclusive
``flock`` on ``<runs_dir>/<hash>/.lock`` (:meth:`Ledger.lock`), so two schedulers, sweeps or users
that ask for the same config never train it at once; the lock dies with its process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from repdegen.core.files import atomic_write_json
from repdegen.core.loaders import STATUS_COMPLETE, CorruptRecord, check_torch_file, load_checkpoint, load_run_record  # noqa: F401 (re-exported)

__all__ = ["CorruptRecord", "check_torch_file", "load_torch_file", "read_record", "Ledger", "RunLocked"]

# Ledger.lock's tries for the exclusive lock, LOCK_WAIT_S apart (~1 s in all): Ledger.holder() takes a shared lock for
# an instant to see whether a live process holds it, and a start must not fail on that probe
LOCK_TRIES, LOCK_WAIT_S = 20, 0.05
# what a render-only reader tells the user to do about a corrupt record
FIX_CORRUPT_RENDER = ("run the same command without render_only=true to move it aside (kept, renamed "
                      "result.corrupt-<time>.json) and run its cell again, or restore the file")


class RunLocked(Exception):
    """Another live process holds the run's lock (``repdegen.reproduce.train`` turns this into a UserError)."""

    def __init__(self, run_dir: Path, holder: str):
        super().__init__(f"{run_dir} is being trained by another process ({holder})")
        self.run_dir, self.holder = run_dir, holder


def read_record(path: Path, fix: str) -> dict:
    """A run record from ``path``; :class:`CorruptRecord` (naming the file, and ``fix``) when it is not one
    (:func:`repdegen.core.loaders.load_run_record`)."""
    return load_run_record(path, fix)


def load_torch_file(path: Path, what: str, fix: str, map_location="cpu") -> Any:
    """``torch.load`` of a checkpoint or weights file (:func:`repdegen.core.loaders.load_checkpoint`)."""
    return load_checkpoint(path, what, fix, map_location=map_location)


class Ledger:
    """``repair``: a corrupt ``result.json`` is moved aside (``result.corrupt-<time>.json``, never deleted)
    and its run counts as not run, so it runs again; without it (a reader such as ``render_only``) a
    corrupt record raises :class:`CorruptRecord`, and the ledger is not changed."""

    def __init__(self, runs_dir: str | Path, repair: bool = False):
        self.root = Path(runs_dir)
        self.repair = repair

    def run_dir(self, config_hash: str) -> Path:
        return self.root / config_hash

    def load(self, config_hash: str) -> dict | None:
        path = self.run_dir(config_hash) / "result.json"
        if not path.is_file():
            return None
        fix = "it was moved aside" if self.repair else FIX_CORRUPT_RENDER
        try:
            return read_record(path, fix)
        except CorruptRecord as err:
            if not self.repair:
                raise
            moved = self.quarantine(config_hash)
            if moved is not None:
                print(f"repdegen: warning: {path} is not a valid run record ({err.why}); moved it to {moved.name} "
                      f"(kept) and treating the run as not run, so it runs again", file=sys.stderr, flush=True)
            return self.load(config_hash) if moved is None else None

    def quarantine(self, config_hash: str) -> Path | None:
        """Move a corrupt ``result.json`` aside; the new path (None if another process moved it first)."""
        import datetime as dt

        path = self.run_dir(config_hash) / "result.json"
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        target = path.with_name(f"result.corrupt-{stamp}.json")
        k = 1
        while target.exists():
            target = path.with_name(f"result.corrupt-{stamp}-{k}.json")
            k += 1
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return None
        return target

    def holder(self, config_hash: str) -> str | None:
        """Who holds the run's lock now ("pid N on host"), or None when no live process does."""
        path = self.run_dir(config_hash) / ".lock"
        if not path.is_file():
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return path.read_text().strip() or "unknown process"
            return None
        finally:
            os.close(fd)

    def is_complete(self, config_hash: str) -> bool:
        record = self.load(config_hash)
        return record is not None and record.get("status") == STATUS_COMPLETE

    def write(self, config_hash: str, record: dict) -> Path:
        path = self.run_dir(config_hash) / "result.json"
        atomic_write_json(path, record)
        return path

    @contextlib.contextmanager
    def lock(self, config_hash: str):
        """Hold the run's exclusive lock for the block; :class:`RunLocked` if another process holds it (for ~1 s:
        :data:`LOCK_TRIES`).

        ``flock`` locks belong to the open file, so a killed holder releases it at once (no stale
        lock files to clean up); the file names the holder (host and pid) for the error message.
        """
        run_dir = self.run_dir(config_hash)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / ".lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            for attempt in range(LOCK_TRIES):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:  # held; or only probed an instant by holder() (a status listing, a scheduler)
                    if attempt == LOCK_TRIES - 1:
                        holder = path.read_text().strip() or "unknown process"
                        raise RunLocked(run_dir, holder) from None
                    time.sleep(LOCK_WAIT_S)
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
            yield
        finally:
            os.close(fd)  # releases the lock
