"""Pre-registration: what a claim's hash covers, that registering only adds, and the judgement of a verdict
against hand-made registrations and start times (reproduce/runs/registration.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import repdegen.reproduce.runs.tables  # noqa: F401  (registers the table schema)
from omegaconf import OmegaConf
from repdegen.reproduce.errors import UserError
from repdegen.reproduce.runs import registration
from repdegen.reproduce.runs.cells import TableConfig


def make_table(margin=None, seeds=None, text="New beats Base", quote="q"):
    chk = {"metric": "test_ppl", "row": "New", "relation": "lower", "than": "Base"}
    if margin is not None:
        chk["margin"] = margin
    cfg = OmegaConf.structured(TableConfig)
    cfg.merge_with({"name": "t", "title": "T", "source": "S", "columns": ["test_ppl"],
                    "rows": [{"label": "Base", "experiment": "x"}, {"label": "New", "experiment": "x", "group": "G"}],
                    "seeds": {"lite": seeds or [1, 2]},
                    "claims": [{"text": text, "source": "Sec. 1", "quote": quote, "checks": [chk]}]})
    return cfg


@dataclass
class FakeCell:
    config_hash: str
    rows: list = field(default_factory=list)
    seed: int | None = None


def test_the_claim_hash_covers_checks_margins_seeds_and_text_but_not_the_quote():
    base = registration.claim_hash(make_table().claims[0], [1, 2])
    assert registration.claim_hash(make_table(quote="other words").claims[0], [1, 2]) == base
    # the default margin written out is the same definition
    assert registration.claim_hash(make_table(margin=0.01).claims[0], [1, 2]) == base
    for changed in (registration.claim_hash(make_table(margin=0.02).claims[0], [1, 2]),
                    registration.claim_hash(make_table().claims[0], [1, 2, 3]),   # a seed added
                    registration.claim_hash(make_table().claims[0], [1]),         # a seed dropped
                    registration.claim_hash(make_table(text="New ties Base").claims[0], [1, 2])):
        assert changed != base


def test_register_only_adds_and_records_rows_seed_time_and_commit(tmp_path, monkeypatch):
    t = make_table()
    cells = [FakeCell("aaaa", [0], 1), FakeCell("bbbb", [1], 1)]
    monkeypatch.setattr(registration, "now", lambda: "2026-01-01T10:00:00")
    assert registration.register(tmp_path, t, "lite", [1, 2], cells, {"commit": "c1", "dirty": False}) == (1, 2)
    path = registration.path_of(tmp_path, "t", "lite")
    data = json.loads(path.read_text())
    assert data["cells"]["bbbb"] == {"rows": ["G / New"], "seed": 1, "registered": "2026-01-01T10:00:00", "commit": "c1"}
    (entry,) = data["claims"].values()
    assert entry == {"text": "New beats Base", "registered": "2026-01-01T10:00:00", "commit": "c1", "dirty": False}
    # again, later: nothing new, and the first times stay
    monkeypatch.setattr(registration, "now", lambda: "2026-01-02T10:00:00")
    assert registration.register(tmp_path, t, "lite", [1, 2], cells, {"commit": "c2"}) == (0, 0)
    assert json.loads(path.read_text()) == data
    # an edited margin is a new definition, registered beside the old one
    assert registration.register(tmp_path, make_table(margin=0.05), "lite", [1, 2], cells, {"commit": "c2"}) == (1, 0)
    assert len(json.loads(path.read_text())["claims"]) == 2


def test_the_claim_hash_at_a_scale_ignores_another_scale_s_na_reason():
    t = make_table()
    t.claims[0].na = {"lite": "measured reason A"}
    at_paper, at_lite = registration.claim_hash(t.claims[0], [1], "paper"), registration.claim_hash(t.claims[0], [1], "lite")
    t.claims[0].na = {"lite": "measured reason B"}
    assert registration.claim_hash(t.claims[0], [1], "paper") == at_paper
    assert registration.claim_hash(t.claims[0], [1], "lite") != at_lite
    t.claims[0].scales = ["lite"]  # no longer meaningful at paper: a different claim there
    assert registration.claim_hash(t.claims[0], [1], "paper") != at_paper


def test_judge_a_verdict_against_the_registration(tmp_path, monkeypatch):
    t = make_table()
    claim = t.claims[0]
    cells = [FakeCell("aaaa", [0], 1), FakeCell("bbbb", [1], 1)]
    monkeypatch.setattr(registration, "now", lambda: "2026-01-01T10:00:00")
    registration.register(tmp_path, t, "lite", [1, 2], cells, {"commit": "c1"})
    reg = registration.load(registration.path_of(tmp_path, "t", "lite"))
    after = [("aaaa", "2026-01-01T10:00:00", "Base"), ("bbbb", "2026-01-01T11:00:00", "New")]
    assert registration.judge(claim, [1, 2], reg, after, "lite") == ""
    before = [("aaaa", "2026-01-01T09:59:59", "Base"), ("bbbb", "2026-01-01T11:00:00", "New")]
    assert "after Base [aaaa] started (2026-01-01T09:59:59)" in registration.judge(claim, [1, 2], reg, before, "lite")
    # the claim edited after the run: its new definition is not in the registration
    edited = make_table(margin=0.03).claims[0]
    assert "was not registered before its cells ran" in registration.judge(edited, [1, 2], reg, after, "lite")
    # a seed dropped after the run (the verdict would read fewer seeds than registered): not pre-registered
    assert "not registered" in registration.judge(claim, [1], reg, after, "lite")
    # a cell the registration does not know (trained outside the table), or no start time
    assert "cell New [cccc] was not registered" in registration.judge(
        claim, [1, 2], reg, [("cccc", "2026-01-01T11:00:00", "New")], "lite")
    assert "records no start time" in registration.judge(claim, [1, 2], reg, [("aaaa", None, "Base")], "lite")


def test_replaced_cells_are_those_of_the_same_row_and_seed():
    reg = {"cells": {"old1": {"rows": ["G / New"], "seed": 1}, "old2": {"rows": ["G / New"], "seed": 2},
                     "base": {"rows": ["Base"], "seed": 1}, "new1": {"rows": ["G / New"], "seed": 1}}}
    assert registration.replaced_cells(reg, {"G / New"}, 1, "new1") == ["old1"]


def test_a_file_that_is_not_a_registration_is_a_clear_error(tmp_path):
    path = tmp_path / "registration.json"
    path.write_text('{"claims": []}')
    with pytest.raises(UserError, match=r"registration.json: not a registration file .*git checkout"):
        registration.load(path)
    path.write_text("{not json")
    with pytest.raises(UserError, match="not a registration file"):
        registration.load(path)
    assert registration.load(tmp_path / "absent.json") == {"claims": {}, "cells": {}}


@pytest.mark.parametrize("commit, new, expected", [
    ({"commit": "abc", "dirty": False}, 3, ""),
    # a lane's earlier step re-rendered a table: nothing for the user to commit when nothing new was registered
    ({"commit": "abc", "dirty": True, "changed": ["results/tables/t/paper/cells.json"]}, 0,
     " (uncommitted changes in results/ only)"),
    ({"commit": "abc", "dirty": True, "changed": ["results/tables/t/paper/cells.json"]}, 2,
     " (uncommitted changes in results/ only; commit this file)"),
    ({"commit": "abc", "dirty": True, "changed": ["conf/table/t.yaml", "results/x.md"]}, 0,
     " (uncommitted changes: commit the configs and this file)"),
    ({"commit": "abc", "dirty": True}, 0, " (uncommitted changes: commit the configs and this file)"),
])
def test_registration_note_names_what_to_commit(commit, new, expected):
    from repdegen.reproduce.runs.tables import registration_note

    assert registration_note(commit, new) == expected
