"""The error types of a user's mistake (a bad config value, missing or corrupt data or files): the message names
the bad value, what was expected, and how to fix it. Entry points (``repdegen.reproduce.errors``) print them as one line
without a traceback; see there for the exit statuses."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input (config, data, paths), not a bug in repdegen."""


class ConfigError(UserError):
    """A config value that cannot work, found before any work is done."""


class DataError(UserError):
    """Missing, empty or malformed corpus files, or a hub that cannot be reached."""


class CorruptFile(UserError):
    """A file of ours (a run record, a checkpoint, weights) that cannot be read: truncated or corrupt."""

    def __init__(self, path, message: str):
        super().__init__(message)
        self.path = path
