"""Claims: checks over a table's cells, evaluated per seed against hand-made results; configs that name a
row or metric the table does not have fail at load; every table has claims, and they hold on the paper's
own numbers where the paper prints them (a check on the transcription)."""

from __future__ import annotations

import dataclasses

import pytest
import repdegen.reproduce.runs.tables  # noqa: F401  (registers the table schema)
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.results.claims import (
    FAILS,
    HOLDS,
    TIE,
    UNDECIDED,
    Claim,
    ClaimCheck,
    evaluate_claims,
    table_metrics,
    validate_claims,
)
from repdegen.reproduce.results.claims_text import (
    CONSOLE_WIDTH,
    claims_console,
    claims_csv,
    claims_markdown,
    shown_state,
    summary_line,
    tally,
    verdict_record,
)
from repdegen.reproduce.runs.cells import TableConfig, expand_cells, scale_names
from repdegen.reproduce.settings.config import CONF_DIR

TABLES = sorted(p.stem for p in (CONF_DIR / "table").glob("*.yaml"))


def make_table(claims: list[dict], rows: list[dict] | None = None, **extra):
    rows = rows or [
        {"label": "Base", "experiment": "x", "group": "A"},
        {"label": "New", "experiment": "x", "group": "A"},
        {"label": "Base", "experiment": "x", "group": "B"},
        {"label": "Other work"},
    ]
    cfg = OmegaConf.structured(TableConfig)
    extra.setdefault("columns", ["test_ppl", "isotropy"])
    cfg.merge_with({"name": "t", "title": "T", "source": "S (2020), Table 1", "rows": rows, "claims": claims, **extra})
    return cfg


def claim(*checks, **kw) -> dict:
    return {"text": "c", "source": "Sec. 1", "checks": list(checks), **kw}


def check(relation, metric="test_ppl", row="New", than="A / Base", value=None, **margins) -> dict:
    c = {"metric": metric, "row": row, "relation": relation, "than": than, **margins}
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
def test_lower_holds_beyond_the_margin_with_every_seed_and_a_mixed_seed_is_a_tie():
    t = make_table([claim(check("lower"))])
    ours = {0: seeds_of([100.0, 102.0, 101.0]), 1: seeds_of([95.0, 99.0, 100.5])}
    (v,) = run(t, ours)
    # differences 5, 3, 0.5 (mean 2.83); margin = max(1 % of 101, sd(100, 102, 101) = 1.0) = 1.01
    r = v.checks[0]
    assert v.state == HOLDS and r.agree == 3
    assert r.difference == pytest.approx(17 / 6) and r.margin == pytest.approx(1.01)
    # seed 3 goes the other way (101.5 > 101): the mean still clears the margin, but the seeds disagree: a tie
    ours[1][3]["test_ppl"] = 101.5
    (v,) = run(t, ours)
    assert v.state == TIE and v.checks[0].agree == 2 and v.checks[0].difference == pytest.approx(2.5)


def test_inside_on_and_beyond_the_margin():
    t = make_table([claim(check("lower"))])
    base = seeds_of([100.0, 100.0, 100.0])                      # sd 0: the stated 1 % (1.0 PPL) is the margin
    inside = {0: base, 1: seeds_of([99.5, 99.4, 99.6])}         # every seed lower, by 0.5: inside
    on = {0: base, 1: seeds_of([99.0, 99.0, 99.0])}             # exactly the margin: not beyond it
    beyond = {0: base, 1: seeds_of([98.9, 98.0, 98.5])}
    worse = {0: base, 1: seeds_of([101.5, 102.0, 101.2])}       # beyond the margin the other way, every seed
    worse_mixed = {0: base, 1: seeds_of([101.5, 102.0, 99.9])}  # one seed lower: not a verdict either way
    assert [run(t, o)[0].state for o in (inside, on, beyond, worse, worse_mixed)] == [TIE, TIE, HOLDS, FAILS, TIE]


