"""The floor every package stands on, importing nothing of ours: error types (`core.errors`), the registry of
models and objectives (`core.registry`) and atomic file writes (`core.files`). `models`, `losses`, `data` and
`analysis` import it and each other; `reproduce` (the entrypoints and orchestration) imports them all, and
nothing imports `reproduce`."""
