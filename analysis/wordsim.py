"""Word-similarity evaluation of an embedding matrix (Yu et al. 2022, Sec. 5.2 and Table 6).

Yu et al.: "Methods are tested whether the similarity between the given two words in the embedding
space is consistent with the ground truth, in terms of Spearman's rank correlation. We adopt cosine
distance to compute the similarity between embeddings", on MEN, WS353, RG65 and RW, with the token
embeddings of the language models; Table 6 reports Spearman's rho x 100.

The official script (ysw1021/AGG ``eval_emb.py``) takes the (tied) output-projection matrix, splits each
word with the GPT-2 tokenizer, averages the rows of its sub-word tokens (a token missing from the
dictionary contributes the ``<unk>`` row), scores a pair by the cosine of the two averages, and computes
``scipy.stats.spearmanr`` (average ranks for ties) over every pair of the dataset.

Here (:func:`word_vector`):

* word-level vocabulary (``repdegen.data.vocab.Vocab`` or anything with ``stoi``): the word's row, looked up
  case-sensitively first, then lowercased (PTB is lowercased; WS353 writes "Jerusalem", "CD");
* BPE (``repdegen.data.bpe.BPETokenizer``): ``tokenizer.encode(word)``; sentencepiece prefixes the word with its
  "▁" word-start marker, so the word is split as it would be at the start of a word in running text,
  and the vector is the mean of its pieces' rows (as the AGG code averages sub-word embeddings). The
  AGG code calls ``GPT2Tokenizer.tokenize(word)`` without a leading space, i.e. it uses the
  word-*internal* form of GPT-2's byte-level BPE ("car", not "Ġcar"); sentencepiece always adds the
  word-start marker, so we use the word-initial form, which is the one a standalone word takes in text;
* a pretrained byte-level BPE (``dataset.tokenizer=byte_bpe``, ``repdegen.data.byte_bpe.ByteBPETokenizer``): the
  same call, which encodes the word as a stripped line, i.e. without the leading space, as the AGG code does; a
  piece the training split never has is ``<unk>``.

Out-of-vocabulary handling (``oov``): ``"drop"`` (default) leaves out every pair with a word that is not
in the vocabulary (word level) or that has a piece outside the BPE model (``<unk>``, only for unseen
characters); ``"unk"`` uses the ``<unk>`` row instead, as the AGG code does. Either way the result
records how many pairs had such a word.

Spearman's rho: Pearson correlation of the ranks, tied values sharing their average rank (the standard
definition, as ``scipy.stats.spearmanr``); computed with numpy (scipy is not a dependency).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

# the four datasets of Yu et al. 2022, Table 6 (files of the wordvectors.org collection, in $REPDEGEN_DATA_DIR/word-sim)
WORDSIM_FILES = {
    "MEN": "EN-MEN-TR-3k.txt",
    "WS353": "EN-WS-353-ALL.txt",
    "RG65": "EN-RG-65.txt",
    "RW": "EN-RW-STANFORD.txt",
}

Pair = tuple[str, str, float]


def default_wordsim_dir() -> Path:
    """``$REPDEGEN_DATA_DIR/word-sim``, else ``./word-sim`` (the word-similarity sets are files, not hub datasets)."""
    root = os.environ.get("REPDEGEN_DATA_DIR")
    return (Path(root).expanduser() if root else Path(".")) / "word-sim"


def load_wordsim(path: str | Path) -> list[Pair]:
    """Pairs ``(word1, word2, score)`` of a word-similarity file: one pair per line, fields separated by
    tabs or spaces (``\\r`` of CRLF files is whitespace too); blank lines and comment lines (starting with
    ``#``) are skipped. Duplicate pairs are kept as in the file (WS-353 rates "money cash" twice)."""
    pairs: list[Pair] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if len(fields) < 3:
                raise ValueError(f"{path}:{lineno}: expected 'word1 word2 score', got {line.strip()!r}")
            try:
                score = float(fields[2])
            except ValueError:
                raise ValueError(f"{path}:{lineno}: the score {fields[2]!r} is not a number") from None
            pairs.append((fields[0], fields[1], score))
    return pairs


def load_wordsim_datasets(root: str | Path | None = None, names: Sequence[str] = tuple(WORDSIM_FILES)) -> dict[str, list[Pair]]:
    """The named datasets (keys of :data:`WORDSIM_FILES`) from ``root`` (default :func:`default_wordsim_dir`)."""
    root = Path(root) if root is not None else default_wordsim_dir()
    out = {}
    for name in names:
        if name not in WORDSIM_FILES:
            raise KeyError(f"unknown word-similarity dataset {name!r}; known: {sorted(WORDSIM_FILES)}")
        path = root / WORDSIM_FILES[name]
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: the word-similarity sets are read from $REPDEGEN_DATA_DIR/word-sim/ "
                                    f"({WORDSIM_FILES[name]} and the others of WORDSIM_FILES); set REPDEGEN_DATA_DIR "
                                    f"to the folder holding word-sim/, or pass its path")
        out[name] = load_wordsim(path)
    return out


