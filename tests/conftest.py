"""Shared fixtures: a tiny generated corpus laid out as REPDEGEN_DATA_DIR expects (README, section "Data"), and config
composition."""

from __future__ import annotations

import inspect
import os
import random
from pathlib import Path

import pytest
import torch
from hydra import initialize_config_dir
from repdegen.reproduce.settings.config import CONF_DIR, compose_config, register_all

register_all()
# one thread per pytest-xdist worker (`make test` runs one worker per core), else up to two
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the processes the end-to-end tests start, too
else:
    torch.set_num_threads(min(2, os.cpu_count() or 1))

# the real corpora, where REPDEGEN_DATA_DIR names a folder holding them (tests that need them skip otherwise)
REAL_DATA = Path(os.environ.get("REPDEGEN_DATA_DIR") or "REPDEGEN_DATA_DIR-not-set")
# the four papers' text files (REPDEGEN_PAPERS_DIR) and the notes on the authors' code (REPDEGEN_REFERENCE_NOTES, a
# Markdown file), where they are given: the tests that check quotes and settings against them skip otherwise
PAPERS_DIR = Path(os.environ.get("REPDEGEN_PAPERS_DIR") or "REPDEGEN_PAPERS_DIR-not-set")
REFERENCE_NOTES = Path(os.environ.get("REPDEGEN_REFERENCE_NOTES") or "REPDEGEN_REFERENCE_NOTES-not-set")


def make_sentences(n_tokens: int, seed: int, vocab: int = 40) -> list[str]:
    """Zipf-ish sentences over w0..w{vocab-1} (plus <unk>), about n_tokens words in all."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)] + ["<unk>"]
    weights = [1.0 / (i + 1) for i in range(len(words))]
    lines, count = [], 0
    while count < n_tokens:
        n = rng.randint(3, 12)
        lines.append(" ".join(rng.choices(words, weights, k=n)))
        count += n + 1
    return lines


def write_tiny_corpus(root: Path, train_tokens: int = 3000, eval_tokens: int = 600) -> Path:
    """PTB and WikiText-2 layouts with generated text; every valid/test word also occurs in train."""
    for local, names in (("ptb", ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")),
                         ("wikitext-2", ("train.txt", "valid.txt", "test.txt"))):
        d = root / local
        d.mkdir(parents=True, exist_ok=True)
        for seed, (name, n) in enumerate(zip(names, (train_tokens, eval_tokens, eval_tokens))):
            lines = make_sentences(n, seed)
            if seed == 0:  # every word occurs in train, so valid/test have no unknown words
                lines.insert(0, " ".join(f"w{i}" for i in range(40)) + " <unk>")
            (d / name).write_text("".join(f" {line} \n" for line in lines))
    return root


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    return write_tiny_corpus(tmp_path_factory.mktemp("tinydata"))


@pytest.fixture
def compose_cfg(tmp_path, tiny_data):
    """compose_cfg(*overrides) -> the DictConfig repdegen.reproduce.train would get, on the tiny corpus."""

    def _compose(*overrides: str, data_dir: Path | None = None, output_dir: Path | None = None):
        base = [
            f"paths.output_dir={output_dir or tmp_path / 'out'}",
            f"dataset.data_dir={data_dir or tiny_data}",
            "trainer.progress=false",
        ]
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            return compose_config([*base, *overrides])

    return _compose


def requires_real_data(*names: str):
    missing = [n for n in names if not (REAL_DATA / n).is_dir()]
    where = (f"under REPDEGEN_DATA_DIR={REAL_DATA}" if os.environ.get("REPDEGEN_DATA_DIR")
             else "(REPDEGEN_DATA_DIR is not set)")
    return pytest.mark.skipif(bool(missing), reason=f"needs the real corpora {', '.join(missing)}, not found {where}: "
                                                    f"set REPDEGEN_DATA_DIR to a folder holding them (the README's section Data)")


# The two test tiers (`make test-fast` while cells train; `make test`, what CI runs, is both): a test is end to end
# (marker e2e) when it starts subprocesses or trains through the entry points, which is read from its own source.
# A test that trains through a helper of its module can say so with @pytest.mark.e2e.
E2E_PATTERNS = ("subprocess.", "run_table(", "run_tables(", "= train(", "train(compose_cfg", "train(cfg", "bench.main(",
                "repdegen.reproduce.runs.launch", "torch.distributed.run")


def is_end_to_end(fn) -> bool:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return any(p in source for p in E2E_PATTERNS)


def pytest_collection_modifyitems(config, items):
    for item in items:
        fn = getattr(item, "function", None)
        if fn is not None and is_end_to_end(fn):
            item.add_marker(pytest.mark.e2e)
