"""Progress bars that suit where they are written: a tqdm bar on a terminal; a plain line every
``every`` updates (about ten per bar, at most one per ``min_seconds``) in a log file or pipe, instead of
tqdm's carriage-return redraws, which fill a log with one long line."""

from __future__ import annotations

import math
import sys
import time

from tqdm import tqdm


def is_terminal(stream=None) -> bool:
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


class LineProgress:
    """The part of tqdm's interface the code uses (``update``, ``set_postfix_str``, ``close``), printing
    ``<desc>: n/total (p%) <postfix>, <rate> <unit>/s`` every ``every`` updates and at the end."""

    def __init__(self, total: int | None = None, desc: str = "", unit: str = "it", initial: int = 0,
                 every: int | None = None, min_seconds: float = 5.0, file=None, **_):
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.every = every or max(1, math.ceil((total or 100) / 10))
        self.min_seconds = min_seconds
        self.file = file
        self.start = self.last_time = time.time()
        self.start_n = initial
        self.last_n = initial
        self.postfix = ""
        self.closed = False

    def _line(self) -> str:
        done = f"{self.n}/{self.total} ({100 * self.n / self.total:.0f}%)" if self.total else f"{self.n}"
        elapsed = time.time() - self.start
        rate = f", {(self.n - self.start_n) / elapsed:.3g} {self.unit}/s" if elapsed > 0 and self.n > self.start_n else ""
        post = f" {self.postfix}" if self.postfix else ""
        return f"{self.desc}: {done}{post}{rate}"

    def _print(self) -> None:
        print(self._line(), file=self.file or sys.stderr, flush=True)
        self.last_n, self.last_time = self.n, time.time()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n - self.last_n >= self.every and time.time() - self.last_time >= self.min_seconds:
            self._print()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def set_postfix(self, ordered_dict=None, refresh: bool = True, **kwargs) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed and self.n != self.last_n:
            self._print()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def progress_bar(total: int | None = None, desc: str = "", disable: bool = False, unit: str = "it", initial: int = 0,
                 file=None, every: int | None = None, min_seconds: float = 5.0, **tqdm_kwargs):
    """tqdm on a terminal (``file``, default stderr), :class:`LineProgress` elsewhere; nothing when disabled."""
    if disable:
        return tqdm(total=total, disable=True)
    if is_terminal(file):
        return tqdm(total=total, desc=desc, unit=unit, initial=initial, file=file, **tqdm_kwargs)
    return LineProgress(total=total, desc=desc, unit=unit, initial=initial, every=every, min_seconds=min_seconds,
                        file=file)