def test_the_baseline_seed_sd_widens_the_margin_when_it_is_larger():
    t = make_table([claim(check("lower"))])
    ours = {0: seeds_of([100.0, 104.0, 96.0]), 1: seeds_of([97.0, 101.0, 93.0])}  # 3 % lower on every seed
    (v,) = run(t, ours)
    assert v.checks[0].margin == pytest.approx(4.0) and v.state == TIE            # sd 4 > 1 % of 100
    ours[1] = seeds_of([95.0, 99.0, 91.0])                                        # 5 lower: beyond sd 4
    assert run(t, ours)[0].state == HOLDS
    # a stated margin larger than the sd wins
    t = make_table([claim(check("lower", margin=0.06))])
    assert run(t, ours)[0].state == TIE and run(t, ours)[0].checks[0].margin == pytest.approx(6.0)


def test_pairs_are_by_seed_not_by_sorted_values():
    t = make_table([claim(check("lower"))])
    # by seed: seed 1 goes the other way (-1.5), seed 2 the claim's way (+6): a tie
    ours = {0: seeds_of([100.0, 103.0]), 1: seeds_of([101.5, 97.0])}
    assert run(t, ours, seeds=(1, 2))[0].state == TIE
    # the same values paired the other way (101.5 with 103, 97 with 100) agree: +3, +1.5, mean 2.25 > sd 2.12
    ours = {0: seeds_of([100.0, 103.0]), 1: seeds_of([97.0, 101.5])}
    assert run(t, ours, seeds=(1, 2))[0].state == HOLDS


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
    ("higher", None, 0.4, 0.4, TIE),                # equal is a tie, not a failure
    ("higher", None, 0.3, 0.4, FAILS),
    ("ratio_at_least", 2.0, 0.81, 0.40, HOLDS),     # 2.025x
    ("ratio_at_least", 2.0, 0.79, 0.40, FAILS),     # 1.975x
    ("ratio_at_most", 1.03, 84.7, 82.7, HOLDS),     # +2.4 %
    ("ratio_at_most", 1.03, 85.3, 82.7, FAILS),     # +3.1 %
    ("within", 0.02, 15.80, 15.51, HOLDS),          # +1.87 %
    ("within", 0.02, 15.20, 15.51, HOLDS),          # -1.999 %
    ("within", 0.02, 15.19, 15.51, FAILS),          # -2.06 %
])
def test_pairwise_relations_without_a_margin(relation, value, a, b, expected):
    t = make_table([claim(check(relation, metric="isotropy", value=value, margin=0.0))])
    (v,) = run(t, {0: seeds_of([b], "isotropy"), 1: seeds_of([a], "isotropy")}, seeds=(1,))
    assert v.state == expected


@pytest.mark.parametrize("relation,value,a,b,expected", [
    # I(W)'s default margin: 5 % of the compared value (0.02 of 0.40; 0.04 of 2 x 0.40 for a ratio)
    ("higher", None, 0.43, 0.40, HOLDS),
    ("higher", None, 0.41, 0.40, TIE),
    ("higher", None, 0.37, 0.40, FAILS),
    ("ratio_at_least", 2.0, 0.81, 0.40, TIE),       # 2.025x: 0.01 past 0.80, inside 0.04
    ("ratio_at_least", 2.0, 0.90, 0.40, HOLDS),
    ("ratio_at_least", 2.0, 0.70, 0.40, FAILS),
])
def test_pairwise_relations_with_the_default_margin(relation, value, a, b, expected):
    t = make_table([claim(check(relation, metric="isotropy", value=value))])
    (v,) = run(t, {0: seeds_of([b], "isotropy"), 1: seeds_of([a], "isotropy")}, seeds=(1,))
    assert v.state == expected


def test_within_is_two_sided_and_checked_per_seed():
    t = make_table([claim(check("within", value=0.02, margin=0.0))])
    ours = {0: seeds_of([100.0, 100.0]), 1: seeds_of([101.9, 97.9])}  # +1.9 % (inside), -2.1 % (outside)
    (v,) = run(t, ours, seeds=(1, 2))
    assert v.state == TIE and v.checks[0].agree == 1
    ours[1] = seeds_of([101.9, 98.5])
    assert run(t, ours, seeds=(1, 2))[0].state == HOLDS


