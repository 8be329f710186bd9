"""Dataset kinds are a registry (data/kinds.py): the two kinds are registered beside their loaders, every consumer
asks the registry, and a new kind is one registration plus one task class."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from repdegen.core.errors import ConfigError
from repdegen.data import kinds
from repdegen.data.corpus import load_corpus
from repdegen.data.translation import load_parallel_corpus
from repdegen.reproduce.engine.tasks import TASKS, LMTask, TranslationTask, check_world_size, make_task
from repdegen.reproduce.train import load_any_corpus


def test_the_registered_kinds():
    assert kinds.names() == ("lm", "translation")
    lm, mt = kinds.get("lm"), kinds.get("translation")
    assert (lm.load, lm.seq2seq, lm.shards_columns) == (load_corpus, False, True)
    assert (mt.load, mt.seq2seq, mt.shards_columns) == (load_parallel_corpus, True, False)
    assert TASKS == {"lm": LMTask, "translation": TranslationTask}


def test_an_unknown_kind_names_the_registered_ones():
    with pytest.raises(ConfigError, match=r"dataset.kind='speech' is not one of lm, translation"):
        kinds.get("speech")


@pytest.mark.parametrize(("override", "message"), [
    ({"tokenizer": "word"}, "set dataset.tokenizer=bpe"),
    ({"vocab_from": "slice"}, "set dataset.vocab_from=split"),
    ({"tgt_lang": "en"}, "needs two different languages"),
])
def test_the_translation_kind_checks_its_combinations(override, message):
    d = OmegaConf.create({"kind": "translation", "tokenizer": "bpe", "vocab_from": "split", "src_lang": "en",
                          "tgt_lang": "de", **override})
    with pytest.raises(ConfigError, match=message):
        kinds.check(d)


def test_only_column_batches_need_the_batch_to_divide_over_ranks():
    for kind, raises in (("lm", True), ("translation", False)):
        cfg = OmegaConf.create({"dataset": {"kind": kind}, "trainer": {"batch_size": 5}})
        if raises:
            with pytest.raises(ConfigError, match="cannot be split evenly over 2 ranks"):
                check_world_size(cfg, 2)
        else:
            check_world_size(cfg, 2)


def test_a_new_kind_is_one_registration_and_one_task_class():
    loaded = []
    kinds.register_kind("toy", lambda cfg, cache_dir=None, verbose=True: loaded.append(cfg.name) or "corpus",
                        seq2seq=False, shards_columns=False)
    try:
        cfg = OmegaConf.create({"dataset": {"kind": "toy", "name": "t"}})
        assert load_any_corpus(cfg.dataset, None) == "corpus" and loaded == ["t"]
        with pytest.raises(ConfigError, match=r"@task_for_kind\('toy'\)"):  # the one other place to touch
            make_task(cfg, "corpus", None, "cpu")
    finally:
        kinds._KINDS.pop("toy")
