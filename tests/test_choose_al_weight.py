"""The AL/REAL weight rule of docs/fidelity.md (scripts/choose_al_weight.py), on hand-made grid results."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from choose_al_weight import choose  # noqa: E402


def test_the_lowest_ppl_wins_outside_the_tie_margin():
    grid = {(30.0, "official"): 120.0, (100.0, "official"): 118.0, (300.0, "official"): 125.0,
            (30.0, "none"): 119.0, (100.0, "none"): 110.0, (300.0, "none"): 130.0}
    assert choose(grid) == (100.0, "none")  # 110 is 6.8 % below the next: no tie


def test_a_tie_goes_to_official_then_to_the_larger_alpha():
    # 110.0 best; 110.5 is +0.45 % (a tie), 110.6 is +0.55 % (not)
    grid = {(30.0, "none"): 110.0, (100.0, "official"): 110.5, (300.0, "official"): 110.6,
            (30.0, "official"): 110.4, (100.0, "none"): 111.0, (300.0, "none"): 110.2}
    assert choose(grid) == (100.0, "official")  # official within the tie: 30 and 100; the larger alpha
    grid = {(30.0, "none"): 110.0, (300.0, "none"): 110.5, (100.0, "official"): 112.0}
    assert choose(grid) == (300.0, "none")  # no official in the tie: the larger alpha
