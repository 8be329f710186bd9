"""The floor every package stands on, importing nothing of ours: error types (`core.errors`), the registry of
models and objectives (`core.registry`), atomic file writes (`core.files`), one checked loader per kind of file the
project reads (`core.loaders`) and the provenance every result records (`core.provenance`: commit, hardware, command
line). `models`, `losses`, `data` and `analysis` import it and each other; `reproduce` (the entrypoints and
orchestration) imports them all, and nothing imports `reproduce`."""