def test_constant_forms_and_claims_of_several_checks():
    t = make_table([claim(check("above", metric="isotropy", than=None, value=0.5)),
                    claim(check("below", than=None, value=70.9), check("higher", metric="isotropy"))])
    ours = {0: {1: {"test_ppl": 80.0, "isotropy": 0.3}}, 1: {1: {"test_ppl": 69.0, "isotropy": 0.6}}}
    first, second = run(t, ours, seeds=(1,))
    assert first.state == HOLDS and second.state == HOLDS
    ours[1][1]["isotropy"] = 0.2  # one check of the second claim fails: the claim fails
    first, second = run(t, ours, seeds=(1,))
    assert first.state == FAILS and second.state == FAILS and [c.state for c in second.checks] == [HOLDS, FAILS]
    ours[1][1]["isotropy"] = 0.305  # inside I(W)'s margin: a tie; with a check that holds, the claim is a tie
    assert run(t, ours, seeds=(1,))[1].state == TIE
    # a constant's margin: 5 % of 0.5 = 0.025, or the row's own seed sd when larger
    t = make_table([claim(check("above", metric="isotropy", than=None, value=0.5))])
    assert run(t, {1: seeds_of([0.51, 0.53], "isotropy")}, seeds=(1, 2))[0].state == TIE
    spread = {1: seeds_of([0.56, 0.80, 0.62], "isotropy")}   # mean 0.66, +0.16 > sd 0.125
    (v,) = run(t, spread)
    assert v.state == HOLDS and v.checks[0].margin == pytest.approx(0.1249, abs=1e-3)


def test_a_claim_combines_its_checks():
    t = make_table([claim(check("lower"), check("higher", metric="isotropy"))])
    base = {1: {"test_ppl": 100.0, "isotropy": 0.40}}
    cases = {  # (test_ppl, isotropy) of New -> the claim's state
        (90.0, 0.50): HOLDS, (90.0, 0.41): TIE, (99.5, 0.41): TIE, (105.0, 0.41): FAILS, (90.0, 0.30): FAILS,
    }
    for (ppl, iso), expected in cases.items():
        (v,) = run(t, {0: base, 1: {1: {"test_ppl": ppl, "isotropy": iso}}}, seeds=(1,))
        assert v.state == expected, (ppl, iso)
    # one check undecided (its cell is not complete) and one tie: undecided, not a tie
    (v,) = run(t, {0: {1: {"test_ppl": 100.0, "isotropy": float("nan")}}, 1: {1: {"test_ppl": 99.5, "isotropy": 0.4}}},
               seeds=(1,))
    assert v.state == UNDECIDED


def test_paper_numbers_are_evaluated_too_and_a_claim_off_its_scales_is_undecided():
    t = make_table([claim(check("lower"), scales=["paper"])])
    ours = {0: seeds_of([100.0]), 1: seeds_of([90.0])}
    paper = {0: {"test_ppl": 87.3}, 1: {"test_ppl": 82.7}}
    (v,) = run(t, ours, seeds=(1,), paper=paper, scale="lite")
    assert v.state == UNDECIDED and v.paper_state == HOLDS and v.checks[0].reason == "meaningful at paper only"
    (v,) = run(t, ours, seeds=(1,), paper=paper, scale="paper")
    assert v.state == HOLDS
    # the paper's own numbers are judged with the stated margin: 86.3 vs 86.3 is a tie
    (v,) = run(t, ours, seeds=(1,), paper={0: {"test_ppl": 86.3}, 1: {"test_ppl": 86.3}}, scale="paper")
    assert v.paper_state == TIE


