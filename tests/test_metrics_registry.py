"""The metric registry (reproduce/results/metrics.py): hand-worked formats and labels, the recorded lists, and that
every metric a table config names (a column or a claim's check) is registered, not derived by the fallback."""

from __future__ import annotations

import math

import pytest
import yaml
from repdegen.reproduce.results.claims import ALWAYS_RECORDED, DEFAULT_MARGINS, LM_RECORDED, default_margin, table_metrics
from repdegen.reproduce.results.metrics import METRICS, metric
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
    # the margin families, by hand: substring rules in the order ppl, isotropy, cos, bleu, uniq
    assert default_margin("valid_ppl_gain") == DEFAULT_MARGINS["ppl"]
    assert default_margin("frac_pos_cos") == DEFAULT_MARGINS["cos"]
    assert default_margin("uniq_rare") == DEFAULT_MARGINS["uniq"]
    assert default_margin("wordsim_rg65") == DEFAULT_MARGINS["wordsim"]
    assert default_margin("p_unk_nontarget") is None


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
