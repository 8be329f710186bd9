"""``python -m reproduce.table table=<name>[,<name>...|all] scale=<smoke|lite|paper> [overrides]``: regenerate paper
tables (run the cells missing from the ledger, then render). The work is :mod:`reproduce.runs.tables`."""

from reproduce.runs.tables import main

if __name__ == "__main__":
    main()
