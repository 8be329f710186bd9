"""One registry pattern for models and objectives: a name maps to a class and its config dataclass,
and the dataclass is stored in Hydra's ConfigStore as ``<group>/schema_<name>``, which the YAML
options of that group extend."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from repdegen.core.errors import ConfigError


class Registry:
    def __init__(self, group: str, key: str):
        self.group = group  # config group, e.g. "model"
        self.key = key  # the config field that names the entry, e.g. "arch"
        self._entries: dict[str, tuple[type, type]] = {}

    def register(self, name: str, config_cls: type) -> Callable[[type], type]:
        def wrap(cls: type) -> type:
            self._entries[name] = (cls, config_cls)
            ConfigStore.instance().store(group=self.group, name=f"schema_{name}", node=config_cls)
            return cls

        return wrap

    def names(self) -> list[str]:
        return sorted(self._entries)

    def classes(self) -> list[type]:
        """The registered classes, in name order."""
        return [self._entries[n][0] for n in self.names()]

    def entry(self, cfg: Any) -> tuple[type, type]:
        name = cfg[self.key] if isinstance(cfg, DictConfig) else getattr(cfg, self.key)
        if name not in self._entries:
            raise ConfigError(f"{self.group}.{self.key}={name!r} is not one of {', '.join(self.names())}")
        return self._entries[name]

    def to_object(self, cfg: Any) -> Any:
        """The config as an instance of its dataclass (a DictConfig is validated against the schema)."""
        config_cls = self.entry(cfg)[1]
        if isinstance(cfg, DictConfig):
            return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(config_cls), cfg))
        return cfg


def import_submodules(package: str, path: Iterable[str]) -> None:
    """Import every module of a package (its registrations run): a new objective or model is one file, no list
    to keep."""
    for info in sorted(pkgutil.iter_modules(list(path)), key=lambda m: m.name):
        if not info.ispkg:  # a subpackage (losses/hf: repdegen.hf) is its own namespace, imported when asked for
            importlib.import_module(f"{package}.{info.name}")


PLUGINS_ENV = "REPDEGEN_PLUGINS"
_LOADED_PLUGINS: set[str] = set()


def load_plugins(spec: str | None = None) -> list[str]:
    """Import the modules named in ``spec`` (default: the ``REPDEGEN_PLUGINS`` environment variable), separated by
    ``os.pathsep`` or commas: a ``.py`` file path or a dotted module name. Their ``@register_objective`` /
    ``@register_model`` decorators run, so their configs compose like ours (their YAML folder goes on Hydra's
    search path: ``hydra.searchpath=[file:///path/to/conf]``). Returns the entries imported now."""
    spec = os.environ.get(PLUGINS_ENV, "") if spec is None else spec
    done = []
    for entry in [e.strip() for part in spec.split(os.pathsep) for e in part.split(",") if e.strip()]:
        if entry in _LOADED_PLUGINS:
            continue
        try:
            if entry.endswith(".py"):
                path = Path(entry).expanduser().resolve()
                if not path.is_file():
                    raise FileNotFoundError(f"{path} does not exist")
                name = f"repdegen_plugin_{path.stem}"
                module_spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[name] = module
                module_spec.loader.exec_module(module)
            else:
                importlib.import_module(entry)
        except (ImportError, FileNotFoundError) as err:
            raise ConfigError(f"{PLUGINS_ENV} entry {entry!r} cannot be imported ({err}); expected a .py file or a "
                              f"module on the Python path, e.g. {PLUGINS_ENV}=/path/to/my_objective.py") from None
        _LOADED_PLUGINS.add(entry)
        done.append(entry)
    return done
