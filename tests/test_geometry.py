"""The geometry metrics of the claims audit's new claims (analysis/geometry.py), the record-level ones
(analysis/record_metrics.py) and the per-seed gains (reproduce/runs/tables.py add_gains), against brute-force loops and
hand-worked examples."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from repdegen.analysis import geometry
from repdegen.analysis.record_metrics import valid_ppl_curve_mean
from repdegen.reproduce.results.render import RenderedRow
from repdegen.reproduce.results.table_render import add_gains


def cos(a, b) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def test_frac_pos_cos_counts_ordered_pairs_and_drops_zero_rows(monkeypatch):
    torch.manual_seed(0)
    w = torch.randn(23, 4) + 0.3
    w[5] = 0.0  # a zero row has no direction: left out
    monkeypatch.setattr(geometry, "BLOCK", 7)  # several blocks
    rows = [r for r in w if r.norm() > 0]
    pos = sum(cos(a, b) > 0 for a, b in itertools.permutations(rows, 2))
    assert geometry.frac_pos_cos(w) == pytest.approx(pos / (len(rows) * (len(rows) - 1)))


def test_centroid_ratio_and_spectrum_by_hand():
    v = torch.tensor([3.0, 4.0])
    assert geometry.centroid_ratio(torch.stack([v, v, v])) == pytest.approx(1.0)   # all rows equal
    assert geometry.centroid_ratio(torch.stack([v, -v])) == pytest.approx(0.0)     # around the origin
    # rows (3, 4) and (0, 0): mean (1.5, 2) of norm 2.5; sqrt(mean |w|^2) = sqrt(12.5)
    assert geometry.centroid_ratio(torch.stack([v, 0 * v])) == pytest.approx(2.5 / math.sqrt(12.5))
    s = geometry.spectrum_metrics([4.0, 2.0, 1.0])
    assert s["sv_norm_mean"] == pytest.approx((1 + 0.5 + 0.25) / 3) and s["sv_ratio_3_2"] == pytest.approx(0.5)


def test_training_groups_rank_seen_types_and_keep_unseen_apart():
    counts = torch.tensor([9, 0, 5, 5, 1, 0, 7, 2, 3, 4, 6, 8])  # id 0 is a special
    g = geometry.training_groups(counts, specials=[0])
    assert g["unseen"].tolist() == [1, 5]
    # seen non-special ids by count desc, ties by id: 11(8) 6(7) 10(6) 2(5) 3(5) 9(4) 8(3) 7(2) 4(1): 9 types
    assert g["frequent"].tolist() == [11, 6, 10]          # round(0.3 * 9) = 3
    assert g["rare"].tolist() == [7, 4]                   # round(0.2 * 9) = 2


def test_group_geometry_against_pairwise_loops(monkeypatch):
    monkeypatch.setattr(geometry, "MIN_GROUP", 2)
    torch.manual_seed(1)
    v = 40
    counts = torch.randint(0, 5, (v,))
    counts[:3] = 0  # some unseen
    w0 = torch.randn(v, 6)
    w = w0 + 0.5 * torch.randn(v, 6) + torch.tensor([1.0, 0, 0, 0, 0, 0])
    g = geometry.training_groups(counts, specials=[])
    out = geometry.group_geometry_metrics(w, counts, [], w0)

    def mean_pairs(rows):
        return sum(cos(a, b) for a, b in itertools.permutations(rows, 2)) / (len(rows) * (len(rows) - 1))

    def mean_cross(a_rows, b_rows):
        return sum(cos(a, b) for a in a_rows for b in b_rows) / (len(a_rows) * len(b_rows))

    rare = [w[i].double() for i in g["rare"]]
    assert out["cos_excess_rare"] == pytest.approx(mean_pairs(rare) - mean_pairs(list(w.double())))
    d = (w - w0).double()
    du, dr, df = ([d[i] for i in g[k]] for k in ("unseen", "rare", "frequent"))
    assert out["drift_cos_unseen"] == pytest.approx(mean_pairs(du))
    assert out["drift_cos_rare_unseen"] == pytest.approx(mean_cross(dr, du))
    assert out["drift_cos_gap_rare_frequent"] == pytest.approx(mean_cross(dr, du) - mean_cross(df, du))
    # a group under the minimum size is no number, not a number from a handful of rows
    monkeypatch.setattr(geometry, "MIN_GROUP", 50)
    assert math.isnan(geometry.group_geometry_metrics(w, counts, [], w0)["drift_cos_unseen"])


def test_nn_rare_frac_against_a_sort(monkeypatch):
    monkeypatch.setattr(geometry, "MIN_GROUP", 1)
    torch.manual_seed(2)
    w = torch.randn(30, 5)
    rare = torch.tensor([3, 7, 8, 20, 21, 29])
    specials = [0, 1]
    expected = []
    for r in rare.tolist():
        sims = sorted(((cos(w[r], w[j]), j) for j in range(30) if j != r and j not in specials), reverse=True)
        expected.append(sum(j in rare.tolist() for _, j in sims[:5]) / 5)
    assert geometry.nn_rare_frac(w, rare, specials) == pytest.approx(sum(expected) / len(expected))


def test_valid_ppl_curve_mean_by_hand():
    hist = [{"stage": "train", "epoch": e, "valid_ppl": v} for e, v in zip((1, 2, 3, 4), (200.0, 150.0, 160.0, 140.0))]
    record = {"config": {"trainer": {"max_epochs": 6}, "optim": {"decay_after_epoch": 2}}, "history": hist}
    # best so far: 200 150 150 140, then kept (early stop) 140 140; mean over epochs 2..6
    assert valid_ppl_curve_mean(record) == pytest.approx((150 + 150 + 140 + 140 + 140) / 5)
    # a second session's epochs and the finetune stage are not the first session's curve
    record["history"] = hist + [{"stage": "train", "epoch": 5, "session": 2, "valid_ppl": 10.0},
                                {"stage": "finetune", "epoch": 1, "valid_ppl": 5.0}]
    assert valid_ppl_curve_mean(record) == pytest.approx((150 + 150 + 140 + 140 + 140) / 5)
    record["config"]["optim"]["decay_after_epoch"] = None  # unset: from epoch 1
    assert valid_ppl_curve_mean(record) == pytest.approx((200 + 150 + 150 + 140 + 140 + 140) / 6)
    assert math.isnan(valid_ppl_curve_mean({"config": {}, "history": []}))


def test_gains_per_seed_against_the_row_baseline_and_on_the_paper_numbers():
    base = RenderedRow("Base", "G", {"test_ppl": 100.0}, {}, "complete", extra={"seeds": {1: {}, 2: {}}})
    new = RenderedRow("New", "G", {"test_ppl": 90.0}, {}, "complete", extra={"seeds": {1: {}, 2: {}}, "baseline": 0})
    ours = {0: {1: {"test_ppl": 100.0}, 2: {"test_ppl": 110.0}}, 1: {1: {"test_ppl": 95.0}, 2: None}}
    paper = {0: dict(base.paper), 1: dict(new.paper)}
    add_gains([base, new], ours, paper)
    assert ours[1][1]["test_ppl_gain"] == pytest.approx(0.05) and ours[1][2] is None   # an incomplete cell stays so
    assert ours[0][1]["test_ppl_gain"] == 0.0 and ours[0][2]["test_ppl_gain"] == 0.0   # the baseline itself
    assert paper[1]["test_ppl_gain"] == pytest.approx(0.1) and "valid_ppl_gain" not in paper[1]


def test_degeneration_onsets_by_hand():
    from repdegen.analysis.record_metrics import degeneration_onset, onset_metrics

    # I(0) = 1: the bound is 0.9; a one-point dip (u=4) does not count; u=12 and u=16 both <= 0.9: the onset is 12
    assert degeneration_onset([[0, 1.0], [4, 0.85], [8, 0.95], [12, 0.9], [16, 0.8]], 4) == 12
    assert degeneration_onset([[0, 1.0], [4, 0.85], [8, 0.88], [12, 0.95]], 4) == 4
    assert degeneration_onset([[0, 1.0], [4, 0.95], [8, 0.89]], 4) == 8  # the last point counts alone
    assert degeneration_onset([[0, 1.0], [4, 0.95], [8, 0.91]], 4) == 12  # none: censored at u_last + interval
    assert math.isnan(degeneration_onset([[4, 1.0], [8, 0.5]], 4))  # no update 0
    record = {"config": {"trainer": {"analysis": {"geometry_every": 4}}}, "trace": {
        "geom_isotropy_rare": [[0, 0.9], [4, 0.7], [8, 0.6]],
        "geom_isotropy_medium": [[0, 0.9], [4, 0.85], [8, 0.8]],
        "geom_isotropy_frequent": [[0, 0.9], [4, 0.9], [8, 0.89]]}}
    m = onset_metrics(record)
    assert m["degeneration_onset_rare"] == 4 and m["degeneration_onset_medium"] == 8 and m["degeneration_onset_frequent"] == 12
    assert m["onset_lag_medium_rare"] == 1 and m["onset_lag_frequent_rare"] == 2
    assert m["onset_frac_medium"] == 1 and m["onset_frac_frequent"] == 1.5
    # both censored: lag 0 (not "rare first"); no trace: no metrics
    flat = {g: [[0, 0.9], [4, 0.9]] for g in ("rare", "medium", "frequent")}
    m = onset_metrics({"config": record["config"], "trace": {f"geom_isotropy_{g}": v for g, v in flat.items()}})
    assert m["onset_lag_medium_rare"] == 0 and m["onset_frac_frequent"] == 2
    assert onset_metrics({"config": {}, "trace": {}}) == {}
