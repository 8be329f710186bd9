"""The config schema: one dataclass per config group, stored in Hydra's ConfigStore (:func:`register_base_configs`).

Every YAML option under ``conf/<group>/`` starts from one of these (through its defaults list), so a misspelled key
or a value of the wrong type fails at composition time, naming the key: ``objective.gama=1`` -> "Key 'gama' not in
'CosRegConfig'". The model and objective schemas live next to their code and register themselves (models/,
losses/); the table configs' schema is repdegen.reproduce.runs.cells.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


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
    # training split (joint source+target for translation) and cached under paths.cache_dir/bpe;
    # ``byte_bpe`` (language models): the pretrained byte-level BPE ``byte_bpe`` names (data/byte_bpe.py)
    tokenizer: str = "word"
    # tokenizer=byte_bpe: a hub name (``gpt2``) or a folder with vocab.json + merges.txt (or tokenizer.json)
    byte_bpe: str | None = None
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
    # translation: validate on every N-th training pair (1-based: pairs N, 2N, ...), held out of training, instead of
    # the valid split's files (the official AGG/fairseq prepare-wmt14en2de.sh: N = 100, a 1 % held out); None: the files
    valid_every: int | None = None
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
    # the test split's reading (final metrics): ``test_bptt`` new tokens per segment (None: ``eval_bptt``), each read
    # after up to ``test_context`` preceding tokens of its column and only the new ones scored (stateless models;
    # fairseq-eval-lm's --context-window, whose --tokens-per-sample is test_bptt + test_context). 0: none
    test_bptt: int | None = None
    test_context: int = 0
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
    # evaluate with the average of the last N epoch checkpoints (fairseq average_checkpoints; 0/1: off), or of the
    # last N interval checkpoints with save_interval_updates
    average_last: int = 0
    # write the weights every N optimizer updates, inside epochs too, keep the last average_last of them and average
    # those instead of the epochs' (fairseq --save-interval-updates N with average_checkpoints.py
    # --num-update-checkpoints; with each, a mid-epoch resume checkpoint); None: per-epoch checkpoints
    save_interval_updates: int | None = None
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
