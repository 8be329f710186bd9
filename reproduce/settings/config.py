"""Typed configuration: one dataclass per config group, stored in Hydra's ConfigStore.

Every YAML option under ``conf/<group>/`` starts from one of these schemas (through its defaults
list), so a misspelled key or a value of the wrong type fails at composition time, naming the key:
``objective.gama=1`` -> "Key 'gama' not in 'CosRegConfig'".

The flow of one run: Hydra composes ``conf/config.yaml`` once (the experiment preset, its values for the objective
and at the scale are options of its defaults list; :func:`experiment_scale` names the last) -> :func:`finalize`
resolves interpolations, applies the scale's width multiplier, checks values that only make sense together, and
returns the read-only config whose :func:`config_hash` identifies the experiment in the ledger.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from repdegen.data import kinds as data_kinds
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.settings.domains import check_domains


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


# --------------------------------------------------------------------------------------------------
# groups shared by every run (model and objective schemas live next to their code and register
# themselves: see models/__init__.py and losses/__init__.py)
# --------------------------------------------------------------------------------------------------
@dataclass
class DatasetConfig:
    """A word-level corpus with train/valid/test splits.

    ``source``: ``auto`` uses ``local`` when a data directory is given (``data_dir`` or the
    ``REPDEGEN_DATA_DIR`` environment variable) and the Hugging Face hub otherwise; ``disk`` reads a
    ``DatasetDict`` saved with ``save_to_disk``; ``text`` reads plain files through
    ``datasets.load_dataset("text", data_files=...)``.
    """

    name: str = MISSING
    source: str = "auto"
    data_dir: str | None = None
    local_dir: str = MISSING
    files: dict[str, str] = field(default_factory=dict)
    hub_name: str | None = None
    hub_config: str | None = None
    # a branch or commit of the hub repository (script-based datasets: their parquet export,
    # "refs/convert/parquet", since `datasets` 4 no longer runs loading scripts)
    hub_revision: str | None = None
    hub_splits: dict[str, str] = field(
        default_factory=lambda: {"train": "train", "valid": "validation", "test": "test"}
    )
    text_field: str = "text"
    disk_path: str | None = None
    text_files: dict[str, str] | None = None
    # what the papers' corpus has; a mismatch is reported (never silently accepted)
    vocab_size: int | None = None
    eos: str = "<eos>"
    unk: str = "<unk>"
    # truncation (set by the scale; None = whole split); train_start: the first training token used
    # (Inan 2017 Sec. 6.2 trains on a 20,000-token window of PTB)
    train_start: int = 0
    train_tokens: int | None = None
    eval_tokens: int | None = None
    # where the vocabulary / BPE model and the frequency groups come from: ``split`` (the whole training split, the
    # papers' setting) or ``slice`` (the train_start/train_tokens window the run trains on; data/corpus.py)
    vocab_from: str = "split"
    # ---- what the corpus is and how it is cut into tokens -------------------------------------
    # ``lm``: one stream of tokens per split; ``translation``: sentence pairs (src_lang -> tgt_lang)
    kind: str = "lm"
    # ``word``: whitespace words + <eos> per line; ``bpe``: a sentencepiece BPE model trained on the
    # training split (joint source+target for translation) and cached under paths.cache_dir/bpe
    tokenizer: str = "word"
    bpe_vocab_size: int | None = None
    # sentencepiece's input_sentence_size: lines sampled to train BPE (0 = every line)
    bpe_sample_lines: int = 2_000_000
    # ---- translation --------------------------------------------------------------------------
    src_lang: str | None = None
    tgt_lang: str | None = None
    # hub/disk records hold {"<lang>": text} under this column (the `wmt14` layout); None: one
    # column per language (the `bentrevett/multi30k` layout)
    translation_field: str | None = "translation"
    # training pairs longer than this many BPE tokens (either side) or with a length ratio above
    # max_len_ratio are dropped (fairseq/Moses clean-corpus; None = keep all)
    max_len: int | None = None
    max_len_ratio: float | None = None
    # truncation to the first N pairs (set by the scale; None = whole split)
    train_pairs: int | None = None
    eval_pairs: int | None = None


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule.

    ``name``: ``sgd`` | ``adam`` | ``ntasgd`` (SGD that switches to averaged SGD when validation stops
    improving, Merity et al. 2018). Schedule: epochs ``1..decay_after_epoch`` run at ``lr``; epoch
    ``e`` after that runs at ``lr * lr_decay ** (e - decay_after_epoch)`` (``lr_decay=1``: constant).
    """

    name: str = "sgd"
    lr: float = 1.0
    # ``epoch``: the per-epoch decay below; ``inverse_sqrt`` (Vaswani et al., fairseq): per optimizer
    # update, linear warm-up from ``warmup_init_lr`` to ``lr`` over ``warmup_updates``, then
    # ``lr * sqrt(warmup_updates / update)``
    schedule: str = "epoch"
    warmup_updates: int = 4000
    warmup_init_lr: float = 1e-7
    weight_decay: float = 0.0
    # Adam only: decoupled weight decay (AdamW; fairseq's Adam applies --weight-decay this way)
    decoupled_weight_decay: bool = False
    momentum: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    lr_decay: float = 1.0
    decay_after_epoch: int = 0
    clip_grad_norm: float | None = 5.0
    nonmono: int = 5


