"""Corpus BLEU (Papineni et al. 2002) in the two flavours the translation papers report, via sacrebleu.

* ``bleu_detok``: standard SacreBLEU (Post 2018) on detokenized text: ``sacrebleu.metrics.BLEU()``
  with its defaults (13a tokenization, case-sensitive, exp smoothing), reported with its signature,
  e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``. Comparable across papers.
* ``bleu_tokenized``: the "tokenized case-sensitive BLEU with compound splitting" of Vaswani et al.
  (2017) and fairseq (``scripts/compound_split_bleu.sh``; tensor2tensor's ``get_ende_bleu.sh``): the
  text is Moses-tokenized, every intra-word hyphen is split by perl's
  ``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g``, and ``multi-bleu.perl`` (fairseq: ``fairseq-score``, the same
  formula) scores the whitespace-separated tokens (no smoothing).
  Here the Moses tokenizer (not a dependency) is approximated by sacrebleu's 13a tokenizer
  (``Tokenizer13a``, mteval-v13a's rules: punctuation split off, but period and comma kept inside
  numbers and hyphens kept inside words, as ``tokenizer.perl`` without ``-a``); the two differ in
  details (Moses splits clitics, "don't" -> "don 't", and escapes "&" as "&amp;"; 13a keeps "don't",
  splits a hyphen after a digit, "5-year" -> "5 - year", where Moses keeps "5-year"). The split
  is applied to the UTF-8 bytes, as perl reads a file without ``-C``: ``\\S`` is one non-whitespace
  byte, matches do not overlap and the scan resumes after the byte that follows the hyphen, so "a-b-c" becomes
  "a ##AT##-##AT## b-c" (only every other hyphen between one-character pieces is split). The tokens
  are scored by ``BLEU(tokenize="none", smooth_method="none", force=True)``, which is multi-bleu's
  formula (brevity penalty exp(1 - r/c) when c < r; BLEU = 0 when an n-gram order has no match).

Both are corpus-level with one reference per sentence and return the score in [0, 100].
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from repdegen.core.errors import DataError
from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

_COMPOUND = re.compile(rb"(\S)-(\S)")  # a bytes pattern: \S is one non-whitespace byte, as in perl
_TOKENIZER_13A = Tokenizer13a()

TOKENIZED_DESCRIPTION = (
    "tokenized case-sensitive BLEU with compound splitting (13a tokenization approximating Moses, "
    "##AT##-##AT## compound split, multi-bleu: no smoothing)"
)
PLAIN_TOKENIZED_DESCRIPTION = "tokenized case-sensitive BLEU (13a tokenization approximating Moses, multi-bleu: no smoothing)"


# the output languages the compound split is the convention for: German (tensor2tensor's get_ende_bleu.sh and
# fairseq's compound_split_bleu.sh are En->De scripts; Gao et al. 2019 report "tokenized case-sensitive BLEU" for
# De->En too, with no split)
COMPOUND_SPLIT_LANGS = ("de",)


def splits_compounds(tgt_lang: str | None) -> bool:
    """Whether ``bleu_tokenized`` applies the compound split to output in ``tgt_lang`` (German: yes)."""
    return (tgt_lang or "").lower() in COMPOUND_SPLIT_LANGS


def compound_split(line: str) -> str:
    """perl ``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`` on the line's UTF-8 bytes."""
    return _COMPOUND.sub(rb"\1 ##AT##-##AT## \2", line.encode("utf-8")).decode("utf-8")


def tokenize_13a(line: str) -> str:
    """sacrebleu's 13a (mteval-v13a) tokenization of one line."""
    return _TOKENIZER_13A(line)


def tokenize_for_bleu(line: str, compound_split_hyphens: bool = True) -> str:
    """The text ``bleu_tokenized`` scores: 13a tokens, then (by default) the compound split."""
    tokens = tokenize_13a(line)
    return compound_split(tokens) if compound_split_hyphens else tokens


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if isinstance(hyps, str) or isinstance(refs, str):
        raise DataError("hyps and refs must be lists of sentences, not single strings; wrap one sentence as [sentence]")
    if len(hyps) != len(refs):
        raise DataError(
            f"{len(hyps)} hypotheses but {len(refs)} references; BLEU needs one reference per hypothesis "
            "(check that no output line was lost or that the right split's references were loaded)"
        )
    if len(hyps) == 0:
        raise DataError("no sentences to score (0 hypotheses and 0 references); check the evaluation split")


def _fields(score) -> dict:
    return {
        "score": float(score.score),
        "precisions": [float(p) for p in score.precisions],
        "bp": float(score.bp),
        "ratio": float(score.ratio),
        "sys_len": int(score.sys_len),
        "ref_len": int(score.ref_len),
        "counts": [int(c) for c in score.counts],
        "totals": [int(t) for t in score.totals],
        "text": str(score),
    }


def bleu_detok(hyps: Sequence[str], refs: Sequence[str]) -> dict:
    """Standard SacreBLEU of detokenized hypotheses against detokenized references.

    Returns ``score``, ``signature`` (sacrebleu's, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|
    version:2.6.0``), ``precisions`` (1- to 4-gram, %), ``bp``, ``ratio``, ``sys_len``, ``ref_len``,
    ``counts``, ``totals``, ``text`` (sacrebleu's one-line summary) and ``flavour`` = ``"sacrebleu"``.
    """
    _check(hyps, refs)
    bleu = BLEU()
    score = bleu.corpus_score(list(hyps), [list(refs)])
    return {**_fields(score), "signature": str(bleu.get_signature()), "flavour": "sacrebleu"}


def bleu_tokenized(hyps: Sequence[str], refs: Sequence[str], compound_split: bool = True) -> dict:
    """Tokenized case-sensitive BLEU (with compound splitting by default), as Vaswani et al. report.

    Both sides are tokenized by ``tokenize_for_bleu``. Returns ``score``, ``description`` (what was
    computed, in words), ``signature`` (sacrebleu's, with ``tok:none|smooth:none``), the fields of
    ``bleu_detok`` and ``flavour`` = ``"tokenized+compound_split"`` (or ``"tokenized"``).
    """
    _check(hyps, refs)
    sys_tok = [tokenize_for_bleu(h, compound_split) for h in hyps]
    ref_tok = [tokenize_for_bleu(r, compound_split) for r in refs]
    bleu = BLEU(tokenize="none", smooth_method="none", force=True)
    score = bleu.corpus_score(sys_tok, [ref_tok])
    description = TOKENIZED_DESCRIPTION if compound_split else PLAIN_TOKENIZED_DESCRIPTION
    return {
        **_fields(score),
        "signature": str(bleu.get_signature()),
        "description": description,
        "flavour": "tokenized+compound_split" if compound_split else "tokenized",
    }
