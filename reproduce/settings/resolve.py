"""A run's resolved config, once: :func:`resolve` turns overrides (an experiment preset, the scale, a table row, the
command line) into a frozen :class:`RunSpec` -- one Hydra composition, finalized: the read-only config, its hash,
the group choices, and what it was composed from. Every consumer starts from one:
``repdegen.reproduce.train`` (its Hydra app's overrides), a table's cells (``repdegen.reproduce.runs.tables``),
``repdegen.reproduce.describe``,
the golden-config check; a cell's process reads the spec its table wrote (:func:`read_cell`) and trains it without
composing or finalizing again.

    from repdegen.reproduce.settings.resolve import resolve
    spec = resolve(["experiment=inan2017/small", "objective=real", "scale=lite"])
    spec.config_hash, spec.choices["model"], spec.cfg.optim.lr, spec.preset   # experiment_scale=inan2017/small/lite
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from omegaconf import DictConfig, OmegaConf
from repdegen.core.errors import CorruptFile
from repdegen.reproduce.settings.config import (
    CONF_DIR,
    compose_with_choices,
    config_hash,
    experiment_scale,
    finalize,
    register_all,
)
from repdegen.reproduce.settings.schema import Config


@dataclass(frozen=True)
class RunSpec:
    cfg: DictConfig  # finalized and read-only: what the run trains and its result.json records
    config_hash: str
    overrides: tuple[str, ...] = ()  # what it was composed with: the experiment's scale option, then the given ones
    preset: tuple[str, ...] = ()  # the part of ``overrides`` added to the given ones (experiment_scale=...)
    choices: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # group -> option

    def sources(self) -> dict:
        """Where each key's value came from (``repdegen describe ... sources=true``)."""
        from repdegen.reproduce.settings.sources import compose_with_sources

        with _hydra_initialized():
            return compose_with_sources(list(self.overrides[len(self.preset):]))[1]


# Hydra composes in two steps: the defaults tree (the group choices: experiment, model, scale, budget, ...), then the
# value overrides (`seed=1`, `paths.runs_dir=...`, `objective.alpha=30`) applied to the merged config
# (hydra._internal.config_loader_impl: `_apply_overrides_to_config`). A table's cells, its seeds and the rows several
# tables share differ in their values only, so a caller that composes many (a table's expansion) passes a ``memo``:
# the first step is kept there once per set of group overrides and the second is Hydra's own function applied to a
# copy, the same config (tests/golden) and the same errors. The memo lives as long as that one call.
def _compose_memo(overrides: list[str], config_name: str, memo: dict | None) -> DictConfig:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if memo is None:
        return compose_with_choices(overrides, config_name)
    repo = getattr(GlobalHydra.instance().config_loader(), "repository", None)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # Hydra's own composition reports a bad override, in its words
        return compose_with_choices(overrides, config_name)
    if repo is None or any(o.is_sweep_override() for o in parsed):
        return compose_with_choices(overrides, config_name)
    # what Hydra's defaults list treats as a value (hydra._internal.defaults_list.Overrides): not a config group, or
    # a dict; Hydra's own settings (hydra.searchpath: where a user's configs are found) belong with the groups
    values = [not o.is_hydra_override() and (not repo.group_exists(o.key_or_group) or isinstance(o.value(), dict))
              for o in parsed]
    groups = [line for line, v in zip(overrides, values) if not v]
    key = (config_name, tuple(groups))
    if key not in memo:
        memo[key] = compose_with_choices(groups, config_name)
    cfg = copy.deepcopy(memo[key])
    ConfigLoaderImpl._apply_overrides_to_config([o for o, v in zip(parsed, values) if v], cfg)
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


