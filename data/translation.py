"""Parallel corpora (Multi30k, WMT14 En-De), a joint BPE vocabulary, and token-bucketed batches.

    corpus = load_parallel_corpus(cfg.dataset, cache_dir)     # ParallelCorpus, src_lang -> tgt_lang
    order = token_batches(split.src_lens(), split.tgt_lens(), max_tokens=4096, shuffle=True, seed=epoch)
    batch = collate(corpus.train, order[0]).to(device)         # TranslationBatch

Sources (``dataset.source``), as in :mod:`repdegen.data.corpus`:
  * ``local``: ``<data_dir>/<local_dir>/<files[split].format(lang=...)>``, one sentence per line, line i of
    the two languages aligned (``files`` use a ``{lang}`` placeholder; relative paths such as
    ``../wmt14-newstest2014/newstest2014.{lang}`` work);
  * ``hub``: ``datasets.load_dataset(hub_name, hub_config, revision=hub_revision)`` with records
    ``{translation_field: {lang: text}}`` (the ``wmt14``/``de-en`` layout), or with ``translation_field``
    null, one column per language (``bentrevett/multi30k``); split names from ``hub_splits``;
  * ``disk``: a ``DatasetDict`` saved with ``save_to_disk`` at ``disk_path``, same record layout;
  * ``auto``: ``local`` when a data directory is set, else ``hub``.

One joint BPE model (:func:`repdegen.data.bpe.train_bpe`) is trained on the training sentences of both languages
(the language that sorts first, then the other), so the same cached model and encoded corpus serve both
directions. Every sentence is its BPE ids + ``</s>``. Training pairs with an empty side, more than
``max_len`` BPE tokens on either side (EOS not counted) or a length ratio above ``max_len_ratio`` are
dropped (counted in ``provenance["dropped"]``); evaluation splits are kept whole, but for a valid split held out of
training (``valid_every``: every N-th training pair, :func:`hold_out_valid`), which is filtered as training is.
``train_pairs`` and ``eval_pairs`` keep the first N pairs (after filtering). ``src_text``/``tgt_text`` are the raw lines: the
references for BLEU.

Encoded sentences are cached under ``<cache_dir>/corpora/<name>-<key>.pt``; ``key`` hashes the source
(sha256 of the files or the ``datasets`` fingerprints) and the BPE model's key; filtering, direction and
truncation are applied after loading.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
from repdegen.core.errors import ConfigError, DataError
from repdegen.core.files import cache_write, remove_stale_cache_temps
from repdegen.data.bpe import EOS, PAD, BPETokenizer, cached_path, train_bpe
from repdegen.data.corpus import SPLITS, Vocab, _read_lines, load_dataset_dict, local_base, resolve_source
from repdegen.data.kinds import register_kind

PARALLEL_CACHE_FORMAT = 1


@dataclass
class ParallelSplit:
    """Aligned sentences: ``src[i]``/``tgt[i]`` are LongTensors of BPE ids ending with EOS; ``src_text[i]``/
    ``tgt_text[i]`` the raw sentences."""

    src: list[torch.Tensor]
    tgt: list[torch.Tensor]
    src_text: list[str]
    tgt_text: list[str]

    def __len__(self) -> int:
        return len(self.src)

    def src_lens(self) -> np.ndarray:
        """Length of every source sentence, EOS included."""
        return np.fromiter((t.numel() for t in self.src), dtype=np.int64, count=len(self.src))

    def tgt_lens(self) -> np.ndarray:
        return np.fromiter((t.numel() for t in self.tgt), dtype=np.int64, count=len(self.tgt))


@dataclass
class ParallelCorpus:
    name: str
    train: ParallelSplit
    valid: ParallelSplit
    test: ParallelSplit
    vocab: Vocab
    tokenizer: BPETokenizer
    src_lang: str
    tgt_lang: str
    provenance: dict

    def split(self, name: str) -> ParallelSplit:
        if name not in SPLITS:
            raise KeyError(f"no split {name!r}; splits are {SPLITS}")
        return getattr(self, name)


# --------------------------------------------------------------------------------------------------
# reading the raw sentences: {split: {lang: [lines]}}
# --------------------------------------------------------------------------------------------------
def _local_pairs(cfg, langs: tuple[str, str]) -> tuple[dict, dict]:
    base = local_base(cfg, cfg.files.get("train", "train.{lang}") if cfg.files else "train.{lang}")
    lines: dict[str, dict[str, list[str]]] = {}
    paths: dict[str, dict[str, str]] = {}
    digests: dict[str, dict[str, str]] = {}
    for split in SPLITS:
        if split not in cfg.files:
            raise DataError(f"dataset.files has no entry for split {split!r}; expected keys {SPLITS}, each a file "
                            f"name with a {{lang}} placeholder such as 'train.{{lang}}'")
        pattern = cfg.files[split]
        if "{lang}" not in pattern:
            raise DataError(f"dataset.files.{split}={pattern!r} has no {{lang}} placeholder; a translation corpus has one "
                            f"file per language, e.g. dataset.files.{split}='{split}.{{lang}}'")
        lines[split], paths[split], digests[split] = {}, {}, {}
        for lang in langs:
            path = Path(os.path.normpath(base / cfg.local_dir / pattern.format(lang=lang)))
            if not path.is_file():
                raise DataError(
                    f"{cfg.name}: expected the {split} split's {lang} side at {path}, but there is no such file; fetch "
                    f"the corpus there, fix dataset.files.{split}={pattern!r}, or use dataset.source=hub"
                )
            paths[split][lang] = str(path)
            digests[split][lang] = hashlib.sha256(path.read_bytes()).hexdigest()
            lines[split][lang] = _read_lines(path)
        a, b = langs
        if len(lines[split][a]) != len(lines[split][b]):
            raise DataError(
                f"{cfg.name}: the {split} split is not aligned: {paths[split][a]} has {len(lines[split][a])} lines but "
                f"{paths[split][b]} has {len(lines[split][b])}; line i of each file must be a translation of the other "
                f"(fix the files or point dataset.files.{split} at an aligned pair)"
            )
    return lines, {"source": "local", "files": paths, "sha256": digests}


def _datasets_pairs(cfg, source: str, langs: tuple[str, str]) -> tuple[dict, dict]:
    import datasets

    dsd, where = load_dataset_dict(cfg, source)
    if not isinstance(dsd, datasets.DatasetDict):
        raise DataError(f"{where} is a single Dataset, not a DatasetDict with splits; save a DatasetDict with "
                        f"train/validation/test splits")
    fld = cfg.translation_field
    lines: dict[str, dict[str, list[str]]] = {}
    prints: dict[str, str] = {}
    for split in SPLITS:
        name = cfg.hub_splits.get(split, split)
        if name not in dsd:
            raise DataError(f"{where} has no split {name!r} (it has {', '.join(dsd)}); set dataset.hub_splits.{split}")
        ds = dsd[name]
        if fld:
            if fld not in ds.column_names:
                raise DataError(f"{where}[{name}] has no column {fld!r} (columns: {ds.column_names}); set "
                                f"dataset.translation_field to the column holding {{lang: text}} records, or to null "
                                f"when each language is a column")
            table = ds.select_columns([fld]).flatten()
            prefix, what = f"{fld}.", f"{where}[{name}].{fld}"
        else:
            table, prefix, what = ds, "", f"{where}[{name}] (one column per language)"
        have = [c[len(prefix) :] for c in table.column_names if c.startswith(prefix)]
        missing = [lang for lang in langs if lang not in have]
        if missing:
            raise DataError(f"{what} has no language {missing[0]!r} (it has {have}); set dataset.src_lang and "
                            f"dataset.tgt_lang to languages of the corpus, or dataset.translation_field")
        lines[split] = {lang: list(table[f"{prefix}{lang}"]) for lang in langs}
        prints[split] = ds._fingerprint
    return lines, {"source": source, "location": where, "fingerprints": prints}


# --------------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------------
def hold_out_valid(lines: dict, info: dict, every: int) -> tuple[dict, dict]:
    """The validation pairs taken out of training: every ``every``-th training pair (1-based), and training keeps the
    rest, as the official prepare-wmt14en2de.sh does (``awk 'NR%100 == 0'`` for valid, ``NR%100 != 0`` for train:
    a 1 % held out) before its BPE is learned; the valid split's files are not read into the run."""
    if not isinstance(every, int) or every < 2:
        raise ConfigError(f"dataset.valid_every={every!r}: expected an integer >= 2 (every N-th training pair is held out "
                          f"for validation; 100 for the official 1 %), or null to validate on the valid split's files")
    train = lines["train"]
    out = dict(lines)
    out["valid"] = {lang: sents[every - 1 :: every] for lang, sents in train.items()}
    out["train"] = {lang: [x for i, x in enumerate(sents, 1) if i % every] for lang, sents in train.items()}
    info = dict(info, valid_every=every, valid_source=f"every {every}th training pair, held out")
    return out, info