def test_a_claim_marked_na_at_a_scale_says_why_and_is_counted_apart():
    t = make_table([claim(check("lower"), na={"lite": "the paper's 0.3 PPL is below our seed sd 0.8"}),
                    claim(check("lower"))])
    ours = {0: seeds_of([100.0]), 1: seeds_of([90.0])}
    na, other = run(t, ours, seeds=(1,), scale="lite")
    assert na.state == UNDECIDED and shown_state(na) == "n/a" and "seed sd 0.8" in na.checks[0].reason
    assert tally([na, other]) == {"holds": 1, "fails": 0, "tie": 0, "undecided": 0, "changed": 0, "n/a": 1}
    assert run(t, ours, seeds=(1,), scale="paper")[0].state == HOLDS
    md = "\n".join(claims_markdown([na, other], "S", "lite", [1]))
    assert "| n/a | c (Sec. 1) |" in md and "1 ✓, 0 ✗, 0 ≈ (ties), 0 – of 1 decidable (1 n/a at this scale)" in md


def test_rendered_claims_show_mean_sd_margin_and_seed_counts():
    t = make_table([claim(check("lower")), claim(check("higher", metric="isotropy"))])
    ours = {0: {1: {"test_ppl": 100.0, "isotropy": 0.4}, 2: {"test_ppl": 102.0, "isotropy": 0.4}},
            1: {1: {"test_ppl": 95.0, "isotropy": 0.405}, 2: {"test_ppl": 97.0, "isotropy": 0.41}}}
    verdicts = run(t, ours, seeds=(1, 2), paper={0: {"test_ppl": 87.3}, 1: {"test_ppl": 82.7}})
    md = "\n".join(claims_markdown(verdicts, "S (2020), Table 1", "lite", [1, 2]))
    # mean ± sample sd of (100, 102) = 101 ± 1.414; of (95, 97) = 96 ± 1.414; difference +5 vs margin max(1.01, 1.41)
    assert "| ✓ | c (Sec. 1) | 87.30 → 82.70 | 101.0 ± 1.4 → 96.0 ± 1.4 [+5 vs margin 1.4; 2/2 seeds] |" in md
    assert "| ≈ | c (Sec. 1) |" in md  # I(W) +0.0075 inside 5 % of 0.4
    assert "1 ✓, 0 ✗, 1 ≈ (ties), 0 – of 2 decidable" in md
    smoke = "\n".join(claims_markdown(verdicts, "S", "smoke", [1, 2]))
    assert "not meaningful at smoke" in smoke
    console = claims_console(verdicts, "S (2020), Table 1", "lite", [1, 2]).splitlines()
    assert console[0].startswith("  Claims (S (2020), Table 1)") and "ours (2 seeds) vs paper" in console[0]
    assert console[1].split() == ["✓", "c", "ours", "101.0", "→", "96.00,", "paper", "87.30", "→", "82.70"]
    assert console[2].split()[0] == "≈"
    # a long claim text is cut to keep its line within the width, the numbers whole
    long = [dataclasses.replace(verdicts[0], claim=OmegaConf.merge(verdicts[0].claim, {"text": "x" * 300}))]
    line = claims_console(long, "S", "lite", [1, 2]).splitlines()[1]
    assert len(line) == CONSOLE_WIDTH and line.endswith("x…  ours 101.0 → 96.00, paper 87.30 → 82.70")
    csv_text = claims_csv(verdicts, "lite")
    assert "100 102" in csv_text and "95 97" in csv_text and "holds" in csv_text and ",tie," in csv_text
    assert summary_line(verdicts, "t", "lite") == "repdegen: claims of t at lite: 1 ✓, 0 ✗, 1 ≈ (ties), 0 – of 2 decidable"


