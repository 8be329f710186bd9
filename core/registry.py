"""One registry pattern for models and objectives: a name maps to a class and its config dataclass,
and the dataclass is stored in Hydra's ConfigStore as ``<group>/schema_<name>``, which the YAML
options of that group extend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from core.errors import ConfigError


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
