"""Yu et al. (2022) tables: every table expands at every scale into the intended runs (model, corpus, objective and
its options per scale), names only known metrics, and carries numbers that the paper's text actually prints."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from repdegen.reproduce.runs.cells import expand_cells, runs_at
from repdegen.reproduce.settings.config import CONF_DIR

from tests.conftest import PAPERS_DIR, REAL_DATA, requires_real_data

YU_TABLES = ["yu2022_t1", "yu2022_t2", "yu2022_t3", "yu2022_t4", "yu2022_t6", "yu2022_t7", "yu2022_t8", "yu2022_t9",
             "yu2022_t10", "yu2022_t11"]
SCALES = ["paper", "lite", "smoke"]
GROUPS = ("frequent", "medium", "rare")
METRICS = {"valid_ppl", "test_ppl", "uniq", "isotropy", "cos_rare_frequent", "bleu", "bleu_tok", "params",
           *(f"ppl_{g}" for g in GROUPS), *(f"uniq_{g}" for g in GROUPS), *(f"isotropy_{g}" for g in GROUPS),
           *(f"wordsim_{d}" for d in ("men", "ws353", "rg65", "rw"))}

# (model, dataset) each experiment's cells must train, per scale
LM_SMALL = ("transformer_lm6", "wikitext2_bpe")
SETTINGS = {
    "yu2022/gpt2_wt103": {"paper": ("gpt2_medium", "wikitext103"), "lite": LM_SMALL, "smoke": LM_SMALL},
    "yu2022/lm6_wt103": {"paper": ("transformer_lm6", "wikitext103"), "lite": LM_SMALL, "smoke": LM_SMALL},
    "yu2022/transformer_base_wmt14": {"paper": ("transformer_base", "wmt14_en_de"),
                                      "lite": ("transformer_base", "multi30k_en_de"),
                                      "smoke": ("transformer_base", "multi30k_en_de")},
    "yu2022/transformer_big_wmt14": {"paper": ("transformer_big", "wmt14_en_de"),
                                     "lite": ("transformer_big", "multi30k_en_de"),
                                     "smoke": ("transformer_big", "multi30k_en_de")},
}
# AGG's alpha per setting (Yu Table 12: 0.03 for language modelling, 0.08 for translation)
AGG_ALPHA = {"yu2022/gpt2_wt103": 0.03, "yu2022/lm6_wt103": 0.03, "yu2022/transformer_base_wmt14": 0.08,
             "yu2022/transformer_big_wmt14": 0.08}
# lite v2 (results/pilots/yu_lm*.md): the LM budget's own AGG alpha (the rare group's largest count in the
# 160k-piece slice / 40 updates an epoch = 21 / 40), lr (7e-4 x 4) and epochs (the first with a gain < 2 %)
LITE_LM = {"alpha": 0.525, "lr": 2.8e-3, "max_epochs": 9, "bpe_vocab_size": 2000}
# one epoch of updates of the lite LM budget (conf/budget/transformer_lm_lite.yaml): static AGG's
# switch point at lite (conf/table/yu2022_t9.yaml)
LITE_EPOCH_UPDATES = 40  # 160,000 pieces / 16 = 10,000 rows; ceil(9,999 / 256) = 40
PAPER_TEXT = PAPERS_DIR / "yu2022-adaptive-gradient-gating.txt"


def compose_app(table: str, scale: str, tmp_path: Path):
    app = compose("table_app", overrides=[f"table={table}", f"scale={scale}", f"paths.output_dir={tmp_path}/out",
                                         f"paths.tables_dir={tmp_path}/tables"])
    app.overrides = [f"dataset.data_dir={tmp_path}", "trainer.progress=false"]
    return app


def row_cells(app) -> dict[int, object]:
    """{row index: its cell} for the rows that run."""
    return {i: cell for cell in expand_cells(app) for i in cell.rows}


def override_value(overrides, key: str):
    """The value of the last ``key=value`` of a list of overrides, as YAML (``[b,c]`` -> ["b", "c"]); None if absent."""
    found = None
    for o in overrides:
        k, _, v = o.partition("=")
        if k == key:
            found = v
    return None if found is None else yaml.safe_load(found)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("table", YU_TABLES)
def test_yu_table_rows_resolve_to_the_intended_runs(table, scale, tmp_path):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose_app(table, scale, tmp_path)
        cells = row_cells(app)
    assert app.table.name == table and app.table.rows and app.table.notes
    assert set(app.table.columns) <= METRICS, set(app.table.columns) - METRICS
    for i, row in enumerate(app.table.rows):
        assert row.paper and set(row.paper) <= set(app.table.columns), row.label
        if row.experiment is None:
            continue
        if not runs_at(row, scale):  # a row its table leaves out at this scale (Table 7's big rows at lite)
            assert i not in cells and scale == "lite" and "big" in row.experiment, row.label
            continue
        cfg = cells[i].cfg
        overrides = [*row.overrides, *row.scale_overrides.get(scale, [])]
        assert cfg.scale.name == scale and cfg.choices["experiment"] == row.experiment
        assert (cfg.model.name, cfg.dataset.name) == SETTINGS[row.experiment][scale], row.label
        objective = override_value(overrides, "objective")
        assert objective and cfg.objective.name == objective, row.label
        # every objective option a row sets reaches the run
        for o in overrides:
            key = o.partition("=")[0]
            if key.startswith("objective."):
                field = key.split(".", 1)[1]
                assert OmegaConf.to_container(cfg.objective)[field] == override_value(overrides, key), (row.label, o)
        if objective in ("agg", "ul_agg", "ul_agg_gated") and "objective.alpha" not in " ".join(overrides):
            lite_lm = scale == "lite" and cfg.dataset.kind != "translation"
            assert cfg.objective.alpha == (LITE_LM["alpha"] if lite_lm else AGG_ALPHA[row.experiment])
        if objective == "ul_agg":
            assert cfg.objective.alpha_ul == 1.0
        if cfg.dataset.kind != "translation":  # the LM settings: recipe and budgets
            last_seed = list((app.table.seeds or {}).get(scale) or [1])[-1]  # lite: seeds 1, 2 (1-3 in Table 9)
            assert cfg.model.tie_weights and cfg.seed == last_seed
            assert cfg.trainer.bptt == {"smoke": 64, "lite": 256, "paper": 1024}[scale]
            cutoffs = cfg.trainer.analysis.group_cutoffs
            assert (list(cutoffs) if cutoffs else None) == ([13000, 36000] if scale == "paper" else None)
            if scale == "paper":
                tokens = cfg.trainer.batch_size * cfg.trainer.bptt * cfg.trainer.update_freq
                assert tokens == 32768 and cfg.optim.lr == 7e-4 and cfg.optim.warmup_updates == 4000
                assert cfg.trainer.max_updates == (40000 if row.experiment == "yu2022/lm6_wt103" else 50000)
            elif scale == "lite":
                assert cfg.trainer.max_updates is None and cfg.trainer.max_epochs == LITE_LM["max_epochs"]
                assert cfg.optim.lr == LITE_LM["lr"] and cfg.dataset.vocab_from == "slice"
                assert cfg.trainer.batch_size * cfg.trainer.bptt == 4096 and cfg.trainer.update_freq == 1
                assert cfg.optim.warmup_updates == 100 and cfg.dataset.train_tokens == 160000
                assert (cfg.model.d_model, cfg.model.n_layers, cfg.dataset.bpe_vocab_size) == (128, 6, LITE_LM["bpe_vocab_size"])
            else:
                assert cfg.model.d_model < 100 and cfg.dataset.train_tokens == 30000 and cfg.trainer.max_epochs == 1


def test_yu_lm_tables_share_their_runs(tmp_path):
    """MLE and AGG of Tables 3, 6, 8, 9, 10 are one pair of runs; UL and UL+AGG of Tables 4 and 11 another; MLE of
    Tables 1 and 2 one run."""
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        hashes = {}
        for table in YU_TABLES:
            app = compose_app(table, "paper", tmp_path)
            for i, cell in row_cells(app).items():
                row = app.table.rows[i]
                hashes[(table, row.label) if row.group is None else (table, row.group, row.label)] = cell.config_hash
    for label in ("MLE", "AGG"):
        assert len({hashes[(t, label)] for t in ("yu2022_t3", "yu2022_t6", "yu2022_t8", "yu2022_t9", "yu2022_t10")}) == 1
    assert hashes[("yu2022_t4", "UL")] == hashes[("yu2022_t11", "UL")]
    assert hashes[("yu2022_t4", "UL + AGG")] == hashes[("yu2022_t11", "UL + AGG")]
    assert hashes[("yu2022_t1", "MLE")] == hashes[("yu2022_t2", "MLE")]
    assert hashes[("yu2022_t1", "MLE")] != hashes[("yu2022_t3", "MLE")]  # the 6-layer LM vs the GPT-2-medium size
    # Table 7's 10 translation runs; the 6-layer LM's MLE, Freeze and 3 partial freezes; the GPT-2-medium-size LM's
    # MLE, AGG, no g1, no g2, static AGG, UL, UL+AGG
    assert len(set(hashes.values())) == 10 + 5 + 7


def _numbers_in(text: str) -> set[Decimal]:
    return {Decimal(t) for t in re.findall(r"(?<![\d.])\d+(?:\.\d+)?(?![\d])", text)}


@pytest.mark.skipif(not PAPER_TEXT.is_file(), reason="needs Yu et al.'s text: set REPDEGEN_PAPERS_DIR")
@pytest.mark.parametrize("table", YU_TABLES)
def test_yu_paper_numbers_are_printed_in_the_paper(table, tmp_path):
    """An independent check of the transcription: every paper number of the table is a number the paper's text
    prints (13.30 matches 13.3; no rounding or arithmetic allowed)."""
    printed = _numbers_in(PAPER_TEXT.read_text(encoding="utf-8"))
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose_app(table, "paper", tmp_path)
    for row in app.table.rows:
        for column, value in row.paper.items():
            assert value is not None and math.isfinite(value)
            assert Decimal(str(value)) in printed, f"{table}, {row.label!r}, {column}: {value} is not in the paper"


def test_yu_paper_numbers_spot_checks(tmp_path):
    """A few cells checked by hand against the PDF layout (the text extraction scrambles columns)."""
    expected = {
        ("yu2022_t1", "Freeze"): {"ppl_rare": 3017.53, "isotropy": 0.739},
        ("yu2022_t2", "Freeze (c)"): {"ppl_rare": 645.24, "isotropy_frequent": 0.443, "isotropy_rare": 0.15},
        ("yu2022_t3", "AGG"): {"uniq_rare": 345, "uniq": 13737, "isotropy": 0.813},
        ("yu2022_t4", "UL + AGG"): {"ppl_rare": 71.48, "uniq_medium": 4884},
        ("yu2022_t6", "AGG"): {"wordsim_rg65": 65.45},
        ("yu2022_t8", "no g1"): {"test_ppl": 15.48, "uniq": 13018, "isotropy": 0.367},
        ("yu2022_t9", "static AGG"): {"test_ppl": 15.55, "uniq": 13614, "isotropy": 0.752},
        ("yu2022_t10", "MLE"): {"isotropy_frequent": 0.51, "isotropy_medium": 0.33, "isotropy_rare": 0.278},
        ("yu2022_t11", "UL + AGG"): {"isotropy_frequent": 0.731, "isotropy_medium": 0.626, "isotropy_rare": 0.696},
    }
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for (table, label), numbers in expected.items():
            rows = [r for r in compose_app(table, "paper", tmp_path).table.rows if r.label == label]
            assert len(rows) == 1 and {k: rows[0].paper[k] for k in numbers} == numbers, (table, label)


def test_yu_uniq_totals_are_the_sum_of_their_groups(tmp_path):
    """Yu Tables 3 and 4: Uniq per group adds up to the total (the paper's Human row excepted: 18290 printed 18920)."""
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for table in ("yu2022_t3", "yu2022_t4"):
            for row in compose_app(table, "paper", tmp_path).table.rows:
                groups = sum(row.paper[f"uniq_{g}"] for g in GROUPS)
                assert groups == (18290 if row.label == "Human" else row.paper["uniq"]), (table, row.label)


@requires_real_data("wikitext-2")
def test_static_agg_switches_after_one_lite_epoch(tmp_path):
    """Table 9's static AGG fixes the rare group after one epoch: at lite that is the updates per epoch of the real
    WikiText-2 BPE stream under the lite batch, as the trainer computes them."""
    from types import SimpleNamespace

    from repdegen.data.corpus import load_corpus
    from repdegen.reproduce.engine.tasks import LMTask

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose_app("yu2022_t9", "lite", tmp_path)
        app.overrides = [f"dataset.data_dir={REAL_DATA}", "trainer.progress=false"]
        cells = row_cells(app)
    row = next(i for i, r in enumerate(app.table.rows) if r.label == "static AGG")
    cfg = cells[row].cfg
    corpus = load_corpus(cfg.dataset, cache_dir=tmp_path / "cache", verbose=False)
    assert corpus.train.numel() == 160000  # the lite prefix (conf/budget/transformer_lm_lite.yaml)
    stateless_model = SimpleNamespace(init_state=lambda *args: None)
    per_epoch = LMTask(cfg, corpus, stateless_model, "cpu").updates_per_epoch()
    assert per_epoch == LITE_EPOCH_UPDATES and cfg.objective.static_after_epochs == 1
    from repdegen.losses import build_objective

    agg = build_objective(cfg.objective, len(corpus.vocab), 0.0)
    agg.setup(updates_per_epoch=per_epoch, special_ids=[0, 1, 2, 3])
    assert agg.static_after == LITE_EPOCH_UPDATES