def test_a_metric_missing_from_a_record_is_named_apart_from_a_non_finite_one():
    """A record rebuilt from a rendering (marked recovered) lacks the metrics the table did not show: the
    reason names the row whose record lacks it, not "not finite"; a NaN is "not finite"; the preset's seed (None) is
    not written as "seed None"."""
    t = make_table([claim(check("lower", row="A / New", than="A / Base"))])
    (v,) = run(t, {0: {None: {}}, 1: {None: {"test_ppl": 90.0}}}, seeds=(None,))
    assert v.state == UNDECIDED and v.checks[0].reason == "test_ppl is not in the record of A / Base"
    (v,) = run(t, {0: {2: {"test_ppl": 100.0}}, 1: {2: {"test_ppl": float("nan")}}}, seeds=(2,))
    assert v.checks[0].reason == "test_ppl is not finite (seed 2)"
    (v,) = run(t, {0: {2: {}}, 1: {2: {}}}, seeds=(2,))
    assert v.checks[0].reason == "test_ppl is not in the record of A / New and A / Base (seed 2)"


def test_a_check_between_two_groups_rows_of_one_label_names_the_groups():
    """Footnote 5's checks compare a model with itself in another group ("first session"): the label alone would
    read "VD-LSTM+AL < VD-LSTM+AL"; with a label that differs, the label alone stays (the claim names the group)."""
    t = make_table([claim(check("lower", row="B / Base", than="A / Base"), check("lower"))])
    ours = {0: seeds_of([100.0]), 1: seeds_of([90.0]), 2: seeds_of([95.0])}
    (v,) = run(t, ours, seeds=(1,))
    same, other = (verdict_record(v)["checks"][i]["what"] for i in (0, 1))
    assert same == "Test PPL: B / Base < A / Base"
    assert other == "Test PPL: New < Base"
    md = "\n".join(claims_markdown([v], "S", "lite", [1]))
    assert "Test PPL: B / Base < A / Base: 100.0 → 95.0" in md


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
    (check("lower", margin=-0.01), r"margin=-0.01; expected a finite number >= 0"),
    (check("lower", margin_abs=float("nan")), r"margin_abs=nan"),
    (check("lower", margin=2.0), r"margin=2.0 is a fraction.*margin_abs"),
])
def test_malformed_checks_fail_at_load(bad, match):
    with pytest.raises(ConfigError, match=match):
        validate_claims(make_table([claim(bad)]), scale_names())


def test_a_metric_without_a_default_margin_needs_one_and_na_needs_a_known_scale_and_a_reason():
    t = make_table([claim(check("lower", metric="custom_score"))], columns=["test_ppl", "custom_score"])
    with pytest.raises(ConfigError, match=r"'custom_score' has no default tie margin; give margin=.*margin_abs="):
        validate_claims(t, scale_names())
    validate_claims(make_table([claim(check("lower", metric="custom_score", margin_abs=0.1))],
                               columns=["test_ppl", "custom_score"]), scale_names())
    with pytest.raises(ConfigError, match=r"na.huge; scales are"):
        validate_claims(make_table([claim(check("lower"), na={"huge": "x"})]), scale_names())
    with pytest.raises(ConfigError, match=r"na.lite without a reason"):
        validate_claims(make_table([claim(check("lower"), na={"lite": " "})]), scale_names())


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
    states = [v.paper_state for v in evaluate_claims(table, {}, [None], paper)]
    assert len(states) == len(table.claims)
    for v, state in zip(table.claims, states):
        assert state in (HOLDS, UNDECIDED), f"{name}: {v.text!r} fails on the paper's numbers"
    # a table whose paper prints none of the numbers its claims compare is listed, so the check is not vacuous
    assert (HOLDS in states) != (name in NO_PAPER_NUMBERS), (name, states)


# the tables whose claims compare nothing the paper prints as numbers (figures; claims over our own metrics)
NO_PAPER_NUMBERS = {"yu2022_fig5"}


def test_claim_and_check_schemas_reject_unknown_keys():
    cfg = OmegaConf.structured(Claim)
    with pytest.raises(Exception, match="tex"):
        cfg.merge_with({"tex": "typo"})
    chk = OmegaConf.structured(ClaimCheck)
    with pytest.raises(Exception, match="relaton"):
        chk.merge_with({"relaton": "lower"})
