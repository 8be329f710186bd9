"""The entry points (``python -m reproduce.<name>``: train, table, describe, analyze, translate, report, aggregate)
and the exit statuses they share (``reproduce.errors``). The work is split by role into four packages: ``settings``
(a run's config resolved once into a RunSpec), ``engine`` (training one run), ``runs`` (many cells: ledger, launch,
tables, sweeps, the file loaders) and ``results`` (metrics registry, claims, rendering, report)."""