def _cache_key(info: dict, tokenizer: BPETokenizer) -> str:
    # canonical (sorted) so both directions of one corpus share the entry; a held-out valid split changes what is encoded
    blob = json.dumps([PARALLEL_CACHE_FORMAT, tokenizer.key, info.get("sha256"), info.get("fingerprints")]
                      + ([info["valid_every"]] if info.get("valid_every") else []), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _check_cfg(cfg) -> tuple[str, str]:
    if getattr(cfg, "kind", "translation") != "translation":
        raise ConfigError(f"dataset.kind={cfg.kind!r}: load_parallel_corpus reads translation corpora; "
                          f"set dataset.kind=translation or load the corpus with repdegen.data.corpus.load_corpus")
    if getattr(cfg, "tokenizer", "bpe") != "bpe":
        raise ConfigError(f"dataset.tokenizer={cfg.tokenizer!r}: translation corpora use a joint BPE vocabulary; "
                          f"set dataset.tokenizer=bpe")
    if not cfg.bpe_vocab_size:
        raise ConfigError(f"dataset.bpe_vocab_size={cfg.bpe_vocab_size!r}: a translation corpus needs the size of its "
                          f"joint BPE vocabulary; set it, e.g. dataset.bpe_vocab_size=8000")
    src, tgt = cfg.src_lang, cfg.tgt_lang
    if not src or not tgt or src == tgt:
        raise ConfigError(f"dataset.src_lang={src!r}, dataset.tgt_lang={tgt!r}: a translation corpus needs two "
                          f"different languages, e.g. dataset.src_lang=en dataset.tgt_lang=de")
    for key in ("max_len", "train_pairs", "eval_pairs"):
        value = getattr(cfg, key, None)
        if value is not None and value <= 0:
            raise ConfigError(f"dataset.{key}={value} must be positive (or null for no limit)")
    if cfg.max_len_ratio is not None and cfg.max_len_ratio < 1:
        raise ConfigError(f"dataset.max_len_ratio={cfg.max_len_ratio} must be at least 1 (or null for no limit)")
    return src, tgt


def _select(flat: torch.Tensor, lens: np.ndarray, idx: np.ndarray) -> list[torch.Tensor]:
    """Sentences ``idx`` of a concatenation (lengths ``lens``), as int64 views of one buffer."""
    if len(idx) == 0:
        return []
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])[idx]
    end = int(starts[-1] + lens[idx[-1]])  # idx is increasing
    flat = flat[:end].long()
    if len(idx) == len(lens):
        return list(flat.split(lens.tolist()))
    return [flat[a : a + n] for a, n in zip(starts.tolist(), lens[idx].tolist())]


