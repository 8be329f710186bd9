"""Dataset kinds as a registry, like models and objectives: ``dataset.kind`` names an entry, and the entry says how
to load such a corpus, whether it needs an encoder-decoder model, how its batches shard over DDP ranks, and which
combinations of its config cannot work (checked when the config is resolved, before any data is read).

A new kind is one :func:`register_kind` call beside its loader (``data/corpus.py`` registers ``lm``,
``data/translation.py`` ``translation``) and one task class in ``reproduce/engine/tasks.py``
(``@task_for_kind(<name>)``); nothing else branches on the kind's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from repdegen.core.errors import ConfigError


@dataclass(frozen=True)
class DatasetKind:
    name: str
    load: Callable  # (dataset_cfg, cache_dir=None, verbose=True) -> the corpus
    seq2seq: bool  # needs an encoder-decoder model (and an encoder-decoder model needs such a kind)
    shards_columns: bool  # batches are BPTT columns that DDP splits over the ranks (trainer.batch_size % world == 0)
    checks: tuple[Callable, ...] = field(default=())  # (dataset_cfg) -> None or a ConfigError


_KINDS: dict[str, DatasetKind] = {}


def register_kind(name: str, load: Callable, *, seq2seq: bool, shards_columns: bool,
                  checks: tuple[Callable, ...] = ()) -> DatasetKind:
    kind = DatasetKind(name, load, seq2seq, shards_columns, tuple(checks))
    _KINDS[name] = kind
    return kind


def names() -> tuple[str, ...]:
    return tuple(sorted(_KINDS))


def get(name: str) -> DatasetKind:
    if name not in _KINDS:
        raise ConfigError(f"dataset.kind={name!r} is not one of {', '.join(names())}; a new kind registers itself with "
                          f"repdegen.data.kinds.register_kind beside its loader")
    return _KINDS[name]


def check(dataset_cfg) -> None:
    """The kind's own combinations that cannot work (a ConfigError naming the value and the fix)."""
    for fn in get(dataset_cfg.kind).checks:
        fn(dataset_cfg)


def load(dataset_cfg, cache_dir=None, verbose: bool = True):
    """The corpus ``dataset_cfg`` describes, by its kind's loader."""
    return get(dataset_cfg.kind).load(dataset_cfg, cache_dir, verbose=verbose)
