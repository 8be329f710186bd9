"""``repdegen table table=<name>[,<name>...|all] scale=<smoke|lite|paper> [overrides]``: regenerate paper
tables (run the cells missing from the ledger, then render). This module reads the command line; the work is
:mod:`repdegen.reproduce.runs.tables` (running), :mod:`repdegen.reproduce.runs.cells` (the cells) and
:mod:`repdegen.reproduce.results.table_render` (collecting and rendering); ``--help`` is
``conf/hydra/help/table.yaml``."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig
from repdegen.reproduce.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USER_ERROR,
    ConfigError,
    exit_on_user_error,
    report_user_error,
)
from repdegen.reproduce.runs.cells import parse_table_names
from repdegen.reproduce.runs.tables import run_tables
from repdegen.reproduce.settings.config import CONF_DIR

CELL_KEYS = ("model", "dataset", "objective", "optim", "trainer", "logger", "seed")


def split_list(text: str) -> list[str]:
    """``a=1,b=[2,3],"c=d"`` -> ``['a=1', 'b=[2,3]', 'c=d']``: split at the commas outside brackets and
    quotes, and unquote quoted items."""
    items, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        cur += ch
    items.append(cur)
    out = []
    for item in (i.strip() for i in items):
        if len(item) >= 2 and item[0] == item[-1] and item[0] in "'\"":
            item = item[1:-1]
        if item:
            out.append(item)
    return out


def overrides_arg(arg: str) -> list[str] | None:
    """The training overrides of an ``overrides=[k=v,...]`` argument (the syntax ``conf/table_app.yaml``
    documents, which Hydra's grammar rejects unquoted); None for any other argument."""
    name, eq, value = arg.partition("=")
    if not eq or name.lstrip("+") != "overrides":
        return None
    value = value.strip()
    if not (value.startswith("[") and value.endswith("]")):
        return None
    return split_list(value[1:-1])


def split_cell_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split command-line overrides into the table app's own and those for every cell; a scale field
    (``scale.max_epochs=3``) goes to both, since the cells compose their own copy of the scale, and so does
    ``hydra.searchpath`` (a user's config folder: their tables, objectives, presets).
    ``overrides=[trainer.device=cpu,seed=2]`` (quoted or not) gives its items to every cell."""
    own, cell = [], []
    for arg in argv:
        listed = overrides_arg(arg)
        if listed is not None:
            cell.extend(listed)
            continue
        dotted = arg.lstrip("+~").split("=", 1)[0]
        key = dotted.split(".")[0]
        if key in CELL_KEYS:
            cell.append(arg)
        elif (key == "scale" and "." in dotted) or dotted == "hydra.searchpath":  # the cells compose with them too
            own.append(arg)
            cell.append(arg)
        else:
            own.append(arg)
    return own, cell


def searchpath_dirs(args: list[str]) -> list[Path]:
    """The config folders a ``hydra.searchpath=[file:///path/conf,...]`` argument adds: where a user's own tables
    (``<folder>/table/<name>.yaml``), objectives and presets live."""
    dirs = []
    for arg in args:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "hydra.searchpath":
            dirs += [Path(item[len("file://"):]) for item in split_list(value.strip().strip("[]"))
                     if item.startswith("file://")]
    return dirs


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def compose_table_apps(app: DictConfig, names: list[str]) -> list[DictConfig]:
    """The app of every table asked for (``names``): the one Hydra composed, and the others composed with the
    same command-line overrides."""
    from hydra.core.hydra_config import HydraConfig

    apps = [app]
    task = [o for o in HydraConfig.get().overrides.task if not o.startswith("table=")]
    for name in names[1:]:
        other = hydra.compose(config_name="table_app", overrides=[*task, f"table={name}"])
        other.overrides = list(app.overrides)
        apps.append(other)
    return apps


def main() -> None:
    """The arguments read once: the table app's own (Hydra's: ``table=``, ``scale=``, ``launch.*``, ``hydra/...``) and
    those for every cell (:func:`split_cell_args`); ``table=all`` or a list is Hydra's first table and ours after."""
    argv = list(sys.argv)
    own, cell = split_cell_args(argv[1:])
    names: list[str] = []
    for k, arg in enumerate(own):
        if arg.startswith("table="):
            try:
                names = parse_table_names(arg.split("=", 1)[1], searchpath_dirs(own))
            except ConfigError as err:
                report_user_error(err)
                sys.exit(EXIT_USER_ERROR)
            own[k] = f"table={names[0]}"

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="table_app")
    def task(app: DictConfig) -> None:
        sys.argv[:] = argv  # Hydra has read its own; the records name the command as it was typed
        app.overrides = [*app.overrides, *cell]
        failed = exit_on_user_error(lambda a: run_tables(compose_table_apps(a, names or [a.table.name])))(app)
        if failed:
            sys.exit(EXIT_FAILED)

    sys.argv[1:] = own
    # Ctrl-C and SIGTERM stop the cells gracefully (each checkpoints first), even when this process
    # was started with SIGINT ignored (a background job of a non-interactive shell)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    from repdegen.reproduce.errors import install_hydra_error_handler

    install_hydra_error_handler()
    try:
        task()
    except KeyboardInterrupt:
        print("repdegen: interrupted; finished cells are in the ledger, and the same command continues the rest",
              file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)




def refuse_partial_cfg(argv: list[str]) -> None:
    """``--cfg job`` is Hydra's composition of the table app: of the first table only, without the arguments that go to
    the cells (:func:`split_cell_args`). When those would be left out, one line and exit 2."""
    from repdegen.reproduce.cli import cfg_request
    from repdegen.reproduce.errors import EXIT_USER_ERROR, ConfigError, report_user_error

    own, cell = split_cell_args(argv[1:])
    if cfg_request(["", *own]) is None:
        return
    tables = []
    for arg in own:
        if arg.startswith("table="):
            try:
                tables = parse_table_names(arg.split("=", 1)[1])
            except ConfigError:
                return  # main reports it
    if len(tables) > 1 or [c for c in cell if c not in own]:
        report_user_error(ConfigError(
            "--cfg job prints one table's own config, without the overrides for its cells; give one table and no "
            "training overrides, or print a cell's config: repdegen describe table=<name> row=<row label> "
            "scale=<scale> <overrides>"))
        sys.exit(EXIT_USER_ERROR)


def cli() -> None:
    """``repdegen table``: this command's entry (``python -m repdegen.reproduce.table`` runs the same)."""
    from repdegen.reproduce.cli import use_app_help

    use_app_help("table")  # --help: conf/hydra/help/table.yaml
    refuse_partial_cfg(sys.argv)
    main()


if __name__ == "__main__":
    cli()
