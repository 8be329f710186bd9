"""Where each value of a run's config comes from: the config files Hydra merged (in its defaults-list order: the
experiment preset and its files for the run's objective and scale among them), the command line or a table row's
overrides, and the scale's width multiplier ``repdegen.reproduce.settings.config.finalize`` applies in Python.

    repdegen describe table=yu2022_t7 row=AGG scale=lite          # one table cell
    repdegen describe experiment=gao2019/awd_lstm_wt2 objective=cosreg scale=lite sources=true

Each line is ``key: value  # source``; a key set by several layers names the last one and, in brackets, the
layers it overrode (``trainer.max_updates: 700  # conf/budget/mt_lite.yaml  [over: conf/experiment/...]``).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

_MISSING = object()


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaf values (lists are leaves; ``defaults`` lists are dropped)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k == "defaults" and isinstance(v, list):
                continue
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


def _container(cfg: DictConfig, resolve: bool) -> dict:
    return OmegaConf.to_container(cfg, resolve=resolve, throw_on_missing=False)


def _file_label(default) -> str:
    """``conf/<path>.yaml`` for a file, ``schema default (<path>)`` for a dataclass in the ConfigStore."""
    from repdegen.reproduce.settings.config import CONF_DIR

    path = default.config_path or "?"
    return f"conf/{path}.yaml" if (CONF_DIR / f"{path}.yaml").is_file() else f"schema default ({path})"


def compose_with_sources(overrides: list[str], config_name: str = "config") -> tuple[DictConfig, dict[str, list[str]]]:
    """The finalized config ``repdegen.reproduce.train <overrides>`` runs, and for each dotted key the layers that set it,
    first to last (Hydra must be initialized, e.g. inside ``initialize_config_dir``)."""
    from hydra._internal.defaults_list import create_defaults_list
    from hydra.core.global_hydra import GlobalHydra
    from repdegen.reproduce.settings.config import compose_with_choices, experiment_scale, finalize

    overrides = experiment_scale(list(overrides))
    loader = GlobalHydra.instance().config_loader()
    parsed, repo = loader._parse_overrides_and_create_caching_repo(config_name, overrides)
    defaults = create_defaults_list(repo=repo, config_name=config_name, overrides_list=parsed, prepend_hydra=True,
                                    skip_missing=False)
    history: dict[str, list[tuple[str, Any]]] = {}
    merged = OmegaConf.create()
    before: dict[str, Any] = {}
    for default in defaults.defaults:
        loaded = loader._load_single_config(default=default, repo=repo)
        merged.merge_with(loaded.config)
        now = flatten(_container(merged, resolve=False))
        label = _file_label(default)
        for key, value in now.items():
            if not key.startswith("hydra.") and before.get(key, _MISSING) != value:
                history.setdefault(key, []).append((label, value))
        before = now

    # the overrides that set values (key=value, +key=value), after every file, in the order given
    composed = compose_with_choices(overrides, config_name)
    for override in defaults.config_overrides:
        key = override.key_or_group.lstrip("+~")
        value = OmegaConf.select(composed, key, default=None)
        label = f"override {override.input_line}"
        for leaf, v in flatten(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value, key).items():
            history.setdefault(leaf, []).append((label, v))

    unresolved = flatten(_container(composed, resolve=False))
    cfg = finalize(composed)
    resolved_before = flatten(_container(composed, resolve=True))
    final = flatten(_container(cfg, resolve=True))
    for key, value in final.items():
        if key in resolved_before and resolved_before[key] == value:
            continue
        if key.startswith("model.") and cfg.scale.width_mult != 1.0:
            why = f"scale.width_mult={cfg.scale.width_mult} (min width {cfg.scale.min_width})"
        else:
            why = "finalize (reproduce/settings/config.py)"
        history.setdefault(key, []).append((why, value))
    sources: dict[str, list[str]] = {}
    for key in final:
        steps = history.get(key, [])
        text = unresolved.get(key)
        interp = f" = {text}" if isinstance(text, str) and "${" in text else ""
        sources[key] = [f"{label}{interp if i == len(steps) - 1 else ''}" for i, (label, _) in enumerate(steps)]
        sources[key] = sources[key] or ["set in Python (reproduce/settings/config.py finalize)"]
    return cfg, sources


def format_sources(cfg: DictConfig, sources: dict[str, list[str]], keys: list[str] | None = None,
                   only_set: bool = False) -> str:
    """``key: value  # last source [earlier sources]``, one line a key, in the config's order."""
    final = flatten(_container(cfg, resolve=True))
    lines = []
    for key in keys or list(final):
        steps = sources.get(key, [])
        if only_set and all(s.startswith("schema default") for s in steps):
            continue
        last = steps[-1] if steps else "?"
        earlier = f"  [over: {'; '.join(reversed(steps[:-1]))}]" if len(steps) > 1 else ""
        lines.append(f"{key}: {_yaml_value(final[key])}  # {last}{earlier}")
    return "\n".join(lines)


def _yaml_value(value: Any) -> str:
    import json

    return "null" if value is None else json.dumps(value) if isinstance(value, (str, list, dict)) else str(value)
