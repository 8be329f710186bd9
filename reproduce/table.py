"""``repdegen table table=<name>[,<name>...|all] scale=<smoke|lite|paper> [overrides]``: regenerate paper
tables (run the cells missing from the ledger, then render). The work is :mod:`repdegen.reproduce.runs.tables`; ``--help`` is
``conf/hydra/help/table.yaml``."""

import sys

from repdegen.reproduce.runs.tables import main, parse_table_names, split_cell_args


def refuse_partial_cfg(argv: list[str]) -> None:
    """``--cfg job`` is Hydra's composition of the table app: of the first table only, without the arguments that go to
    the cells (:func:`repdegen.reproduce.runs.tables.split_cell_args`). When those would be left out, one line and exit 2."""
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
