"""BPTT streams: a 1-D token sequence cut into ``batch_size`` parallel columns, read in segments.

    stream = batchify(ids, B)            # (T, B); column b is the b-th contiguous slice of the corpus
    x, y = get_batch(stream, i, n)       # x = stream[i:i+n], y = stream[i+1:i+1+n]

Fixed segments (Zaremba et al., Inan et al.) or AWD-LSTM's variable length: with probability 0.95 the
base length is ``bptt``, else ``bptt / 2``; the segment length is ``max(5, int(N(base, 5)))`` and the
learning rate of that step is scaled by ``seq_len / bptt`` (Merity et al. 2018, Sec. 4.1).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch


def batchify(ids: torch.Tensor, batch_size: int) -> torch.Tensor:
    """(N,) -> (N // B, B); the N mod B trailing tokens are dropped."""
    n = ids.numel() // batch_size
    if n < 2:
        raise ValueError(f"{ids.numel()} tokens cannot fill batch_size={batch_size} columns of at least 2 tokens")
    return ids[: n * batch_size].view(batch_size, n).t().contiguous()


def get_batch(stream: torch.Tensor, i: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(seq_len, stream.size(0) - 1 - i)
    return stream[i : i + seq_len], stream[i + 1 : i + 1 + seq_len]


def variable_length(rng: np.random.Generator, bptt: int, max_len: int | None = None) -> int:
    base = bptt if rng.random() < 0.95 else bptt / 2.0
    seq_len = max(5, int(rng.normal(base, 5)))
    return min(seq_len, max_len) if max_len is not None else seq_len


def bptt_segments(
    stream: torch.Tensor, bptt: int, rng: np.random.Generator | None = None, max_len: int | None = None
) -> Iterator[tuple[int, int]]:
    """Yield ``(start, seq_len)`` over the stream: fixed ``bptt`` without ``rng``, AWD-LSTM's variable
    lengths with it. The last segment may be shorter."""
    i, T = 0, stream.size(0)
    while i < T - 1 - (1 if rng is not None else 0):
        n = variable_length(rng, bptt, max_len) if rng is not None else bptt
        n = min(n, T - 1 - i)
        yield i, n
        i += n