def _keep_mask(cfg, a_lens: np.ndarray, b_lens: np.ndarray) -> tuple[np.ndarray, dict]:
    """Which training pairs to keep; lengths exclude EOS."""
    empty = (a_lens == 0) | (b_lens == 0)
    too_long = np.zeros_like(empty) if cfg.max_len is None else ~empty & ((a_lens > cfg.max_len) | (b_lens > cfg.max_len))
    if cfg.max_len_ratio is None:
        ratio = np.zeros_like(empty)
    else:
        hi, lo = np.maximum(a_lens, b_lens), np.maximum(np.minimum(a_lens, b_lens), 1)
        ratio = ~empty & ~too_long & (hi > cfg.max_len_ratio * lo)
    keep = ~(empty | too_long | ratio)
    return keep, {"empty": int(empty.sum()), "max_len": int(too_long.sum()), "ratio": int(ratio.sum())}


def load_parallel_corpus(cfg, cache_dir: str | Path | None = None, verbose: bool = True) -> ParallelCorpus:
    """Load (from cache when the source is unchanged) the translation corpus ``cfg`` describes, in the direction
    ``cfg.src_lang -> cfg.tgt_lang``."""
    src_lang, tgt_lang = _check_cfg(cfg)
    langs = tuple(sorted((src_lang, tgt_lang)))
    source = resolve_source(cfg)
    if source == "local":
        lines, info = _local_pairs(cfg, (src_lang, tgt_lang))
    elif source in ("hub", "disk"):
        lines, info = _datasets_pairs(cfg, source, (src_lang, tgt_lang))
    else:
        raise DataError(f"dataset.source={source!r}: translation corpora are read from local, hub or disk (or auto)")
    every = getattr(cfg, "valid_every", None)
    if every is not None:
        lines, info = hold_out_valid(lines, info, every)
    for split in SPLITS:
        n_src, n_tgt = len(lines[split][src_lang]), len(lines[split][tgt_lang])
        if n_src == 0 or n_src != n_tgt:
            where = info.get("files", {}).get(split) or info.get("location")
            raise DataError(f"{cfg.name}: the {split} split ({where}) has {n_src} {src_lang} and {n_tgt} {tgt_lang} sentences; "
                            f"each split needs at least one aligned pair; check the source")

    train_lines = lines["train"][langs[0]] + lines["train"][langs[1]]
    tokenizer = train_bpe(train_lines, cfg.bpe_vocab_size, cache_dir, sample_lines=cfg.bpe_sample_lines, name=cfg.name)
    del train_lines
    key = _cache_key(info, tokenizer)
    cache_path = cached_path(Path(cache_dir) / "corpora", cfg.name, key, ".pt") if cache_dir else None
    if cache_path is not None:  # what a writer of this cache entry killed mid-write left
        remove_stale_cache_temps(cache_path)
    if cache_path is not None and cache_path.is_file():
        blob = torch.load(cache_path, weights_only=False)
    else:
        enc = {}
        for split in SPLITS:
            enc[split] = {}
            for lang in langs:
                flat, lens = tokenizer.encode_flat(lines[split][lang], add_eos=True)
                dtype = np.int32 if len(tokenizer) < 2**31 else np.int64
                enc[split][lang] = {"ids": torch.from_numpy(flat.astype(dtype)), "lens": torch.from_numpy(lens)}
        blob = {"enc": enc, "key": key, "info": info}
        if cache_path is not None:
            cache_write(cache_path, lambda tmp: torch.save(blob, tmp))

    splits: dict[str, ParallelSplit] = {}
    pairs, dropped, used, dropped_valid = {}, {}, {}, {}
    for split in SPLITS:
        e_src, e_tgt = blob["enc"][split][src_lang], blob["enc"][split][tgt_lang]
        s_lens, t_lens = e_src["lens"].numpy(), e_tgt["lens"].numpy()
        pairs[split] = len(s_lens)
        idx = np.arange(len(s_lens))
        # a valid split held out of training is cleaned as training is (prepare-wmt14en2de.sh cleans both)
        if split == "train" or (split == "valid" and info.get("valid_every")):
            keep, counts = _keep_mask(cfg, s_lens - 1, t_lens - 1)
            idx = np.flatnonzero(keep)
            if split == "train":
                dropped = counts
            else:
                dropped_valid = counts
            if len(idx) == 0:
                raise DataError(f"{cfg.name}: every {split} pair was dropped by the filters ({counts}); raise "
                                f"dataset.max_len / dataset.max_len_ratio or set them to null")
        limit = cfg.train_pairs if split == "train" else cfg.eval_pairs
        if limit is not None:
            idx = idx[:limit]
        used[split] = len(idx)
        s_text, t_text = lines[split][src_lang], lines[split][tgt_lang]
        splits[split] = ParallelSplit(_select(e_src["ids"], s_lens, idx), _select(e_tgt["ids"], t_lens, idx),
                                      [s_text[i] for i in idx.tolist()], [t_text[i] for i in idx.tolist()])

    provenance = dict(info, cache_key=blob["key"], tokenizer="bpe", bpe_vocab_size=cfg.bpe_vocab_size,
                      bpe_key=tokenizer.key, bpe_model=tokenizer.path, vocab_size=len(tokenizer),
                      src_lang=src_lang, tgt_lang=tgt_lang, pairs=pairs, dropped=dropped, used_pairs=used,
                      max_len=cfg.max_len, max_len_ratio=cfg.max_len_ratio,
                      **({"dropped_valid": dropped_valid} if info.get("valid_every") else {}),
                      tokens={s: {lang: int(blob["enc"][s][lang]["ids"].numel()) for lang in langs} for s in SPLITS})
    if verbose and any(dropped.values()):
        print(f"repdegen: {cfg.name}: dropped {sum(dropped.values())} of {pairs['train']} training pairs ({dropped})")
    return ParallelCorpus(cfg.name, splits["train"], splits["valid"], splits["test"], tokenizer.vocab(), tokenizer,
                          src_lang, tgt_lang, provenance)


