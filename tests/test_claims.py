"""Claims: checks over a table's cells, evaluated per seed against hand-made results; configs that name a
row or metric the table does not have fail at load; every table has claims, and they hold on the paper's
own numbers where the paper prints them (a check on the transcription)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import reproduce.table  # noqa: F401  (registers the table schema)
from reproduce.claims import (
    FAILS,
    HOLDS,
    UNDECIDED,
    Claim,
    ClaimCheck,
    claims_console,
    claims_csv,
    claims_markdown,
    evaluate_claims,
    table_metrics,
    validate_claims,
)
from reproduce.config import CONF_DIR
from reproduce.errors import ConfigError
from reproduce.table import TableConfig, expand_cells, scale_names

TABLES = sorted(p.stem for p in (CONF_DIR / "table").glob("*.yaml"))


def make_table(claims: list[dict], rows: list[dict] | None = None, **extra):
    rows = rows or [
        {"label": "Base", "experiment": "x", "group": "A"},
        {"label": "New", "experiment": "x", "group": "A"},
        {"label": "Base", "experiment": "x", "group": "B"},
        {"label": "Other work"},
    ]
    cfg = OmegaConf.structured(TableConfig)
    cfg.merge_with({"name": "t", "title": "T", "source": "S (2020), Table 1", "columns": ["test_ppl", "isotropy"],
                    "rows": rows, "claims": claims, **extra})
    return cfg


def claim(*checks, **kw) -> dict:
    return {"text": "c", "source": "Sec. 1", "checks": list(checks), **kw}


def check(relation, metric="test_ppl", row="New", than="A / Base", value=None) -> dict:
    c = {"metric": metric, "row": row, "relation": relation, "than": than}
    if value is not None:
        c["value"] = value
    return c


def run(table, ours, seeds=(1, 2, 3), paper=None, scale=None):
    return evaluate_claims(table, ours, list(seeds), paper or {}, scale)


def seeds_of(values: list[float], metric="test_ppl") -> dict:
    return {s + 1: {metric: v} for s, v in enumerate(values)}


# --------------------------------------------------------------------------------------------------
# evaluation against hand-made cells
# --------------------------------------------------------------------------------------------------
def test_lower_holds_when_every_seed_agrees_and_fails_on_one_mixed_seed():
    t = make_table([claim(check("lower"))])
    ours = {0: seeds_of([100.0, 102.0, 101.0]), 1: seeds_of([95.0, 99.0, 100.5])}
    (v,) = run(t, ours)
    assert v.state == HOLDS and v.checks[0].agree == 3
    # seed 3 disagrees (101.5 > 101): the means still differ in the claimed direction, the rule says no
    ours[1][3]["test_ppl"] = 101.5
    (v,) = run(t, ours)
    assert v.state == FAILS and v.checks[0].agree == 2
    assert sum(ours[1][s]["test_ppl"] for s in (1, 2, 3)) < sum(ours[0][s]["test_ppl"] for s in (1, 2, 3))


def test_pairs_are_by_seed_not_by_sorted_values():
    # New is lower than Base for each seed, though New's worst seed is above Base's best
    t = make_table([claim(check("lower"))])
    ours = {0: seeds_of([90.0, 120.0]), 1: seeds_of([89.0, 119.0])}
    assert run(t, ours, seeds=(1, 2))[0].state == HOLDS
    ours = {0: seeds_of([90.0, 120.0]), 1: seeds_of([119.0, 89.0])}  # swapped: seed 1 goes the other way
    assert run(t, ours, seeds=(1, 2))[0].state == FAILS


def test_missing_cell_leaves_the_claim_undecided():
    t = make_table([claim(check("lower"))])
    ours = {0: {1: {"test_ppl": 100.0}, 2: None}, 1: seeds_of([90.0, 91.0])}
    (v,) = run(t, ours, seeds=(1, 2))
    assert v.state == UNDECIDED and "complete" in v.checks[0].reason
    (v,) = run(t, {1: seeds_of([90.0, 91.0])}, seeds=(1, 2))  # the baseline row is not run at this scale
    assert v.state == UNDECIDED and "not run" in v.checks[0].reason


def test_a_non_finite_value_is_not_a_verdict():
    t = make_table([claim(check("lower"))])
    (v,) = run(t, {0: seeds_of([100.0]), 1: seeds_of([float("nan")])}, seeds=(1,))
    assert v.state == UNDECIDED and "finite" in v.checks[0].reason


@pytest.mark.parametrize("relation,value,a,b,expected", [
    ("higher", None, 0.5, 0.4, HOLDS),
    ("higher", None, 0.4, 0.4, FAILS),              # equal is not higher
    ("ratio_at_least", 2.0, 0.81, 0.40, HOLDS),     # 2.025x
    ("ratio_at_least", 2.0, 0.79, 0.40, FAILS),     # 1.975x
    ("ratio_at_most", 1.03, 84.7, 82.7, HOLDS),     # +2.4 %
    ("ratio_at_most", 1.03, 85.3, 82.7, FAILS),     # +3.1 %
    ("within", 0.02, 15.80, 15.51, HOLDS),          # +1.87 %
    ("within", 0.02, 15.20, 15.51, HOLDS),          # -1.999 %
    ("within", 0.02, 15.19, 15.51, FAILS),          # -2.06 %
])
def test_pairwise_relations(relation, value, a, b, expected):
    t = make_table([claim(check(relation, metric="isotropy", value=value))])
    (v,) = run(t, {0: seeds_of([b], "isotropy"), 1: seeds_of([a], "isotropy")}, seeds=(1,))
    assert v.state == expected


def test_within_is_two_sided_and_checked_per_seed():
    t = make_table([claim(check("within", value=0.02))])
    ours = {0: seeds_of([100.0, 100.0]), 1: seeds_of([101.9, 97.9])}  # +1.9 %, -2.1 %
    (v,) = run(t, ours, seeds=(1, 2))
    assert v.state == FAILS and v.checks[0].agree == 1


def test_constant_forms_and_claims_of_several_checks():
    t = make_table([claim(check("above", metric="isotropy", than=None, value=0.5)),
                    claim(check("below", than=None, value=70.9), check("higher", metric="isotropy"))])
    ours = {0: {1: {"test_ppl": 80.0, "isotropy": 0.3}}, 1: {1: {"test_ppl": 69.0, "isotropy": 0.6}}}
    first, second = run(t, ours, seeds=(1,))
    assert first.state == HOLDS and second.state == HOLDS
    ours[1][1]["isotropy"] = 0.2  # one check of the second claim fails: the claim fails
    first, second = run(t, ours, seeds=(1,))
    assert first.state == FAILS and second.state == FAILS and [c.state for c in second.checks] == [HOLDS, FAILS]


def test_paper_numbers_are_evaluated_too_and_a_claim_off_its_scales_is_undecided():
    t = make_table([claim(check("lower"), scales=["paper"])])
    ours = {0: seeds_of([100.0]), 1: seeds_of([90.0])}
    paper = {0: {"test_ppl": 87.3}, 1: {"test_ppl": 82.7}}
    (v,) = run(t, ours, seeds=(1,), paper=paper, scale="lite")
    assert v.state == UNDECIDED and v.paper_state == HOLDS and v.checks[0].reason == "meaningful at paper only"
    (v,) = run(t, ours, seeds=(1,), paper=paper, scale="paper")
    assert v.state == HOLDS


def test_rendered_claims_show_mean_sd_and_seed_counts():
    t = make_table([claim(check("lower"))])
    ours = {0: seeds_of([100.0, 102.0]), 1: seeds_of([95.0, 97.0])}
    verdicts = run(t, ours, seeds=(1, 2), paper={0: {"test_ppl": 87.3}, 1: {"test_ppl": 82.7}})
    md = "\n".join(claims_markdown(verdicts, "S (2020), Table 1", "lite", [1, 2]))
    # mean ± sample sd of (100, 102) = 101 ± 1.414; of (95, 97) = 96 ± 1.414
    assert "| ✓ | c (Sec. 1) | 87.30 → 82.70 | 101.0±1.41 → 96.00±1.41 (2/2 seeds) |" in md
    smoke = "\n".join(claims_markdown(verdicts, "S", "smoke", [1, 2]))
    assert "not meaningful at smoke" in smoke
    console = claims_console(verdicts, "S (2020), Table 1", "lite", [1, 2]).splitlines()
    assert console[0].startswith("  Claims (S (2020), Table 1)") and "ours (2 seeds)" in console[0]
    assert console[1].split() == ["✓", "c", "87.30", "→", "82.70", "101.0±1.41", "→", "96.00±1.41", "(2/2", "seeds)"]
    csv_text = claims_csv(verdicts, "lite")
    assert "100 102" in csv_text and "95 97" in csv_text and "holds" in csv_text


# --------------------------------------------------------------------------------------------------
# validation at load
# --------------------------------------------------------------------------------------------------
def test_a_misspelled_row_label_fails_naming_it_and_the_rows():
    t = make_table([claim(check("lower", row="Nwe"))])
    with pytest.raises(ConfigError) as err:
        validate_claims(t, scale_names())
    msg = str(err.value)
    assert "'Nwe'" in msg and "'New'" in msg and "'A / Base'" in msg


def test_an_ambiguous_label_asks_for_the_group():
    t = make_table([claim(check("lower", than="Base"))])
    with pytest.raises(ConfigError, match=r"several groups: write '<group> / Base' with one of 'A', 'B'"):
        validate_claims(t, scale_names())


def test_a_misspelled_metric_fails_naming_it_and_the_metrics():
    t = make_table([claim(check("lower", metric="test_pll"))])
    with pytest.raises(ConfigError, match=r"'test_pll'.*its metrics: test_ppl, isotropy"):
        validate_claims(t, scale_names())


@pytest.mark.parametrize("bad,match", [
    (check("smaller"), "relation='smaller'"),
    (check("ratio_at_least"), "needs value"),
    (check("lower", than=None), "give than="),
    (check("above", value=1.0), "drop than="),
    (check("lower", than="Other work"), "other work"),
])
def test_malformed_checks_fail_at_load(bad, match):
    with pytest.raises(ConfigError, match=match):
        validate_claims(make_table([claim(bad)]), scale_names())


def test_bad_seeds_scales_and_baseline_fail_at_load():
    with pytest.raises(ConfigError, match="seeds has the scale 'lit'"):
        validate_claims(make_table([], seeds={"lit": [1]}), scale_names())
    with pytest.raises(ConfigError, match="distinct"):
        validate_claims(make_table([], seeds={"lite": [1, 1]}), scale_names())
    with pytest.raises(ConfigError, match="baseline of row 'Base' names the row 'Bse', which is not a row"):
        validate_claims(make_table([], baseline="Bse"), scale_names())


def test_a_misspelled_label_in_a_table_config_fails_when_the_table_loads(tmp_path):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose("table_app", overrides=["table=yu2022_t3", "scale=smoke", f"paths.output_dir={tmp_path}"])
        app.table.claims[0].checks[0].row = "AGGG"
        with pytest.raises(ConfigError, match=r"'AGGG', which is not a row of this table.*'MLE', 'AGG'"):
            expand_cells(app)


# --------------------------------------------------------------------------------------------------
# the table configs
# --------------------------------------------------------------------------------------------------
def _compose(name: str):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("table_app", overrides=[f"table={name}", "scale=lite"]).table


@pytest.mark.parametrize("name", TABLES)
def test_every_table_has_claims_over_its_own_rows_and_metrics(name):
    table = _compose(name)
    assert len(table.claims) >= 1, f"{name} has no claims"
    validate_claims(table, scale_names())  # rows exist and are run, metrics exist, relations well formed
    labels = {r.label for r in table.rows} | {f"{r.group} / {r.label}" for r in table.rows if r.group}
    metrics = set(table_metrics(table))
    for c in table.claims:
        assert c.text and c.source
        for k in c.checks:
            assert k.row in labels and (k.than is None or k.than in labels) and k.metric in metrics


@pytest.mark.parametrize("name", TABLES)
def test_claims_hold_on_the_papers_own_numbers(name):
    """Where the paper prints the numbers a claim compares, the claim must hold on them: a claim that
    fails on its own paper is a transcription or drafting error."""
    table = _compose(name)
    paper = {i: {k: float(v) for k, v in (r.paper or {}).items() if v is not None} for i, r in enumerate(table.rows)}
    for v in evaluate_claims(table, {}, [None], paper):
        assert v.paper_state in (HOLDS, UNDECIDED), f"{name}: {v.claim.text!r} fails on the paper's numbers"


def test_claim_and_check_schemas_reject_unknown_keys():
    cfg = OmegaConf.structured(Claim)
    with pytest.raises(Exception, match="tex"):
        cfg.merge_with({"tex": "typo"})
    chk = OmegaConf.structured(ClaimCheck)
    with pytest.raises(Exception, match="relaton"):
        chk.merge_with({"relaton": "lower"})
