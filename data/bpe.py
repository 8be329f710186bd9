"""Sentencepiece BPE with our own id space: specials first, then pieces sorted by training frequency.

    tok = train_bpe(lines, vocab_size=8000, cache_dir="outputs/cache", name="multi30k")
    tok.encode("Ein Hund läuft.")      # [ids] (no EOS)
    tok.decode(ids)                     # detokenized text; <pad>/<s>/</s> skipped
    tok.vocab()                         # repdegen.data.vocab.Vocab (itos, counts, eos="</s>", unk="<unk>")

Ids: ``PAD, BOS, EOS, UNK = 0, 1, 2, 3``, then the sentencepiece pieces sorted by their count in the
encoded training lines (descending; ties by sentencepiece id), so frequency groups are slices of the
id range; pieces that never occur in the encoded training data (intermediate merges) come last.
``counts[i]`` is the number of times id ``i`` occurs in the encoded training lines, with one EOS per
line (the LM corpora and the translation sentences end every line with EOS); ``<pad>`` and ``<s>``
count 0, ``<unk>`` counts the UNKs of the training data (the ``unk_literal`` words, e.g. WikiText's
``<unk>``, and characters outside the model, none with ``character_coverage=1``).

``vocab_size`` counts the pieces, the four specials excluded: ``len(tok) == vocab_size + 4`` (a fairseq
dictionary of ``vocab_size`` BPE types plus its 4 specials); sentencepiece is trained with
``vocab_size + 1`` entries (its own ``<unk>``, which becomes our UNK, and the pieces).
``hard_vocab_limit=False``: a corpus too small for that many merges gives fewer pieces (``len(tok)``
says how many) instead of failing.

Cache: ``<cache_dir>/bpe/<name>-<key>.model`` (the sentencepiece model, usable by ``spm_encode``) and
``<name>-<key>.json`` (our id mapping and counts); ``key`` hashes the training lines and every option
that changes the result, so a second call with the same lines loads instead of training (a model
cached under another name with the same key is the same model, and is used).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Iterable, Sequence
from itertools import chain
from pathlib import Path

import numpy as np
import torch
from repdegen.core.errors import ConfigError, DataError
from repdegen.core.files import cache_write
from repdegen.data.vocab import Vocab

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
N_SPECIALS = len(SPECIALS)
# bump when the trainer options or the id mapping below change: old cached models are not reused
BPE_FORMAT = 2
SP_SEED = 1
ENCODE_CHUNK = 100_000


def _sp():
    import sentencepiece as spm

    return spm


def _as_ids(ids) -> np.ndarray:
    if isinstance(ids, torch.Tensor):
        return ids.detach().cpu().numpy().astype(np.int64, copy=False).reshape(-1)
    return np.asarray(ids, dtype=np.int64).reshape(-1)


def _parts(lines: Sequence[str], lit: str | None) -> tuple[list[str], dict[int, list[int]] | None]:
    """Texts for sentencepiece and, for the lines holding the unk literal as a word, how to reassemble
    them: {line index: [text index, or -1 for the literal]}."""
    if not lit:
        return list(lines), None
    texts: list[str] = []
    plans: dict[int, list[int]] = {}
    for i, line in enumerate(lines):
        if lit not in line or lit not in (words := line.split()):
            texts.append(line)
            continue
        plan, run = [], []
        for w in words:
            if w == lit:
                if run:
                    plan.append(len(texts))
                    texts.append(" ".join(run))
                    run = []
                plan.append(-1)
            else:
                run.append(w)
        if run:
            plan.append(len(texts))
            texts.append(" ".join(run))
        plans[i] = plan
    return texts, plans


def _sp_encode(sp, lines: Sequence[str], lit: str | None) -> list[list[int]]:
    """Sentencepiece ids per line (batch encoding); an unk-literal word is sentencepiece's <unk> (id 0)."""
    texts, plans = _parts(lines, lit)
    enc: list[list[int]] = []
    for start in range(0, len(texts), ENCODE_CHUNK):
        enc.extend(sp.encode(texts[start : start + ENCODE_CHUNK], out_type=int))
    if not plans:
        return enc
    out: list[list[int]] = []
    k = 0
    for i in range(len(lines)):
        plan = plans.get(i)
        if plan is None:
            out.append(enc[k])
            k += 1
            continue
        ids: list[int] = []
        for p in plan:
            if p < 0:
                ids.append(0)
            else:
                ids.extend(enc[p])
                k += 1
        out.append(ids)
    return out


