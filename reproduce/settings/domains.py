"""The domain of every numeric setting of a run's config, checked once when the config is resolved (``finalize``).

A domain is written as a short string beside the key it governs: ``int>0`` (a count or a size), ``int>=0``,
``float>0`` (a rate), ``float>=0`` (a weight that may be off), ``[0,1)`` (a probability below one, e.g. dropout),
``[0,1]``, ``(0,1]``, ``float`` (any finite number). Every domain also allows ``null`` where the config allows it
(OmegaConf leaves unset values ``None``; the code reads ``None`` as "off" or "not capped"). Keys are dotted paths;
``*`` matches one path part (``model.*dropout*`` would not: patterns match whole parts, ``fnmatch`` style).

:func:`check_domains` walks the resolved config and raises one :class:`~repdegen.reproduce.errors.ConfigError` for the first
value outside its domain, naming the key, the value, what is expected and a value that fits. Values of the wrong
kind (a string or a fraction where a count is expected), NaN and infinities are caught for every numeric key, declared
or not; ``tests/test_domains.py`` checks that every numeric key of every table cell and preset has a declared domain
(tests/golden), and that values outside each domain are refused.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

from repdegen.reproduce.errors import ConfigError

# the config sections of a run whose numbers the domains govern, checked by finalize (paths and logger settings are
# checked where used; the table command's `launch` section, declared below too, by repdegen.reproduce.runs.launch.validate_launch
# before a table registers anything)
SECTIONS = ("seed", "dataset", "model", "objective", "optim", "trainer", "scale")

DOMAINS: dict[str, str] = {
    "seed": "int>=0",
    # the table command's launch settings (not part of a run's config)
    "launch.parallel": "int>0",
    "launch.poll_seconds": "float>0",
    "launch.grace_seconds": "float>=0",
    # dataset
    "dataset.bpe_sample_lines": "int>0",
    "dataset.bpe_vocab_size": "int>0",
    "dataset.valid_every": "int>=2",  # every N-th training pair held out (data/translation.py hold_out_valid)
    "dataset.max_len_ratio": "float>=1",
    "dataset.vocab_size": "int>0",
    "dataset.train_tokens": "int>0",
    "dataset.eval_tokens": "int>0",
    "dataset.train_pairs": "int>0",
    "dataset.eval_pairs": "int>0",
    "dataset.train_start": "int>=0",
    "dataset.max_len": "int>0",
    # model: sizes, probabilities, regularisation weights
    **{f"model.{k}": "int>0" for k in ("d_ffn", "d_model", "decoder_layers", "encoder_layers", "embedding_size",
                                       "hidden_size", "max_positions", "n_heads", "n_layers", "num_layers")},
    **{f"model.{k}": "[0,1)" for k in ("dropout", "attention_dropout", "activation_dropout", "dropoute", "dropouth",
                                       "dropouti", "wdrop")},
    "model.init_scale": "float>0",
    "model.ar_alpha": "float>=0",
    "model.tar_beta": "float>=0",
    "model.pad_id": "int>=0",
    # objectives (conf/objective/*.yaml)
    "objective.alpha": "float>=0",
    "objective.chunk_rows": "int>0",
    "objective.alpha_ul": "float>=0",
    "objective.beta": "[0,1]",
    "objective.c1": "float>=0",
    "objective.c2": "float>=0",
    "objective.eps": "float>=0",
    "objective.every": "int>0",
    "objective.gamma": "float>=0",
    "objective.lambda_prior": "float>=0",
    "objective.rare_fraction": "[0,1]",
    "objective.static_after_epochs": "float>0",
    "objective.static_after_updates": "int>=0",
    "objective.memory_updates": "int>0",
    "objective.temperature": "float>0",
    # optimisation
    "optim.lr": "float>0",
    "optim.lr_decay": "(0,1]",
    "optim.decay_after_epoch": "int>=0",
    "optim.clip_grad_norm": "float>=0",
    "optim.eps": "float>0",
    "optim.momentum": "[0,1)",
    "optim.nonmono": "int>=0",
    "optim.warmup_init_lr": "float>=0",
    "optim.warmup_updates": "int>=0",
    "optim.weight_decay": "float>=0",
    # training
    **{f"trainer.{k}": "int>0" for k in ("batch_size", "bptt", "eval_batch_size", "eval_bptt", "test_batch_size",
                                         "test_bptt", "max_epochs", "max_tokens", "max_updates", "update_freq", "early_stopping",
                                         "stop_after_updates", "stop_after_epochs", "log_interval")},
    **{f"trainer.{k}": "int>=0" for k in ("average_last", "finetune_epochs", "retrain_sessions", "gpus",
                                          "test_context")},
    "trainer.save_interval_updates": "int>0",
    "trainer.label_smoothing": "[0,1)",
    "trainer.early_stopping_min_delta": "[0,1)",
    "trainer.analysis.geometry_every": "int>0",
    "trainer.analysis.geometry_until": "int>0",
    "trainer.cache.bptt": "int>0",
    "trainer.cache.window": "int>0",
    "trainer.cache.theta": "float>=0",
    "trainer.cache.lambdah": "[0,1]",
    "trainer.generation.batch_size": "int>0",
    "trainer.generation.beam": "int>0",
    "trainer.generation.length_penalty": "float",
    "trainer.generation.max_len_a": "float>=0",
    "trainer.generation.max_len_b": "int>=0",
    # the scale's record (conf/scale/*.yaml)
    **{f"scale.{k}": "int>0" for k in ("max_epochs", "train_tokens", "eval_tokens", "train_pairs", "eval_pairs",
                                       "cache_window", "update_freq", "max_updates", "min_width")},
    **{f"scale.{k}": "int>=0" for k in ("finetune_epochs", "warmup_updates", "gpus")},
    "scale.width_mult": "(0,1]",
}


# what a key means, added to its domain error where the bounds alone do not say it
HINTS = {
    "trainer.retrain_sessions": "0: one training session; 1: Inan et al. 2017's footnote-5 re-training from the first "
                                "session's best weights",
    "trainer.early_stopping_min_delta": "the relative drop of the training objective that counts as an improvement "
                                        "under trainer.early_stopping_on=train (0.001: 0.1 %)",
    "trainer.label_smoothing": "the share of the target's probability spread over the vocabulary; 0: none",
    "trainer.save_interval_updates": "optimizer updates between the checkpoints averaged for the final weights; null: "
                                     "average per-epoch checkpoints",
    "launch.parallel": "cells at a time on the CPU, each given cores / N threads",
    "launch.poll_seconds": "how often the scheduler looks at its cells",
    "launch.grace_seconds": "how long a stopped cell may take to write its checkpoint",
}


@dataclass(frozen=True)
class Domain:
    integer: bool
    low: float | None
    high: float | None
    low_open: bool
    high_open: bool
    text: str

    def contains(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def example(self) -> str:
        """A value inside the domain, for the error message's fix."""
        low = self.low or 0.0
        if self.integer:
            return str(int(low) + 1 if self.low_open else int(low))
        if self.high is not None:
            return "0.5" if self.high >= 1 else str(self.high / 2)
        return f"{low + 1 if self.low_open else low:.1f}"

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.low is None and self.high is None:
            return f"{kind} (finite)"
        if self.high is None:
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        return f"{kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


