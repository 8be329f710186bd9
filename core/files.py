"""Writing files so that no reader sees half of one: through a temporary file renamed over the target
(:func:`atomic_write_bytes`, for run directories that one process owns at a time), or through a temporary name
that carries host and pid (:func:`cache_write`, for caches that several processes and hosts share). A full disk
becomes an ``OSError(ENOSPC)`` that names the file."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _as_disk_full(err: BaseException, path: Path) -> BaseException:
    """torch.save reports a full disk as a RuntimeError ("iostream error", "failed writing file"): an
    OSError(ENOSPC) naming ``path`` when the disk is (nearly) full, else ``err`` itself."""
    if isinstance(err, OSError) or not isinstance(err, RuntimeError):
        return err
    try:
        free = shutil.disk_usage(Path(path).parent).free
    except OSError:
        return err
    if free < 64 * 2**20:
        return OSError(errno.ENOSPC, f"No space left on device ({free // 1024} KiB free)", str(path))
    return err


def atomic_write_bytes(path: Path, write) -> None:
    """Write ``path`` through a temporary file in its directory (``.<name>.<random>.tmp``) renamed over it:
    readers never see half a file; the temporary file is removed when the write fails (a full disk), and
    one left by a killed writer is removed by the next run of the same config (:func:`remove_stale_temps`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        _discard_temp(tmp, err, path)
        raise


def _discard_temp(tmp, err: BaseException, path: Path) -> None:
    """After a failed write of ``path`` through ``tmp``: remove the temp file; a full disk becomes the
    user error that names ``path`` (raised here); any other error is re-raised by the caller."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    full = _as_disk_full(err, path)
    if full is not err:
        raise full from None


def atomic_write_json(path: Path, obj: Any, parents: bool = False, compact: bool = False) -> None:
    """``obj`` as indented JSON at ``path``, atomically; ``parents``: create the missing parent folders first;
    ``compact``: one line without spaces (a large record committed to git: half the bytes of the indented form)."""
    if parents:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, separators=(",", ":")) + "\n" if compact else json.dumps(obj, indent=2, sort_keys=False)
    atomic_write_bytes(path, lambda f: f.write(text.encode()))


def atomic_torch_save(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, lambda f: torch.save(obj, f))


def remove_stale_temps(run_dir: Path, keep_prefixes: tuple[str, ...] = (".cell.yaml.",)) -> list[Path]:
    """Remove the temporary files (``.<name>.<random>.tmp``) a killed writer left in a run directory.
    Call it holding the run's lock: then no other process writes there (but a table process may be
    writing ``cell.yaml``, whose temporary files are kept)."""
    removed = []
    for tmp in Path(run_dir).glob(".*.tmp"):
        if tmp.name.startswith(keep_prefixes) or not tmp.is_file():
            continue
        try:
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:
            pass
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_cache_temps(path: Path) -> None:
    """Remove the temporary files of ``path`` (``<name>.<host>-<pid>.tmp``) that killed writers left:
    this host's whose process is gone, another host's after a day."""
    path = Path(path)
    host = socket.gethostname().replace("-", "_").replace(".", "_")
    for tmp in path.parent.glob(f"{path.name}.*-*.tmp"):
        owner, _, pid = tmp.name[len(path.name) + 1 : -len(".tmp")].rpartition("-")
        try:
            stale = (owner == host and pid.isdigit() and not _pid_alive(int(pid))) or (
                owner != host and time.time() - tmp.stat().st_mtime > 86400)
            if stale:
                tmp.unlink()
        except FileNotFoundError:
            pass


def cache_write(path: Path, write) -> None:
    """Write a file of a cache that several processes (and hosts) share, e.g. ``cache/corpora/<name>.pt``:
    through ``<name>.<host>-<pid>.tmp`` renamed over it; the temporary file is removed when the write
    fails (a full disk), and those a killed writer left are removed first (this host's whose process is
    gone; another host's after a day)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_cache_temps(path)
    host = socket.gethostname().replace("-", "_").replace(".", "_")
    tmp = path.with_name(f"{path.name}.{host}-{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        _discard_temp(tmp, err, path)
        raise


def output_problem(path: str | Path, flag: str, folder: bool = False, overwrite: bool = True) -> str | None:
    """Why ``path`` (given as ``flag``) cannot take a command's output, checked before the work so that nothing is
    computed only to be lost at the end; None when it can. A file's path must not be a folder (nor, with
    ``overwrite=False``, an existing file: a measured result is never overwritten), a folder's must not be a file, and
    the nearest folder that exists on the way must be a folder one can create a file in. Nothing is created."""
    p = Path(path)
    if folder and p.exists() and not p.is_dir():
        return f"{flag} {p} is a file; expected a folder (existing or new): pass a folder's path"
    if not folder and p.is_dir():
        return f"{flag} {p} is a folder; expected the path of a file, e.g. {flag} {p / ('out' + (p.suffix or '.json'))}"
    if not folder and not overwrite and p.exists():
        return (f"{flag} {p} exists; expected a new path (a result already written there is not overwritten): pass "
                f"another path, or move that file aside")
    base = p if folder else p.parent
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        return f"{flag} {p}: {base} is a file, not a folder; expected a path whose folders are folders: pass another path"
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as err:
        return (f"{flag} {p}: cannot create a file in {base} ({err.strerror}); expected a writable folder: make it "
                f"writable, or pass a path in another folder")
    return None
