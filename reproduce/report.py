"""``repdegen report [--check]``: gather the committed renderings under ``results/`` into
``results/README.md``. The work is :mod:`repdegen.reproduce.results.report`."""

import sys

from repdegen.reproduce.results.report import main


def cli() -> None:
    """``repdegen report``: this command's entry (``python -m repdegen.reproduce.report`` runs the same)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
