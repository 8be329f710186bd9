"""Corpora (HF `datasets` hub or a local directory), vocabularies and batching."""

from data.batching import batchify, bptt_segments, get_batch
from data.corpus import Corpus, Vocab, load_corpus

__all__ = ["Corpus", "Vocab", "load_corpus", "batchify", "get_batch", "bptt_segments"]
