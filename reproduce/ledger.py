"""The results store: one directory per experiment, named by its config hash.

    <runs_dir>/<hash>/result.json     resolved config, hash, metric history, final metrics, parameter
                                      count, commit, hardware, wall time, status
    <runs_dir>/<hash>/checkpoint.pt   last completed epoch (for trainer.resume=true)
    <runs_dir>/<hash>/best.pt         weights with the best validation loss

Every file is written to a temporary name in the same directory and renamed over the old one, so a
reader (or a killed writer) never sees half a file. A process training a run holds an exclusive
``flock`` on ``<runs_dir>/<hash>/.lock`` (:meth:`Ledger.lock`), so two schedulers, sweeps or users
that ask for the same config never train it at once; the lock dies with its process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch

STATUS_COMPLETE = "complete"


class RunLocked(Exception):
    """Another live process holds the run's lock (``reproduce.train`` turns this into a UserError)."""

    def __init__(self, run_dir: Path, holder: str):
        super().__init__(f"{run_dir} is being trained by another process ({holder})")
        self.run_dir, self.holder = run_dir, holder


def atomic_write_bytes(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, lambda f: f.write(json.dumps(obj, indent=2, sort_keys=False).encode()))


def atomic_torch_save(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, lambda f: torch.save(obj, f))


class Ledger:
    def __init__(self, runs_dir: str | Path):
        self.root = Path(runs_dir)

    def run_dir(self, config_hash: str) -> Path:
        return self.root / config_hash

    def load(self, config_hash: str) -> dict | None:
        path = self.run_dir(config_hash) / "result.json"
        if not path.is_file():
            return None
        return json.loads(path.read_text())

    def is_complete(self, config_hash: str) -> bool:
        record = self.load(config_hash)
        return record is not None and record.get("status") == STATUS_COMPLETE

    def write(self, config_hash: str, record: dict) -> Path:
        path = self.run_dir(config_hash) / "result.json"
        atomic_write_json(path, record)
        return path

    @contextlib.contextmanager
    def lock(self, config_hash: str):
        """Hold the run's exclusive lock for the block; :class:`RunLocked` if another process holds it.

        ``flock`` locks belong to the open file, so a killed holder releases it at once (no stale
        lock files to clean up); the file names the holder (host and pid) for the error message.
        """
        run_dir = self.run_dir(config_hash)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / ".lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = path.read_text().strip() or "unknown process"
                raise RunLocked(run_dir, holder) from None
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
            yield
        finally:
            os.close(fd)  # releases the lock
