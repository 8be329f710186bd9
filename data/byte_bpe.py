"""A pretrained byte-level BPE (GPT-2's) for language-model corpora, with this suite's id space.

    dataset.tokenizer=byte_bpe dataset.byte_bpe=gpt2               # the hub's GPT-2 tokenizer (or the local hub cache)
    dataset.tokenizer=byte_bpe dataset.byte_bpe=/path/to/folder    # vocab.json + merges.txt, or tokenizer.json
    dataset.tokenizer=byte_bpe dataset.byte_bpe=/path/tokenizer.json

Yu et al. (2022)'s data step (ysw1021/AGG, ``data/language_model/gpt2_tokenize.py``, then ``fairseq-preprocess
--only-source``, fairseq 0.9) passes each line of the tokenized WikiText-103 files (``wiki.*.tokens``, v1) to
pytorch_transformers' ``GPT2Tokenizer.tokenize``, whose split on the special tokens strips each part of the text first:
a line is encoded as ``line.strip()``, so its first word has no leading-space marker (``Ġ``), its newline is not a
piece, and a blank line has no pieces (the script's ``<|endoftext|>`` check empties it). WikiText's literal ``<unk>``
is plain text to GPT-2: ``Ġ<``, ``unk``, ``>`` (three pieces). The script writes the pieces joined by spaces, one line
each; fairseq's binarizer splits them on whitespace (no byte-level piece holds whitespace) and adds ``</s>`` to every
line, and its dictionary holds the pieces that occur in the training split, sorted by count, with every other piece
of valid/test mapped to ``<unk>``. Here, the same: each line becomes the pieces of ``line.strip()`` + ``</s>``
(:func:`line_text` is that rule).

Ids follow :mod:`repdegen.data.bpe`: ``<pad> <s> </s> <unk>`` (0..3), then the pretrained pieces that occur in the
training split (``dataset.vocab_from=slice``: in the tokens the run trains on), sorted by that count (descending; ties
by the pretrained id, where fairseq breaks ties by the piece's text), so frequency groups are slices of the id range.
A piece of valid/test that training never has is ``<unk>`` (fairseq's ``Dictionary.index``); the corpus's provenance
``oov`` counts those per split. ``counts[i]``: occurrences of id ``i`` in the encoded training lines, one ``</s>`` a
line; ``<unk>`` counts 0 (a byte-level BPE has no unknown characters).

The pretrained tokenizer (``dataset.byte_bpe``): an existing folder or file first (a folder holding ``tokenizer.json``,
or ``vocab.json`` and ``merges.txt``; a ``tokenizer.json`` file; a ``vocab.json`` file with ``merges.txt`` beside it),
else a Hugging Face hub name: the local hub cache, then the hub (``tokenizer.json``). It needs the ``tokenizers``
library (``pip install "repdegen[hf]"``). It must reproduce text exactly (checked on the first training lines), as
a byte-level BPE without a normalizer does.

``Corpus.tokenizer`` is a :class:`ByteBPETokenizer`: ``encode(text)`` gives the pieces ``text`` has as a line of the
corpus (stripped: a word alone is its line-initial form, without ``Ġ``, as the AGG word-similarity script tokenizes
words); ``decode(ids)`` writes ``</s>`` as the newline it stands for, skips ``<pad>``/``<s>`` and writes ``<unk>`` in
place of a piece missing from the dictionary. The encoded corpus is cached under ``<cache_dir>/corpora`` keyed by the
tokenizer's content and the source files (data/corpus.py); a run saves the tokenizer as ``bpe.model`` (the tokenizer's
JSON) and its mapping as ``bpe.json``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch
from repdegen.core.errors import ConfigError, DataError
from repdegen.data.bpe import (
    BOS,
    EOS,
    N_SPECIALS,
    PAD,
    SPECIALS,
    UNK,
    FlatEncoding,
    _as_ids,
    load_model_pair,
    save_model_pair,
)
from repdegen.data.vocab import Vocab

# bump when the line rule, the id mapping or the cached blob below change: old cached corpora are not reused
BYTE_BPE_FORMAT = 1
ENCODE_CHUNK = 100_000
CHECK_LINES = 1000  # training lines whose round trip through the tokenizer is checked
FIX = 'pip install "repdegen[hf]"'


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(f"dataset.tokenizer=byte_bpe needs the `tokenizers` library, which is not installed; "
                          f"install it with {FIX} (or pip install tokenizers), or use dataset.tokenizer=bpe") from None
    return tokenizers


def line_text(line: str) -> str:
    """The text a corpus line is encoded as: the line stripped (see the module doc)."""
    return line.strip()


@dataclass
class Pretrained:
    """A loaded pretrained tokenizer: the ``tokenizers.Tokenizer``, where it came from, and a hash of its content."""

    tokenizer: Any
    value: str  # dataset.byte_bpe as given
    source: str  # the files or hub name it was read from
    key: str

    @classmethod
    def of(cls, tokenizer, value: str, source: str) -> Pretrained:
        blob = repr((BYTE_BPE_FORMAT, tokenizer.to_str())).encode("utf-8", "surrogatepass")
        return cls(tokenizer, value, source, hashlib.sha256(blob).hexdigest()[:16])

    def encode_hf(self, lines: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(the pretrained ids of every line's text concatenated, int64; the number of ids of each line)."""
        encode = getattr(self.tokenizer, "encode_batch_fast", None) or self.tokenizer.encode_batch
        flats, lens = [], []
        for start in range(0, len(lines), ENCODE_CHUNK):
            enc = encode([line_text(s) for s in lines[start : start + ENCODE_CHUNK]], add_special_tokens=False)
            ids = [e.ids for e in enc]
            n = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
            flats.append(np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(n.sum())))
            lens.append(n)
        if not flats:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(flats), np.concatenate(lens)

    def stream(self, lines: Sequence[str]) -> np.ndarray:
        """The pretrained ids of ``lines`` with ``-1`` after each line (where ``</s>`` goes)."""
        flat, lens = self.encode_hf(lines)
        return _insert_after_lines(flat, lens, -1)


