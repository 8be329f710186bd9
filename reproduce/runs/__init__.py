"""Running many cells: the run ledger, launching cells (local processes, torchrun, SLURM), the paper tables as cells,
sweeps and their aggregation, pre-registration, and the provenance every result records."""