def _sp_flat(sp, lines: Sequence[str], lit: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Sentencepiece ids of every line concatenated (int64) and the number of ids of each line."""
    flats, lens = [], []
    for start in range(0, len(lines), ENCODE_CHUNK):
        enc = _sp_encode(sp, lines[start : start + ENCODE_CHUNK], lit)
        n = np.fromiter(map(len, enc), dtype=np.int64, count=len(enc))
        flats.append(np.fromiter(chain.from_iterable(enc), dtype=np.int64, count=int(n.sum())))
        lens.append(n)
    if not flats:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(flats), np.concatenate(lens)


class FlatEncoding:
    """``encode_batch`` and ``encode`` from a tokenizer's ``encode_flat`` (our ids of every line concatenated, and each
    line's length)."""

    def encode_batch(self, lines: Sequence[str], add_eos: bool = False) -> list[list[int]]:
        flat, lens = self.encode_flat(lines, add_eos)
        return [a.tolist() for a in np.split(flat, np.cumsum(lens)[:-1])] if len(lens) else []

    def encode(self, text: str, add_eos: bool = False) -> list[int]:
        """Our ids of one text, encoded as a corpus line is (no EOS unless ``add_eos``)."""
        return self.encode_flat([text], add_eos)[0].tolist()


class BPETokenizer(FlatEncoding):
    """A trained sentencepiece BPE model and the mapping between its ids and ours (see the module doc)."""

    def __init__(self, model_proto: bytes, order: Sequence[int], counts: Sequence[int], unk_literal: str | None = None,
                 key: str = "", name: str = "bpe", path: str | None = None, restricted: bool = False):
        spm = _sp()
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.model_proto = bytes(model_proto)
        self.unk_literal = unk_literal
        self.key, self.name, self.path = key, name, path
        n_sp = self.sp.get_piece_size()
        order = np.asarray(order, dtype=np.int64)
        # ``order``: every sentencepiece piece but <unk> (id 0), or a subset of them (``restricted``: the pieces
        # that occur in the training text, as a fairseq dictionary holds; the others encode as <unk>)
        valid_order = (len(set(order.tolist())) == len(order) and (order.size == 0 or (order.min() >= 1 and order.max() < n_sp))
                       if restricted else sorted(order.tolist()) == list(range(1, n_sp)))
        if not valid_order or len(counts) != N_SPECIALS + len(order):
            raise DataError(
                f"BPE mapping of {path or name} does not match its model ({n_sp} pieces, {len(order)} mapped, "
                f"{len(counts)} counts); delete the cached files to retrain"
            )
        self.order = order
        # sentencepiece id -> our id (sentencepiece's <unk>, id 0, is our UNK) and back (-1: no piece)
        self.restricted = restricted
        self._sp2our = np.full(n_sp, UNK, dtype=np.int64)
        self._sp2our[order] = np.arange(N_SPECIALS, N_SPECIALS + len(order))
        self._our2sp = np.concatenate([np.array([-1, -1, -1, 0], dtype=np.int64), order])
        self.itos: list[str] = list(SPECIALS) + [self.sp.id_to_piece(int(i)) for i in order]
        clash = sorted(set(self.itos[N_SPECIALS:]) & set(SPECIALS))
        if clash:
            raise DataError(
                f"BPE model {name}: the training text makes the piece(s) {clash}, which are our special tokens; "
                f"if the corpus writes unknown words as {clash[0]!r}, set dataset.unk={clash[0]!r} (unk_literal) so "
                f"they map to <unk>, or remove those strings from the text"
            )
        self.counts = torch.tensor(list(counts), dtype=torch.long)

    # ---- sizes and vocabulary -------------------------------------------------------------------------
    pad_id, bos_id, eos_id, unk_id = PAD, BOS, EOS, UNK

    def __len__(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"BPETokenizer(name={self.name!r}, size={len(self)}, unk_literal={self.unk_literal!r}, key={self.key!r})"

    def vocab(self):
        return Vocab(list(self.itos), self.counts.clone(), eos=SPECIALS[EOS], unk=SPECIALS[UNK])

    # ---- encoding -------------------------------------------------------------------------------------
    def encode_flat(self, lines: Sequence[str], add_eos: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """All lines at once: (ids of every line concatenated, int64; length of each line, EOS included
        when ``add_eos``). Encoded in chunks, so millions of lines never become Python int lists at once."""
        flat, lens = _sp_flat(self.sp, lines, self.unk_literal)
        flat = self._sp2our[flat]
        if not add_eos:
            return flat, lens
        out = np.full(flat.size + lens.size, EOS, dtype=np.int64)
        out[np.arange(flat.size) + np.repeat(np.arange(lens.size), lens)] = flat
        return out, lens + 1

    # ---- decoding -------------------------------------------------------------------------------------
    def decode(self, ids) -> str:
        """Detokenized text. <pad>, <s> and </s> are skipped; <unk> is written as the unk literal (as a word)
        or ``<unk>`` in place."""
        a = _as_ids(ids)
        if a.size and (a.min() < 0 or a.max() >= len(self)):
            raise ValueError(f"id {int(a.min() if a.min() < 0 else a.max())} is outside the vocabulary (0..{len(self) - 1})")
        a = a[(a != PAD) & (a != BOS) & (a != EOS)]
        if not self.unk_literal:
            return self.sp.decode(self._our2sp[a].tolist())
        parts, start = [], 0
        for u in np.flatnonzero(a == UNK).tolist() + [a.size]:
            if u > start:
                text = self.sp.decode(self._our2sp[a[start:u]].tolist()).strip()
                if text:
                    parts.append(text)
            if u < a.size:
                parts.append(self.unk_literal)
            start = u + 1
        return " ".join(parts)

    def decode_batch(self, batch: Iterable) -> list[str]:
        return [self.decode(ids) for ids in batch]

    # ---- persistence ----------------------------------------------------------------------------------
    def save(self, model_path: str | Path, meta: dict | None = None) -> None:
        """Write ``<stem>.json`` (mapping) then ``<stem>.model`` (sentencepiece): :func:`save_model_pair`."""
        mapping = {"format": BPE_FORMAT, "order": self.order.tolist(), "counts": self.counts.tolist(),
                   "unk_literal": self.unk_literal, "key": self.key, "name": self.name, "restricted": self.restricted,
                   **(meta or {})}
        self.path = save_model_pair(model_path, mapping, self.model_proto)

    @classmethod
    def load(cls, model_path: str | Path) -> BPETokenizer:
        model_path = Path(model_path)
        meta = load_model_pair(model_path, "no BPE model at {model} (with its mapping {mapping}); train it with train_bpe")
        return cls(model_path.read_bytes(), meta["order"], meta["counts"], meta.get("unk_literal"), meta.get("key", ""),
                   meta.get("name", model_path.stem), str(model_path), restricted=bool(meta.get("restricted", False)))

    def restricted_to(self, counts) -> BPETokenizer:
        """This model with only the pieces whose ``counts`` (one per id of ours) are > 0, in the order of those
        counts (descending; ties in id order); the other pieces encode as <unk>. The specials stay."""
        counts = np.asarray(counts, dtype=np.int64)
        ours = np.arange(N_SPECIALS, len(self.itos))
        keep = ours[counts[N_SPECIALS:] > 0]
        keep = keep[np.lexsort((keep, -counts[keep]))]
        new_counts = counts[:N_SPECIALS].tolist() + counts[keep].tolist()
        return BPETokenizer(self.model_proto, self._our2sp[keep], new_counts, self.unk_literal, f"{self.key}-occurring",
                            self.name, None, restricted=True)


def save_model_pair(model_path: str | Path, mapping: dict, model: bytes) -> str:
    """A tokenizer on disk: ``<stem>.json`` (our id mapping) then ``model_path`` (the tokenizer's own file), each
    atomically; a cache entry counts as present only when the model file exists, so it is written last."""
    model_path = Path(model_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    for path, data in ((model_path.with_suffix(".json"), json.dumps(mapping).encode()), (model_path, model)):
        cache_write(path, lambda tmp, data=data: tmp.write_bytes(data))
    return str(model_path)


def load_model_pair(model_path: Path, missing: str) -> dict:
    """The id mapping saved beside ``model_path`` (:func:`save_model_pair`); a DataError ``missing`` (formatted with
    ``model`` and ``mapping``) when either file is not there."""
    meta_path = model_path.with_suffix(".json")
    if not model_path.is_file() or not meta_path.is_file():
        raise DataError(missing.format(model=model_path, mapping=meta_path.name))
    return json.loads(meta_path.read_text())


# --------------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------------
def lines_digest(lines: Sequence[str]) -> str:
    h = hashlib.sha256()
    for start in range(0, len(lines), ENCODE_CHUNK):
        h.update("".join(f"{line}\n" for line in lines[start : start + ENCODE_CHUNK]).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _effective_sample(sample_lines: int | None, n_lines: int) -> int:
    return int(sample_lines) if sample_lines and 0 < sample_lines < n_lines else 0


def bpe_key(lines: Sequence[str], vocab_size: int, sample_lines: int | None, unk_literal: str | None) -> str:
    spm = _sp()
    blob = repr((BPE_FORMAT, spm.__version__, lines_digest(lines), len(lines), int(vocab_size),
                 _effective_sample(sample_lines, len(lines)), unk_literal or None))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "bpe"


def cached_path(folder: Path, name: str, key: str, suffix: str) -> Path:
    """``<folder>/<name>-<key><suffix>``; when only another name has that key (the same content, e.g. the
    other translation direction of a corpus), that file."""
    path = folder / f"{_safe_name(name)}-{key}{suffix}"
    if not path.is_file() and folder.is_dir():
        others = sorted(folder.glob(f"*-{key}{suffix}"))
        if others:
            return others[0]
    return path


def train_bpe(lines: Sequence[str], vocab_size: int, cache_dir: str | Path | None, sample_lines: int | None = 2_000_000,
              unk_literal: str | None = None, name: str = "bpe", num_threads: int = 2, verbose: bool = False) -> BPETokenizer:
    """Train (or load from ``<cache_dir>/bpe``) a BPE model of ``vocab_size`` ids (ours, specials included)
    on ``lines``. ``sample_lines > 0``: sentencepiece trains on that many randomly sampled lines when there
    are more (``input_sentence_size``); the counts always come from every line. ``unk_literal``: a word
    that means "unknown word" in the text (WikiText's ``<unk>``): left out of training, encoded as UNK."""
    if vocab_size is None or int(vocab_size) < 1:
        raise ConfigError(
            f"dataset.bpe_vocab_size={vocab_size!r}: a BPE corpus needs a positive number of pieces (the "
            f"{N_SPECIALS} specials come on top), e.g. dataset.bpe_vocab_size=8000"
        )
    if len(lines) == 0 or not any(line.strip() for line in lines):
        raise DataError(f"BPE {name}: the training lines are empty; there is nothing to learn pieces from")
    vocab_size = int(vocab_size)
    key = bpe_key(lines, vocab_size, sample_lines, unk_literal)
    model_path = cached_path(Path(cache_dir) / "bpe", name, key, ".model") if cache_dir else None
    if model_path is not None and model_path.is_file() and model_path.with_suffix(".json").is_file():
        return BPETokenizer.load(model_path)

    spm = _sp()
    if unk_literal:
        def training_lines():
            for line in lines:
                yield " ".join(w for w in line.split() if w != unk_literal) if unk_literal in line else line
    else:
        def training_lines():
            yield from lines

    longest = max(len(line.encode("utf-8", "surrogatepass")) for line in lines)
    sample = _effective_sample(sample_lines, len(lines))
    options = dict(
        model_type="bpe", vocab_size=vocab_size + 1, character_coverage=1.0,
        unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, unk_surface=SPECIALS[UNK], hard_vocab_limit=False,
        num_threads=num_threads, max_sentence_length=max(4192, longest + 1), minloglevel=0 if verbose else 2,
    )
    if sample:
        options.update(input_sentence_size=sample, shuffle_input_sentence=True)
        spm.set_random_generator_seed(SP_SEED)
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=training_lines(), model_writer=writer, **options)
    except RuntimeError as err:
        hint = ("raise dataset.bpe_vocab_size: it must hold every distinct character of the training text"
                if "required_chars" in str(err) or "too small" in str(err) else "check the training lines")
        raise DataError(f"sentencepiece could not train BPE {name} (bpe_vocab_size={vocab_size}, i.e. sentencepiece "
                        f"vocab_size={vocab_size + 1}; {len(lines)} lines): {err}; {hint}") from None
    sp = spm.SentencePieceProcessor(model_proto=writer.getvalue())
    # counts of sentencepiece ids over every training line, then our order
    n_sp = sp.get_piece_size()
    sp_counts = np.zeros(n_sp, dtype=np.int64)
    for start in range(0, len(lines), ENCODE_CHUNK):
        sp_counts += np.bincount(_sp_flat(sp, lines[start : start + ENCODE_CHUNK], unk_literal)[0], minlength=n_sp)
    pieces = np.arange(1, n_sp)
    order = pieces[np.lexsort((pieces, -sp_counts[1:]))]
    counts = [0, 0, len(lines), int(sp_counts[0])] + sp_counts[order].tolist()
    tok = BPETokenizer(writer.getvalue(), order, counts, unk_literal, key, name)
    if model_path is not None:
        tok.save(model_path, meta={"vocab_size": vocab_size, "lines": len(lines), "sample_lines": sample,
                                   "sentencepiece": spm.__version__})
    return tok

