"""The entry points (``repdegen <name>``, or ``python -m repdegen.reproduce.<name>``: train, table, describe, analyze,
translate, report, status, aggregate; the command list in :mod:`repdegen.reproduce.cli`)
and the exit statuses they share (``repdegen.reproduce.errors``). The work is split by role into four packages: ``settings``
(a run's config resolved once into a RunSpec), ``engine`` (training one run), ``runs`` (many cells: ledger, launch,
tables, sweeps, the file loaders) and ``results`` (metrics registry, claims, rendering, report)."""
