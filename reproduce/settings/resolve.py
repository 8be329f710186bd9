"""A run's resolved config, once: :func:`resolve` turns overrides (an experiment preset and its sections for the
objective and scale, the scale, a table row, the command line) into a frozen :class:`RunSpec` -- the finalized
read-only config, its hash, the group choices, and what it was composed from. Every consumer starts from one:
``reproduce.train`` (its Hydra app's overrides), a table's cells (``reproduce.runs.tables``), ``reproduce.describe``,
the golden-config check; a cell's process reads the spec its table wrote (:func:`read_cell`) and trains it without
composing or finalizing again.

    from reproduce.settings.resolve import resolve
    spec = resolve(["experiment=inan2017/small", "objective=real", "scale=lite"])
    spec.config_hash, spec.choices["model"], spec.cfg.optim.lr, spec.preset   # the preset's sections' overrides
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from omegaconf import DictConfig, OmegaConf

from core.errors import CorruptFile
from reproduce.settings.config import (
    CONF_DIR,
    Config,
    compose_preset,
    compose_with_choices,
    config_hash,
    finalize,
    register_all,
)


@dataclass(frozen=True)
class RunSpec:
    cfg: DictConfig  # finalized and read-only: what the run trains and its result.json records
    config_hash: str
    overrides: tuple[str, ...] = ()  # what it was composed with: the preset's sections first, then the given ones
    preset: tuple[str, ...] = ()  # the part of ``overrides`` the preset's sections added (the given ones win)
    choices: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # group -> option

    def sources(self) -> dict:
        """Where each key's value came from (``python -m reproduce.describe ... sources=true``)."""
        from reproduce.settings.sources import compose_with_sources

        with _hydra_initialized():
            return compose_with_sources(list(self.overrides[len(self.preset):]))[1]


# a table's cells differ by their seed: the composition of a row is kept once, and each other seed is that config with
# its `seed` set (what Hydra's `seed=<int>` override does, a plain value resolved later by finalize); keyed by Hydra's
# search path so that no composition is reused across config trees (tests/golden guards the equality)
_SEEDLESS: dict[tuple, DictConfig] = {}


def _compose_seeded(overrides: list[str], config_name: str) -> DictConfig:
    from hydra.core.global_hydra import GlobalHydra

    seeds = [o for o in overrides if o.split("=", 1)[0] == "seed"]
    value = seeds[0].split("=", 1)[1] if len(seeds) == 1 else ""
    if not value.isdigit():
        return compose_with_choices(overrides, config_name)
    where = str(GlobalHydra.instance().config_loader().get_sources())
    key = (where, config_name, tuple(o for o in overrides if o != seeds[0]))
    base = _SEEDLESS.get(key)
    if base is None:
        if len(_SEEDLESS) > 1024:
            _SEEDLESS.clear()
        cfg = compose_with_choices(overrides, config_name)
        _SEEDLESS[key] = copy.deepcopy(cfg)
        return cfg
    cfg = copy.deepcopy(base)
    cfg.seed = int(value)
    return cfg


@contextlib.contextmanager
def _hydra_initialized():
    """Hydra's composition as it is (inside an app, or a test's ``initialize_config_dir``), else initialized on the
    project's ``conf/`` for the call."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        yield
        return
    register_all()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield


def compose(overrides: Sequence[str], config_name: str = "config",
            composed: DictConfig | None = None) -> tuple[DictConfig, list[str], list[str]]:
    """The composed (not yet finalized) config of ``overrides``, the overrides it was composed with, and the part
    the preset's sections added. ``composed``: the composition of ``overrides`` when the caller has it already (a
    Hydra app's own config, which honours the app's ``hydra.searchpath``), used instead of composing them again."""
    given = list(overrides)

    def compose_fn(o: list[str]) -> DictConfig:
        if composed is not None and o == given:
            return composed
        return _compose_seeded(o, config_name)

    with _hydra_initialized():
        cfg, composed_with = compose_preset(compose_fn, given, cache=None if composed is not None else config_name)
    return cfg, composed_with, composed_with[: len(composed_with) - len(given)]


def resolve(overrides: Sequence[str], config_name: str = "config", composed: DictConfig | None = None) -> RunSpec:
    """THE resolution of a run: compose (with the preset's sections), finalize (scale, domains, checks), hash."""
    cfg, composed_with, preset = compose(overrides, config_name, composed)
    return from_config(cfg, composed_with, preset)


def from_config(cfg: DictConfig, overrides: Sequence[str] = (), preset: Sequence[str] = ()) -> RunSpec:
    """The spec of a config composed elsewhere (a test's own composition); finalized here if it is not yet."""
    cfg = finalize(cfg)
    return RunSpec(cfg, config_hash(cfg), tuple(overrides), tuple(preset),
                   MappingProxyType(dict(cfg.get("choices") or {})))


def as_spec(run: RunSpec | DictConfig) -> RunSpec:
    return run if isinstance(run, RunSpec) else from_config(run)


# ---- a table cell's spec on disk: <runs_dir>/<hash>/cell.yaml ------------------------------------------------
def write_cell(spec: RunSpec, runs_dir: str | Path) -> Path:
    """``<runs_dir>/<hash>/cell.yaml``: the finalized config a cell's process trains (resuming)."""
    from core.files import atomic_write_bytes

    path = Path(runs_dir) / spec.config_hash / "cell.yaml"
    container = OmegaConf.to_container(spec.cfg, resolve=True)
    container.setdefault("trainer", {})["resume"] = True
    atomic_write_bytes(path, lambda f: f.write(OmegaConf.to_yaml(OmegaConf.create(container)).encode()))
    return path


def read_cell(path: str | Path) -> RunSpec:
    """The spec a table wrote to ``path``: its config on the current schema (fields added to the code since it was
    written take their defaults, which leave the experiment and its hash unchanged), not composed or finalized again.
    Its hash must be the one its directory is named by: an edited cell.yaml is another experiment."""
    from core.loaders import load_cell_yaml

    path = Path(path)
    base = OmegaConf.structured(Config)
    OmegaConf.set_struct(base, False)
    cfg = OmegaConf.merge(base, load_cell_yaml(path))  # its schema checked, the file named when it is bad
    if not cfg.get("_finalized", False):
        raise CorruptFile(path, f"{path} is not a cell config written by reproduce.table (it was never finalized); "
                                f"run the table again to write it")
    OmegaConf.set_struct(cfg, True)
    OmegaConf.set_readonly(cfg, True)
    h = config_hash(cfg)
    if path.parent.name != h:
        raise CorruptFile(path, f"{path} holds the config of {h}, not of {path.parent.name} (the file was edited or "
                                f"copied); remove it and run the table again to write it")
    return RunSpec(cfg, h, choices=MappingProxyType(dict(cfg.get("choices") or {})))


# ---- a sweep job's spec: <job dir>/run_spec.json --------------------------------------------------------------
JOB_SPEC = "run_spec.json"


def record_job_spec(job_dir: str | Path, spec: RunSpec) -> None:
    """What ``reproduce.runs.sweeps`` needs to find a multirun job's run in the ledger without composing its
    overrides again: the hash, the ledger folder (absolute) and the overrides it was composed with."""
    from core.files import atomic_write_json

    atomic_write_json(Path(job_dir) / JOB_SPEC, {"config_hash": spec.config_hash,
                                                 "runs_dir": str(Path(spec.cfg.paths.runs_dir).resolve()),
                                                 "overrides": list(spec.overrides)})
