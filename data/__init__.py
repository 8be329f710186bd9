"""Corpora (HF `datasets` hub or a local directory), vocabularies, BPE and batching."""

from repdegen.data.batching import batchify, bptt_segments, get_batch
from repdegen.data.bpe import BPETokenizer, train_bpe
from repdegen.data.corpus import Corpus, Vocab, load_corpus
from repdegen.data.translation import ParallelCorpus, load_parallel_corpus

__all__ = ["Corpus", "Vocab", "load_corpus", "batchify", "get_batch", "bptt_segments", "BPETokenizer", "train_bpe",
           "ParallelCorpus", "load_parallel_corpus"]