def _insert_after_lines(flat: np.ndarray, lens: np.ndarray, value: int) -> np.ndarray:
    out = np.full(flat.size + lens.size, value, dtype=np.int64)
    out[np.arange(flat.size) + np.repeat(np.arange(lens.size), lens)] = flat
    return out


def _first_line(err: BaseException, limit: int = 160) -> str:
    """``<type>: <the message's first sentence>``, at most ``limit`` characters of it."""
    text = (str(err).strip().splitlines() or [""])[0].split(". ")[0].rstrip(".")
    return f"{type(err).__name__}: {text if len(text) <= limit else text[: limit - 3] + '...'}"


def _from_files(tk, path: Path) -> tuple[Any, str]:
    """The tokenizer in the folder or file ``path`` and the files it was read from; a DataError naming what is missing."""
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            path = path / "tokenizer.json"
        elif (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
            path = path / "vocab.json"
        else:
            held = sorted(p.name for p in path.iterdir())[:8]
            raise DataError(f"dataset.byte_bpe={str(path)!r}: the folder holds neither tokenizer.json nor vocab.json + "
                            f"merges.txt (it holds {held or 'nothing'}); point dataset.byte_bpe at a folder with GPT-2's "
                            f"vocab.json and merges.txt (or its tokenizer.json), or use the hub name gpt2")
    merges = path.with_name("merges.txt")
    try:
        if path.name == "vocab.json" or (path.suffix == ".json" and merges.is_file() and "model" not in
                                         json.loads(path.read_text(encoding="utf-8"))):
            if not merges.is_file():
                raise DataError(f"dataset.byte_bpe={str(path)!r}: a vocab.json needs merges.txt beside it ({merges} does "
                                f"not exist); put GPT-2's merges.txt there, or point at a tokenizer.json")
            tok = tk.Tokenizer(tk.models.BPE.from_file(str(path), str(merges)))
            tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = tk.decoders.ByteLevel()
            return tok, f"{path} + {merges.name}"
        return tk.Tokenizer.from_file(str(path)), str(path)
    except DataError:
        raise
    except Exception as err:  # a malformed JSON or merges file: tokenizers and json raise several kinds
        raise DataError(f"dataset.byte_bpe={str(path)!r} could not be read as a byte-level BPE ({_first_line(err)}); "
                        f"expected a tokenizer.json, or vocab.json + merges.txt (GPT-2's files)") from None


def _from_hub(tk, name: str, local: Path) -> tuple[Any, str]:
    """The tokenizer of the hub model ``name``: from the local hub cache, else downloaded; a DataError saying what was
    tried and how to point at local files."""
    tried = []
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        hf_hub_download = None
        tried.append("the hub (huggingface_hub is not installed)")
    if hf_hub_download is not None:
        for local_only, names in ((True, ("tokenizer.json",)), (True, ("vocab.json", "merges.txt")),
                                  (False, ("tokenizer.json",))):
            try:
                paths = [Path(hf_hub_download(name, f, local_files_only=local_only)) for f in names]
            except Exception as err:  # offline, unknown name, no such file: huggingface_hub raises many kinds
                tried.append(f"the local hub cache ({' + '.join(names)}): not there" if local_only
                             else f"the hub ({' + '.join(names)}): {_first_line(err)}")
                continue
            tok, _ = _from_files(tk, paths[0])
            return tok, f"hub {name} ({' + '.join(str(p) for p in paths)})"
    raise DataError(
        f"dataset.byte_bpe={name!r}: no folder or file {local} exists, and the Hugging Face hub gave no tokenizer named "
        f"{name!r}; tried {'; '.join(tried)}. Without a network, copy GPT-2's vocab.json and merges.txt (or its "
        f"tokenizer.json) into a folder and set dataset.byte_bpe=/path/to/that/folder"
    )


def load_pretrained(value: str | None) -> Pretrained:
    """The pretrained byte-level BPE ``dataset.byte_bpe`` names (a folder, a file or a hub name; module doc)."""
    if not value or not str(value).strip():
        raise ConfigError(f"dataset.tokenizer=byte_bpe needs dataset.byte_bpe (got {value!r}): the hub name of a "
                          f"pretrained byte-level BPE (gpt2) or a folder with its vocab.json + merges.txt; e.g. "
                          f"dataset.byte_bpe=gpt2")
    tk = _tokenizers()
    value = str(value)
    path = Path(value).expanduser()
    if path.exists():
        tok, source = _from_files(tk, path)
    elif value.startswith(("/", ".", "~")) or path.suffix in (".json", ".txt") or value.count("/") > 1:
        raise DataError(f"dataset.byte_bpe={value!r}: no such folder or file ({path.resolve()}); point it at a folder "
                        f"holding GPT-2's vocab.json + merges.txt (or tokenizer.json), or give the hub name gpt2")
    else:
        tok, source = _from_hub(tk, value, path.resolve())
    return Pretrained.of(tok, value, source)


def _check_round_trip(pre: Pretrained, lines: Sequence[str]) -> None:
    """The tokenizer must give back each text it encodes (a byte-level BPE does; a normalizer or missing bytes do not)."""
    for n, line in enumerate(lines[:CHECK_LINES], 1):
        text = line_text(line)
        ids = pre.tokenizer.encode(text, add_special_tokens=False).ids
        back = pre.tokenizer.decode(ids, skip_special_tokens=False)
        if back != text:
            raise DataError(f"dataset.byte_bpe={pre.value!r} ({pre.source}) does not reproduce the text it encodes "
                            f"(training line {n}: {text[:60]!r} comes back as {back[:60]!r}); expected a byte-level BPE "
                            f"without a normalizer, such as GPT-2's vocab.json + merges.txt")


class ByteBPETokenizer(FlatEncoding):
    """A pretrained byte-level BPE and the mapping between its ids and ours (see the module doc)."""

    pad_id, bos_id, eos_id, unk_id = PAD, BOS, EOS, UNK

    def __init__(self, pretrained: Pretrained, order: Sequence[int], counts: Sequence[int], path: str | None = None):
        self.pretrained, self.hf, self.path = pretrained, pretrained.tokenizer, path
        self.key, self.name = pretrained.key, pretrained.value
        n_hf = self.hf.get_vocab_size(with_added_tokens=True)
        order = np.asarray(order, dtype=np.int64).reshape(-1)
        if (len(set(order.tolist())) != order.size or (order.size and (order.min() < 0 or order.max() >= n_hf))
                or len(counts) != N_SPECIALS + order.size):
            raise DataError(f"byte-level BPE mapping of {pretrained.source} does not match the tokenizer ({n_hf} pieces, "
                            f"{order.size} mapped, {len(counts)} counts); delete the cached corpus to rebuild it")
        self.order = order
        self._hf2our = np.full(n_hf, UNK, dtype=np.int64)
        self._hf2our[order] = np.arange(N_SPECIALS, N_SPECIALS + order.size)
        self._our2hf = np.concatenate([np.full(N_SPECIALS, -1, dtype=np.int64), order])
        self.itos: list[str] = list(SPECIALS) + [self.hf.id_to_token(int(i)) for i in order]
        clash = sorted(set(self.itos[N_SPECIALS:]) & set(SPECIALS))
        if clash:
            raise DataError(f"dataset.byte_bpe={pretrained.value!r}: the training text holds the piece(s) {clash}, which "
                            f"are our special tokens' names; remove those strings from the corpus")
        self.counts = torch.tensor(list(counts), dtype=torch.long)

    @classmethod
    def from_training(cls, pretrained: Pretrained, train_stream: np.ndarray) -> ByteBPETokenizer:
        """The dictionary of the pieces in ``train_stream`` (pretrained ids, ``-1`` for each line's ``</s>``), by count."""
        n_hf = pretrained.tokenizer.get_vocab_size(with_added_tokens=True)
        hf_counts = np.bincount(train_stream[train_stream >= 0], minlength=n_hf)
        kept = np.flatnonzero(hf_counts)
        order = kept[np.lexsort((kept, -hf_counts[kept]))]
        counts = [0, 0, int(np.count_nonzero(train_stream < 0)), 0] + hf_counts[order].tolist()
        return cls(pretrained, order, counts)

    def __len__(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"ByteBPETokenizer(source={self.pretrained.source!r}, size={len(self)}, key={self.key!r})"

    def vocab(self) -> Vocab:
        return Vocab(list(self.itos), self.counts.clone(), eos=SPECIALS[EOS], unk=SPECIALS[UNK])

    def provenance(self) -> dict:
        return {"tokenizer": "byte_bpe", "byte_bpe": self.pretrained.value, "byte_bpe_source": self.pretrained.source,
                "byte_bpe_key": self.key, "byte_bpe_pieces": len(self) - N_SPECIALS}

    # ---- encoding -------------------------------------------------------------------------------------
    def ours(self, stream: np.ndarray) -> np.ndarray:
        """Our ids of a stream of pretrained ids (``-1``: ``</s>``); pieces outside the dictionary are ``<unk>``."""
        return np.where(stream < 0, EOS, self._hf2our[np.maximum(stream, 0)])

    def encode_flat(self, lines: Sequence[str], add_eos: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(our ids of every line concatenated, int64; each line's length, ``</s>`` included when ``add_eos``)."""
        flat, lens = self.pretrained.encode_hf(lines)
        flat = self._hf2our[flat]
        if not add_eos:
            return flat, lens
        return _insert_after_lines(flat, lens, EOS), lens + 1

    # ---- decoding -------------------------------------------------------------------------------------
    def decode(self, ids) -> str:
        """The text: ``</s>`` is a newline, ``<pad>``/``<s>`` are skipped, ``<unk>`` is written as ``<unk>``."""
        a = _as_ids(ids)
        if a.size and (a.min() < 0 or a.max() >= len(self)):
            raise ValueError(f"id {int(a.min() if a.min() < 0 else a.max())} is outside the vocabulary (0..{len(self) - 1})")
        a = a[(a != PAD) & (a != BOS)]
        parts, start = [], 0
        for u in np.flatnonzero((a == UNK) | (a == EOS)).tolist() + [a.size]:
            if u > start:
                parts.append(self.hf.decode(self._our2hf[a[start:u]].tolist(), skip_special_tokens=False))
            if u < a.size:
                parts.append("\n" if a[u] == EOS else SPECIALS[UNK])
            start = u + 1
        return "".join(parts)

    def decode_batch(self, batch: Iterable) -> list[str]:
        return [self.decode(ids) for ids in batch]

    # ---- persistence ----------------------------------------------------------------------------------
    def save(self, model_path: str | Path, meta: dict | None = None) -> None:
        """Write ``<stem>.json`` (mapping) then ``model_path`` (the tokenizer's JSON): ``save_model_pair``."""
        mapping = {"format": BYTE_BPE_FORMAT, "tokenizer": "byte_bpe", "order": self.order.tolist(),
                   "counts": self.counts.tolist(), "key": self.key, "value": self.pretrained.value,
                   "source": self.pretrained.source, **(meta or {})}
        self.path = save_model_pair(model_path, mapping, self.hf.to_str().encode("utf-8"))

    @classmethod
    def load(cls, model_path: str | Path) -> ByteBPETokenizer:
        model_path = Path(model_path)
        meta = load_model_pair(model_path, "no byte-level BPE at {model} (with its mapping {mapping}); a run saves them "
                                           "there, or rebuild the corpus with dataset.tokenizer=byte_bpe")
        tok = _tokenizers().Tokenizer.from_str(model_path.read_text(encoding="utf-8"))
        pre = Pretrained(tok, meta.get("value", ""), meta.get("source", str(model_path)), meta.get("key", ""))
        return cls(pre, meta["order"], meta["counts"], str(model_path))


# --------------------------------------------------------------------------------------------------
# the corpus (data/corpus.py calls these)
# --------------------------------------------------------------------------------------------------
def corpus_key(info: dict, pretrained: Pretrained) -> str:
    blob = repr((BYTE_BPE_FORMAT, "byte_bpe", pretrained.key, sorted(info.get("sha256", {}).items()),
                 sorted(info.get("fingerprints", {}).items())))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _streams(cfg, lines: dict[str, list[str]], info: dict, pretrained: Pretrained) -> dict[str, np.ndarray]:
    """Each split's pretrained ids with ``-1`` for each line's ``</s>``; an empty split is a DataError."""
    _check_round_trip(pretrained, lines["train"])
    streams = {}
    for s in ("train", "valid", "test"):
        streams[s] = pretrained.stream(lines[s])
        if not np.any(streams[s] >= 0):
            where = info.get("files", {}).get(s) or info.get("location")
            raise DataError(f"{cfg.name}: the {s} split ({where}) is empty: it has no words; check the file")
    return streams


def _ours(tokenizer: ByteBPETokenizer, streams: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """(our ids per split as tensors, the number of pieces outside the dictionary per split)."""
    ids, oov = {}, {}
    for s, stream in streams.items():
        ours = tokenizer.ours(stream)
        ids[s] = torch.from_numpy(ours)
        oov[s] = int(np.count_nonzero(ours == UNK))
    return ids, oov


def corpus_blob(cfg, lines: dict[str, list[str]], info: dict, pretrained: Pretrained, key: str) -> dict:
    """The encoded splits of the whole training split's dictionary, as data/corpus.py caches them (``order`` and
    ``counts`` rebuild the tokenizer: :func:`tokenizer_of`)."""
    streams = _streams(cfg, lines, info, pretrained)
    tokenizer = ByteBPETokenizer.from_training(pretrained, streams["train"])
    ids, oov = _ours(tokenizer, streams)
    return {"tokenizer": "byte_bpe", "itos": tokenizer.itos, "counts": tokenizer.counts, "order": tokenizer.order,
            "ids": ids, "oov": oov, "info": info, "key": key}


def tokenizer_of(pretrained: Pretrained, blob: dict) -> ByteBPETokenizer:
    return ByteBPETokenizer(pretrained, blob["order"], blob["counts"])


def slice_corpus(cfg, lines: dict[str, list[str]], info: dict, window) -> tuple[dict, Vocab, ByteBPETokenizer, dict]:
    """``dataset.vocab_from=slice``: the dictionary of the pieces in the training window the run trains on.
    ``window(n_train) -> (start, end)`` cuts it (data/corpus.py's ``_slice_window``)."""
    pretrained = load_pretrained(cfg.byte_bpe)
    streams = _streams(cfg, lines, info, pretrained)
    start, end = window(int(streams["train"].size))
    streams["train"] = streams["train"][start:end]
    tokenizer = ByteBPETokenizer.from_training(pretrained, streams["train"])
    ids, oov = _ours(tokenizer, streams)
    return ids, tokenizer.vocab(), tokenizer, dict(tokenizer.provenance(), oov=oov)