# --------------------------------------------------------------------------------------------------
# batching
# --------------------------------------------------------------------------------------------------
def token_batches(src_lens, tgt_lens, max_tokens: int, shuffle: bool, seed=None) -> list[list[int]]:
    """Pair indices in batches of at most ``max_tokens`` padded tokens (fairseq): pairs sorted by (target length,
    source length), stable; batches filled greedily so that ``len(batch) * max(longest source, longest target)
    <= max_tokens`` (lengths include EOS); with ``shuffle``, the order of the batches is shuffled by
    ``numpy.random.default_rng(seed)`` (an int or a sequence of ints such as ``[seed, epoch]``). Every index
    appears exactly once."""
    s = np.asarray(src_lens, dtype=np.int64).reshape(-1)
    t = np.asarray(tgt_lens, dtype=np.int64).reshape(-1)
    if s.shape != t.shape:
        raise ValueError(f"{s.size} source lengths but {t.size} target lengths")
    if max_tokens <= 0:
        raise ConfigError(f"trainer.max_tokens={max_tokens} must be positive")
    size = np.maximum(s, t)
    if size.size and size.max() > max_tokens:
        i = int(np.argmax(size > max_tokens))
        raise DataError(
            f"sentence pair {i} has {int(size[i])} tokens (source {int(s[i])}, target {int(t[i])}, EOS included), more "
            f"than trainer.max_tokens={max_tokens} allows in one batch; raise trainer.max_tokens or set dataset.max_len "
            f"to drop long training pairs"
        )
    order = np.lexsort((s, t))  # stable: ties keep index order
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i, n in zip(order.tolist(), size[order].tolist()):
        if cur and (len(cur) + 1) * max(longest, n) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    if shuffle:
        perm = np.random.default_rng(seed).permutation(len(batches))
        batches = [batches[k] for k in perm.tolist()]
    return batches


