"""One error type for every mistake a user can make: the message names the bad value,
what was expected, and how to fix it. Entry points print it without a traceback."""

from __future__ import annotations

import functools
import sys


class UserError(Exception):
    """A problem with the user's input (config, data, paths), not a bug in repdegen."""


class ConfigError(UserError):
    """A config value that cannot work, found before any work is done."""


class DataError(UserError):
    """Missing, empty or malformed corpus files, or a hub that cannot be reached."""


def exit_on_user_error(fn):
    """Decorator for entry points: a UserError becomes one clear message and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            print(f"repdegen: error: {err}", file=sys.stderr)
            sys.exit(2)

    return wrapper
