"""Parallel corpora (repdegen.data.translation): sources, joint BPE, filtering, token batches and collation."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from repdegen.data.bpe import EOS, PAD
from repdegen.data.translation import ParallelSplit, collate, load_parallel_corpus, token_batches
from repdegen.reproduce.errors import DataError
from repdegen.reproduce.settings.schema import DatasetConfig

from tests.conftest import REAL_DATA, requires_real_data

PAIRS = [
    ("A little girl runs across the street.", "Ein kleines Mädchen läuft über die Straße."),
    ("Two dogs are playing in the snow!", "Zwei Hunde spielen im Schnee!"),
    ("The man wears a green hat.", "Der Mann trägt einen grünen Hut."),
    ("A woman in a blue dress crosses the bridge.", "Eine Frau in einem blauen Kleid überquert die Brücke."),
    ("Five boys talk about the weather.", "Fünf Jungen äußern sich über das Wetter."),
    ("A dog runs.", "Ein Hund läuft."),
    ("The girl plays the guitar in the street.", "Das Mädchen spielt Gitarre auf der Straße."),
]
FILES = {"train": "train.{lang}", "valid": "val.{lang}", "test": "../elsewhere/test.{lang}"}


def make_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """Recombined handwritten pairs (the same words on each side, so every character is in training)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 3)
        chosen = rng.sample(PAIRS, k)
        out.append((" ".join(p[0] for p in chosen), " ".join(p[1] for p in chosen)))
    return out


