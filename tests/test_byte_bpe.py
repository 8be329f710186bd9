"""A pretrained byte-level BPE (repdegen.data.byte_bpe, dataset.tokenizer=byte_bpe) on a tiny WikiText-layout corpus,
checked against the tokenizer's own encodings: the stripped lines + </s>, ids by training frequency after the 4
specials, unseen test pieces as <unk>, decoding, the cache, the slice window and the errors."""

from __future__ import annotations

import json
import math
import random
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from repdegen.data.bpe import EOS, SPECIALS, UNK
from repdegen.data.corpus import load_corpus
from repdegen.reproduce.errors import ConfigError, DataError
from repdegen.reproduce.settings.schema import DatasetConfig

FILES = {"train": "train.txt", "valid": "valid.txt", "test": "test.txt"}
WORDS = ("the of and in to a was is on as for with by he it from at his that an which were city river king game "
         "album song film team season war army ship road station church school year first new world The King London "
         "American").split()
RARE = ["Ωmega", "zyxt", "Ærø"]  # in the tokenizer's training text and in valid/test, never in the corpus's train split


def _lines(n: int, seed: int, rare: bool) -> list[str]:
    """WikiText-like lines: a leading space, titles, blank lines, <unk>; ``rare``: some hold words of RARE."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        if k % 9 == 0:
            out.append(" ")  # WikiText's blank lines
        words = rng.choices(WORDS, k=rng.randint(2, 12))
        if k % 5 == 1:
            words.insert(rng.randint(0, len(words)), "<unk>")
        if k % 3 == 0:
            words.insert(0, "<unk>")  # line-initial
        if rare and k % 4 == 2:
            words.insert(rng.randint(0, len(words)), rng.choice(RARE))
        out.append(f" = {' '.join(words[:3])} = " if k % 11 == 0 else f" {' '.join(words)} . ")
    return out


@pytest.fixture(scope="module")
def tk():
    return pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bytedata")
    d = root / "wikitext-2"
    d.mkdir()
    for seed, (split, name) in enumerate(FILES.items()):
        (d / name).write_text("\n".join(_lines(300 if split == "train" else 60, seed, rare=split != "train")) + "\n")
    return root


def _train_tokenizer(tk, texts: list[str]):
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=420, initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                     show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


@pytest.fixture(scope="module")
def trained(tk):
    """A byte-level BPE trained on a few hundred lines of its own text (RARE words included)."""
    return _train_tokenizer(tk, [line.strip() for line in _lines(400, 99, rare=True)])


@pytest.fixture(scope="module")
def bpe_dir(trained, tmp_path_factory) -> Path:
    """``trained`` saved as vocab.json + merges.txt, the layout of GPT-2's files."""
    folder = tmp_path_factory.mktemp("gpt2like")
    trained.model.save(str(folder))
    assert sorted(p.name for p in folder.iterdir()) == ["merges.txt", "vocab.json"]
    return folder


@pytest.fixture(scope="module")
def json_file(trained, tmp_path_factory) -> Path:
    """``trained`` saved as one tokenizer.json."""
    path = tmp_path_factory.mktemp("gpt2json") / "tokenizer.json"
    trained.save(str(path))
    return path


def _cfg(root: Path, value, **kw):
    base = dict(name="wikibyte", local_dir="wikitext-2", files=dict(FILES), data_dir=str(root), tokenizer="byte_bpe",
                byte_bpe=None if value is None else str(value), eos="</s>")
    base.update(kw)
    return OmegaConf.structured(DatasetConfig(**base))


def _raw(root: Path, split: str) -> list[str]:
    return (root / "wikitext-2" / FILES[split]).read_text().split("\n")[:-1]


def _brute(tk, bpe_dir: Path, root: Path, train_lines: list[str] | None = None):
    """The expectation, from the tokenizer files alone: each split's pieces (of the stripped lines), the training
    Counter, the id order (4 specials, then by count, ties by the tokenizer's id) and each split's ids."""
    hf = tk.Tokenizer(tk.models.BPE.from_file(str(bpe_dir / "vocab.json"), str(bpe_dir / "merges.txt")))
    hf.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    pieces = {s: [hf.encode(line.strip()).tokens for line in _raw(root, s)] for s in FILES}
    counter = Counter(p for line in (train_lines or pieces["train"]) for p in line)
    order = sorted(counter, key=lambda p: (-counter[p], hf.token_to_id(p)))
    itos = list(SPECIALS) + order
    stoi = {p: i for i, p in enumerate(itos)}
    ids = {s: [i for line in pieces[s] for i in [*(stoi.get(p, UNK) for p in line), EOS]] for s in FILES}
    return hf, pieces, counter, itos, ids


