"""``python -m reproduce.report [--check]``: gather the committed renderings under ``results/`` into
``results/README.md``. The work is :mod:`reproduce.results.report`."""

import sys

from reproduce.results.report import main

if __name__ == "__main__":
    sys.exit(main())
