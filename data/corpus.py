"""Language-model corpora (PTB, WikiText-2, or any corpus with train/valid/test splits).

``dataset.tokenizer=word``: each line becomes ``line.split() + ["<eos>"]`` (the convention of the
PTB/WikiText language-modelling code of all three papers). The vocabulary is built from the training
split only; ids are sorted by training frequency (most frequent first, ties in order of first
appearance), and the counts are kept, so frequency groups are slices of the id range.

``dataset.tokenizer=bpe``: a sentencepiece BPE model of ``dataset.bpe_vocab_size`` ids is trained on
the training split's lines (cached under ``<cache_dir>/bpe``, see :mod:`repdegen.data.bpe`); each line becomes
its pieces + ``</s>``; the word ``dataset.unk`` (WikiText's ``<unk>``) maps to ``<unk>``. Ids are sorted
by training frequency after the four specials ``<pad> <s> </s> <unk>``; ``Corpus.tokenizer`` decodes.

``dataset.tokenizer=byte_bpe``: a pretrained byte-level BPE (GPT-2's: ``dataset.byte_bpe=gpt2`` or a folder with its
vocab.json + merges.txt) encodes each stripped line, + ``</s>``, as Yu et al.'s data step did (``<unk>`` is three
pieces); the ids are the same four specials, then the pieces that occur in training by count; other pieces of
valid/test are ``<unk>`` (:mod:`repdegen.data.byte_bpe`).

``dataset.vocab_from`` (lite v2, docs/lite_v2.md): ``split`` (the default, the papers' setting) builds the
vocabulary or BPE model from the whole training split and then cuts the ``train_start``/``train_tokens`` window
out of it; ``slice`` builds them from the window the run trains on, so a prefix run's vocabulary and frequency
groups hold only what it sees (at ``paper`` the window is the split: the two agree). Word-level: the window's
tokens give the vocabulary (``<unk>``/``<eos>`` added with count 0 if the window lacks them); other words of any
split are ``<unk>``. BPE: the window is found with the split's BPE model, the lines holding it train a second
BPE model, and the run trains on the first ``train_tokens`` pieces of those lines under it. Either way the
vocabulary's counts are the counts in the training stream the run reads (so the frequency groups are).

Sources (``dataset.source``):
  * ``local``: ``<data_dir>/<local_dir>/<files[split]>`` where ``data_dir`` defaults to the
    ``REPDEGEN_DATA_DIR`` environment variable (the layout of the README's section "Data");
  * ``hub``: ``datasets.load_dataset(hub_name, hub_config)`` (``ptb_text_only``;
    ``wikitext``/``wikitext-2-v1``);
  * ``disk``: a ``DatasetDict`` saved with ``save_to_disk`` at ``disk_path``;
  * ``text``: plain files read by ``datasets.load_dataset("text", data_files=text_files)``;
  * ``auto``: ``local`` when a data directory is set, else ``hub``.

Processed corpora are cached under ``<cache_dir>/corpora`` keyed by the content of the source
(sha256 of the files, or the ``datasets`` fingerprints), so an edited file is never served stale.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from repdegen.core.errors import ConfigError, DataError
from repdegen.core.files import cache_write, remove_stale_cache_temps
from repdegen.data.bpe import EOS, SPECIALS, UNK, train_bpe
from repdegen.data.kinds import register_kind
from repdegen.data.vocab import Vocab

SPLITS = ("train", "valid", "test")
CACHE_FORMAT = 1


@dataclass
class Corpus:
    name: str
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor
    vocab: Vocab
    provenance: dict
    # the repdegen.data.bpe.BPETokenizer (or data.byte_bpe.ByteBPETokenizer) of a subword corpus (None: word level)
    tokenizer: Any = None

    def split(self, name: str) -> torch.Tensor:
        return getattr(self, name)


# --------------------------------------------------------------------------------------------------
# reading the raw lines
# --------------------------------------------------------------------------------------------------
def data_dir_from(cfg) -> str | None:
    return cfg.data_dir or os.environ.get("REPDEGEN_DATA_DIR") or None


def resolve_source(cfg) -> str:
    if cfg.source != "auto":
        return cfg.source
    return "local" if data_dir_from(cfg) else "hub"


def _decode(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DataError(
            f"{path} is not valid UTF-8: byte {raw[err.start]:#04x} at offset {err.start} (line {line}). "
            f"The corpora are UTF-8 text; re-encode the file (e.g. `iconv -f latin1 -t utf-8`) or fetch a clean copy"
        ) from None


def _read_lines(path: Path) -> list[str]:
    """The file's lines with universal newlines, as the text-mode iteration of the papers' readers."""
    lines = io.StringIO(_decode(path), newline=None).read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def local_base(cfg, example: str) -> Path:
    """The data directory of ``dataset.source=local`` (``dataset.data_dir`` or ``REPDEGEN_DATA_DIR``);
    ``example`` names a file it should hold, for the error message."""
    root = data_dir_from(cfg)
    if not root:
        raise DataError(
            f"dataset.source=local needs a data directory: set REPDEGEN_DATA_DIR (or dataset.data_dir) to a folder "
            f"holding {cfg.local_dir}/ (the layout of the README's section Data), or use dataset.source=hub"
        )
    base = Path(root).expanduser()
    if not base.is_dir():
        raise DataError(
            f"data directory {base} does not exist (from {'dataset.data_dir' if cfg.data_dir else 'REPDEGEN_DATA_DIR'}); "
            f"point it at a folder holding {cfg.local_dir}/{example}, or unset it to load {cfg.name} from the Hugging "
            f"Face hub"
        )
    return base


def _local_lines(cfg) -> tuple[dict[str, list[str]], dict]:
    base = local_base(cfg, cfg.files.get("train", ""))
    lines, digests, paths = {}, {}, {}
    for split in SPLITS:
        if split not in cfg.files:
            raise DataError(f"dataset.files has no entry for split {split!r}; expected keys {SPLITS}")
        path = base / cfg.local_dir / cfg.files[split]
        if not path.is_file():
            raise DataError(
                f"{cfg.name}: expected the {split} split at {path}, but there is no such file. The directory should "
                f"hold {cfg.local_dir}/{{{','.join(cfg.files[s] for s in SPLITS)}}}; fetch the corpus there, or "
                f"use dataset.source=hub"
            )
        digests[split] = hashlib.sha256(path.read_bytes()).hexdigest()
        paths[split] = str(path)
        lines[split] = _read_lines(path)
    return lines, {"source": "local", "files": paths, "sha256": digests}


def unavailable(cfg, source: str, err: Exception) -> DataError:
    """The error for a corpus `datasets` could not load (offline hub, bad saved folder...)."""
    return DataError(
        f"could not load {cfg.name} through `datasets` ({source}): {type(err).__name__}: {err}. "
        f"Without a network, set REPDEGEN_DATA_DIR to a folder laid out as the README's section Data says "
        f"(dataset.source=local), or pass dataset.source=disk dataset.disk_path=<saved DatasetDict>"
    )


def load_dataset_dict(cfg, source: str):
    """(DatasetDict, a description of where it came from) for ``dataset.source`` hub | disk | text,
    with one clear DataError for anything `datasets` cannot load."""
    import datasets

    try:
        if source == "hub":
            if not cfg.hub_name:
                raise DataError(f"dataset {cfg.name!r} has no hub_name; use dataset.source=local")
            dsd = datasets.load_dataset(cfg.hub_name, cfg.hub_config, revision=cfg.hub_revision)
            where = f"{cfg.hub_name}" + (f"/{cfg.hub_config}" if cfg.hub_config else "")
            where += f"@{cfg.hub_revision}" if cfg.hub_revision else ""
        elif source == "disk":
            if not cfg.disk_path or not Path(cfg.disk_path).exists():
                raise DataError(
                    f"dataset.disk_path={cfg.disk_path!r} does not exist; give the folder written by "
                    f"DatasetDict.save_to_disk"
                )
            dsd = datasets.load_from_disk(cfg.disk_path)
            where = cfg.disk_path
        else:
            files = dict(cfg.text_files or {})
            missing = [f"{s}={files.get(s)}" for s in SPLITS if not files.get(s) or not Path(files[s]).is_file()]
            if missing:
                raise DataError(
                    f"dataset.source=text needs dataset.text_files with an existing file per split; missing: "
                    f"{', '.join(missing)}"
                )
            dsd = datasets.load_dataset("text", data_files=files)
            where = ", ".join(f"{k}={v}" for k, v in files.items())
    except DataError:
        raise
    except Exception as err:  # the hub raises many kinds; all mean "could not get the data"
        raise unavailable(cfg, source, err) from None
    return dsd, where


def _datasets_lines(cfg, source: str) -> tuple[dict[str, list[str]], dict]:
    dsd, where = load_dataset_dict(cfg, source)
    split_names = cfg.hub_splits if source in ("hub", "disk") else {s: s for s in SPLITS}
    lines, prints = {}, {}
    for split in SPLITS:
        name = split_names.get(split, split)
        if name not in dsd:
            raise DataError(f"{where} has no split {name!r} (it has {', '.join(dsd)}); set dataset.hub_splits.{split}")
        ds = dsd[name]
        field_name = cfg.text_field if source != "text" else "text"
        if field_name not in ds.column_names:
            raise DataError(f"{where}[{name}] has no column {field_name!r} (columns: {ds.column_names}); set dataset.text_field")
        lines[split] = list(ds[field_name])
        prints[split] = ds._fingerprint
    return lines, {"source": source, "location": where, "fingerprints": prints}


# --------------------------------------------------------------------------------------------------
# tokens, vocabulary, ids
# --------------------------------------------------------------------------------------------------
def tokenize(lines: list[str], eos: str) -> list[str]:
    tokens: list[str] = []
    for line in lines:
        tokens.extend(line.split())
        tokens.append(eos)
    return tokens


def build_vocab(train_tokens: list[str], eos: str, unk: str) -> Vocab:
    counts = Counter(train_tokens)  # insertion order = first appearance
    order = sorted(counts, key=lambda w: -counts[w])  # stable: ties keep first-appearance order
    return Vocab(order, torch.tensor([counts[w] for w in order], dtype=torch.long), eos=eos, unk=unk)


def numericalize(tokens: list[str], vocab: Vocab, split: str, name: str) -> tuple[torch.Tensor, int]:
    stoi, unk_id = vocab.stoi, vocab.unk_id
    ids, oov = [], 0
    for w in tokens:
        i = stoi.get(w)
        if i is None:
            if unk_id is None:
                raise DataError(
                    f"{name}: the {split} split has the word {w!r}, which is not in the training vocabulary, and the "
                    f"vocabulary has no {vocab.unk!r} token to map it to; set dataset.unk to the corpus's unknown token"
                )
            i, oov = unk_id, oov + 1
        ids.append(i)
    return torch.tensor(ids, dtype=torch.long), oov


def _cache_key(info: dict, cfg) -> str:
    blob = repr((CACHE_FORMAT, cfg.eos, cfg.unk, sorted(info.get("sha256", {}).items()),
                 sorted(info.get("fingerprints", {}).items())))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _bpe_cache_key(info: dict, tokenizer) -> str:
    blob = repr((CACHE_FORMAT, "bpe", tokenizer.key, sorted(info.get("sha256", {}).items()),
                 sorted(info.get("fingerprints", {}).items())))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _bpe_blob(cfg, lines: dict[str, list[str]], info: dict, tokenizer, key: str) -> dict:
    import numpy as np

    ids, oov = {}, {}
    for s in SPLITS:
        flat, _ = tokenizer.encode_flat(lines[s], add_eos=True)
        if not np.any(flat != EOS):
            where = info.get("files", {}).get(s) or info.get("location")
            raise DataError(f"{cfg.name}: the {s} split ({where}) is empty: it has no words; check the file")
        ids[s] = torch.from_numpy(flat)
        # UNKs that are not the corpus's own unknown-word literal (characters the BPE model lacks)
        literal = sum(line.split().count(cfg.unk) for line in lines[s] if cfg.unk in line) if cfg.unk else 0
        oov[s] = int(np.count_nonzero(flat == UNK)) - literal
    return {"itos": tokenizer.itos, "counts": tokenizer.counts, "ids": ids, "oov": oov, "info": info, "key": key}


def _slice_window(cfg, n_train: int) -> tuple[int, int]:
    """(start, end) of the training window in tokens; a start beyond the split is an error."""
    start = getattr(cfg, "train_start", 0) or 0
    if start >= n_train:
        raise DataError(f"dataset.train_start={start} is beyond the {n_train} training tokens of {cfg.name}; "
                        f"set dataset.train_start below {n_train}")
    end = n_train if cfg.train_tokens is None else min(n_train, start + int(cfg.train_tokens))
    return start, end


def _with_types(vocab: Vocab, words: list[str]) -> Vocab:
    """``vocab`` with the given words appended (count 0) where it lacks them."""
    extra = [w for w in dict.fromkeys(words) if w and w not in vocab.stoi]
    if not extra:
        return vocab
    counts = torch.cat([vocab.counts, torch.zeros(len(extra), dtype=torch.long)])
    return Vocab(vocab.itos + extra, counts, eos=vocab.eos, unk=vocab.unk)


def _slice_vocab_corpus(cfg, lines: dict[str, list[str]], info: dict, cache_dir) -> tuple[dict, Vocab, Any, dict]:
    """dataset.vocab_from=slice: (ids per split, vocabulary, tokenizer or None, provenance extras); see the module doc."""
    if getattr(cfg, "tokenizer", "word") == "byte_bpe":
        from repdegen.data.byte_bpe import slice_corpus

        return slice_corpus(cfg, lines, info, lambda n: _slice_window(cfg, n))
    if getattr(cfg, "tokenizer", "word") == "bpe":
        full = train_bpe(lines["train"], cfg.bpe_vocab_size, cache_dir, sample_lines=cfg.bpe_sample_lines,
                         unk_literal=cfg.unk or None, name=cfg.name)
        _, lens = full.encode_flat(lines["train"], add_eos=True)
        ends = torch.from_numpy(lens).cumsum(0)
        start, end = _slice_window(cfg, int(ends[-1]) if len(ends) else 0)
        first = int(torch.searchsorted(ends, start, right=True))
        last = int(torch.searchsorted(ends, end - 1, right=True))
        # the window's own BPE model cuts its lines into fewer pieces than the split's does: grow the lines (and
        # retrain) until they hold the window's pieces under their own model, or the split ends
        for _ in range(4):
            window_lines = lines["train"][first : last + 1]
            tokenizer = train_bpe(window_lines, cfg.bpe_vocab_size, cache_dir, sample_lines=cfg.bpe_sample_lines,
                                  unk_literal=cfg.unk or None, name=f"{cfg.name}-slice")
            held = int(tokenizer.counts.sum())  # pieces + one </s> a line
            if held >= end - start or last + 1 >= len(lines["train"]):
                break
            grow = max(1, int((last + 1 - first) * ((end - start) / max(held, 1) - 1) * 1.02) + 1)
            last = min(len(lines["train"]) - 1, last + grow)
        window = {"train": window_lines, "valid": lines["valid"], "test": lines["test"]}
        flat, _ = tokenizer.encode_flat(window_lines, add_eos=True)
        # the vocabulary holds the pieces the run trains on, as the papers' fairseq dictionaries hold the pieces that
        # occur (a piece made only as an intermediate merge would be a never-trained row in the rare group)
        tokenizer = tokenizer.restricted_to(np.bincount(flat[: end - start], minlength=len(tokenizer)))
        blob = _bpe_blob(cfg, window, info, tokenizer, tokenizer.key)
        ids = dict(blob["ids"])
        ids["train"] = ids["train"][: end - start]
        counts = torch.bincount(ids["train"], minlength=len(tokenizer))
        vocab = Vocab(list(tokenizer.itos), counts, eos=SPECIALS[EOS], unk=SPECIALS[UNK])
        extras = {"tokenizer": "bpe", "bpe_vocab_size": cfg.bpe_vocab_size, "bpe_key": tokenizer.key,
                  "bpe_model": tokenizer.path, "window_lines": [first, last + 1], "oov": blob["oov"]}
        return ids, vocab, tokenizer, extras
    tokens = {s: tokenize(lines[s], cfg.eos) for s in SPLITS}
    start, end = _slice_window(cfg, len(tokens["train"]))
    window = tokens["train"][start:end]
    vocab = _with_types(build_vocab(window, cfg.eos, cfg.unk), [cfg.eos, cfg.unk])
    ids, oov = {}, {}
    for s in SPLITS:
        ids[s], oov[s] = numericalize(window if s == "train" else tokens[s], vocab, s, cfg.name)
    vocab = Vocab(vocab.itos, torch.bincount(ids["train"], minlength=len(vocab)), eos=cfg.eos, unk=cfg.unk)
    return ids, vocab, None, {"oov": oov}


def load_corpus(cfg, cache_dir: str | Path | None = None, verbose: bool = True) -> Corpus:
    """Load (from cache when the source is unchanged) and return the corpus ``cfg`` describes."""
    kind = getattr(cfg, "kind", "lm")
    if kind != "lm":
        raise ConfigError(f"dataset.kind={kind!r}: load_corpus reads language-model corpora (kind=lm); "
                        f"load translation corpora with repdegen.data.translation.load_parallel_corpus")
    tokenizer_name = getattr(cfg, "tokenizer", "word")
    if tokenizer_name not in ("word", "bpe", "byte_bpe"):
        raise ConfigError(f"dataset.tokenizer={tokenizer_name!r} is not one of word, bpe, byte_bpe; "
                          f"set dataset.tokenizer=word, bpe or byte_bpe")
    if tokenizer_name == "bpe" and not cfg.bpe_vocab_size:
        raise ConfigError(f"dataset.tokenizer=bpe needs dataset.bpe_vocab_size (got {cfg.bpe_vocab_size!r}); "
                        f"set it, e.g. dataset.bpe_vocab_size=8000")
    source = resolve_source(cfg)
    if source not in ("local", "hub", "disk", "text"):
        raise DataError(f"dataset.source={source!r} is not one of auto, local, hub, disk, text")
    lines, info = _local_lines(cfg) if source == "local" else _datasets_lines(cfg, source)
    vocab_from = getattr(cfg, "vocab_from", "split")
    if vocab_from not in ("split", "slice"):
        raise ConfigError(f"dataset.vocab_from={vocab_from!r} is not one of split, slice; set dataset.vocab_from=split "
                          f"(the vocabulary of the whole training split) or slice (of the tokens the run trains on)")
    if vocab_from == "slice":
        for s in ("valid", "test"):
            if not any(line.strip() for line in lines[s]):
                where = info.get("files", {}).get(s) or info.get("location")
                raise DataError(f"{cfg.name}: the {s} split ({where}) is empty: it has no words; check the file")
        ids, vocab, tokenizer, extras = _slice_vocab_corpus(cfg, lines, info, cache_dir)
        provenance = dict(info, vocab_from="slice", vocab_size=len(vocab),
                          tokens={s: int(ids[s].numel()) for s in SPLITS}, **extras)
        if cfg.eval_tokens is not None:
            ids["valid"] = ids["valid"][: cfg.eval_tokens]
            ids["test"] = ids["test"][: cfg.eval_tokens]
        provenance["used_tokens"] = {s: int(ids[s].numel()) for s in SPLITS}
        return Corpus(cfg.name, ids["train"], ids["valid"], ids["test"], vocab, provenance, tokenizer)
    tokenizer = None
    if tokenizer_name == "bpe":
        tokenizer = train_bpe(lines["train"], cfg.bpe_vocab_size, cache_dir, sample_lines=cfg.bpe_sample_lines,
                              unk_literal=cfg.unk or None, name=cfg.name)
        key = _bpe_cache_key(info, tokenizer)
    elif tokenizer_name == "byte_bpe":
        from repdegen.data import byte_bpe

        pretrained = byte_bpe.load_pretrained(cfg.byte_bpe)
        key = byte_bpe.corpus_key(info, pretrained)
    else:
        key = _cache_key(info, cfg)
    cache_path = Path(cache_dir) / "corpora" / f"{cfg.name}-{key}.pt" if cache_dir else None
    if cache_path is not None:  # what a writer of this cache entry killed mid-write left
        remove_stale_cache_temps(cache_path)
    if cache_path is not None and cache_path.is_file():
        blob = torch.load(cache_path, weights_only=False)
    elif tokenizer_name == "byte_bpe":
        blob = byte_bpe.corpus_blob(cfg, lines, info, pretrained, key)
    elif tokenizer is not None:
        blob = _bpe_blob(cfg, lines, info, tokenizer, key)
    else:
        tokens = {s: tokenize(lines[s], cfg.eos) for s in SPLITS}
        for s in SPLITS:
            if len(tokens[s]) == 0 or all(t == cfg.eos for t in tokens[s]):
                where = info.get("files", {}).get(s) or info.get("location")
                raise DataError(f"{cfg.name}: the {s} split ({where}) is empty: it has no words; check the file")
        vocab = build_vocab(tokens["train"], cfg.eos, cfg.unk)
        ids, oov = {}, {}
        for s in SPLITS:
            ids[s], oov[s] = numericalize(tokens[s], vocab, s, cfg.name)
        blob = {"itos": vocab.itos, "counts": vocab.counts, "ids": ids, "oov": oov, "info": info, "key": key}
    if cache_path is not None and not cache_path.is_file():
        cache_write(cache_path, lambda tmp: torch.save(blob, tmp))
    if tokenizer_name == "byte_bpe":
        tokenizer = byte_bpe.tokenizer_of(pretrained, blob)
    if tokenizer is not None:
        vocab = tokenizer.vocab()
    else:
        vocab = Vocab(blob["itos"], blob["counts"], eos=cfg.eos, unk=cfg.unk)
    provenance = dict(blob["info"], cache_key=blob["key"], vocab_size=len(vocab), oov=blob["oov"],
                      tokens={s: int(blob["ids"][s].numel()) for s in SPLITS})
    if tokenizer_name == "byte_bpe":
        provenance.update(tokenizer.provenance())
    elif tokenizer is not None:
        provenance.update(tokenizer="bpe", bpe_vocab_size=cfg.bpe_vocab_size, bpe_key=tokenizer.key, bpe_model=tokenizer.path)
    if cfg.vocab_size is not None and len(vocab) != cfg.vocab_size:
        print(f"repdegen: warning: {cfg.name} has {len(vocab)} types, the papers' corpus has {cfg.vocab_size}; "
              f"check the source files ({info.get('files') or info.get('location')})")
    ids = dict(blob["ids"])
    start = getattr(cfg, "train_start", 0) or 0
    if start:
        if start >= ids["train"].numel():
            raise DataError(f"dataset.train_start={start} is beyond the {ids['train'].numel()} training tokens of {cfg.name}")
        ids["train"] = ids["train"][start:]
    if cfg.train_tokens is not None:
        ids["train"] = ids["train"][: cfg.train_tokens]
    if cfg.eval_tokens is not None:
        ids["valid"] = ids["valid"][: cfg.eval_tokens]
        ids["test"] = ids["test"][: cfg.eval_tokens]
    provenance["used_tokens"] = {s: int(ids[s].numel()) for s in SPLITS}
    return Corpus(cfg.name, ids["train"], ids["valid"], ids["test"], vocab, provenance, tokenizer)


# one token stream per split, batched as BPTT columns (or fixed-length blocks) of a language model
register_kind("lm", load_corpus, seq2seq=False, shards_columns=True)