def test_ids_are_the_stripped_lines_pieces_plus_eos_sorted_by_training_frequency(tk, bpe_dir, corpus_root, tmp_path):
    corpus = load_corpus(_cfg(corpus_root, bpe_dir), tmp_path / "cache")
    hf, pieces, counter, itos, ids = _brute(tk, bpe_dir, corpus_root)
    tok = corpus.tokenizer
    assert tok.itos == itos and corpus.vocab.itos == itos and itos[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
    n_train = len(_raw(corpus_root, "train"))
    assert tok.counts.tolist() == [0, 0, n_train, 0] + [counter[p] for p in itos[4:]]
    assert corpus.vocab.counts.tolist() == torch.bincount(corpus.train, minlength=len(tok)).tolist()
    assert all(c > 0 for c in tok.counts[4:].tolist())  # only pieces that occur in training
    assert len(tok) < hf.get_vocab_size()  # ... so not every piece of the tokenizer
    for s in FILES:
        assert corpus.split(s).tolist() == ids[s], s
    # the line rule: no line-initial Ġ, no newline piece, WikiText's <unk> as characters, a blank line is </s> alone
    assert "Ċ" not in "".join(itos) and "<unk>" not in itos[4:] and {"Ġ<", "unk", ">"} <= set(itos)
    assert pieces["train"][0] == [] and corpus.train[0].item() == EOS
    assert UNK not in corpus.train.tolist() and corpus.provenance["oov"]["train"] == 0
    assert corpus.provenance["tokenizer"] == "byte_bpe" and corpus.provenance["byte_bpe"] == str(bpe_dir)


def test_unseen_test_pieces_map_to_unk(tk, bpe_dir, corpus_root, tmp_path):
    corpus = load_corpus(_cfg(corpus_root, bpe_dir), tmp_path / "cache")
    _, pieces, counter, _, _ = _brute(tk, bpe_dir, corpus_root)
    for s in ("valid", "test"):
        unseen = sum(p not in counter for line in pieces[s] for p in line)
        assert unseen > 0 and corpus.provenance["oov"][s] == unseen
        assert corpus.split(s).tolist().count(UNK) == unseen
    # and the tokenizer itself: a rare word's pieces outside the dictionary are <unk>
    assert UNK in corpus.tokenizer.encode("Ωmega")


def test_decoding_gives_back_the_text(tk, bpe_dir, corpus_root, tmp_path):
    tok = load_corpus(_cfg(corpus_root, bpe_dir), tmp_path / "cache").tokenizer
    raw = _raw(corpus_root, "train")
    flat, lens = tok.encode_flat(raw, add_eos=True)
    assert lens.tolist() == [len(tok.encode(line)) + 1 for line in raw]
    # </s> is the newline of each line; the line is stripped; <unk> is its characters
    assert tok.decode(flat) == "".join(f"{line.strip()}\n" for line in raw)
    assert tok.decode(tok.encode(" the <unk> king . ")) == "the <unk> king ."
    assert tok.decode([1, 0, *tok.encode("the king"), EOS, 0]) == "the king\n"
    assert tok.decode(tok.encode("the Ωmega")).startswith("the") and "<unk>" in tok.decode(tok.encode("the Ωmega"))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([len(tok)])
    # word similarity splits a word with encode (analysis/wordsim.py): the line-initial form, known if no <unk>
    from repdegen.analysis.wordsim import word_ids

    ids, known = word_ids("king", tok)
    assert known and tok.decode(ids) == "king" and tok.itos[ids[0]] == "king"
    assert word_ids("Ωmega", tok)[1] is False


def test_tokenizer_json_gives_the_same_corpus_and_the_cache_is_used(tk, bpe_dir, json_file, corpus_root, tmp_path,
                                                                     monkeypatch):
    from repdegen.data import byte_bpe

    a = load_corpus(_cfg(corpus_root, bpe_dir), tmp_path / "cache")
    b = load_corpus(_cfg(corpus_root, json_file.parent), tmp_path / "cache2")
    assert a.tokenizer.itos == b.tokenizer.itos and all(torch.equal(a.split(s), b.split(s)) for s in FILES)
    assert len(list((tmp_path / "cache" / "corpora").glob("wikibyte-*.pt"))) == 1
    monkeypatch.setattr(byte_bpe, "corpus_blob", lambda *a, **k: pytest.fail("the cached corpus was not used"))
    c = load_corpus(_cfg(corpus_root, bpe_dir), tmp_path / "cache")
    assert c.tokenizer.itos == a.tokenizer.itos and torch.equal(c.test, a.test)
    assert c.tokenizer.encode("the king") == a.tokenizer.encode("the king")
    # an edited tokenizer is another cache entry
    edited = tmp_path / "edited"
    edited.mkdir()
    spec = json.loads(json_file.read_text())
    assert spec["pre_tokenizer"]["type"] == "ByteLevel" and spec["pre_tokenizer"]["trim_offsets"] is True
    spec["pre_tokenizer"]["trim_offsets"] = False  # offsets only: the same pieces, another tokenizer
    (edited / "tokenizer.json").write_text(json.dumps(spec))
    monkeypatch.undo()
    load_corpus(_cfg(corpus_root, edited), tmp_path / "cache")
    assert len(list((tmp_path / "cache" / "corpora").glob("wikibyte-*.pt"))) == 2


def test_save_and_load_round_trip(tk, bpe_dir, corpus_root, tmp_path):
    from repdegen.data.byte_bpe import ByteBPETokenizer

    tok = load_corpus(_cfg(corpus_root, bpe_dir), tmp_path / "cache").tokenizer
    tok.save(tmp_path / "run" / "bpe.model")  # what a run writes beside its weights
    meta = json.loads((tmp_path / "run" / "bpe.json").read_text())
    assert meta["tokenizer"] == "byte_bpe" and meta["value"] == str(bpe_dir)
    back = ByteBPETokenizer.load(tmp_path / "run" / "bpe.model")
    assert back.itos == tok.itos and back.counts.tolist() == tok.counts.tolist()
    text = " the <unk> river Ωmega . "
    assert back.encode(text) == tok.encode(text) and back.decode(tok.encode(text)) == tok.decode(tok.encode(text))
    with pytest.raises(DataError, match="no byte-level BPE at"):
        ByteBPETokenizer.load(tmp_path / "missing.model")


def test_slice_vocabulary_holds_the_windows_pieces(tk, bpe_dir, corpus_root, tmp_path):
    corpus = load_corpus(_cfg(corpus_root, bpe_dir, train_tokens=700, vocab_from="slice"), tmp_path / "cache")
    _, pieces, _, _, _ = _brute(tk, bpe_dir, corpus_root)
    stream = [p for line in pieces["train"] for p in [*line, None]][:700]  # None: the line's </s>
    counter = Counter(p for p in stream if p is not None)
    assert corpus.train.numel() == 700 and corpus.vocab.itos[4:] == corpus.tokenizer.itos[4:]
    assert set(corpus.vocab.itos[4:]) == set(counter)
    assert corpus.vocab.counts.tolist() == [0, 0, stream.count(None), 0] + [counter[p] for p in corpus.vocab.itos[4:]]
    assert corpus.train.tolist() == [EOS if p is None else corpus.vocab.stoi[p] for p in stream]
    c = corpus.vocab.counts[4:]
    assert torch.all(c[:-1] >= c[1:])
    assert corpus.provenance["oov"]["test"] >= 1


def test_missing_library_names_the_extra(corpus_root, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers raises ImportError
    with pytest.raises(ConfigError, match=r'tokenizers.*pip install "repdegen\[hf\]"'):
        load_corpus(_cfg(corpus_root, "gpt2"), tmp_path / "cache")


def test_bad_values_name_the_value_and_the_fix(tk, bpe_dir, json_file, corpus_root, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"needs dataset.byte_bpe .*dataset.byte_bpe=gpt2"):
        load_corpus(_cfg(corpus_root, None), tmp_path / "cache")
    bad = tmp_path / "no" / "such" / "folder"
    with pytest.raises(DataError, match=rf"dataset.byte_bpe='{bad}': no such folder or file.*vocab.json \+ merges.txt"):
        load_corpus(_cfg(corpus_root, bad), tmp_path / "cache")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    with pytest.raises(DataError, match=r"holds neither tokenizer.json nor vocab.json \+ merges.txt.*notes.txt"):
        load_corpus(_cfg(corpus_root, empty), tmp_path / "cache")
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    (lonely / "vocab.json").write_text((bpe_dir / "vocab.json").read_text())
    with pytest.raises(DataError, match=r"needs merges.txt beside it"):
        load_corpus(_cfg(corpus_root, lonely / "vocab.json"), tmp_path / "cache")
    # a tokenizer that does not give back its text (a lowercasing normalizer) is refused
    lower = tk.Tokenizer.from_file(str(json_file))
    lower.normalizer = tk.normalizers.Lowercase()
    (tmp_path / "lower").mkdir()
    lower.save(str(tmp_path / "lower" / "tokenizer.json"))
    with pytest.raises(DataError, match=r"does not reproduce the text it encodes.*byte-level BPE"):
        load_corpus(_cfg(corpus_root, tmp_path / "lower"), tmp_path / "cache")
    # a hub name without a network (and nothing in the hub cache): what was tried and how to point at local files
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hubcache"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"dataset.byte_bpe='gpt2'.*tried the local hub cache.*the hub.*"
                                        r"dataset.byte_bpe=/path/to/that/folder"):
        load_corpus(_cfg(corpus_root, "gpt2"), tmp_path / "cache")


def test_config_choice_and_hash(compose_cfg):
    from repdegen.reproduce.settings.config import config_hash, finalize, hashed_view

    plain = finalize(compose_cfg("dataset=wikitext2_bpe"))
    assert plain.dataset.byte_bpe is None and "byte_bpe" not in hashed_view(plain)["dataset"]  # hashes unchanged
    opted = finalize(compose_cfg("dataset=wikitext2_bpe", "dataset.tokenizer=byte_bpe", "dataset.byte_bpe=gpt2"))
    assert hashed_view(opted)["dataset"]["byte_bpe"] == "gpt2" and config_hash(opted) != config_hash(plain)
    with pytest.raises(ConfigError, match="needs dataset.byte_bpe"):
        finalize(compose_cfg("dataset=wikitext2_bpe", "dataset.tokenizer=byte_bpe"))


def test_a_language_model_trains_on_the_byte_bpe_corpus(tk, bpe_dir, compose_cfg, tmp_path):
    from repdegen.data.byte_bpe import ByteBPETokenizer
    from repdegen.reproduce.train import train

    out = tmp_path / "out"
    rec = train(compose_cfg("model=transformer_lm6", "dataset=wikitext2_bpe", "dataset.tokenizer=byte_bpe",
                            f"dataset.byte_bpe={bpe_dir}", "model.d_model=16", "model.n_layers=1", "model.n_heads=2",
                            "model.d_ffn=32", "trainer.bptt=16", "trainer.batch_size=4", "trainer.eval_bptt=16",
                            "trainer.eval_batch_size=4", "trainer.test_batch_size=4", "optim.warmup_updates=2",
                            "trainer.device=cpu", "trainer.max_epochs=1", output_dir=out))
    assert rec["status"] == "complete" and math.isfinite(rec["metrics"]["final"]["test_ppl"])
    assert math.isfinite(rec["metrics"]["final"]["ppl_rare"]) and rec["corpus"]["tokenizer"] == "byte_bpe"
    run = out / "runs" / rec["config_hash"]
    tok = ByteBPETokenizer.load(run / "bpe.model")  # the run directory alone decodes
    assert tok.itos[:4] == list(SPECIALS) and tok.decode(tok.encode("w1 w2 <unk>")) == "w1 w2 <unk>"
    assert torch.load(run / "vocab_counts.pt").tolist() == tok.counts.tolist()
