"""Translate a file with a trained model: beam search, detokenized output, BLEU when a reference is given.

    repdegen translate checkpoint=outputs/runs/<hash> input=newstest2014.en
    repdegen translate checkpoint=outputs/runs/<hash>/best.pt input=test.en output=test.hyp.de \\
        reference=test.de beam=5 length_penalty=1.0

``checkpoint``: a run directory (its final weights: the checkpoint average when the run averaged, else
``last.pt`` / ``best.pt`` as the run's ``trainer.final_weights``) or a weights file inside one. The run's
``result.json`` gives the model config and its ``bpe.model`` the tokenizer, so nothing else is read.
Decoding options default to the run's ``trainer.generation``; ``beam=1`` is greedy search. One line in,
one line out, in input order; empty input lines give empty output lines.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from repdegen.reproduce.engine.progress import progress_bar
from repdegen.reproduce.errors import ConfigError, DataError, exit_on_user_error
from repdegen.reproduce.runs.trained import load_weights_file, read_record, resolve_checkpoint
from repdegen.reproduce.settings.config import CONF_DIR, register_all
from repdegen.reproduce.settings.schema import GenerationConfig

register_all()

@dataclass
class TranslateConfig:
    checkpoint: str = MISSING
    input: str = MISSING
    # default: standard output
    output: str | None = None
    # a reference translation of `input`: prints SacreBLEU (with its signature) and tokenized BLEU
    reference: str | None = None
    device: str = "auto"
    # decoding (None: the run's trainer.generation value)
    beam: int | None = None
    length_penalty: float | None = None
    length_penalty_form: str | None = None
    max_len_a: float | None = None
    max_len_b: int | None = None
    batch_size: int | None = None


ConfigStore.instance().store(name="translate_app_base", node=TranslateConfig)


def load_translator(checkpoint: str, device: torch.device):
    """(model in eval mode, tokenizer, the run's config) from a run directory or weights file."""
    from repdegen.data.bpe import BPETokenizer
    from repdegen.models import build_model

    run_dir, weights = resolve_checkpoint(checkpoint)
    cfg = OmegaConf.create(read_record(run_dir)["config"])
    if cfg.dataset.kind != "translation":
        raise ConfigError(
            f"{run_dir} is a {cfg.dataset.kind} run of {cfg.model.name}; repdegen.reproduce.translate needs a translation model"
        )
    if not (run_dir / "bpe.model").is_file():
        raise DataError(f"{run_dir} has no bpe.model (runs save their tokenizer there); rerun training or copy it from the cache")
    tokenizer = BPETokenizer.load(run_dir / "bpe.model")
    model = build_model(cfg.model, len(tokenizer), cfg.model.tie_weights)
    blob = load_weights_file(weights)
    model.load_state_dict(blob["model"])
    return model.to(device).eval(), tokenizer, cfg, weights


def translate_lines(model, tokenizer, lines: list[str], gen, device, progress: bool = True) -> list[str]:
    from repdegen.data.bpe import EOS, PAD
    from repdegen.models.generation import translate

    encoded = [tokenizer.encode(line, add_eos=True) for line in lines]
    order = sorted(range(len(lines)), key=lambda i: len(encoded[i]))
    out = [""] * len(lines)
    todo = [i for i in order if lines[i].strip()]
    bar = progress_bar(total=len(todo), desc="translate", disable=not progress, unit="sent", dynamic_ncols=True)
    for k in range(0, len(todo), gen.batch_size):
        idx = todo[k : k + gen.batch_size]
        width = max(len(encoded[i]) for i in idx)
        src = torch.full((len(idx), width), PAD, dtype=torch.long)
        for row, i in enumerate(idx):
            src[row, : len(encoded[i])] = torch.tensor(encoded[i])
        nbest = translate(model, src.to(device), gen, bos=EOS, eos=EOS, pad=PAD)
        for i, hyps in zip(idx, nbest):
            out[i] = tokenizer.decode(hyps[0].tokens)
        bar.update(len(idx))
    bar.close()
    return out


def run(app: DictConfig) -> list[str]:
    from repdegen.analysis.bleu import bleu_detok, bleu_tokenized
    from repdegen.reproduce.runs.execute import pick_device

    device = pick_device(app.device)
    model, tokenizer, cfg, weights = load_translator(app.checkpoint, device)
    gen = OmegaConf.merge(OmegaConf.structured(GenerationConfig), cfg.trainer.generation)
    for key in ("beam", "length_penalty", "length_penalty_form", "max_len_a", "max_len_b", "batch_size"):
        if app[key] is not None:
            gen[key] = app[key]
    src_path = Path(app.input).expanduser()
    if not src_path.is_file():
        raise DataError(f"input={app.input!r} does not exist; give a text file with one {cfg.dataset.src_lang} sentence per line")
    lines = src_path.read_text(encoding="utf-8").splitlines()
    start = time.time()
    print(f"repdegen: translating {len(lines)} lines ({cfg.dataset.src_lang}->{cfg.dataset.tgt_lang}) with {weights}, "
          f"beam {gen.beam}, length penalty {gen.length_penalty} ({gen.length_penalty_form})", file=sys.stderr, flush=True)
    hyps = translate_lines(model, tokenizer, lines, gen, device)
    text = "".join(h + "\n" for h in hyps)
    if app.output:
        Path(app.output).expanduser().write_text(text, encoding="utf-8")
        print(f"repdegen: wrote {app.output} ({time.time() - start:.0f}s)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if app.reference:
        refs = Path(app.reference).expanduser().read_text(encoding="utf-8").splitlines()
        detok, tok = bleu_detok(hyps, refs), bleu_tokenized(hyps, refs)
        print(f"SacreBLEU {detok['score']:.2f}  ({detok['signature']})", file=sys.stderr)
        print(f"tokenized BLEU {tok['score']:.2f}  ({tok['description']})", file=sys.stderr)
    return hyps


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="translate_app")
def main(app: DictConfig) -> None:
    exit_on_user_error(run)(app)


def cli() -> None:
    """``repdegen translate``: this command's entry (``python -m repdegen.reproduce.translate`` runs the same)."""
    from repdegen.reproduce.cli import use_app_help
    from repdegen.reproduce.errors import install_hydra_error_handler

    install_hydra_error_handler()
    use_app_help("translate")  # --help: conf/hydra/help/translate.yaml
    main()


if __name__ == "__main__":
    cli()