@dataclass
class TranslationBatch:
    """``src`` (B, S) and ``target`` (B, T) right-padded with PAD; ``prev`` (B, T) = EOS then ``target[:, :-1]``
    (the decoder's input, as fairseq); ``n_tokens``: non-pad target tokens; ``indices``: the pairs' indices."""

    src: torch.Tensor
    prev: torch.Tensor
    target: torch.Tensor
    n_tokens: int
    indices: list[int]
    src_lengths: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    def to(self, device, non_blocking: bool = False) -> TranslationBatch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("src", "prev", "target", "src_lengths"):
            moved[name] = moved[name].to(device, non_blocking=non_blocking)
        return TranslationBatch(**moved)

    def pin_memory(self) -> TranslationBatch:
        """The batch in page-locked host memory, so that ``to(cuda, non_blocking=True)`` does not block."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("src", "prev", "target", "src_lengths"):
            moved[name] = moved[name].pin_memory()
        return TranslationBatch(**moved)

    def __len__(self) -> int:
        return self.src.size(0)


def _pad(seqs: list[torch.Tensor], pad: int) -> torch.Tensor:
    out = torch.full((len(seqs), max(x.numel() for x in seqs)), pad, dtype=torch.long)
    for row, x in enumerate(seqs):
        out[row, : x.numel()] = x
    return out


def collate(split: ParallelSplit, indices, pad: int = PAD, eos: int = EOS) -> TranslationBatch:
    """The batch of pairs ``indices`` of ``split`` (see :class:`TranslationBatch`)."""
    indices = [int(i) for i in indices]
    if not indices:
        raise ValueError("collate needs at least one index")
    src = [split.src[i] for i in indices]
    tgt = [split.tgt[i] for i in indices]
    target = _pad(tgt, pad)
    prev = torch.full_like(target, pad)
    prev[:, 0] = eos
    for row, x in enumerate(tgt):
        prev[row, 1 : x.numel()] = x[:-1]
    src_lengths = torch.tensor([x.numel() for x in src], dtype=torch.long)
    return TranslationBatch(_pad(src, pad), prev, target, int(sum(x.numel() for x in tgt)), indices, src_lengths)


def _check_tokenizer(d) -> None:
    if d.tokenizer != "bpe":
        raise ConfigError(f"dataset.tokenizer={d.tokenizer!r}: translation corpora use a joint BPE; set dataset.tokenizer=bpe")


def _check_vocab_from(d) -> None:
    if d.vocab_from != "split":
        raise ConfigError(f"dataset.vocab_from={d.vocab_from!r}: translation corpora build their joint BPE from the training "
                          f"pairs they keep (dataset.train_pairs); set dataset.vocab_from=split")


def _check_languages(d) -> None:
    if not d.src_lang or not d.tgt_lang or d.src_lang == d.tgt_lang:
        raise ConfigError(
            f"dataset.src_lang={d.src_lang!r}, dataset.tgt_lang={d.tgt_lang!r}: a translation corpus needs two different "
            f"languages, e.g. dataset.src_lang=en dataset.tgt_lang=de"
        )


# sentence pairs, token-bucketed batches (not BPTT columns), an encoder-decoder model
register_kind("translation", load_parallel_corpus, seq2seq=True, shards_columns=False,
              checks=(_check_tokenizer, _check_vocab_from, _check_languages))
