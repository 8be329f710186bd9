"""``python -m reproduce.status [--scale S] [--all] [--json]``: the runs of the ledger that are training, stopped
part-way or failed, with their progress. The work is :mod:`reproduce.runs.status`."""

import sys

from reproduce.runs.status import main

if __name__ == "__main__":
    sys.exit(main())