def write_parallel(root: Path, n_train: int = 120) -> Path:
    splits = {"train": make_pairs(n_train, 0), "valid": make_pairs(12, 1), "test": make_pairs(10, 2)}
    splits["train"][5] = ("", "Leer.")  # an empty side: dropped from train
    splits["train"][7] = ("A dog runs.", "Ein Hund läuft. Zwei Hunde spielen im Schnee!")  # length ratio > 3
    for split, pairs in splits.items():
        for k, lang in enumerate(("en", "de")):
            path = Path(f"{root}/m30/{FILES[split].format(lang=lang)}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(p[k] + "\n" for p in pairs))
    return root


def tr_cfg(root: Path | None, **kw):
    base = dict(name="toy30k", kind="translation", tokenizer="bpe", bpe_vocab_size=150, local_dir="m30", files=dict(FILES),
                data_dir=str(root) if root else None, src_lang="en", tgt_lang="de")
    base.update(kw)
    return OmegaConf.structured(DatasetConfig(**base))


@pytest.fixture(scope="module")
def pdata(tmp_path_factory) -> Path:
    return write_parallel(tmp_path_factory.mktemp("parallel"))


def read(root: Path, split: str, lang: str) -> list[str]:
    return Path(f"{root}/m30/{FILES[split].format(lang=lang)}").read_text().split("\n")[:-1]


def test_local_layout_with_lang_placeholders(pdata, tmp_path):
    corpus = load_parallel_corpus(tr_cfg(pdata), tmp_path)
    tok = corpus.tokenizer
    assert len(corpus.vocab) == len(tok) == 150 + 4 and corpus.vocab.itos == tok.itos
    assert corpus.provenance["pairs"] == {"train": 120, "valid": 12, "test": 10}
    assert corpus.provenance["dropped"] == {"empty": 1, "max_len": 0, "ratio": 0}
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (119, 12, 10)
    for split in ("train", "valid", "test"):
        en, de = read(pdata, split, "en"), read(pdata, split, "de")
        if split == "train":
            en, de = en[:5] + en[6:], de[:5] + de[6:]
        s = corpus.split(split)
        assert s.src_text == en and s.tgt_text == de  # the raw sentences: BLEU references
        for i in range(len(s)):
            assert s.src[i].dtype == torch.long and s.src[i].tolist() == tok.encode(en[i]) + [EOS]
            assert s.tgt[i].tolist() == tok.encode(de[i]) + [EOS]
            assert tok.decode(s.tgt[i]) == de[i]
    # joint BPE: its counts are those of both training sides (all 120 pairs), one EOS per sentence
    brute = torch.zeros(len(tok), dtype=torch.long)
    for line in read(pdata, "train", "en") + read(pdata, "train", "de"):
        brute += torch.bincount(torch.tensor([*tok.encode(line), EOS]), minlength=len(tok))
    assert torch.equal(tok.counts, brute)
    assert corpus.provenance["files"]["test"]["de"] == str(pdata / "elsewhere" / "test.de")


def test_both_directions_share_the_bpe_and_the_cache(pdata, tmp_path, monkeypatch):
    import sentencepiece

    ende = load_parallel_corpus(tr_cfg(pdata), tmp_path)
    monkeypatch.setattr(sentencepiece.SentencePieceTrainer, "train", lambda *a, **k: pytest.fail("retrained"))
    deen = load_parallel_corpus(tr_cfg(pdata, name="toy30k_de_en", src_lang="de", tgt_lang="en"), tmp_path)
    assert deen.provenance["bpe_key"] == ende.provenance["bpe_key"] and deen.vocab.itos == ende.vocab.itos
    assert deen.provenance["cache_key"] == ende.provenance["cache_key"]
    assert (deen.src_lang, deen.tgt_lang) == ("de", "en")
    for a, b in zip(deen.test.src, ende.test.tgt):
        assert torch.equal(a, b)
    assert deen.test.tgt_text == ende.test.src_text
    assert len(list((tmp_path / "bpe").glob("*.model"))) == 1 and len(list((tmp_path / "corpora").glob("*.pt"))) == 1


def test_misaligned_files_name_both_files_and_counts(tmp_path):
    root = write_parallel(tmp_path)
    (root / "m30" / "val.de").write_text("Eins.\nZwei.\n")
    with pytest.raises(DataError, match=r"valid split is not aligned: .*val\.en has 12 lines but .*val\.de has 2"):
        load_parallel_corpus(tr_cfg(root))


def test_missing_file_and_missing_placeholder(tmp_path):
    root = write_parallel(tmp_path)
    (root / "m30" / "train.de").unlink()
    with pytest.raises(DataError, match=r"train split's de side at .*train\.de"):
        load_parallel_corpus(tr_cfg(root))
    with pytest.raises(DataError, match=r"no \{lang\} placeholder"):
        load_parallel_corpus(tr_cfg(root, files={"train": "train.txt", "valid": "v.{lang}", "test": "t.{lang}"}))


def test_disk_datasetdict_gives_the_local_corpus(pdata, tmp_path):
    import datasets

    names = {"train": "train", "valid": "validation", "test": "test"}
    dsd = datasets.DatasetDict({
        hub: datasets.Dataset.from_dict({"translation": [{"de": d, "en": e} for e, d in
                                                         zip(read(pdata, split, "en"), read(pdata, split, "de"))]})
        for split, hub in names.items()
    })
    dsd.save_to_disk(str(tmp_path / "saved"))
    disk = load_parallel_corpus(tr_cfg(None, source="disk", disk_path=str(tmp_path / "saved")), tmp_path / "c")
    local = load_parallel_corpus(tr_cfg(pdata), tmp_path / "c")
    assert disk.provenance["source"] == "disk" and disk.vocab.itos == local.vocab.itos
    for split in ("train", "valid", "test"):
        a, b = disk.split(split), local.split(split)
        assert a.src_text == b.src_text and a.tgt_text == b.tgt_text
        assert all(torch.equal(x, y) for x, y in zip(a.src + a.tgt, b.src + b.tgt))
    with pytest.raises(DataError, match=r"no language 'fr'.*\['de', 'en'\]"):
        load_parallel_corpus(tr_cfg(None, source="disk", disk_path=str(tmp_path / "saved"), tgt_lang="fr"))
    # one column per language (bentrevett/multi30k): translation_field=null
    datasets.DatasetDict({
        hub: datasets.Dataset.from_dict({"en": read(pdata, split, "en"), "de": read(pdata, split, "de")})
        for split, hub in names.items()
    }).save_to_disk(str(tmp_path / "columns"))
    cols = load_parallel_corpus(tr_cfg(None, source="disk", disk_path=str(tmp_path / "columns"), translation_field=None))
    assert cols.test.tgt_text == local.test.tgt_text and all(torch.equal(x, y) for x, y in zip(cols.train.src, local.train.src))


def test_length_filters_and_truncation(pdata, tmp_path):
    full = load_parallel_corpus(tr_cfg(pdata), tmp_path)
    tok = full.tokenizer
    en, de = read(pdata, "train", "en"), read(pdata, "train", "de")
    lens = [(len(tok.encode(a)), len(tok.encode(b))) for a, b in zip(en, de)]
    max_len = int(np.median([max(p) for p in lens]))
    cut = load_parallel_corpus(tr_cfg(pdata, max_len=max_len, max_len_ratio=1.5), tmp_path)
    keep = [i for i, (a, b) in enumerate(lens) if 0 < a <= max_len and 0 < b <= max_len and max(a, b) <= 1.5 * min(a, b)]
    assert cut.train.src_text == [en[i] for i in keep] and cut.train.tgt_text == [de[i] for i in keep]
    too_long = sum(1 for a, b in lens if a and b and max(a, b) > max_len)
    assert cut.provenance["dropped"] == {"empty": 1, "max_len": too_long, "ratio": 119 - too_long - len(keep)}
    assert too_long > 0 and cut.provenance["dropped"]["ratio"] > 0 and 7 not in keep
    assert all(x.numel() <= max_len + 1 for x in cut.train.src + cut.train.tgt)
    assert len(cut.valid) == 12 and len(cut.test) == 10  # evaluation splits are kept whole
    short = load_parallel_corpus(tr_cfg(pdata, train_pairs=7, eval_pairs=3), tmp_path)
    assert short.train.src_text == full.train.src_text[:7] and len(short.valid) == len(short.test) == 3
    assert short.provenance["used_pairs"] == {"train": 7, "valid": 3, "test": 3}


# --------------------------------------------------------------------------------------------------
# token batches and collation
# --------------------------------------------------------------------------------------------------
def padded(batch, s, t) -> int:
    return len(batch) * max(max(s[i], t[i]) for i in batch)


@pytest.mark.parametrize("seed", range(6))
def test_token_batches_respect_max_tokens_and_cover_every_pair(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    s, t = rng.integers(1, 60, n), rng.integers(1, 60, n)
    max_tokens = int(rng.integers(60, 700))
    batches = token_batches(s, t, max_tokens, shuffle=False)
    assert sorted(i for b in batches for i in b) == list(range(n))
    assert all(padded(b, s, t) <= max_tokens for b in batches)
    # unshuffled: the stable (tgt, src) order, cut greedily (the next pair would not have fit)
    assert [i for b in batches for i in b] == sorted(range(n), key=lambda i: (t[i], s[i]))
    for b, nxt in zip(batches, batches[1:]):
        assert padded([*b, nxt[0]], s, t) > max_tokens
    shuffled = token_batches(s, t, max_tokens, shuffle=True, seed=3)
    assert shuffled == token_batches(s, t, max_tokens, shuffle=True, seed=3)
    assert sorted(map(tuple, shuffled)) == sorted(map(tuple, batches))
    if len(batches) > 3:
        assert shuffled != token_batches(s, t, max_tokens, shuffle=True, seed=4)


def test_a_pair_longer_than_max_tokens_is_named():
    with pytest.raises(DataError, match=r"sentence pair 2 has 70 tokens.*raise trainer.max_tokens.*dataset.max_len"):
        token_batches([3, 4, 70], [5, 6, 8], 64, shuffle=False)


def test_collate_shifts_the_target():
    def t(x):
        return torch.tensor(x)

    split = ParallelSplit([t([5, 6, 2]), t([7, 2]), t([9, 2])], [t([8, 9, 10, 2]), t([11, 2]), t([4, 2])],
                          ["a b", "c", "d"], ["w x y", "z", "v"])
    b = collate(split, [0, 1])
    assert b.src.tolist() == [[5, 6, 2], [7, 2, PAD]]
    assert b.target.tolist() == [[8, 9, 10, 2], [11, 2, PAD, PAD]]
    assert b.prev.tolist() == [[EOS, 8, 9, 10], [EOS, 11, PAD, PAD]]
    assert b.n_tokens == 6 and b.indices == [0, 1] and b.src_lengths.tolist() == [3, 2]
    moved = b.to("cpu")
    assert torch.equal(moved.prev, b.prev) and moved.n_tokens == 6 and len(moved) == 2


@pytest.mark.slow
@requires_real_data("multi30k")
def test_real_multi30k(tmp_path):
    cfg = tr_cfg(REAL_DATA, name="multi30k", local_dir="multi30k", bpe_vocab_size=8000,
                 files={"train": "train.{lang}", "valid": "val.{lang}", "test": "test_2016_flickr.{lang}"})
    corpus = load_parallel_corpus(cfg, tmp_path)
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (29000, 1014, 1000)
    assert len(corpus.vocab) == 8004 and torch.all(corpus.vocab.counts[4:-1] >= corpus.vocab.counts[5:])
    tok = corpus.tokenizer
    for split in ("valid", "test"):
        s = corpus.split(split)
        for ids, text in zip(s.tgt + s.src, s.tgt_text + s.src_text):
            assert tok.decode(ids) == " ".join(text.split())  # round trip up to repeated spaces
    batches = token_batches(corpus.train.src_lens(), corpus.train.tgt_lens(), 4096, shuffle=True, seed=1)
    assert sum(map(len, batches)) == 29000


def test_valid_held_out_of_training_every_nth_pair(pdata, tmp_path):
    """``dataset.valid_every=N``: the valid split is training pairs N, 2N, ... (1-based, as ``awk 'NR%N == 0'``), training
    keeps the others, the valid files are not read, and the held-out pairs are filtered as training is."""
    train_en, train_de = read(pdata, "train", "en"), read(pdata, "train", "de")
    pairs = list(zip(train_en, train_de))
    corpus = load_parallel_corpus(tr_cfg(pdata, valid_every=4, max_len_ratio=3.0), tmp_path)
    ratio_pair, empty_pair = pairs[7], pairs[5]  # line 8 (held out: 8 % 4 == 0), over the ratio; line 6, an empty side
    held = [p for i, p in enumerate(pairs, 1) if i % 4 == 0]
    assert ratio_pair in held and empty_pair not in held
    assert list(zip(corpus.valid.src_text, corpus.valid.tgt_text)) == [p for p in held if p != ratio_pair]
    kept = [p for i, p in enumerate(pairs, 1) if i % 4]
    assert list(zip(corpus.train.src_text, corpus.train.tgt_text)) == [p for p in kept if p != empty_pair]
    prov = corpus.provenance
    assert prov["valid_every"] == 4 and prov["dropped_valid"]["ratio"] == 1 and prov["dropped"]["empty"] == 1
    # the same files without it: another cache entry, the valid files again
    plain = load_parallel_corpus(tr_cfg(pdata, max_len_ratio=3.0), tmp_path)
    assert plain.valid.src_text == read(pdata, "valid", "en") and len(list((tmp_path / "corpora").glob("*.pt"))) == 2
    with pytest.raises(Exception, match=r"dataset.valid_every=1: expected an integer >= 2"):
        load_parallel_corpus(tr_cfg(pdata, valid_every=1), tmp_path)
