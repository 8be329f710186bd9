"""A run's config from its composition to its hash. The schema (one dataclass per config group) is
:mod:`repdegen.reproduce.settings.schema`; this module registers it with the models' and the objectives' own.

The flow of one run: Hydra composes ``conf/config.yaml`` once (the experiment preset, its values for the objective
and at the scale are options of its defaults list; :func:`experiment_scale` names the last) -> :func:`finalize`
resolves interpolations, applies the scale's width multiplier, checks values that only make sense together, and
returns the read-only config whose :func:`config_hash` identifies the experiment in the ledger.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from repdegen.data import kinds as data_kinds
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.settings.domains import check_domains
from repdegen.reproduce.settings.schema import ScaleConfig, register_base_configs


def _conf_dir() -> Path:
    """The config folder: the package ``repdegen.conf`` (``conf/`` of a checkout, or the folder a wheel installs).
    A broken install that lacks it is a clear error naming where it looked, not Hydra's "config directory not found"."""
    import importlib.resources

    try:
        where = Path(str(importlib.resources.files("repdegen.conf")))
    except ModuleNotFoundError:
        where = Path(__file__).resolve().parents[2] / "conf"
    if not (where / "config.yaml").is_file():
        raise SystemExit(f"repdegen: error: the configs are not where the package keeps them: {where}/config.yaml does "
                         f"not exist (the package repdegen.conf of this install); reinstall repdegen "
                         f"(pip install --force-reinstall repdegen, or make install in a checkout)")
    return where


CONF_DIR = _conf_dir()


def window_start(seed, n_tokens, length) -> int:
    """``${window_start:${seed},N,L}`` in a config: the first token of a window of ``L`` contiguous tokens drawn
    uniformly from a split of ``N``, a pure function of the run's seed (Inan et al. 2017, Sec. 6.2: "a randomly chosen
    20,000 contiguous word sequence in the PTB training set", one per run)."""
    import numpy as np

    seed, n_tokens, length = int(seed), int(n_tokens), int(length)
    if not 0 < length <= n_tokens:
        raise ConfigError(f"window_start: a window of {length} tokens in a split of {n_tokens}: expected 0 < L <= N")
    return int(np.random.default_rng([seed, length]).integers(0, n_tokens - length + 1))


OmegaConf.register_new_resolver("window_start", window_start, replace=True)





_REGISTERED = False


def register_all() -> None:
    """Register every schema (ours, the models', the objectives') in the ConfigStore once."""
    global _REGISTERED
    if _REGISTERED:
        return
    register_base_configs()
    from repdegen import (
        losses,  # noqa: F401  (registers objective schemas)
        models,  # noqa: F401  (registers model schemas)
    )
    from repdegen.core.registry import load_plugins

    try:
        load_plugins()  # REPDEGEN_PLUGINS: objectives and models from outside the repository
    except ConfigError as err:  # at import of an entrypoint: one line and exit status 2, no traceback
        from repdegen.reproduce.errors import EXIT_USER_ERROR, report_user_error

        report_user_error(err)
        raise SystemExit(EXIT_USER_ERROR) from None

    _REGISTERED = True


# --------------------------------------------------------------------------------------------------
# finalize: resolve, scale, validate, hash
# --------------------------------------------------------------------------------------------------
# Keys that say where things live or how a run is driven, not what is computed: they are left out
# of the config hash, so the same experiment is found again from another machine or directory.
HASH_EXCLUDED = (
    "paths",
    "logger",
    "choices",
    "dataset.source",
    "dataset.data_dir",
    "dataset.disk_path",
    "dataset.text_files",
    "dataset.hub_name",
    "dataset.hub_config",
    "dataset.hub_revision",
    "dataset.hub_splits",
    "dataset.text_field",
    "dataset.local_dir",
    "dataset.files",
    "trainer.device",
    "trainer.resume",
    "trainer.progress",
    "trainer.log_interval",
    "trainer.stop_after_epochs",
    "trainer.stop_after_updates",
    "trainer.gpus",
    "trainer.compile",
    "trainer.compile_backend",
    "trainer.compile_mode",
    "scale.gpus",
    # how the output layer's loss is computed (row chunks, gradients formed in the forward): the same function up
    # to float summation order, like trainer.compile; the record keeps it (cell.yaml)
    "objective.chunk_rows",
)

