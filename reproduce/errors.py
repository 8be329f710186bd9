"""One error type for every mistake a user can make: the message names the bad value, what was
expected, and how to fix it. Entry points print it as one line (``repdegen: error: ...``) without a
traceback and exit with :data:`EXIT_USER_ERROR`.

Exit statuses of every entry point (``repdegen.reproduce.train``, ``repdegen.reproduce.table``,
``repdegen.reproduce.runs.launch``,
``repdegen.reproduce.analyze``, ``repdegen.reproduce.translate``, ``repdegen.reproduce.describe``,
``repdegen.reproduce.runs.sweeps``):

* 0 (:data:`EXIT_OK`): done;
* 1 (:data:`EXIT_FAILED`): a run failed (diverged, a bug: its log says why) or a table has cells that did
  not complete;
* 2 (:data:`EXIT_USER_ERROR`): a user error -- a bad value on the command line or in a config (Hydra's
  own composition errors included), a missing, unreadable or corrupt file, a read-only or full disk;
  nothing was run and nothing written was changed;
* 3 (:data:`EXIT_PREEMPTED`): stopped by a signal after writing a checkpoint; the same command (with
  ``trainer.resume=true`` for ``repdegen.reproduce.train``) continues;
* 4 (:data:`EXIT_ELSEWHERE`, ``repdegen.reproduce.runs.launch`` only, the process of one table cell): another live
  process holds the run's lock and trains it; not run here, not failed;
* 130 (:data:`EXIT_INTERRUPTED`): ``repdegen.reproduce.table`` stopped by Ctrl-C or SIGTERM (its cells checkpoint
  first); the same command continues.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import sys

from repdegen.core.errors import ConfigError, CorruptFile, DataError, UserError  # noqa: F401 (the types live in core)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_PREEMPTED = 3
EXIT_ELSEWHERE = 4  # a cell's launch only: another live process holds the run's lock (trains it)
EXIT_INTERRUPTED = 130


# how a training run ends other than complete (repdegen.reproduce.engine.trainer raises them, repdegen.reproduce.train reports
# them)
class TrainingDiverged(UserError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""

    @classmethod
    def at_update(cls, desc: str, step: int, n_steps: int, lr: float, state, checkpoint) -> TrainingDiverged:
        return cls(f"the training loss became NaN or infinite at {desc}, by update {step + 1}/{n_steps} (lr={lr:g}). "
                   f"The last good checkpoint (after epoch {state.epoch} of stage {state.stage!r}) is kept at "
                   f"{checkpoint}. Lower optim.lr or set optim.clip_grad_norm, then rerun with trainer.resume=true")


class SimulatedInterrupt(Exception):
    """Raised after ``trainer.stop_after_epochs`` epochs (tests of kill-and-resume)."""


class Preempted(Exception):
    """SIGUSR1/SIGTERM (or ``trainer.stop_after_updates``) stopped the run after a checkpoint was
    written; ``trainer.resume=true`` continues it exactly."""



# how to give a required key that was left out (``checkpoint=`` of repdegen.reproduce.analyze / translate)
MISSING_HINTS = {
    "checkpoint": "checkpoint=outputs/runs/<hash> (a run directory of repdegen.reproduce.train, or a weights file in one)",
    "input": "input=<a text file with one sentence per line>",
}

_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_ACCESS_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}


def as_user_error(err: BaseException) -> UserError | None:
    """The :class:`UserError` an exception from outside our code stands for, or None when it is a bug:

    * a composition Hydra refused (an unknown config group option, scale or key, a bad override);
    * a required config value left out (OmegaConf's ``MissingMandatoryValue``);
    * a read-only directory or a full disk (``OSError`` with EACCES/EPERM/EROFS, ENOSPC/EDQUOT/EFBIG).
    """
    if isinstance(err, UserError):
        return err
    try:  # a composition the entry point asked Hydra for (hydra.compose): an unknown option, scale or key
        from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    except ImportError:  # pragma: no cover
        ConfigCompositionException = MissingConfigException = OverrideParseException = ()  # noqa: N806
    if isinstance(err, (ConfigCompositionException, MissingConfigException, OverrideParseException)):
        return ConfigError(condense_hydra_error(err))
    try:
        from omegaconf.errors import MissingMandatoryValue
    except ImportError:  # pragma: no cover
        MissingMandatoryValue = ()  # noqa: N806
    if MissingMandatoryValue and isinstance(err, MissingMandatoryValue):
        key = getattr(err, "full_key", None) or "a required value"
        hint = MISSING_HINTS.get(str(key), f"{key}=<value>")
        return ConfigError(f"{key}= is required and was not given; add {hint} to the command line")
    if isinstance(err, OSError) and err.errno in _DISK_ERRNOS | _ACCESS_ERRNOS:
        where = err.filename or "a file"
        if err.errno in _DISK_ERRNOS:
            return UserError(
                f"no space left to write {where} ({err.strerror}); expected free space on that disk: free some, or "
                f"point paths.output_dir / paths.cache_dir at another disk, and run the same command again "
                f"(finished work is kept, unfinished runs resume)")
        return UserError(
            f"cannot write {where} ({err.strerror}); expected a writable directory: make it writable, or point "
            f"paths.output_dir (or the path you gave) at a writable directory")
    return None


def report_user_error(err: UserError) -> None:
    """``repdegen: error: <message>`` on stderr, one line."""
    text = " ".join(str(err).split("\n")).strip()
    print(f"repdegen: error: {text}", file=sys.stderr, flush=True)


# set when an entry point's own function starts: Hydra errors before it are composition errors (user
# errors), exceptions after it are the run's own
_TASK_STARTED = False


def exit_on_user_error(fn):
    """Decorator for entry points: a user error becomes one clear message and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        global _TASK_STARTED
        _TASK_STARTED = True
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            user = as_user_error(err)
            if user is None:
                raise
            report_user_error(user)
            sys.exit(EXIT_USER_ERROR)

    return wrapper


def mark_task_started() -> None:
    global _TASK_STARTED
    _TASK_STARTED = True


# ---- Hydra's own errors (an unknown key, a missing config group option, the override grammar) ----------
def condense_hydra_error(ex: BaseException) -> str:
    """Hydra's multi-line error (and its OmegaConf cause) as one line, with what to do about it."""
    text = str(ex)
    cause = ex.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text += "\n" + str(cause)
    parts: list[str] = []
    options: list[str] | None = None
    skip_search_path = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("Config search path"):
            skip_search_path = True
            continue
        if skip_search_path and raw.startswith("\t") and "provider=" in line:
            continue
        if m := re.match(r"Available options in '(.+)':", line):
            options = []
            parts.append(f"the options of {m.group(1)} are")
            continue
        if options is not None and raw.startswith(("\t", "  ")):
            if not line.startswith(("schema_", "base_")):  # the schemas the options are checked against
                options.append(line)
            continue
        if options is not None:
            parts[-1] += " " + ", ".join(options)
            options = None
        if line.startswith(("object_type=", "reference_type=", "Set the environment variable HYDRA_FULL_ERROR")):
            continue
        if line.startswith("full_key:"):
            continue
        if line.startswith("See https://hydra.cc"):
            continue
        parts.append(line.rstrip("."))
    if options is not None:
        parts[-1] += " " + ", ".join(options)
    message = "; ".join(dict.fromkeys(parts))
    if "Could not find" in message:
        fix = "pick one of the options listed"
    elif re.search(r"Key '.*' not in|Could not override|Could not append", message):
        fix = "check the key's spelling (repdegen describe <overrides> prints the whole config)"
        # Hydra's "To append to your config use +key=value" would add a key no code reads (and a schema section
        # refuses it), "... default list use +group=option" a group this command does not have: never offered
        message = re.sub(r"\.? ?;? ?To append to your (config|default list) use \+[^;\s]+", "", message)
        near = _nearest_fields(message)
        if near:
            fix = f"did you mean {' or '.join(near)}? " + fix
        elif "No match in the defaults list" in message:
            group = re.search(r"Could not override '([^']+)'", message)
            what = f"'{group.group(1)}'" if group else "that group"
            fix = f"this command has no config group {what}: leave it out (the command's --help lists its settings)"
    elif re.search(r"no viable alternative|mismatched input|extraneous input|token recognition error", message):
        fix = ("quote a value that holds '=', ',', brackets or spaces, e.g. 'key=\"a=b\"' or "
               "overrides='[\"trainer.device=cpu\"]' (https://hydra.cc/docs/advanced/override_grammar/basic)")
    elif "could not be converted" in message or "Invalid value" in message:
        fix = "give a value of the expected type"
    else:
        fix = "fix that argument on the command line"
    return f"{message}; {fix}"


def _nearest_fields(message: str) -> list[str]:
    """For Hydra's "Key 'k' not in 'SomeConfig'" (with "full_key: a.b.k" before it): the fields of that schema nearest
    to k, as full keys; [] when the schema is not one of ours."""
    import dataclasses
    import difflib

    m = re.search(r"Key '([^']+)' not in '(\w+)'", message)
    if not m:
        return []
    key, name = m.groups()
    kind = None
    # the schema among the modules already loaded (the entry point has imported the configs, models and objectives;
    # importing them here would make this bottom-floor module depend on them)
    schemas = [getattr(m, name, None) for k, m in list(sys.modules.items()) if k.split(".")[0] == "repdegen" and m]
    kind = next((c for c in schemas if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__name__ == name),
                None)
    if kind is None:
        return []
    full = re.search(r"(?:Could not override|Could not append to config\. An item is already at) '([^']+)'", message)
    prefix = full.group(1).rsplit(".", 1)[0] + "." if full and "." in full.group(1) else ""
    names = sorted(f.name for f in dataclasses.fields(kind))
    return [prefix + n for n in difflib.get_close_matches(key, names, n=2, cutoff=0.6)]


# Hydra's command-line flags (hydra/_internal/utils.py get_args_parser): those that take a value, and the others
HYDRA_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun", "--info", "-i"}
HYDRA_FLAGS = HYDRA_VALUE_FLAGS | {"--help", "-h", "--hydra-help", "--version", "--resolve", "--run", "-r",
                                   "--multirun", "-m", "--shell-completion", "-sc"}


def check_flags(argv: list[str]) -> None:
    """An option Hydra does not know (``--bogus``, ``--max-epochs 3``) as one ``repdegen: error:`` line, exit status 2,
    instead of argparse's usage block: the entry points take ``key=value`` overrides and Hydra's flags."""
    expect_value = False
    for arg in argv:
        if expect_value:
            expect_value = False
            if not arg.startswith("-") or arg in ("-", "--"):
                continue
        name = arg.split("=", 1)[0]
        if arg.startswith("-") and name not in HYDRA_FLAGS:
            print(f"repdegen: error: unknown option {arg!r}: the entry points take key=value overrides (e.g. "
                  f"trainer.max_epochs=3, not --max-epochs 3) and Hydra's flags (--help, --cfg job, -m ...); see "
                  f"python -m {_entry_name()} --help", file=sys.stderr, flush=True)
            sys.exit(EXIT_USER_ERROR)
        expect_value = name in HYDRA_VALUE_FLAGS and "=" not in arg and name not in ("--info", "-i")


def _entry_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None and spec.name else "reproduce.<entry point>"


def install_hydra_error_handler() -> None:
    """Make Hydra's errors before an entry point starts (composition, override grammar, an unknown option) one
    ``repdegen: error:`` line and exit status 2, like every other user error. Errors raised after the
    entry point started keep Hydra's report (exit status 1). ``HYDRA_FULL_ERROR=1`` shows everything."""
    check_flags(sys.argv[1:])
    try:
        import hydra._internal.utils as hydra_utils
    except ImportError:  # pragma: no cover
        return
    original = getattr(hydra_utils, "run_and_report", None)
    if original is None or getattr(original, "_repdegen", False):
        return

    def run_and_report(func):
        try:
            return func()
        except Exception as ex:
            if _TASK_STARTED or os.environ.get("HYDRA_FULL_ERROR") == "1":
                return original(_reraise(ex))
            user = as_user_error(ex)
            message = str(user) if user is not None else condense_hydra_error(ex)
            print(f"repdegen: error: {message}", file=sys.stderr, flush=True)
            sys.exit(EXIT_USER_ERROR)

    run_and_report._repdegen = True
    hydra_utils.run_and_report = run_and_report


def _reraise(ex: BaseException):
    def func():
        raise ex

    return func


FAILURE_NOTE = "failure.json"  # in a Hydra job's folder: why a job of a sweep that raised failed (repdegen.reproduce.runs.sweeps)


def write_failure_note(job_dir, error: BaseException) -> None:
    """``failure.json`` in a job folder: the error a job raised, for ``repdegen.reproduce.runs.sweeps`` to say why it failed."""
    from pathlib import Path

    from repdegen.core.files import atomic_write_json

    atomic_write_json(Path(job_dir) / FAILURE_NOTE, {"status": "failed", "error": f"{type(error).__name__}: {error}"})