@dataclass
class CacheConfig:
    """Continuous cache pointer (Grave et al. 2017) at evaluation, as in AWD-LSTM's pointer.py."""

    enabled: bool = False
    window: int = 500
    theta: float = 1.0
    lambdah: float = 0.1
    bptt: int = 2000


@dataclass
class GenerationConfig:
    """Decoding for translation (BLEU) and continuations. ``beam=1`` is greedy search.

    Length penalty: ``fairseq`` ranks finished hypotheses by ``sum log p / len ** length_penalty``;
    ``gnmt`` by ``sum log p / ((5 + len) / 6) ** length_penalty`` (Wu et al. 2016, tensor2tensor).
    Output length is at most ``max_len_a * source_len + max_len_b`` tokens.
    """

    beam: int = 4
    length_penalty: float = 0.6
    length_penalty_form: str = "fairseq"
    max_len_a: float = 1.2
    max_len_b: int = 10
    # sentences per batch of generation
    batch_size: int = 64
    # the split(s) BLEU is reported on at the end of a translation run
    bleu_splits: list[str] = field(default_factory=lambda: ["test"])


@dataclass
class AnalysisConfig:
    """Degeneration metrics of language models, computed on the final weights (Yu et al. 2022).

    ``groups``: per frequency group (frequent / medium / rare = 30 / 50 / 20 % of types by training
    frequency, or the official AGG index cut-offs ``group_cutoffs: [13000, 36000]``) the test PPL
    and Uniq, the I(W) of the group's output embeddings and the rare-frequent mean cosine:
    ``ppl_<group>``, ``uniq``, ``uniq_<group>``, ``isotropy_<group>``, ``cos_rare_frequent``.
    ``wordsim``: Spearman x 100 of the output embedding on MEN, WS353, RG65, RW (``wordsim_<name>``;
    needs the word-sim folder under ``REPDEGEN_DATA_DIR``).
    """

    groups: bool = True
    group_cutoffs: list[int] | None = None
    wordsim: bool = False
    # Yu et al. 2022 Fig. 1: the groups' I(W) and the rare-frequent cosine traced at update 0 and every
    # ``geometry_every`` updates up to ``geometry_until`` (null: the whole run), in ``result.json`` ``trace``
    # (``geom_<metric>``); the onset metrics of analysis/record_metrics.py read it. null: no trace.
    geometry_every: int | None = None
    geometry_until: int | None = None


@dataclass
class TrainerConfig:
    """One training loop for every model and objective.

    ``loss_reduction``: ``mean`` (mean over tokens, the PyTorch convention) or ``sum_over_time``
    (summed over the BPTT steps and averaged over the batch, the TensorFlow PTB tutorial convention
    used by Zaremba et al. and Inan et al.; it multiplies the gradient by ``bptt``).
    """

    max_epochs: int = 40
    batch_size: int = 20
    bptt: int = 35
    variable_bptt: bool = False
    loss_reduction: str = "mean"
    eval_batch_size: int = 10
    eval_bptt: int = 35
    test_batch_size: int = 1
    early_stopping: int | None = None
    # what early stopping watches: ``valid`` (the validation NLL; stop after more than ``early_stopping`` epochs
    # without a lower one) or ``train`` (the epoch's mean training objective, ``train_loss`` in the history: stop after
    # more than ``early_stopping`` epochs without one at least ``early_stopping_min_delta`` (relative) below the
    # best that counted; for runs whose aim is the training loss's minimum, e.g. Inan et al. 2017's Fig. 1)
    early_stopping_on: str = "valid"
    early_stopping_min_delta: float = 0.0
    finetune_epochs: int = 0
    # further training sessions after the first, each restarting the schedule (lr, decay, early stopping, a fresh
    # optimizer) from the previous session's best weights: Inan et al. (2017) footnote 5 (reproduce/engine/stages.py)
    retrain_sessions: int = 0
    cache: CacheConfig = field(default_factory=CacheConfig)
    # singular values of the output embedding at every evaluation (I(W) and mean cosine always)
    spectrum: bool = True
    # also the test PPL after every epoch (for curves); the final test PPL is always computed
    test_every_epoch: bool = False
    # run control: these do not change results and are left out of the config hash
    device: str = "auto"
    resume: bool = False
    progress: bool = True
    log_interval: int = 200
    stop_after_epochs: int | None = None
    # stop with a mid-epoch checkpoint after this many optimizer updates in all, as a preemption signal
    # would (tests of preemption; status "preempted")
    stop_after_updates: int | None = None
    # GPUs a scheduler (repdegen.reproduce.runs.tables) gives this run: >1 launches it as one DDP job under torchrun
    # over that many local GPUs (or tasks on a SLURM node). The batch settings are global, so the
    # result does not depend on it: run control, not part of the config hash
    gpus: int = 1
    # torch.compile the model's forward (run control: same results within float tolerance, so not in the
    # config hash). compile_backend: inductor (the default of torch.compile; needs a C++ compiler on the
    # CPU), or aot_eager / eager to check a model traces without code generation
    compile: bool = False
    compile_backend: str = "inductor"
    # torch.compile's mode: default, or reduce-overhead (CUDA graphs: fewer kernel launches from the host, for a
    # host-bound update such as the medium VD-LSTM's on a GPU), max-autotune, max-autotune-no-cudagraphs
    compile_mode: str = "default"
    # ---- update-based training (Transformers) ---------------------------------------------------
    # stateless LMs (Transformers): visit the contiguous bptt-token blocks in a new random order
    # every epoch (fairseq shuffles its blocks); recurrent models always read the stream in order
    shuffle_blocks: bool = True
    # gradient accumulation: micro-batches per optimizer update (fairseq --update-freq)
    update_freq: int = 1
    # stop after this many optimizer updates (None: only max_epochs)
    max_updates: int | None = None
    # translation batches: sentence pairs bucketed by length, at most max_tokens padded tokens
    # (max(src, tgt) length x sentences, as fairseq) per micro-batch
    max_tokens: int = 4096
    # label smoothing of the NLL term of every objective (fairseq label_smoothed_cross_entropy)
    label_smoothing: float = 0.0
    # fp32 | bf16 | auto (bf16 on a CUDA device that supports it, else fp32): torch.autocast on the
    # forward pass and the loss; weights and optimizer state stay fp32
    precision: str = "fp32"
    # evaluate with the average of the last N epoch checkpoints (fairseq average_checkpoints; 0/1: off)
    average_last: int = 0
    # which weights give the final metrics: ``best`` (lowest validation loss) or ``last``
    final_weights: str = "best"
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)