VALID_CHOICES = {
    "optim.name": ("sgd", "adam", "ntasgd"),
    "optim.schedule": ("epoch", "inverse_sqrt"),
    "trainer.precision": ("fp32", "bf16", "auto"),
    "trainer.final_weights": ("best", "last"),
    "trainer.early_stopping_on": ("valid", "train"),
    "trainer.generation.length_penalty_form": ("fairseq", "gnmt"),
    "dataset.kind": data_kinds.names(),
    "dataset.tokenizer": ("word", "bpe", "byte_bpe"),
    "dataset.vocab_from": ("split", "slice"),
    "trainer.loss_reduction": ("mean", "sum_over_time"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.compile_mode": ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    "dataset.source": ("auto", "local", "hub", "disk", "text"),
    "logger.name": ("none", "wandb"),
    "logger.mode": ("offline", "online", "disabled"),
}


def _check_choice(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    value = OmegaConf.select(cfg, key)
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}; set {key}=<one of those>")


# the config key each scale field caps: min(the key's value, scale.<field>), or the field when the key is unset
# what each field of the scale's record stands for: conf/scale/<name>.yaml sets these keys (smoke, by interpolation
# from its record), so `scale.max_epochs=3 scale=smoke` reaches trainer.max_epochs; a record field changed where its
# scale file does not set the key would do nothing, which :func:`_check_scale_record` turns into an error
SCALE_FIELDS = {
    "max_epochs": "trainer.max_epochs",
    "finetune_epochs": "trainer.finetune_epochs",
    "train_tokens": "dataset.train_tokens",
    "eval_tokens": "dataset.eval_tokens",
    "train_pairs": "dataset.train_pairs",
    "eval_pairs": "dataset.eval_pairs",
    "cache_window": "trainer.cache.window",
    "warmup_updates": "optim.warmup_updates",
    "update_freq": "trainer.update_freq",
    "gpus": "trainer.gpus",
    "max_updates": "trainer.max_updates",
}


def _check_scale_record(cfg: DictConfig) -> None:
    """A field of ``scale`` changed (``scale.max_updates=3``) that its scale file does not pass on is an error naming
    the key to set instead; the record itself stays what the scale file says."""
    import yaml

    path = CONF_DIR / "scale" / f"{cfg.scale.name}.yaml"
    stated = ((yaml.safe_load(path.read_text()) or {}).get("scale") or {}) if path.is_file() else {}
    for name, key in SCALE_FIELDS.items():
        value, default = cfg.scale[name], stated.get(name, getattr(ScaleConfig, name))
        if value != default and OmegaConf.select(cfg, key) != value:
            raise ConfigError(f"scale.{name}={value}: the scale's fields record what conf/scale/{cfg.scale.name}.yaml "
                              f"sets ({name}: {default}), and at scale={cfg.scale.name} it does not set {key} from it; "
                              f"set the value itself: {key}={value}")


def apply_scale(cfg: DictConfig, model_cls: type) -> None:
    """The scale's width multiplier (``scale.width_mult``: smoke runs every model at a tenth of its widths, at least
    ``scale.min_width``), in place, on the widths ``model_cls`` (the model's registered class) names. Everything else
    a scale changes is set in its file (conf/scale/<name>.yaml)."""
    s = cfg.scale
    if s.width_mult != 1.0:
        if hasattr(model_cls, "scale_widths"):  # models whose widths must stay multiples (attention heads)
            model_cls.scale_widths(cfg.model, s.width_mult, s.min_width)
        else:
            for key in model_cls.WIDTH_FIELDS:
                if cfg.model[key] is not None:
                    cfg.model[key] = max(s.min_width, int(round(cfg.model[key] * s.width_mult)))


def _check_data_model(cfg: DictConfig) -> None:
    """Combinations that cannot work, caught before any data is read."""
    d, t = cfg.dataset, cfg.trainer
    seq2seq = cfg.model.arch == "transformer"
    kind = data_kinds.get(d.kind)
    if kind.seq2seq and not seq2seq:
        raise ConfigError(
            f"dataset={d.name} is a translation corpus but model={cfg.model.name} is a language model; "
            f"use an encoder-decoder model (model=transformer_base or model=transformer_big)"
        )
    if seq2seq and not kind.seq2seq:
        raise ConfigError(
            f"model={cfg.model.name} is an encoder-decoder translation model but dataset={d.name} is a language-modelling "
            f"corpus; use a translation dataset (dataset=wmt14_en_de, dataset=multi30k_en_de) or a language model"
        )
    if d.tokenizer == "bpe" and not d.bpe_vocab_size:
        raise ConfigError(f"dataset.tokenizer=bpe needs dataset.bpe_vocab_size (e.g. 8000); got {d.bpe_vocab_size}")
    if d.tokenizer == "byte_bpe" and not d.get("byte_bpe"):
        raise ConfigError(f"dataset.tokenizer=byte_bpe needs dataset.byte_bpe (got {d.get('byte_bpe')!r}): a hub name "
                          f"(dataset.byte_bpe=gpt2) or a folder with GPT-2's vocab.json + merges.txt")
    data_kinds.check(d)  # the kind's own combinations (data/kinds.py)
    # numeric bounds (retrain_sessions >= 0, label_smoothing in [0, 1), ...): reproduce/settings/domains.py, checked before this
    if t.precision == "bf16" and t.device == "cpu":
        print("repdegen: note: trainer.precision=bf16 on the CPU is slow; it is meant for GPUs")
    if cfg.optim.schedule == "inverse_sqrt" and cfg.optim.name != "adam":
        raise ConfigError(f"optim.schedule=inverse_sqrt is used with Adam (optim.name=adam); got optim.name={cfg.optim.name}")
    betas = list(cfg.optim.get("betas") or [])
    if len(betas) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
                                  for b in betas):
        raise ConfigError(f"optim.betas={betas!r}: expected two numbers in [0, 1) (Adam's decay rates of the first "
                          f"and second moments); set optim.betas=[0.9,0.999]")
    if t.get("retrain_sessions", 0) > 0:  # each session restarts the schedule by epoch, from the last one's best
        clash = {"trainer.average_last": t.average_last if t.average_last > 1 else None,
                 "trainer.max_updates": t.max_updates,
                 "optim.schedule": cfg.optim.schedule if cfg.optim.schedule == "inverse_sqrt" else None}
        clash = {k: v for k, v in clash.items() if v is not None}
        if clash:
            key, value = next(iter(clash.items()))
            raise ConfigError(
                f"trainer.retrain_sessions={t.retrain_sessions} with {key}={value}: a re-training session (Inan et al. "
                f"2017, footnote 5) restarts an epoch-based schedule from the previous session's best weights; "
                f"checkpoint averaging and update-counted budgets or schedules do not restart with it. Set "
                f"trainer.retrain_sessions=0, or use the default of {key}")
    interval = t.get("save_interval_updates")
    if interval is not None and t.average_last < 2:  # the interval checkpoints exist to be averaged
        raise ConfigError(f"trainer.save_interval_updates={interval} with trainer.average_last={t.average_last}: the "
                          f"interval checkpoints are kept for averaging, and at least 2 are needed; set "
                          f"trainer.average_last to the number to average (e.g. 5), or trainer.save_interval_updates=null")
    min_delta = t.get("early_stopping_min_delta", 0.0)
    if min_delta and t.get("early_stopping_on", "valid") != "train":
        raise ConfigError(f"trainer.early_stopping_min_delta={min_delta} applies to trainer.early_stopping_on=train only "
                          f"(validation stops on any lower validation NLL); set trainer.early_stopping_on=train or "
                          f"trainer.early_stopping_min_delta=0")


