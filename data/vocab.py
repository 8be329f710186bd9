"""The vocabulary of a corpus: types sorted by training frequency with their counts, so frequency groups are
slices of the id range (word-level corpora build it in :mod:`repdegen.data.corpus`, BPE ones in :mod:`repdegen.data.bpe`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Vocab:
    """Types sorted by training frequency; ``counts[i]`` is the training count of type ``i``."""

    itos: list[str]
    counts: torch.Tensor
    eos: str = "<eos>"
    unk: str = "<unk>"
    stoi: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def eos_id(self) -> int:
        return self.stoi[self.eos]

    @property
    def unk_id(self) -> int | None:
        return self.stoi.get(self.unk)
