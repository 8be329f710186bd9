"""The entry points (``python -m reproduce.<name>``: train, table, describe, analyze, translate, report, aggregate)
and the exit statuses they share (``reproduce.errors``). The work is split by role into four packages: ``spec`` (a
run's config), ``engine`` (training one run), ``runs`` (many cells: ledger, launch, tables, sweeps) and ``results``
(claims, rendering, report)."""
