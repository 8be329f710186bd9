"""Sizes without training: parameter counts (total and by part) and the resolved hyperparameters.

    python -m reproduce.describe model=awd_lstm dataset=wikitext2
    python -m reproduce.describe experiment=inan2017/medium objective=real

The vocabulary size is counted from the corpus when it is in a local directory (``REPDEGEN_DATA_DIR``),
else taken from ``dataset.vocab_size`` (the papers' value); the output says which. The model
is built on PyTorch's meta device, so even the largest model costs no memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from models import build_model, resolve_tie
from reproduce.config import config_hash, finalize, register_all
from reproduce.errors import exit_on_user_error
from reproduce.train import hydra_choices, plain_config

register_all()


def describe(cfg: DictConfig) -> dict:
    cfg = finalize(cfg)
    from data.corpus import data_dir_from, resolve_source
    from reproduce.train import load_any_corpus

    d = cfg.dataset
    root = data_dir_from(d)
    local = resolve_source(d) == "local" and root is not None and (Path(root) / d.local_dir).is_dir()
    if d.vocab_size is not None and not local:  # no network round trip just to count types
        vocab_size = d.vocab_size
        vocab_source = "dataset.vocab_size (the papers' corpus; set REPDEGEN_DATA_DIR to count a local copy)"
    elif d.tokenizer == "bpe" and not local:
        from data.bpe import N_SPECIALS

        vocab_size = d.bpe_vocab_size + N_SPECIALS
        vocab_source = ("dataset.bpe_vocab_size + 4 specials (the BPE is not trained yet; set REPDEGEN_DATA_DIR to count "
                        "a local copy)")
    else:
        vocab_size = len(load_any_corpus(d, cfg.paths.cache_dir).vocab)
        vocab_source = "corpus"
    tie = resolve_tie(cfg.model, cfg.objective)
    with torch.device("meta"):
        model = build_model(cfg.model, vocab_size, tie)
    total = sum(p.numel() for p in model.parameters())
    return {
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "objective": cfg.objective.name,
        "vocab_size": vocab_size,
        "vocab_size_from": vocab_source,
        "tie_weights": tie,
        "parameters": {"total": total, "millions": round(total / 1e6, 2), "by_part": model.parameter_breakdown()},
        "config_hash": config_hash(cfg),
        "config": plain_config(cfg),
    }


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    cfg.choices = hydra_choices()
    print(json.dumps(exit_on_user_error(describe)(cfg), indent=2))


if __name__ == "__main__":
    from reproduce.errors import install_hydra_error_handler

    install_hydra_error_handler()
    main()