def parse_domain(text: str) -> Domain:
    """``int>0``, ``int>=0``, ``float>0``, ``float>=0``, ``float``, ``[a,b)``, ``(a,b]``, ``[a,b]``, ``(a,b)``."""
    t = text.replace(" ", "")
    if t[0] in "[(":
        low, high = (float(x) for x in t[1:-1].split(","))
        return Domain(False, low, high, t[0] == "(", t[-1] == ")", text)
    for op, low_open in ((">=", False), (">", True)):
        if op in t:
            kind, bound = t.split(op)
            return Domain(kind == "int", float(bound), None, low_open, False, text)
    if t in ("int", "float"):
        return Domain(t == "int", None, None, False, False, text)
    raise ValueError(f"unknown domain {text!r}")


PARSED = {key: parse_domain(text) for key, text in DOMAINS.items()}


def domain_of(key: str) -> Domain | None:
    """The declared domain of the dotted ``key`` (exact, else the first pattern that matches it), or None."""
    if key in PARSED:
        return PARSED[key]
    for pattern, domain in PARSED.items():
        if "*" in pattern and fnmatch.fnmatchcase(key, pattern):
            return domain
    return None


def _leaves(node, prefix: str):
    """(dotted key, value) of every scalar leaf under a plain dict/list tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif not isinstance(node, list):  # lists (betas, group cut-offs) are checked by their owners
        yield prefix, node


def numeric_leaves(cfg, sections: tuple[str, ...] = SECTIONS) -> dict[str, object]:
    """The leaves of the governed ``sections`` that are numbers (bools excluded) or are declared numeric."""
    from omegaconf import DictConfig, OmegaConf

    tree = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    out = {}
    for section in sections:
        if section not in tree:
            continue
        for key, value in _leaves({section: tree[section]}, ""):
            if (isinstance(value, (int, float)) and not isinstance(value, bool)) or domain_of(key) is not None:
                out[key] = value
    return out


def check_domains(cfg, sections: tuple[str, ...] = SECTIONS) -> None:
    """Raise a ConfigError for the first numeric setting of ``sections`` outside its domain (see the module doc)."""
    for key, value in numeric_leaves(cfg, sections).items():
        domain = domain_of(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            want = domain.describe() if domain else "a number"
            raise ConfigError(f"{key}={value!r} is not a number: expected {want}; set {key}="
                              f"{domain.example() if domain else '<a number>'}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value} is not finite: expected "
                              f"{domain.describe() if domain else 'a finite number'}; set {key}=<a finite value>")
        if domain is None:
            continue
        if domain.integer and not isinstance(value, int):
            raise ConfigError(f"{key}={value!r} is not an integer: expected {domain.describe()}; "
                              f"set {key}={max(int(value), int(domain.example()))}")
        if not domain.contains(value):
            hint = f" ({HINTS[key]})" if key in HINTS else ""
            raise ConfigError(f"{key}={value!r} is outside its domain: expected {domain.describe()}{hint}; "
                              f"set {key}=<a value in it>, e.g. {key}={domain.example()}")
