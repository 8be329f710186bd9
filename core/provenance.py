"""Where and with what a result was produced: git commit, hardware, software versions."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import torch

# the folder above the package's code: a git checkout when repdegen runs from one (an editable install), else the
# site-packages folder of a wheel (no checkout there: the commit is recorded as "unknown")
SOURCE_ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=1)
def git_commit() -> dict:
    def run(*args: str) -> str:  # "XY path" lines of --porcelain keep their leading blank: strip the end only
        return subprocess.run(["git", *args], cwd=SOURCE_ROOT, capture_output=True, text=True, timeout=10).stdout.rstrip()

    try:
        # only this package's own checkout: a wheel inside some other git repository (a virtualenv in a project) is not
        top = run("rev-parse", "--show-toplevel")
        if not top or Path(top).resolve() != SOURCE_ROOT:
            return {"commit": "unknown", "dirty": False}
        commit = run("rev-parse", "HEAD") or "unknown"
        changed = [line[3:] for line in run("status", "--porcelain", "--untracked-files=no").splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        commit, changed = "unknown", []
    out = {"commit": commit, "dirty": bool(changed)}
    if changed:  # which tracked files differ (the first 20): a re-rendered results page is not a code change
        out["changed"] = changed[:20] + ([f"... {len(changed) - 20} more"] if len(changed) > 20 else [])
    return out


def only_results_changed(git: dict) -> bool:
    """A dirty tree whose every changed file (as ``git_commit`` lists them) is a rendered result, which no run reads."""
    changed = git.get("changed") or []
    return bool(git.get("dirty")) and bool(changed) and all(str(p).startswith("results/") for p in changed)


def uncommitted_note(git: dict) -> str:
    """How a rendering names a dirty tree: " (uncommitted changes)", or "... in results/ only"; "" for a clean one."""
    if not git.get("dirty"):
        return ""
    return " (uncommitted changes in results/ only)" if only_results_changed(git) else " (uncommitted changes)"


# the command that started this process when it came through ``repdegen <command>`` (repdegen.reproduce.cli.main)
ENTRY: str | None = None


def command_line(argv: list[str] | None = None) -> str:
    """How this process was started, as the user would type it: ``repdegen train a=b ...``, or ``python -m
    repdegen.reproduce.train a=b ...`` for a module run with ``-m``."""
    argv = list(sys.argv if argv is None else argv)
    if ENTRY is not None:
        head = ENTRY
    else:
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        script = Path(argv[0]).resolve() if argv else Path("?")
        if spec is not None and spec.name and Path(getattr(main, "__file__", "") or "?").resolve() == script:
            head = f"python -m {spec.name.removesuffix('.__main__')}"
        else:
            try:  # a script of the checkout, run by path
                head = f"python {script.relative_to(SOURCE_ROOT)}"
            except ValueError:
                head = Path(argv[0]).name if argv else "?"
    return " ".join([head, *argv[1:]])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(device: torch.device | str | None = None) -> dict:
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device) if device is not None else "cpu",
    }
    from repdegen.core import malloc

    if malloc.applied() is not None:  # the allocator setting of a CPU run (core/malloc.py)
        info["malloc"] = malloc.applied()
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
        info["cuda"] = torch.version.cuda
    return info


def hardware_summary(hw: dict) -> str:
    if str(hw.get("device", "cpu")).startswith("cuda") and hw.get("gpu"):
        return f"{hw['gpu']} (torch {hw['torch']})"
    return f"CPU: {hw.get('cpu')} x{hw.get('torch_threads')} threads (torch {hw['torch']})"
