"""``repdegen status [--scale S] [--all] [--json]``: the runs of the ledger that are training, stopped
part-way or failed, with their progress. The work is :mod:`repdegen.reproduce.runs.status`."""

import sys

from repdegen.reproduce.runs.status import main


def cli() -> None:
    """``repdegen status``: this command's entry (``python -m repdegen.reproduce.status`` runs the same)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
