"""Corpus loading, vocabularies, batching, and the errors a user can run into."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from repdegen.data.batching import batchify, bptt_segments, get_batch, variable_length
from repdegen.data.bpe import EOS
from repdegen.data.corpus import load_corpus
from repdegen.reproduce.errors import DataError
from repdegen.reproduce.settings.schema import DatasetConfig

from tests.conftest import REAL_DATA, requires_real_data, write_tiny_corpus

PTB_FILES = {"train": "ptb.train.txt", "valid": "ptb.valid.txt", "test": "ptb.test.txt"}


def ptb_cfg(**kw) -> DatasetConfig:
    base = dict(name="ptb", local_dir="ptb", files=dict(PTB_FILES), hub_name="ptb_text_only", text_field="sentence")
    base.update(kw)
    return OmegaConf.structured(DatasetConfig(**base))


def write_split(root: Path, train: str, valid: str, test: str) -> Path:
    d = root / "ptb"
    d.mkdir(parents=True, exist_ok=True)
    for name, text in zip(PTB_FILES.values(), (train, valid, test)):
        (d / name).write_text(text)
    return root


def test_tokens_vocab_and_ids(tmp_path):
    root = write_split(tmp_path, " b a b \n c b a\n", "a b\n", "c\n")
    corpus = load_corpus(ptb_cfg(data_dir=str(root), unk="<unk>"))
    # train tokens: b a b <eos> c b a <eos>; counts b3 a2 <eos>2 c1; tie a/<eos> broken by first appearance
    assert corpus.vocab.itos == ["b", "a", "<eos>", "c"]
    assert corpus.vocab.counts.tolist() == [3, 2, 2, 1]
    assert corpus.train.tolist() == [0, 1, 0, 2, 3, 0, 1, 2]
    assert corpus.valid.tolist() == [1, 0, 2] and corpus.test.tolist() == [3, 2]
    assert corpus.provenance["tokens"] == {"train": 8, "valid": 3, "test": 2}


def test_unknown_words_map_to_unk_or_fail_clearly(tmp_path):
    root = write_split(tmp_path / "a", "x <unk> y\n", "x zz\n", "y\n")
    corpus = load_corpus(ptb_cfg(data_dir=str(root)))
    assert corpus.valid.tolist()[1] == corpus.vocab.stoi["<unk>"]
    assert corpus.provenance["oov"]["valid"] == 1
    root = write_split(tmp_path / "b", "x y\n", "x zz\n", "y\n")
    with pytest.raises(DataError, match=r"'zz'.*no '<unk>' token"):
        load_corpus(ptb_cfg(data_dir=str(root)))


def test_missing_directory_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(DataError) as err:
        load_corpus(ptb_cfg(data_dir=str(tmp_path / "nowhere")))
    msg = str(err.value)
    assert str(tmp_path / "nowhere") in msg and "ptb/ptb.train.txt" in msg and "hub" in msg


def test_missing_file_names_the_expected_path(tmp_path):
    root = write_split(tmp_path, "a\n", "a\n", "a\n")
    (root / "ptb" / "ptb.test.txt").unlink()
    with pytest.raises(DataError, match=r"expected the test split at .*ptb\.test\.txt"):
        load_corpus(ptb_cfg(data_dir=str(root)))


def test_empty_split_is_an_error(tmp_path):
    root = write_split(tmp_path, "a b\n", "\n\n", "a\n")
    with pytest.raises(DataError, match=r"valid split .* is empty"):
        load_corpus(ptb_cfg(data_dir=str(root)))


def test_non_utf8_bytes_are_reported_with_their_position(tmp_path):
    root = write_split(tmp_path, "a b\n", "a\n", "a\n")
    (root / "ptb" / "ptb.train.txt").write_bytes(b"a b\nc \xe9t\xe9\n")
    with pytest.raises(DataError, match=r"not valid UTF-8: byte 0xe9 at offset 6 \(line 2\).*iconv"):
        load_corpus(ptb_cfg(data_dir=str(root)))


def test_local_source_without_a_directory_says_how_to_fix(monkeypatch):
    monkeypatch.delenv("REPDEGEN_DATA_DIR", raising=False)
    with pytest.raises(DataError, match="REPDEGEN_DATA_DIR"):
        load_corpus(ptb_cfg(source="local"))


def test_offline_hub_is_a_clear_error(tmp_path):
    code = (
        "from tests.test_data import ptb_cfg\n"
        "from repdegen.data.corpus import load_corpus\n"
        "from repdegen.reproduce.errors import DataError\n"
        "try:\n    load_corpus(ptb_cfg(source='hub'))\n"
        "except DataError as e:\n    print('DATAERROR', e)\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert "DATAERROR" in out.stdout, out.stderr[-2000:]
    assert "ptb" in out.stdout and "REPDEGEN_DATA_DIR" in out.stdout


def test_hub_paths_with_datasets_the_test_makes(tmp_path, tiny_data):
    """The `datasets` code paths (save_to_disk/load_from_disk and the text loader) give exactly the
    corpus the local reader gives."""
    import datasets

    local = load_corpus(ptb_cfg(data_dir=str(tiny_data)))
    lines = {s: (tiny_data / "ptb" / f).read_text().split("\n")[:-1] for s, f in PTB_FILES.items()}
    dsd = datasets.DatasetDict({hub: datasets.Dataset.from_dict({"sentence": lines[s]})
                                for s, hub in (("train", "train"), ("valid", "validation"), ("test", "test"))})
    dsd.save_to_disk(str(tmp_path / "saved"))
    disk = load_corpus(ptb_cfg(source="disk", disk_path=str(tmp_path / "saved")))
    text = load_corpus(ptb_cfg(source="text", text_files={s: str(tiny_data / "ptb" / f) for s, f in PTB_FILES.items()}))
    for other in (disk, text):
        assert other.vocab.itos == local.vocab.itos
        for s in ("train", "valid", "test"):
            assert torch.equal(other.split(s), local.split(s))


def test_cache_is_keyed_by_file_content(tmp_path):
    root = write_split(tmp_path / "d", "a b b\n", "a\n", "b\n")
    cache = tmp_path / "cache"
    first = load_corpus(ptb_cfg(data_dir=str(root)), cache)
    files = list((cache / "corpora").glob("*.pt"))
    assert len(files) == 1
    assert load_corpus(ptb_cfg(data_dir=str(root)), cache).vocab.itos == first.vocab.itos
    (root / "ptb" / "ptb.train.txt").write_text("a a a b\n")
    changed = load_corpus(ptb_cfg(data_dir=str(root)), cache)
    assert changed.vocab.itos[0] == "a" and len(list((cache / "corpora").glob("*.pt"))) == 2


def test_truncation_for_scales(tmp_path, tiny_data):
    corpus = load_corpus(ptb_cfg(data_dir=str(tiny_data), train_tokens=100, eval_tokens=50))
    assert corpus.train.numel() == 100 and corpus.valid.numel() == 50 and corpus.test.numel() == 50
    assert corpus.provenance["tokens"]["train"] > 100  # the vocabulary still comes from the whole split


def test_batchify_and_get_batch():
    ids = torch.arange(23)
    s = batchify(ids, 4)  # 5 rows x 4 columns; 3 trailing tokens dropped
    assert s.shape == (5, 4) and s[:, 1].tolist() == [5, 6, 7, 8, 9]
    x, y = get_batch(s, 0, 3)
    assert torch.equal(y, s[1:4]) and torch.equal(x, s[0:3])
    x, y = get_batch(s, 3, 3)  # clipped at the end
    assert x.size(0) == 1 and torch.equal(y, s[4:5])


def test_segments_cover_the_stream():
    s = batchify(torch.arange(1000), 10)  # 100 rows
    fixed = list(bptt_segments(s, 35))
    assert fixed == [(0, 35), (35, 35), (70, 29)]
    rng = np.random.default_rng(0)
    var = list(bptt_segments(s, 20, rng))
    assert var[0][0] == 0 and all(a + n == b for (a, n), (b, _) in zip(var, var[1:]))
    assert var[-1][0] + var[-1][1] >= 98


def test_variable_length_distribution():
    rng = np.random.default_rng(0)
    lens = np.array([variable_length(rng, 70) for _ in range(20000)])
    assert lens.min() >= 5
    assert abs((lens < 50).mean() - 0.05) < 0.01  # ~5% of segments centred at bptt/2
    assert abs(lens[lens > 50].mean() - 69.5) < 0.3  # int() of N(70, 5)


@pytest.mark.slow
@requires_real_data("ptb", "wikitext-2")
@pytest.mark.parametrize("name,local,files,expected,types", [
    ("ptb", "ptb", PTB_FILES, (929589, 73760, 82430), 10000),
    ("wikitext2", "wikitext-2", {"train": "train.txt", "valid": "valid.txt", "test": "test.txt"},
     (2088628, 217646, 245569), 33278),
])
def test_real_corpora_sizes(tmp_path, name, local, files, expected, types):
    cfg = ptb_cfg(name=name, local_dir=local, files=files, data_dir=str(REAL_DATA))
    corpus = load_corpus(cfg)
    assert (corpus.train.numel(), corpus.valid.numel(), corpus.test.numel()) == expected
    assert len(corpus.vocab) == types and corpus.vocab.itos[0] in ("<eos>", "the", ",")
    assert sum(corpus.provenance["oov"].values()) == 0
    assert torch.all(corpus.vocab.counts[:-1] >= corpus.vocab.counts[1:])


def test_generated_corpus_helper_is_consistent(tmp_path):
    root = write_tiny_corpus(tmp_path, 500, 100)
    corpus = load_corpus(ptb_cfg(data_dir=str(root)))
    assert corpus.provenance["oov"] == {"train": 0, "valid": 0, "test": 0}


# ---- dataset.vocab_from=slice: the vocabulary and the counts of the window the run trains on (lite v2) -----------
def test_slice_vocabulary_is_the_windows_own(tmp_path):
    # train tokens: a b a <eos> | c d c <eos> e <unk> <eos>   (the window: tokens 4..8 = c d c <eos> e)
    root = write_split(tmp_path, "a b a\nc d c\ne <unk>\n", "c a z\n", "e d\n")
    corpus = load_corpus(ptb_cfg(data_dir=str(root), train_start=4, train_tokens=5, vocab_from="slice"))
    # brute force: the window's types by count (ties by first appearance), then <unk> (absent there) with count 0
    assert corpus.vocab.itos == ["c", "d", "<eos>", "e", "<unk>"]
    assert corpus.vocab.counts.tolist() == [2, 1, 1, 1, 0]
    assert corpus.train.tolist() == [0, 1, 0, 2, 3]
    unk = corpus.vocab.stoi["<unk>"]
    assert corpus.valid.tolist() == [0, unk, unk, 2] and corpus.test.tolist() == [3, 1, 2]
    assert corpus.provenance["oov"] == {"train": 0, "valid": 2, "test": 0} and corpus.provenance["vocab_from"] == "slice"
    # the default (split) keeps the whole split's vocabulary and cuts the window out of its stream
    split = load_corpus(ptb_cfg(data_dir=str(root), train_start=4, train_tokens=5))
    assert set(split.vocab.itos) == {"a", "b", "c", "d", "e", "<unk>", "<eos>"}
    assert [split.vocab.itos[i] for i in split.train.tolist()] == ["c", "d", "c", "<eos>", "e"]


def test_slice_vocabulary_errors_name_the_value(tmp_path):
    root = write_split(tmp_path, "a b\n", "a\n", "b\n")
    with pytest.raises(DataError, match=r"train_start=9 is beyond the 3 training tokens"):
        load_corpus(ptb_cfg(data_dir=str(root), train_start=9, vocab_from="slice"))
    from repdegen.reproduce.errors import ConfigError

    with pytest.raises(ConfigError, match=r"vocab_from='window' is not one of split, slice"):
        load_corpus(ptb_cfg(data_dir=str(root), vocab_from="window"))


def test_slice_bpe_holds_the_windows_pieces(tmp_path):
    from tests.test_bpe import bpe_cfg, write_wiki

    root = write_wiki(tmp_path / "data")
    corpus = load_corpus(bpe_cfg(root, train_tokens=1500, vocab_from="slice"), tmp_path / "cache")
    tok = corpus.tokenizer
    assert corpus.train.numel() == 1500 and tok.restricted
    # every piece of the vocabulary occurs in the training stream, and the counts are that stream's
    counts = torch.bincount(corpus.train, minlength=len(corpus.vocab))
    assert corpus.vocab.counts.tolist() == counts.tolist() and bool(torch.all(counts[4:] > 0))
    # the stream is the window's lines encoded by the window's model, from the first line on
    lines = (root / "wikitext-2" / "train.txt").read_text().split("\n")[:-1]
    first, end = corpus.provenance["window_lines"]
    assert first == 0 and end < len(lines)
    expected = [i for line in lines[first:end] for i in [*tok.encode(line), EOS]][:1500]
    assert corpus.train.tolist() == expected
    # a piece the window never made is <unk> in the other splits, and counted there as out of vocabulary
    valid_lines = (root / "wikitext-2" / "valid.txt").read_text().split("\n")[:-1]
    assert corpus.valid.tolist() == [i for line in valid_lines for i in [*tok.encode(line), EOS]]
    literal = sum(line.split().count("<unk>") for line in valid_lines)
    assert corpus.provenance["oov"]["valid"] == int((corpus.valid == 3).sum()) - literal
