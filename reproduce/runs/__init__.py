"""Running cells: one run end to end (``execute``: train a spec in the ledger, locked and resumable), the run ledger,
launching cells (local processes, torchrun, SLURM), the paper tables as cells, sweeps and their aggregation,
pre-registration, and the provenance every result records."""