def check_unknown_keys(cfg: DictConfig) -> None:
    """Every key of a section that has a schema (a dataclass: dataset, optim, trainer and its sub-sections, scale,
    logger, model, objective) is one of its fields: ``+trainer.foo=1`` appends a key Hydra cannot refuse, which no
    code reads and which would change the run's hash. One ConfigError naming it and the nearest fields."""
    import dataclasses
    import difflib

    def walk(node, path: str) -> None:
        kind = OmegaConf.get_type(node)
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
            return
        fields = {f.name for f in dataclasses.fields(kind)}
        for key in node.keys():
            if key not in fields:
                near = difflib.get_close_matches(str(key), sorted(fields), n=3, cutoff=0.6)
                hint = f"did you mean {', '.join(f'{path}.{n}' for n in near)}? " if near else ""
                raise ConfigError(f"{path}.{key} is not a setting of {path} ({kind.__name__}): {hint}remove it, or "
                                  f"see the settings with repdegen describe <overrides>")
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                walk(child, f"{path}.{key}")

    for section in ("dataset", "optim", "trainer", "scale", "logger", "model", "objective"):
        if isinstance(cfg.get(section), DictConfig):
            walk(cfg[section], section)


def finalize(cfg: DictConfig, copy_first: bool = True) -> DictConfig:
    """Resolve every interpolation, apply the scale, validate, and return a read-only copy (``copy_first=False``: the
    caller's own fresh composition, finalized in place, as :func:`repdegen.reproduce.settings.resolve.resolve` does).

    The returned config is what a run uses and what its ``result.json`` records; it is read-only, and a read-only
    config is a finalized one (:func:`repdegen.reproduce.settings.resolve.from_config`).
    """
    if OmegaConf.is_readonly(cfg):
        raise ValueError("finalize takes a composed config, and this one is read-only: finalized already (its widths "
                         "scaled); use it as it is")
    cfg = copy.deepcopy(cfg) if copy_first else cfg
    OmegaConf.resolve(cfg)
    # for messages in the user's own numbers (only a scale that changes the widths needs a copy)
    unscaled_model = copy.deepcopy(cfg.model) if cfg.scale.width_mult != 1.0 else cfg.model
    # every numeric setting inside its declared domain (reproduce/settings/domains.py), in the user's own numbers
    # and before anything computes with them (a NaN width would end in a traceback inside apply_scale)
    check_unknown_keys(cfg)
    check_domains(cfg)
    _check_scale_record(cfg)
    from repdegen.losses import OBJECTIVES, validate_objective
    from repdegen.models import MODELS, resolve_tie

    # the one lookup of each registry: the classes that scale, validate and check tying below
    model_cls, objective_cls = MODELS.entry(cfg.model)[0], OBJECTIVES.entry(cfg.objective)[0]
    apply_scale(cfg, model_cls)
    for key, allowed in VALID_CHOICES.items():
        _check_choice(cfg, key, allowed)
    _check_data_model(cfg)
    model_cls.validate_config(cfg.model)
    validate_objective(cfg.objective, objective_cls)
    # one canonical place for tying, so `objective.tie_weights: null` and an explicit equal value hash alike
    tie = resolve_tie(cfg.model, cfg.objective)
    try:
        model_cls.check_tie(cfg.model, tie)
    except ConfigError as scaled_err:
        if cfg.scale.width_mult == 1.0:
            raise
        # name the sizes the user gave (and a fix that works at this scale), not the scaled ones
        try:
            model_cls.check_tie(unscaled_model, tie)
        except ConfigError as err:
            raise ConfigError(f"{err} (at scale={cfg.scale.name} the widths are scaled by {cfg.scale.width_mult}; "
                              f"{scaled_err.args[0].split(' has ', 1)[-1].split(';')[0]})") from None
        raise
    cfg.model.tie_weights = tie
    cfg.objective.tie_weights = tie
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _drop(container: dict, dotted: str) -> None:
    node = container
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.get(part)
        if not isinstance(node, dict):
            return
    node.pop(parts[-1], None)


