"""BLEU against the sacrebleu command line, text tokenized by hand, perl's own compound split and a
plain-Python multi-bleu."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from repdegen.analysis.bleu import bleu_detok, bleu_tokenized, compound_split, splits_compounds, tokenize_for_bleu
from repdegen.reproduce.errors import DataError

REFS = [
    "The state-of-the-art system, which costs $5.50, works.",
    '"Don\'t go," she said (quietly).',
    "A 5-year-old well-known German-American e-mail.",
    "Über-cool x-y-z and a-b-c.",
    "Prices rose 3.5% in 2014-2015.",
    "Mr. Smith-Jones & co. -- the end",
    "The committee's long-term plan was approved on Monday.",
    "Twenty-three people attended the follow-up meeting.",
    "She bought a high-quality, low-cost laptop!",
    "Is this the so-called 'self-driving' car?",
    "The U.S. economy grew by 2.3 per cent last year.",
    "Berlin's mayor met the co-founders at 10:30 a.m.",
]
HYPS = [
    "The state-of-the-art system, which costs $5.50, is working.",
    '"Do not go," she said quietly.',
    "A five-year-old well-known German-American email.",
    "Über-cool x-y-z and a-b-c.",
    "Prices rose by 3.5% in 2014-2015.",
    "Mr. Smith-Jones and co. -- the end",
    "The committee's long-term plan was adopted on Monday.",
    "Twenty-three people attended the follow-up meeting.",
    "She bought a high-quality low-cost laptop.",
    "Is this the so-called self-driving car?",
    "The US economy grew by 2.3 percent last year.",
    "The mayor of Berlin met the co-founders at 10:30.",
]

# 13a tokens + compound split, written by hand for the first six pairs
HAND_REFS = [
    "The state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art system , which costs $ 5.50 , works .",
    "\" Don't go , \" she said ( quietly ) .",
    "A 5 - year ##AT##-##AT## old well ##AT##-##AT## known German ##AT##-##AT## American e ##AT##-##AT## mail .",
    "Über ##AT##-##AT## cool x ##AT##-##AT## y-z and a ##AT##-##AT## b-c .",
    "Prices rose 3.5 % in 2014 - 2015 .",
    "Mr . Smith ##AT##-##AT## Jones & co . -- the end",
]
HAND_HYPS = [
    "The state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art system , which costs $ 5.50 , is working .",
    "\" Do not go , \" she said quietly .",
    "A five ##AT##-##AT## year ##AT##-##AT## old well ##AT##-##AT## known German ##AT##-##AT## American email .",
    "Über ##AT##-##AT## cool x ##AT##-##AT## y-z and a ##AT##-##AT## b-c .",
    "Prices rose by 3.5 % in 2014 - 2015 .",
    "Mr . Smith ##AT##-##AT## Jones and co . -- the end",
]


def sacrebleu_cli(tmp_path: Path, hyps: list[str], refs: list[str], *args: str) -> dict:
    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_text("".join(f"{r}\n" for r in refs), encoding="utf-8")
    hyp.write_text("".join(f"{h}\n" for h in hyps), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-w", "10", "-f", "json", *args],
        capture_output=True, text=True, check=True, encoding="utf-8",
    )
    return json.loads(out.stdout)


def multi_bleu(hyps: list[str], refs: list[str]) -> float:
    """multi-bleu.perl on whitespace tokens: no smoothing, brevity penalty on the corpus lengths."""
    correct, total, c, r = [0] * 4, [0] * 4, 0, 0
    for h, ref in zip(hyps, refs):
        ht, rt = h.split(), ref.split()
        c, r = c + len(ht), r + len(rt)
        for n in range(1, 5):
            hg = Counter(tuple(ht[i : i + n]) for i in range(len(ht) - n + 1))
            rg = Counter(tuple(rt[i : i + n]) for i in range(len(rt) - n + 1))
            correct[n - 1] += sum(min(k, rg[g]) for g, k in hg.items())
            total[n - 1] += sum(hg.values())
    if 0 in correct:
        return 0.0
    bp = 1.0 if c >= r else math.exp(1 - r / c)
    return 100 * bp * math.exp(sum(math.log(k / t) for k, t in zip(correct, total)) / 4)


def test_bleu_detok_equals_the_sacrebleu_command_line(tmp_path):
    cli = sacrebleu_cli(tmp_path, HYPS, REFS)
    ours = bleu_detok(HYPS, REFS)
    assert ours["score"] == pytest.approx(cli["score"], abs=1e-6)
    assert ours["signature"] == cli["signature"]
    assert ours["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert 0 < ours["score"] < 100 and len(ours["precisions"]) == 4 and ours["flavour"] == "sacrebleu"


def test_compound_split_by_hand():
    assert compound_split("state-of-the-art") == "state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art"
    assert compound_split("rich-text format") == "rich ##AT##-##AT## text format"
    # perl's s///g does not overlap: after "a-b" the scan resumes past "b", so "-c" is left alone
    assert compound_split("a-b-c") == "a ##AT##-##AT## b-c"
    assert compound_split("a-b-c-d-e") == "a ##AT##-##AT## b-c ##AT##-##AT## d-e"
    assert compound_split("a--b") == "a ##AT##-##AT## -b"
    for unchanged in ("-x", "x-", "a - b", "--", "no hyphen"):
        assert compound_split(unchanged) == unchanged
    # perl reads bytes: "\S" is one byte of "ü", so the scan resumes inside it and "-b" still matches
    assert compound_split("a-ü-b") == "a ##AT##-##AT## ü ##AT##-##AT## b"


@pytest.mark.skipif(shutil.which("perl") is None, reason="perl is not installed")
def test_compound_split_equals_perl(tmp_path):
    lines = [*REFS, *HYPS, "a-ü-b ü-b-ä a-b-c-d-e --x x-- a--b -- 1-2-3", "x\u00a0-y z-\u00e9-\u00e8-w"]
    src = tmp_path / "in.txt"
    src.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    perl = subprocess.run(["perl", "-ple", "s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g"], stdin=src.open("rb"),
                          capture_output=True, check=True).stdout.decode("utf-8")
    assert perl.splitlines() == [compound_split(line) for line in lines]


def test_tokenization_by_hand():
    assert [tokenize_for_bleu(s) for s in REFS[:6]] == HAND_REFS
    assert [tokenize_for_bleu(s) for s in HYPS[:6]] == HAND_HYPS
    assert tokenize_for_bleu("well-known.", compound_split_hyphens=False) == "well-known ."


def test_bleu_tokenized_equals_the_command_line_on_hand_tokenized_text(tmp_path):
    cli = sacrebleu_cli(tmp_path, HAND_HYPS, HAND_REFS, "-tok", "none", "-s", "none")
    ours = bleu_tokenized(HYPS[:6], REFS[:6])
    assert ours["score"] == pytest.approx(cli["score"], abs=1e-6)
    assert ours["score"] == pytest.approx(multi_bleu(HAND_HYPS, HAND_REFS), abs=1e-9)
    assert ours["signature"] == cli["signature"]
    assert "compound splitting" in ours["description"] and ours["flavour"] == "tokenized+compound_split"


def test_bleu_tokenized_on_the_whole_corpus(tmp_path):
    ours = bleu_tokenized(HYPS, REFS)
    hyps_tok, refs_tok = [tokenize_for_bleu(h) for h in HYPS], [tokenize_for_bleu(r) for r in REFS]
    assert ours["score"] == pytest.approx(multi_bleu(hyps_tok, refs_tok), abs=1e-9)
    # splitting compounds adds easy matches ("##AT##-##AT##"): the score differs from the plain one
    plain = bleu_tokenized(HYPS, REFS, compound_split=False)
    assert plain["score"] != pytest.approx(ours["score"]) and plain["flavour"] == "tokenized"
    assert "compound" not in plain["description"]
    cli = sacrebleu_cli(tmp_path, HYPS, REFS, "-tok", "13a", "-s", "none")
    assert plain["score"] == pytest.approx(cli["score"], abs=1e-6)


def test_perfect_hypotheses_score_100_and_no_match_scores_0():
    assert bleu_detok(REFS, REFS)["score"] == pytest.approx(100.0)
    assert bleu_tokenized(REFS, REFS)["score"] == pytest.approx(100.0)
    # multi-bleu has no smoothing: no 4-gram match at all gives 0; SacreBLEU's exp smoothing does not
    hyps, refs = ["the cat sat on"], ["the cat sat in"]
    assert bleu_tokenized(hyps, refs)["score"] == 0.0
    assert bleu_detok(hyps, refs)["score"] > 0.0


def test_mismatched_or_empty_inputs_are_data_errors():
    with pytest.raises(DataError, match="3 hypotheses but 2 references"):
        bleu_detok(["a", "b", "c"], ["a", "b"])
    with pytest.raises(DataError, match="1 hypotheses but 2 references"):
        bleu_tokenized(["a"], ["a", "b"])
    with pytest.raises(DataError, match="no sentences"):
        bleu_detok([], [])
    with pytest.raises(DataError, match="lists of sentences"):
        bleu_tokenized("a b", "a b")


def test_the_compound_split_is_for_german_output_only():
    """tensor2tensor's get_ende_bleu.sh and fairseq's compound_split_bleu.sh are En->De scripts; De->En is scored
    tokenized without the split (Gao et al. 2019 Sec. 6.2: "tokenized case-sensitive BLEU")."""
    assert splits_compounds("de") and splits_compounds("DE")
    assert not splits_compounds("en") and not splits_compounds(None)
    assert tokenize_for_bleu("a state-of-the-art model", False) == "a state-of-the-art model"
    hyp = ["the state-of-the-art model works well on this test set today"]
    assert bleu_tokenized(hyp, hyp, compound_split=False)["flavour"] == "tokenized"
