"""BPE (repdegen.data.bpe): round trips, the frequency-sorted id space, the unk literal, the cache, and BPE LM corpora."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
import sentencepiece
import torch
from omegaconf import OmegaConf
from repdegen.data.bpe import BOS, EOS, PAD, SPECIALS, UNK, BPETokenizer, train_bpe
from repdegen.data.corpus import load_corpus
from repdegen.reproduce.errors import ConfigError, DataError
from repdegen.reproduce.settings.schema import DatasetConfig

SENTENCES = [
    "Ein kleines Mädchen läuft über die Straße.",
    "Zwei Hunde spielen im Schnee, während es dunkel wird!",
    "Der Mann trägt einen grünen Hut und spielt Gitarre.",
    "Eine Frau in einem blauen Kleid überquert die Brücke?",
    "„Schön!“, sagte sie; dann ging sie nach Hause.",
    "Fünf Jungen äußern sich (laut) über das Wetter: schlecht.",
    "A little girl runs across the street.",
    "Two dogs are playing in the snow, while it's getting dark!",
    "The man wears a green hat and plays the guitar.",
    "A woman in a blue dress crosses the bridge?",
    "\"Nice!\", she said; then she went home.",
    "Five boys talk (loudly) about the weather: bad - very bad.",
    "Öl, Äpfel und Übungen kosten 12,50 € pro Stück.",
]


def make_lines(n: int, seed: int = 0) -> list[str]:
    """The handwritten sentences plus recombinations of their words (every character occurs in them)."""
    rng = random.Random(seed)
    words = [w for s in SENTENCES for w in s.split()]
    lines = list(SENTENCES)
    while len(lines) < n:
        lines.append(" ".join(rng.choices(words, k=rng.randint(1, 14))))
    return lines


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return make_lines(400)


@pytest.fixture(scope="module")
def tok(lines, tmp_path_factory) -> BPETokenizer:
    return train_bpe(lines, 120, tmp_path_factory.mktemp("bpecache"), name="toy")


def test_round_trip_of_german_and_english_text(tok, lines):
    for s in lines + make_lines(60, seed=7)[len(SENTENCES):]:
        ids = tok.encode(s)
        assert all(i >= len(SPECIALS) for i in ids), s  # every character is covered: no UNK
        assert tok.decode(ids) == s
    assert tok.decode([BOS, *tok.encode("Öl und Äpfel."), EOS, PAD, PAD]) == "Öl und Äpfel."
    assert tok.decode(torch.tensor(tok.encode("über"))) == "über"


def test_specials_and_ids_sorted_by_training_frequency(tok, lines):
    assert tok.itos[:4] == ["<pad>", "<s>", "</s>", "<unk>"] and (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert len(tok) == 120 + 4 and len(set(tok.itos)) == len(tok)  # bpe vocab_size counts the pieces only
    # brute force: count the ids of every encoded training line, one EOS per line
    brute = Counter(i for line in lines for i in tok.encode(line))
    brute[EOS] += len(lines)
    assert tok.counts.tolist() == [brute.get(i, 0) for i in range(len(tok))]
    c = tok.counts[4:]
    assert torch.all(c[:-1] >= c[1:])
    # ties keep sentencepiece's order
    for a in range(len(c) - 1):
        if c[a] == c[a + 1]:
            assert tok.sp.piece_to_id(tok.itos[4 + a]) < tok.sp.piece_to_id(tok.itos[5 + a])
    vocab = tok.vocab()
    assert vocab.itos == tok.itos and vocab.eos_id == EOS and vocab.unk_id == UNK and torch.equal(vocab.counts, tok.counts)


def test_batch_encoding_matches_one_at_a_time(tok, lines):
    flat, lens = tok.encode_flat(lines[:50], add_eos=True)
    expected = [tok.encode(s) + [EOS] for s in lines[:50]]
    assert lens.tolist() == [len(e) for e in expected]
    assert flat.tolist() == [i for e in expected for i in e]
    assert tok.encode_batch(lines[:50]) == [e[:-1] for e in expected]


def test_unknown_characters_and_the_unk_literal(tmp_path, lines):
    plain = train_bpe(lines, 120, None)
    ids = plain.encode("Ein 漢 Hund")
    assert ids.count(UNK) == 1 and plain.decode(ids) == "Ein <unk> Hund"  # in place of the unknown character
    assert plain.decode(plain.encode("Hund漢.")) == "Hund<unk>."
    wiki = [f"{s} <unk> ende" if k % 3 == 0 else s for k, s in enumerate(lines)] + ["<unk>", "<unk> <unk> a"]
    tok = train_bpe(wiki, 120, tmp_path, unk_literal="<unk>", name="wiki")
    assert not any("<" in p and p not in SPECIALS for p in tok.itos)  # the literal is never split into pieces
    ids = tok.encode("Der <unk> Mann <unk>")
    assert ids == tok.encode("Der") + [UNK] + tok.encode("Mann") + [UNK]
    assert tok.decode(ids) == "Der <unk> Mann <unk>" and tok.encode("<unk>") == [UNK]
    assert int(tok.counts[UNK]) == sum(line.split().count("<unk>") for line in wiki)
    assert tok.encode_batch(wiki[:9]) == [tok.encode(s) for s in wiki[:9]]
    # the mapping survives the cache: a reload has the literal
    again = BPETokenizer.load(tok.path)
    assert again.unk_literal == "<unk>" and again.encode("a <unk>") == tok.encode("a <unk>")


def test_cache_hit_does_not_retrain(tmp_path, lines, monkeypatch):
    first = train_bpe(lines, 100, tmp_path, name="c")
    files = sorted(p.name for p in (tmp_path / "bpe").iterdir())
    assert files == [f"c-{first.key}.json", f"c-{first.key}.model"]

    def fail(*a, **k):
        raise AssertionError("retrained")

    monkeypatch.setattr(sentencepiece.SentencePieceTrainer, "train", fail)
    second = train_bpe(list(lines), 100, tmp_path, name="c")
    assert second.itos == first.itos and torch.equal(second.counts, first.counts)
    with pytest.raises(AssertionError, match="retrained"):  # another size or other lines: a new model
        train_bpe(lines, 101, tmp_path, name="c")
    with pytest.raises(AssertionError, match="retrained"):
        train_bpe(lines[:-1], 100, tmp_path, name="c")
    # the key is the content: the same lines under another name reuse the model
    assert train_bpe(lines, 100, tmp_path, name="other").itos == first.itos


def test_small_corpus_gives_fewer_pieces_and_bad_sizes_fail_clearly(tmp_path):
    tiny = train_bpe(["ab ab", "ba"], 500, tmp_path)
    assert 4 < len(tiny) < 500 and tiny.decode(tiny.encode("ab ba")) == "ab ba"
    with pytest.raises(ConfigError, match="bpe_vocab_size=0"):
        train_bpe(["ab"], 0, tmp_path)
    with pytest.raises(DataError, match=r"bpe_vocab_size=8.*required_chars.*raise dataset.bpe_vocab_size"):
        train_bpe(["abcdefghijklmnop qrstuvwxyz"], 8, tmp_path)
    with pytest.raises(DataError, match="empty"):
        train_bpe(["", "  "], 50, tmp_path)


# --------------------------------------------------------------------------------------------------
# BPE language-model corpora through repdegen.data.corpus.load_corpus
# --------------------------------------------------------------------------------------------------
WIKI_FILES = {"train": "train.txt", "valid": "valid.txt", "test": "test.txt"}


def bpe_cfg(root: Path, **kw):
    base = dict(name="wikibpe", local_dir="wikitext-2", files=dict(WIKI_FILES), data_dir=str(root), tokenizer="bpe",
                bpe_vocab_size=90)
    base.update(kw)
    return OmegaConf.structured(DatasetConfig(**base))


def write_wiki(root: Path) -> Path:
    d = root / "wikitext-2"
    d.mkdir(parents=True, exist_ok=True)
    for seed, name in enumerate(WIKI_FILES.values()):
        text = make_lines(150 if seed == 0 else 30, seed)
        text = [f" {s} <unk> . " if k % 4 == 1 else f" {s} " for k, s in enumerate(text)]
        text.insert(2, "")  # a blank line: EOS only, as the word-level reader
        (d / name).write_text("\n".join(text) + "\n")
    return root


def test_bpe_lm_corpus_is_pieces_plus_eos_per_line(tmp_path):
    root = write_wiki(tmp_path / "data")
    corpus = load_corpus(bpe_cfg(root), tmp_path / "cache")
    tok = corpus.tokenizer
    assert isinstance(tok, BPETokenizer) and len(tok) == 94 and tok.unk_literal == "<unk>"
    for split, name in WIKI_FILES.items():
        raw = (root / "wikitext-2" / name).read_text().split("\n")[:-1]
        expected = [i for line in raw for i in [*tok.encode(line), EOS]]
        assert corpus.split(split).tolist() == expected
    # the counts are those of the training stream, and ids are sorted by them
    assert corpus.vocab.itos == tok.itos and corpus.vocab.eos == "</s>" and corpus.vocab.eos_id == EOS
    assert corpus.vocab.counts.tolist() == torch.bincount(corpus.train, minlength=len(tok)).tolist()
    assert torch.all(corpus.vocab.counts[4:-1] >= corpus.vocab.counts[5:])
    assert corpus.provenance["oov"] == {"train": 0, "valid": 0, "test": 0}
    assert corpus.provenance["tokenizer"] == "bpe" and corpus.provenance["vocab_size"] == 94
    # cached: the same corpus again; another BPE size is another corpus
    again = load_corpus(bpe_cfg(root), tmp_path / "cache")
    assert torch.equal(again.train, corpus.train) and again.vocab.itos == corpus.vocab.itos
    other = load_corpus(bpe_cfg(root, bpe_vocab_size=80), tmp_path / "cache")
    assert len(other.vocab) == 84 and len(list((tmp_path / "cache" / "corpora").glob("*.pt"))) == 2
    # the word-level corpus of the same files is untouched by all this
    word = load_corpus(bpe_cfg(root, tokenizer="word"), tmp_path / "cache")
    assert word.tokenizer is None and "<eos>" in word.vocab.stoi and word.vocab.itos[0] != "<pad>"


def test_bpe_lm_corpus_needs_a_vocabulary_size(tmp_path):
    root = write_wiki(tmp_path)
    with pytest.raises(ConfigError, match=r"bpe_vocab_size.*None.*set it"):
        load_corpus(bpe_cfg(root, bpe_vocab_size=None))
    with pytest.raises(ConfigError, match=r"tokenizer='chars'"):
        load_corpus(bpe_cfg(root, tokenizer="chars"))
