"""``python -m reproduce.aggregate <sweep dir>... [--out DIR] [--metrics a,b]``: aggregate a sweep (a Hydra
multirun) into a table and one plot per metric. The work is :mod:`reproduce.runs.sweeps`."""

from reproduce.runs.sweeps import main

if __name__ == "__main__":
    main()