@dataclass
class ScaleConfig:
    """How far a run is shrunk from the paper's setting.

    ``paper``: the papers' hyperparameters. ``lite``: each table's claims on a 2-core CPU. ``smoke``: minutes on a
    2-core CPU. The record of what a scale sets (conf/scale/<name>.yaml sets those values over the experiment
    preset, by interpolation from here); per-experiment budgets are conf/experiment_scale/<experiment>/<scale>.yaml.
    """

    name: str = "paper"
    max_epochs: int | None = None
    finetune_epochs: int | None = None
    train_tokens: int | None = None
    eval_tokens: int | None = None
    width_mult: float = 1.0
    min_width: int = 8
    cache_window: int | None = None
    # translation: the first N training / evaluation pairs; caps on update-based training
    train_pairs: int | None = None
    eval_pairs: int | None = None
    max_updates: int | None = None
    # cap on the learning-rate warm-up (inverse_sqrt schedules), so a short run leaves the warm-up
    warmup_updates: int | None = None
    # cap on gradient accumulation, so a short run makes several updates
    update_freq: int | None = None
    # cap on the GPUs a scheduler gives one run (trainer.gpus): lite/smoke cells run one per GPU
    gpus: int | None = None


@dataclass
class LoggerConfig:
    """``none`` (default) or ``wandb`` (offline unless ``mode=online``)."""

    name: str = "none"
    project: str = "repdegen"
    group: str | None = None
    mode: str = "offline"


@dataclass
class PathsConfig:
    output_dir: str = "outputs"
    runs_dir: str = "${paths.output_dir}/runs"
    cache_dir: str = "${paths.output_dir}/cache"
    tables_dir: str = "results/tables"


@dataclass
class Config:
    model: Any = MISSING
    dataset: DatasetConfig = MISSING
    objective: Any = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerConfig = MISSING
    scale: ScaleConfig = MISSING
    logger: LoggerConfig = MISSING
    paths: PathsConfig = field(default_factory=PathsConfig)
    seed: int = 1
    # the Hydra choices (experiment, model, objective...), filled in by the entry points
    choices: dict[str, str] = field(default_factory=dict)


def register_base_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(group="dataset", name="base_dataset", node=DatasetConfig)
    cs.store(group="optim", name="base_optim", node=OptimConfig)
    cs.store(group="trainer", name="base_trainer", node=TrainerConfig)
    cs.store(group="scale", name="base_scale", node=ScaleConfig)
    cs.store(group="logger", name="base_logger", node=LoggerConfig)


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
    "dataset.tokenizer": ("word", "bpe"),
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


def finalize(cfg: DictConfig) -> DictConfig:
    """Resolve every interpolation, apply the scale, validate, and return a read-only copy.

    The returned config is what a run uses and what its ``result.json`` records; it is read-only, and a read-only
    config is a finalized one (:func:`repdegen.reproduce.settings.resolve.from_config`).
    """
    if OmegaConf.is_readonly(cfg):
        raise ValueError("finalize takes a composed config, and this one is read-only: finalized already (its widths "
                         "scaled); use it as it is")
    cfg = copy.deepcopy(cfg)
    OmegaConf.resolve(cfg)
    unscaled_model = copy.deepcopy(cfg.model)  # for messages in the user's own numbers
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
                           "trainer.analysis.geometry_every": None, "trainer.analysis.geometry_until": None}


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
