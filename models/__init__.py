"""Model registry: ``build_model(cfg.model, vocab_size, tie_weights)``.

Each architecture registers a config dataclass (stored in Hydra's ConfigStore as
``model/schema_<arch>``) and a class. YAML files in ``conf/model/`` pick a schema in their defaults
list and set the sizes of one paper model.
"""

from __future__ import annotations

from typing import Any

from repdegen.core.registry import Registry, import_submodules

MODELS = Registry("model", "arch")
register_model = MODELS.register


def validate_model(model_cfg: Any) -> None:
    MODELS.entry(model_cfg)[0].validate_config(model_cfg)


def resolve_tie(model_cfg: Any, objective_cfg: Any) -> bool:
    """The objective may force tying (``re``, ``real``); otherwise the model's default holds."""
    tie = objective_cfg.get("tie_weights") if objective_cfg is not None else None
    return bool(model_cfg.tie_weights) if tie is None else bool(tie)


def build_model(model_cfg: Any, vocab_size: int, tie_weights: bool | None = None):
    """Instantiate ``model_cfg`` for a vocabulary of ``vocab_size`` types.

    ``tie_weights`` overrides the config's own flag (the objective decides, see ``resolve_tie``). A
    model whose embedding size differs from its last hidden size cannot be tied: that is a
    ConfigError, not a shape crash.
    """
    model_cls = MODELS.entry(model_cfg)[0]
    model_cfg = MODELS.to_object(model_cfg)
    tie = model_cfg.tie_weights if tie_weights is None else tie_weights
    model_cls.check_tie(model_cfg, tie)
    return model_cls(model_cfg, vocab_size, tie)


import_submodules(__name__, __path__)  # every module here registers its architectures