# keys added after cells had run: left out of the hash at their default, so that the configs which do not use them
# keep the hashes (and the ledger entries) they had before the key existed
HASH_OMITTED_AT_DEFAULT = {"trainer.retrain_sessions": 0, "dataset.vocab_from": "split",
                           "trainer.early_stopping_on": "valid", "trainer.early_stopping_min_delta": 0.0,
                           "trainer.analysis.geometry_every": None, "trainer.analysis.geometry_until": None,
                           "objective.group_cutoffs": None, "trainer.test_bptt": None, "trainer.test_context": 0,
                           "trainer.save_interval_updates": None, "dataset.byte_bpe": None,
                           "dataset.valid_every": None, "objective.unit_norm_axis": "word"}


def hashed_view(cfg: DictConfig) -> dict:
    """The part of a finalized config that defines the experiment (see HASH_EXCLUDED, HASH_OMITTED_AT_DEFAULT)."""
    container = OmegaConf.to_container(cfg, resolve=True)
    for key in HASH_EXCLUDED:
        _drop(container, key)
    for key, default in HASH_OMITTED_AT_DEFAULT.items():
        if OmegaConf.select(cfg, key, default=default) == default:
            _drop(container, key)
    return container


def config_hash(cfg: DictConfig) -> str:
    """A short, stable identifier of the experiment a finalized config describes."""
    blob = json.dumps(hashed_view(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


DEFAULT_SCALE = "paper"  # conf/config.yaml's default scale (tests/test_runspec.py holds them equal)


def experiment_scale(overrides: list[str]) -> list[str]:
    """``overrides`` with the option ``experiment_scale=<experiment>/<scale>`` added when that file exists and they do
    not choose one themselves. What a preset sets at a scale may choose other groups (Yu et al.'s LM presets train
    model=transformer_lm6 on dataset=wikitext2_bpe at lite), a choice that depends on two other choices; Hydra makes
    such a choice only from the command line (its defaults list refuses overrides under an interpolated option), so
    it is made here, from the overrides' text, before the one composition. Hydra must be initialized."""
    from hydra.core.global_hydra import GlobalHydra

    chosen: dict[str, str] = {}
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep:
            chosen[key.lstrip("+")] = value
        elif key.startswith("~"):
            chosen[key[1:]] = "null"
    experiment, scale = chosen.get("experiment"), chosen.get("scale", DEFAULT_SCALE)
    if "experiment_scale" in chosen or experiment in (None, "null"):
        return list(overrides)
    option = f"experiment_scale/{experiment}/{scale}"
    if not any(source.is_config(option) for source in GlobalHydra.instance().config_loader().get_sources()):
        return list(overrides)
    return [f"experiment_scale={experiment}/{scale}", *overrides]


def hydra_choices(hydra_cfg) -> dict[str, str]:
    """The group choices of a composition (``hydra.runtime.choices``), without Hydra's own groups: the one place
    ``choices`` is derived, and checked (:func:`check_choices`)."""
    choices = {k: str(v) for k, v in hydra_cfg.runtime.choices.items() if not k.startswith("hydra/") and v is not None}
    check_choices(choices)
    return choices


def _options(group: str) -> list[str]:
    root = CONF_DIR / group
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def check_choices(choices: dict[str, str]) -> None:
    """What Hydra lets through without a word: an ``optional`` group's option that does not exist (``experiment=``
    misspelled would train the defaults under the misspelled name) and a group's schema node chosen as an option
    (``scale=base_scale``). One ConfigError naming the value, the options nearest to it and how to list them."""
    import difflib

    for group, value in choices.items():
        group = group.split("@")[0]
        options = _options(group) if (CONF_DIR / group).is_dir() else []
        schema = value.startswith(("base_", "schema_"))
        missing = group == "experiment" and value not in options
        if schema or missing:
            near = difflib.get_close_matches(value, options, n=3, cutoff=0.5) or options[:5]
            what = "is the schema the options are checked against, not an option" if schema else "does not exist"
            raise ConfigError(f"{group}={value} {what}: expected one of conf/{group}/*.yaml, e.g. "
                              f"{', '.join(f'{group}={o}' for o in near)} (all of them: ls conf/{group})")


def compose_with_choices(overrides: list[str], config_name: str = "config") -> DictConfig:
    """Hydra's composition of ``overrides`` (Hydra must be initialized), its group choices in ``cfg.choices``."""
    from hydra import compose

    cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    choices = hydra_choices(cfg.hydra)
    OmegaConf.set_struct(cfg, False)
    del cfg["hydra"]
    cfg.choices = choices
    OmegaConf.set_struct(cfg, True)
    return cfg


def compose_config(overrides: list[str], config_name: str = "config") -> DictConfig:
    """The config ``repdegen train <overrides>`` runs, before :func:`finalize` (Hydra must be initialized, e.g.
    inside ``initialize_config_dir``): Hydra's composition, the experiment's scale options chosen
    (:func:`experiment_scale`)."""
    from hydra import compose

    return compose(config_name=config_name, overrides=experiment_scale(list(overrides)))
