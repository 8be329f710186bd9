"""``${window_start:${seed},N,L}``: Inan et al. 2017's Fig. 1 draws its 20,000-token window at random per run."""

from __future__ import annotations

import numpy as np
import pytest
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.settings.config import window_start
from repdegen.reproduce.settings.resolve import resolve


def test_a_window_per_seed_inside_the_split_and_reproducible():
    starts = [window_start(s, 929_589, 20_000) for s in range(1, 11)]
    assert all(0 <= x <= 929_589 - 20_000 for x in starts)
    assert len(set(starts)) == 10  # ten runs, ten windows
    assert starts == [window_start(s, 929_589, 20_000) for s in range(1, 11)]  # a pure function of the seed
    # the draw itself: numpy's generator seeded with (seed, length), uniform over the valid starts
    assert starts[0] == int(np.random.default_rng([1, 20_000]).integers(0, 929_589 - 20_000 + 1))
    assert window_start(7, 10, 10) == 0  # a window as long as the split starts at its first token
    with pytest.raises(ConfigError, match="a window of 11 tokens in a split of 10"):
        window_start(1, 10, 11)


def test_fig1_paper_cells_draw_their_window_and_lite_keeps_the_fixed_one():
    paper = [resolve(["experiment=inan2017/fig1", "objective=al", "scale=paper", f"seed={s}"]).cfg for s in (1, 2)]
    assert [c.dataset.train_start for c in paper] == [window_start(s, 929_589, 20_000) for s in (1, 2)]
    assert all(c.dataset.train_tokens == 20_000 for c in paper)
    lite = resolve(["experiment=inan2017/fig1", "objective=al", "scale=lite", "seed=2"]).cfg
    assert lite.dataset.train_start == 100_000