def compose(overrides: Sequence[str], config_name: str = "config", composed: DictConfig | None = None,
            memo: dict | None = None) -> tuple[DictConfig, list[str], list[str]]:
    """The composed (not yet finalized) config of ``overrides``, the overrides it was composed with, and the part
    added to them (the experiment's scale option, :func:`~repdegen.reproduce.settings.config.experiment_scale`).
    ``composed``: the composition of ``overrides`` when the caller has it already (a Hydra app's own config, which
    honours the app's ``hydra.searchpath``), used when nothing was added. ``memo``: see :func:`_compose_memo`."""
    given = list(overrides)
    with _hydra_initialized():
        full = experiment_scale(given)
        cfg = composed if composed is not None and full == given else _compose_memo(full, config_name, memo)
    return cfg, full, full[: len(full) - len(given)]


def resolve(overrides: Sequence[str], config_name: str = "config", composed: DictConfig | None = None,
            memo: dict | None = None) -> RunSpec:
    """THE resolution of a run: compose once, finalize (scale, domains, checks), hash."""
    cfg, composed_with, added = compose(overrides, config_name, composed, memo)
    # a composition of this call is finalized in place; the caller's own (``composed``) is copied first
    return from_config(cfg, composed_with, added, owned=cfg is not composed)


def from_config(cfg: DictConfig, overrides: Sequence[str] = (), preset: Sequence[str] = (),
                owned: bool = False) -> RunSpec:
    """The spec of a config composed elsewhere (a test's own composition), finalized here; a read-only config is a
    finalized one (what :func:`~repdegen.reproduce.settings.config.finalize` returns) and is taken as it is.
    ``owned``: no one else holds ``cfg``, so it is finalized in place."""
    cfg = cfg if OmegaConf.is_readonly(cfg) else finalize(cfg, copy_first=not owned)
    return RunSpec(cfg, config_hash(cfg), tuple(overrides), tuple(preset),
                   MappingProxyType(dict(cfg.get("choices") or {})))


def as_spec(run: RunSpec | DictConfig) -> RunSpec:
    return run if isinstance(run, RunSpec) else from_config(run)


# ---- a table cell's spec on disk: <runs_dir>/<hash>/cell.yaml ------------------------------------------------
def write_cell(spec: RunSpec, runs_dir: str | Path) -> Path:
    """``<runs_dir>/<hash>/cell.yaml``: the finalized config a cell's process trains (resuming)."""
    from repdegen.core.files import atomic_write_bytes

    path = Path(runs_dir) / spec.config_hash / "cell.yaml"
    container = OmegaConf.to_container(spec.cfg, resolve=True)
    container.setdefault("trainer", {})["resume"] = True
    atomic_write_bytes(path, lambda f: f.write(OmegaConf.to_yaml(OmegaConf.create(container)).encode()))
    return path


# keys of the config that cell.yaml files written by earlier versions hold: a flag and the presets' former sections
# (objectives:, scales:; now conf/experiment_objective/ and conf/experiment_scale/), none of them in the hash
LEGACY_CELL_KEYS = ("_finalized", "objectives", "scales")


def read_cell(path: str | Path) -> RunSpec:
    """The spec a table wrote to ``path``: its config on the current schema (fields added to the code since it was
    written take their defaults, which leave the experiment and its hash unchanged), not composed or finalized again.
    Its hash must be the one its directory is named by: an edited cell.yaml is another experiment."""
    from repdegen.core.loaders import load_cell_yaml

    path = Path(path)
    base = OmegaConf.structured(Config)
    OmegaConf.set_struct(base, False)
    written = load_cell_yaml(path)
    for key in LEGACY_CELL_KEYS:  # left out of the hash; cell.yaml files written before they were removed hold them
        written.pop(key, None)
    cfg = OmegaConf.merge(base, written)  # its schema checked, the file named when it is bad
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
    """What ``repdegen.reproduce.runs.sweeps`` needs to find a multirun job's run in the ledger without composing its
    overrides again: the hash, the ledger folder (absolute) and the overrides it was composed with."""
    from repdegen.core.files import atomic_write_json

    atomic_write_json(Path(job_dir) / JOB_SPEC, {"config_hash": spec.config_hash,
                                                 "runs_dir": str(Path(spec.cfg.paths.runs_dir).resolve()),
                                                 "overrides": list(spec.overrides)})
