"""The metric registry (reproduce/results/metrics.py): hand-worked formats, labels, sources and margins, the recorded
lists, and that every metric a table config names (a column or a claim's check) is registered, not derived by the
fallback."""

from __future__ import annotations

import math

import pytest
import yaml
from repdegen.reproduce.results.claims import ALWAYS_RECORDED, LM_RECORDED, default_margin, table_metrics
from repdegen.reproduce.results.metrics import METRICS, SOURCES, analysis_metrics, from_source, metric
from repdegen.reproduce.settings.config import CONF_DIR


@pytest.mark.parametrize(("name", "value", "text"), [
    ("test_ppl", 86.346, "86.35"), ("test_ppl", 123.456, "123.5"), ("ppl_rare", 1311.2, "1311"),
    ("isotropy", 0.51234, "0.512"), ("mean_cos", 0.000123456, "0.000123"), ("uniq", 733.6, "734"),
    ("uniq_rare_over_human", 0.33333, "0.333"), ("bleu", 27.316, "27.32"), ("params", 24.06, "24.1"),
    ("params", 123.4, "123"), ("valid_ppl_gain", -0.04567, "-0.0457"), ("wordsim_men", 12.54, "12.5"),
    ("wall_time_s", 1851.0, "1851"), ("test_ppl", None, "–"), ("test_ppl", math.inf, "inf"),
])
def test_format_hand_worked(name, value, text):
    assert metric(name).format(value) == text


def test_labels_directions_tasks():
    assert metric("isotropy_rare").label == "I(W) rare"
    assert metric("wordsim_ws353").label == "WS353"
    assert (metric("test_ppl").better, metric("uniq").better, metric("bleu").better) == ("lower", "higher", "higher")
    assert metric("bleu").task == "translation" and metric("ppl_rare").task == "lm" and metric("isotropy").task == "any"
    unknown = metric("something_new")  # derived: its own name as label, no direction
    assert (unknown.label, unknown.better, unknown.task) == ("something_new", None, "any")


def test_recorded_lists_and_margins():
    assert {"valid_ppl", "test_ppl", "isotropy", "mean_cos"} <= set(ALWAYS_RECORDED)
    assert {f"ppl_{g}" for g in ("frequent", "medium", "rare")} <= set(LM_RECORDED)
    assert not set(ALWAYS_RECORDED) & set(LM_RECORDED)
    assert "bleu" not in ALWAYS_RECORDED + LM_RECORDED  # a translation table's own column
    # the margin families, by hand: substring rules in the order ppl, isotropy, cos, bleu, uniq; the claims read the
    # registry's margin
    assert default_margin("valid_ppl_gain") == metric("valid_ppl_gain").margin == (0.01, 0.0)
    assert default_margin("frac_pos_cos") == (0.0, 0.01) and default_margin("isotropy_rare") == (0.05, 0.0)
    assert default_margin("uniq_rare") == (0.02, 0.0) and default_margin("bleu_tok") == (0.0, 0.3)
    assert default_margin("wordsim_rg65") == (0.0, 2.0) and default_margin("params") == (0.0, 0.0)
    assert default_margin("p_unk_nontarget") is None


def test_each_metric_says_where_its_value_comes_from():
    assert all(m.source in SOURCES for m in METRICS.values())
    by_hand = {"valid_ppl": "evaluation", "isotropy": "evaluation", "al_target_entropy": "evaluation",
               "test_ppl": "final", "ppl_rare": "final", "uniq": "final", "bleu": "final", "wordsim_men": "final",
               "onset_frac_medium": "record", "valid_ppl_curve_mean": "record", "params": "record",
               "test_ppl_gain": "record", "cont_uniq_mean": "analysis"}
    assert {n: metric(n).source for n in by_hand} == by_hand
    assert set(from_source("analysis")) == {n for names in analysis_metrics().values() for n in names}
    assert metric("something_new").source == "evaluation"  # a key a run records that nobody registered


def test_every_metric_a_table_names_is_registered():
    unregistered = []
    for path in sorted((CONF_DIR / "table").glob("*.yaml")):
        table = yaml.safe_load(path.read_text())
        named = list(table.get("columns") or [])
        named += [check["metric"] for claim in table.get("claims") or [] for check in claim.get("checks") or []]
        unregistered += [(path.name, m) for m in named if m not in METRICS]
    assert not unregistered, f"register these in reproduce/results/metrics.py: {unregistered}"


def test_translation_tables_do_not_offer_lm_metrics():
    class Table:
        columns = ["bleu"]

    assert "ppl_rare" not in table_metrics(Table) and "isotropy" in table_metrics(Table)


def test_record_metrics_are_derived_through_their_registry_entry():
    """The renderer's record-derived values come from the registry's ``derive``: the curve mean by hand, onset
    metrics only where the record has a trace, the spectrum's for an older record that lacks them."""
    from repdegen.reproduce.results.metrics import derived

    record = {"config": {"trainer": {"max_epochs": 3}, "optim": {}},
              "history": [{"stage": "train", "epoch": e, "valid_ppl": v} for e, v in ((1, 10.0), (2, 8.0), (3, 9.0))]}
    out = derived(record, {})
    assert out == {"valid_ppl_curve_mean": (10.0 + 8.0 + 8.0) / 3}  # the running best 10, 8, 8; no trace, no spectrum
    out = derived(record, {"singular_values": [4.0, 2.0, 1.0]})
    assert set(out) == {"valid_ppl_curve_mean", "sv_norm_mean", "sv_ratio_3_2"}
    assert derived(record, {"singular_values": [4.0, 2.0, 1.0], "sv_norm_mean": 0.5, "sv_ratio_3_2": 0.5}) == {
        "valid_ppl_curve_mean": pytest.approx(26 / 3)}  # what the stage recorded is not derived again
    gap = dict(record, history=[record["history"][0], record["history"][2]])
    assert math.isnan(derived(gap, {})["valid_ppl_curve_mean"])  # a gap in the history: not a curve


def test_a_registered_metric_needs_a_new_name_and_a_known_source():
    from repdegen.core.errors import ConfigError
    from repdegen.reproduce.results.metrics import Metric, register_metric

    with pytest.raises(ConfigError, match="'test_ppl' is registered already"):
        register_metric(Metric("test_ppl", "Test PPL"))
    with pytest.raises(ConfigError, match="source 'elsewhere' is not one of evaluation, final, record, analysis"):
        register_metric(Metric("a_new_one", "A new one", source="elsewhere"))
    assert "a_new_one" not in METRICS