def rankdata(x) -> np.ndarray:
    """Ranks 1..n of ``x``; tied values get the average of the ranks they span."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    # boundaries of runs of equal values
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], xs.size]
    avg = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def spearman(x, y) -> float:
    """Spearman's rank correlation: the Pearson correlation of the average ranks. NaN when either side
    is constant or has fewer than 2 values."""
    rx, ry = rankdata(x), rankdata(y)
    if rx.size != ry.size:
        raise ValueError(f"spearman: {rx.size} vs {ry.size} values")
    if rx.size < 2:
        return float("nan")
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = np.sqrt((rx * rx).sum() * (ry * ry).sum())
    return float((rx * ry).sum() / denom) if denom > 0 else float("nan")


def _is_tokenizer(vocab_or_tokenizer) -> bool:
    return hasattr(vocab_or_tokenizer, "encode") and not hasattr(vocab_or_tokenizer, "stoi")


def word_ids(word: str, vocab_or_tokenizer) -> tuple[list[int], bool]:
    """(ids whose rows make up ``word``, whether every id is a real entry rather than ``<unk>``).

    Word level: ``[stoi[word]]``, else ``[stoi[word.lower()]]``, else ``([unk_id], False)`` (``[]`` when the
    vocabulary has no ``<unk>``). BPE: the word's word-initial pieces (``tokenizer.encode(word)``)."""
    if _is_tokenizer(vocab_or_tokenizer):
        tok = vocab_or_tokenizer
        ids = list(tok.encode(word))
        unk = getattr(tok, "unk_id", None)
        return ids, bool(ids) and unk not in ids
    stoi = vocab_or_tokenizer.stoi
    for w in (word, word.lower()):
        if w in stoi:
            return [stoi[w]], True
    unk = getattr(vocab_or_tokenizer, "unk_id", None)
    return ([unk] if unk is not None else []), False


def word_vector(word: str, vocab_or_tokenizer, weight: torch.Tensor, oov: str = "drop") -> torch.Tensor | None:
    """The vector of ``word`` from ``weight`` (V x d): its row (word level) or the mean of its BPE pieces'
    rows (see the module doc). An out-of-vocabulary word gives None with ``oov="drop"``; with
    ``oov="unk"`` its missing parts are the ``<unk>`` row (None if there is no ``<unk>``)."""
    if oov not in ("drop", "unk"):
        raise ValueError(f"oov={oov!r}: expected 'drop' or 'unk'")
    ids, known = word_ids(word, vocab_or_tokenizer)
    if not ids or (not known and oov == "drop"):
        return None
    return weight.detach()[torch.tensor(ids, device=weight.device)].to(torch.float64).mean(0)


def evaluate_wordsim(weight: torch.Tensor, vocab_or_tokenizer, datasets: Mapping[str, Sequence[Pair] | str | Path] | None = None,
                     oov: str = "drop") -> dict[str, dict]:
    """Spearman's rho x 100 between the cosine similarity of the two words' vectors and the human score.

    ``datasets``: {name: pairs or a file path}; default the four of Yu et al. 2022 Table 6
    (:func:`load_wordsim_datasets`). Returns ``{name: {"spearman": 100 * rho over the used pairs,
    "pairs": pairs used, "total": pairs in the dataset, "oov": pairs with an out-of-vocabulary word}}``
    (with ``oov="drop"``, ``pairs == total - oov``). A vector of norm 0 has cosine 0.
    """
    if datasets is None:
        datasets = load_wordsim_datasets()
    cache: dict[str, torch.Tensor | None] = {}
    known_cache: dict[str, bool] = {}

    def vec(word: str):
        if word not in cache:
            cache[word] = word_vector(word, vocab_or_tokenizer, weight, oov)
            known_cache[word] = word_ids(word, vocab_or_tokenizer)[1]
        return cache[word]

    results = {}
    for name, data in datasets.items():
        pairs = load_wordsim(data) if isinstance(data, str | Path) else list(data)
        sims, gold, n_oov = [], [], 0
        for w1, w2, score in pairs:
            v1, v2 = vec(w1), vec(w2)
            if not (known_cache[w1] and known_cache[w2]):
                n_oov += 1
            if v1 is None or v2 is None:
                continue
            denom = float(v1.norm() * v2.norm())
            sims.append(float(v1.dot(v2)) / denom if denom > 0 else 0.0)
            gold.append(score)
        results[name] = {
            "spearman": 100.0 * spearman(sims, gold) if len(sims) >= 2 else float("nan"),
            "pairs": len(sims),
            "total": len(pairs),
            "oov": n_oov,
        }
    return results
