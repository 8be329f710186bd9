"""The floor every package stands on, importing nothing of ours: error types (`repdegen.core.errors`), the registry of
models and objectives (`repdegen.core.registry`), atomic file writes (`repdegen.core.files`), one checked loader per kind of file
the
project reads (`repdegen.core.loaders`) and the provenance every result records (`repdegen.core.provenance`: commit, hardware,
command
line). `models`, `losses`, `data` and `analysis` import it and each other; `reproduce` (the entrypoints and
orchestration) imports them all, and nothing imports `reproduce`."""
