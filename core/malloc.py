"""Keep freed memory in the process on CPU runs (glibc's ``mallopt``): no page faults on every large buffer.

PyTorch's CPU tensors come from ``malloc``. glibc serves a request above its mmap threshold (at most 32 MiB; a PTB
LSTM's logits at batch 50 x 20 steps x 10,000 words are 40 MB) with a fresh ``mmap`` and gives it back with
``munmap`` when the tensor is freed, so every update faults in and zeroes the same buffers again: on the Intel Xeon
here a one-thread paper cell spent ~27 % of its CPU time in the kernel (~115,000 minor faults a second). With
``M_MMAP_MAX`` = 0 every block comes from the heap, and with a trim threshold above any heap size the freed blocks
stay there for the next update. Nothing computed changes (where a buffer lives does not change its arithmetic);
memory held stays at the run's peak instead of falling between updates. Measured in results/bench/cpu/README.md.

Applied by :class:`repdegen.reproduce.engine.trainer.Trainer` on a CPU device. ``REPDEGEN_MALLOC=system`` keeps glibc's
defaults; a C library other than glibc (macOS, musl) is left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# <malloc.h>
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
_TRIM_THRESHOLD = 2**31 - 1  # the largest int mallopt takes: the heap is never trimmed below any size reached
_TOP_PAD = 64 * 2**20  # heap extensions 64 MiB larger than asked: fewer brk calls (the A/B ran with 256 MiB)
ENV = "REPDEGEN_MALLOC"
CHOICES = ("reuse", "system")

_applied: str | None = None


def _glibc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # glibc only  # noqa: B018
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> str:
    """Set glibc's allocator to reuse freed blocks (once per process); what was done, for the log:
    ``reuse``, ``system`` (``REPDEGEN_MALLOC=system``) or ``unavailable`` (not glibc)."""
    global _applied
    if _applied is not None:
        return _applied
    choice = os.environ.get(ENV, "reuse").strip().lower() or "reuse"
    if choice not in CHOICES:
        from repdegen.core.errors import UserError

        raise UserError(f"{ENV}={os.environ[ENV]!r} is not one of {', '.join(CHOICES)}: 'reuse' (the default) keeps "
                        f"freed memory in the process on CPU runs, 'system' keeps glibc's defaults. Set it to one "
                        f"of them or unset it")
    if choice == "system":
        _applied = "system"
        return _applied
    libc = _glibc()
    if libc is None:
        _applied = "unavailable"
        return _applied
    ok = all(libc.mallopt(p, v) == 1 for p, v in ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, _TRIM_THRESHOLD),
                                                   (M_TOP_PAD, _TOP_PAD)))
    _applied = "reuse" if ok else "unavailable"
    return _applied


def applied() -> str | None:
    """What :func:`keep_freed_memory` did in this process (None: it was not called: not a CPU run)."""
    return _applied
