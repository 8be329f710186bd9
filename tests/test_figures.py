"""A table's figures as a reader wants them: a row is (group, label) and one colour everywhere; a
row's seeds are one line, their mean, with a min-max band; geometry is a grid with the metric registry's labels; the
SVD projections of the rows are panels of one figure on the same axis limits. The data are read back from the
matplotlib figures the ``figure_*`` functions return (or from the arguments the plotting functions get)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgba
from repdegen.analysis import embedding_figures as ef
from repdegen.analysis.figures import Seeds, figure_validation_curves, mean_band, plot_validation_curves
from repdegen.analysis.groups import frequency_groups


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _by_gid(fig, gid):
    """The artists of ``fig`` (lines and bands, every panel) whose gid is ``gid``."""
    return [a for ax in fig.axes for a in (*ax.lines, *ax.collections) if a.get_gid() == gid]


def _band(artist) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(xs, lower, upper) of a fill_between band."""
    v = artist.get_paths()[0].vertices
    xs = np.unique(v[:, 0])
    lo = np.array([v[v[:, 0] == x, 1].min() for x in xs])
    hi = np.array([v[v[:, 0] == x, 1].max() for x in xs])
    return xs, lo, hi


def _legend_texts(fig) -> list[str]:
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    return [t.get_text() for lg in legends for t in lg.get_texts()]


def _history(ppls, stage="train", session=1):
    return [{"stage": stage, "session": session, "valid_ppl": p, "train_ppl": p * 0.8} for p in ppls]


# ---- validation curves ------------------------------------------------------------------------------------------


def test_curves_draw_the_mean_over_seeds_and_a_min_max_band_one_colour_per_row():
    seeds = [[300.0, 200.0, 150.0], [330.0, 190.0, 160.0], [310.0, 230.0, 140.0]]
    other = [500.0, 400.0, 350.0]
    series = [("VD-LSTM", "Small", _history(p)) for p in seeds] + [("VD-LSTM+REAL", "Small", _history(other))]
    fig = figure_validation_curves(series, "t")
    (line,) = _by_gid(fig, "Small|VD-LSTM|train|valid")
    assert list(line.get_xdata()) == [1, 2, 3]
    assert np.allclose(line.get_ydata(), [np.mean(col) for col in zip(*seeds)])
    (band,) = _by_gid(fig, "Small|VD-LSTM|train|band")
    xs, lo, hi = _band(band)
    assert list(xs) == [1, 2, 3]
    assert np.allclose(lo, [min(col) for col in zip(*seeds)]) and np.allclose(hi, [max(col) for col in zip(*seeds)])
    # one line per row, not one per seed; a row's line and band share its colour; rows differ
    valid_lines = [a for a in fig.axes[0].lines if str(a.get_gid()).endswith("|valid")]
    assert len(valid_lines) == 2
    (real,) = _by_gid(fig, "Small|VD-LSTM+REAL|train|valid")
    assert list(real.get_ydata()) == other and not _by_gid(fig, "Small|VD-LSTM+REAL|train|band")  # one seed: no band
    assert to_rgba(line.get_color()) == to_rgba(band.get_facecolor()[0], 1.0)
    assert to_rgba(line.get_color()) != to_rgba(real.get_color())
    # the legend names the rows once each and says what the line and band are; it sits outside the panel
    texts = _legend_texts(fig)
    assert texts[:2] == ["VD-LSTM (3 seeds)", "VD-LSTM+REAL (1 seed)"]  # rows with different numbers of seeds
    assert fig.legends and fig.legends[0].get_title().get_text() == "line: mean of its seeds; band: their min–max"
    assert fig.axes[0].get_legend() is None


def test_curves_draw_each_rows_paper_target_across_its_panel_in_its_colour():
    series = [("MLE", "Small", _history([300.0, 200.0])), ("RE", "Small", _history([310.0, 190.0])),
              ("MLE", "Medium", _history([250.0, 150.0]))]
    fig = figure_validation_curves(series, "t", targets={("Small", "MLE"): 92.6, ("Medium", "MLE"): 82.0,
                                                           ("Small", "nope"): 1.0, ("Small", "RE"): float("nan")})
    (small,) = _by_gid(fig, "Small|MLE|paper")
    (medium,) = _by_gid(fig, "Medium|MLE|paper")
    assert list(small.get_ydata()) == [92.6, 92.6] and list(medium.get_ydata()) == [82.0, 82.0]
    assert small.axes is fig.axes[0] and medium.axes is fig.axes[1]  # each in its row's panel
    (line,) = _by_gid(fig, "Small|MLE|train|valid")
    assert to_rgba(small.get_color()) == to_rgba(line.get_color())
    assert not _by_gid(fig, "Small|RE|paper") and not _by_gid(fig, "Small|nope|paper")  # NaN, or no such row: none
    assert "thin dotted line across: the paper's validation PPL" in _legend_texts(fig)
    plain = figure_validation_curves(series, "t")
    assert not [a for a in plain.axes[0].lines if str(a.get_gid()).endswith("|paper")]
    assert "thin dotted line across: the paper's validation PPL" not in _legend_texts(plain)


def test_curves_seeds_of_different_lengths_are_matched_by_epoch():
    series = [("MLE", None, _history([300.0, 200.0, 150.0])), ("MLE", None, _history([320.0, 210.0]))]
    fig = figure_validation_curves(series, "t")
    (line,) = _by_gid(fig, "None|MLE|train|valid")
    assert np.allclose(line.get_ydata(), [310.0, 205.0, 150.0])  # epoch 3: the one seed that reached it
    assert "line: mean of 2 seeds; band: their min–max" in [lg.get_title().get_text() for lg in fig.legends]


def test_curves_rows_with_one_label_in_two_groups_stay_two_rows():
    series = [("MLE", "En→De", _history([300.0, 200.0])), ("CosReg", "En→De", _history([290.0, 190.0])),
              ("MLE", "De→En", _history([250.0, 180.0])), ("CosReg", "De→En", _history([240.0, 170.0]))]
    fig = figure_validation_curves(series, "t")
    assert [ax.get_title() for ax in fig.axes] == ["En→De", "De→En"]
    (en,) = _by_gid(fig, "En→De|MLE|train|valid")
    (de,) = _by_gid(fig, "De→En|MLE|train|valid")
    assert list(en.get_ydata()) == [300.0, 200.0] and list(de.get_ydata()) == [250.0, 180.0]  # not averaged together
    assert en.axes is fig.axes[0] and de.axes is fig.axes[1]
    assert len({to_rgba(a.get_color()) for a in fig.axes[0].lines + fig.axes[1].lines}) == 4
    assert {"En→De / MLE", "De→En / MLE", "En→De / CosReg", "De→En / CosReg"} <= set(_legend_texts(fig))


def test_curves_keep_the_styles_of_finetuning_retraining_and_training_ppl(tmp_path):
    runs = [_history([300.0, 200.0]) + _history([190.0], session=2) + _history([180.0, 170.0], stage="finetune")
            for _ in range(2)]
    runs[1][0]["valid_ppl"] = 320.0
    fig = figure_validation_curves([("AWD-LSTM", None, h) for h in runs], "t", show_train=True)
    styles = {a.get_gid(): (a.get_linestyle(), a.get_alpha()) for a in fig.axes[0].lines}
    assert styles["None|AWD-LSTM|train|valid"][0] == "-" and styles["None|AWD-LSTM|retrain|valid"][0] == ":"
    assert styles["None|AWD-LSTM|finetune|valid"][0] == "--"
    assert styles["None|AWD-LSTM|train|train"] == ("-", 0.35)  # the training PPL: faint, in the part's style
    (ft,) = _by_gid(fig, "None|AWD-LSTM|finetune|valid")
    assert list(ft.get_xdata()) == [4, 5]  # the finetuning epochs continue the axis
    assert {"re-training session", "finetuning", "faint: training PPL"} <= set(_legend_texts(fig))
    assert plot_validation_curves([("AWD-LSTM", None, h) for h in runs], tmp_path / "c.png", "t").is_file()
    assert plot_validation_curves([("x", None, [])], tmp_path / "none.png", "t") is None


def test_mean_band_leaves_out_non_finite_values():
    xs, mean, lo, hi, n = mean_band([{1: 2.0, 2: float("nan")}, {1: 4.0, 2: 6.0}])
    assert list(xs) == [1, 2] and list(mean) == [3.0, 6.0] and list(lo) == [2.0, 6.0] and list(n) == [2, 1]


# ---- embedding geometry ------------------------------------------------------------------------------------------


def test_geometry_is_a_grid_with_the_given_labels_and_the_mean_over_seeds():
    keys = ["isotropy", "isotropy_rare", "isotropy_frequent", "cos_rare_frequent"]
    labels = {"isotropy": "I(W)", "isotropy_rare": "I(W) rare", "isotropy_frequent": "I(W) frequent",
              "cos_rare_frequent": "cos(rare, freq)"}
    rng = np.random.default_rng(0)
    runs = [[{"step": s, **{k: float(rng.random()) for k in keys}} for s in (100, 200, 300)] for _ in range(3)]
    runs[2] = runs[2][:2]  # a seed with one evaluation fewer
    other = [{"step": s, **{k: 0.5 for k in keys}} for s in (100, 200, 300)]
    fig = ef.figure_metric_over_training({"MLE": Seeds(runs), "AGG": other}, keys, "t", labels=labels,
                                         x_label="training updates")
    assert len(fig.axes) == 4
    assert {ax.get_subplotspec().get_geometry()[:2] for ax in fig.axes} == {(2, 2)}
    assert [ax.get_ylabel() for ax in fig.axes] == [labels[k] for k in keys]
    assert {ax.get_xlabel() for ax in fig.axes} == {"training updates"}
    w, h = fig.get_size_inches()
    assert w < 11 and h > 5  # a grid, not a strip
    for k in keys:
        (line,) = _by_gid(fig, f"MLE|{k}|train|mean")
        want = [np.mean([r[i][k] for r in runs if i < len(r)]) for i in range(3)]
        assert list(line.get_xdata()) == [100, 200, 300] and np.allclose(line.get_ydata(), want)
        (band,) = _by_gid(fig, f"MLE|{k}|train|band")
        assert np.allclose(_band(band)[2], [max(r[i][k] for r in runs if i < len(r)) for i in range(3)])
        (agg,) = _by_gid(fig, f"AGG|{k}|train|mean")
        assert to_rgba(agg.get_color()) != to_rgba(line.get_color())
    assert sorted(t for t in _legend_texts(fig)) == ["AGG (1 seed)", "MLE (3 seeds)"]
    three = ef.figure_metric_over_training({"MLE": runs[0]}, keys[:3], "t")
    assert len(three.axes) == 3 and three.axes[2].get_subplotspec().get_geometry()[:2] == (2, 2)
    assert [ax.get_ylabel() for ax in three.axes] == keys[:3]  # no labels given: the keys


def test_metric_over_training_takes_the_colours_given():
    fig = ef.figure_metric_over_training({"AGG": [{"step": 1, "rare_count": 5.0}]}, "rare_count", "t",
                                         colors={"AGG": "tab:orange"}, labels={"rare_count": "AGG rare group size"})
    (line,) = _by_gid(fig, "AGG|rare_count|train|mean")
    assert to_rgba(line.get_color()) == to_rgba("tab:orange")
    assert fig.axes[0].get_ylabel() == "AGG rare group size" and fig.axes[0].get_legend() is not None


def test_singular_values_mean_of_the_normalised_spectra_of_the_seeds():
    torch.manual_seed(0)
    ws = [torch.randn(40, 6, dtype=torch.float64) for _ in range(3)]
    fig = ef.figure_singular_values({"MLE": Seeds(ws), "AGG": torch.randn(40, 6)}, "t")
    spectra = np.stack([(s / s[0]).numpy() for s in (torch.linalg.svdvals(w) for w in ws)])
    (line,) = _by_gid(fig, "MLE|mean")
    assert list(line.get_xdata()) == list(range(1, 7)) and np.allclose(line.get_ydata(), spectra.mean(0))
    (band,) = _by_gid(fig, "MLE|band")
    _, lo, hi = _band(band)
    assert np.allclose(lo, spectra.min(0)) and np.allclose(hi, spectra.max(0))
    assert not _by_gid(fig, "AGG|band")
    legend = fig.axes[0].get_legend()
    assert legend.get_title().get_text() == "line: mean of its seeds; band: their min–max"
    assert [t.get_text() for t in legend.get_texts()] == ["MLE (3 seeds)", "AGG (1 seed)"]


# ---- SVD projections ---------------------------------------------------------------------------------------------


def test_svd_projections_one_panel_per_row_on_the_same_limits(tmp_path):
    torch.manual_seed(0)
    counts = torch.arange(60, 0, -1)
    a = torch.randn(60, 8, dtype=torch.float64) + 3.0  # a cone away from the origin
    b = torch.randn(60, 8, dtype=torch.float64) * 0.3
    panels = {"En→De / MLE — seed 1": (a, counts), "De→En / MLE — seed 1": (b, counts)}
    fig = ef.figure_svd_projections(panels, "t")
    assert [ax.get_title() for ax in fig.axes] == list(panels)
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim() and fig.axes[0].get_ylim() == fig.axes[1].get_ylim()
    (x0, x1), (y0, y1) = fig.axes[0].get_xlim(), fig.axes[0].get_ylim()
    assert x1 - x0 == pytest.approx(y1 - y0) and x0 < 0 < x1 and y0 < 0 < y1  # square, holds the origin
    groups = frequency_groups(counts)
    for ax, w in zip(fig.axes, (a, b)):
        coords = ef.svd_projection(w)
        for name in ("frequent", "medium", "rare"):
            (pts,) = [c for c in ax.collections if c.get_gid() == f"svd|{name}"]
            assert np.allclose(pts.get_offsets(), coords[groups[name]])
            assert to_rgba(pts.get_facecolor()[0], 1.0) == to_rgba(ef.GROUP_COLORS[name])
        assert (coords[:, 0] >= x0).all() and (coords[:, 0] <= x1).all()
        assert (coords[:, 1] >= y0).all() and (coords[:, 1] <= y1).all()
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)  # one legend
    assert [t.get_text().split()[0] for t in fig.legends[0].get_texts()] == ["frequent", "medium", "rare"]
    five = ef.figure_svd_projections({f"row {k}": (a, counts) for k in range(5)}, "t")
    assert len(five.axes) == 5 and five.axes[0].get_subplotspec().get_geometry()[:2] == (2, 3)
    assert ef.plot_svd_projections(panels, tmp_path / "svd.png", "t", max_points=20).is_file()


# ---- a table's figures (repdegen.reproduce.results.table_figures.render_embedding_figures) ------------------------


def _record(tmp_path, h, label, group, seed, scale=1.0):
    run = tmp_path / "runs" / h
    run.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(50, 6, generator=g) * scale + 1.0
    torch.save({"model": {"embedding.weight": w}}, run / "best.pt")
    torch.save(torch.arange(50, 0, -1), run / "vocab_counts.pt")
    sv = torch.linalg.svdvals(w).tolist()
    hist = [{"stage": "train", "updates": 10 * e, "valid_ppl": 100.0 / e + seed, "isotropy": 0.5 + 0.1 * seed / e,
             "cos_rare_frequent": -0.1 * seed} for e in (1, 2, 3)]
    return {"config_hash": h, "config": {"model": {"tie_weights": True}}, "history": hist,
            "metrics": {"final": {"singular_values": sv, "weights": "best.pt"}},
            "_row_label": label, "_row_group": group, "_seed": seed, "_first_seed": seed == 1}


def test_render_embedding_figures_keys_rows_by_group_and_label(tmp_path, monkeypatch):
    from repdegen.reproduce.results.table_figures import render_embedding_figures

    records = [_record(tmp_path, f"{g}-{label}-{s}", label, g, s, scale)
               for g, label, scale in (("A", "MLE", 1.0), ("A", "CosReg", 2.0), ("B", "MLE", 3.0))
               for s in (1, 2)]
    out = tmp_path / "out"
    out.mkdir()
    (out / "svd_1.png").write_bytes(b"stale")
    calls = {}
    for fn in ("plot_singular_values", "plot_metric_over_training", "plot_svd_projections"):
        real = getattr(ef, fn)

        def spy(*args, _real=real, _fn=fn, **kw):
            calls[_fn] = (args, kw)
            return _real(*args, **kw)

        monkeypatch.setattr(ef, fn, spy)
    written = render_embedding_figures(records, tmp_path / "runs", out, "Gao et al. (2019), Table 2, scale lite")
    assert list(written) == ["singular_values.png", "geometry_over_training.png", "svd_projection.png"]
    assert all((out / f).is_file() for f in written) and not (out / "svd_1.png").exists()
    names = ["A / MLE", "A / CosReg", "B / MLE"]
    spectra, _, _ = calls["plot_singular_values"][0]
    assert list(spectra) == names and all(isinstance(s, Seeds) and len(s) == 2 for s in spectra.values())
    assert spectra["B / MLE"][0] == records[4]["metrics"]["final"]["singular_values"]
    colors = calls["plot_singular_values"][1]["colors"]
    assert len({to_rgba(c) for c in colors.values()}) == 3
    histories, keys = calls["plot_metric_over_training"][0][:2]
    kw = calls["plot_metric_over_training"][1]
    assert list(histories) == names and keys == ["isotropy", "cos_rare_frequent"]
    assert kw["labels"] == {"isotropy": "I(W)", "cos_rare_frequent": "cos(rare, freq)"} and kw["colors"] == colors
    panels = calls["plot_svd_projections"][0][0]
    assert list(panels) == [f"{n} — seed 1" for n in names]
    # its own weights' projection (numpy's SVD here, signs as the figure fixes them), not those of "A / MLE",
    # drawn from the projection kept beside the run (computed once; the paper archive copies the same file)
    saved = torch.load(tmp_path / "runs" / "B-MLE-1" / "best.pt")["model"]["embedding.weight"].double().numpy()
    vt = np.linalg.svd(saved, full_matrices=False)[2][:2]
    expected = saved @ vt.T
    expected *= np.where(expected.mean(0) >= 0, 1.0, -1.0)
    drawn = panels["B / MLE — seed 1"][0]
    assert isinstance(drawn, ef.Projected) and (tmp_path / "runs" / "B-MLE-1" / "svd_projection.npz").is_file()
    np.testing.assert_allclose(drawn.coords, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    assert "B / MLE (seed 1)" in written["svd_projection.png"]
    assert "line: mean over seeds 1, 2; band: min–max" in written["singular_values.png"]


def test_render_embedding_figures_falls_back_to_a_seed_whose_weights_are_here(tmp_path):
    from repdegen.reproduce.results.table_figures import render_embedding_figures

    records = [_record(tmp_path, f"A{s}", "MLE", None, s) for s in (1, 2)]
    (tmp_path / "runs" / "A1" / "best.pt").unlink()
    written = render_embedding_figures(records, tmp_path / "runs", tmp_path / "out", "t")
    assert "MLE (seed 2)" in written["svd_projection.png"]


def test_a_long_legend_grows_the_figure_not_squeezes_the_panel(tmp_path):
    """Twelve runs in one panel (``repdegen.reproduce.status --plot`` of a ledger): the legend's rows are added to the
    figure's height, so the panel keeps (within a line's rounding) the height it has with one run."""
    def history(start):
        return [{"stage": "train", "epoch": e, "valid_ppl": start / e, "train_ppl": start / e / 2} for e in (1, 2, 3)]

    def panel_inches(n):
        fig = figure_validation_curves([(f"run number {i} [abcdef12]", None, history(300 + i)) for i in range(n)],
                                       "t", show_train=True)
        fig.savefig(tmp_path / f"{n}.png")  # the constrained layout is done at drawing
        height = fig.axes[0].get_position().height * fig.get_figheight()
        plt.close(fig)
        return height

    one, twelve = panel_inches(1), panel_inches(12)
    assert twelve == pytest.approx(one, abs=0.25) and twelve > 2.5


def test_an_al_rows_target_entropy_gets_its_own_panel(tmp_path, monkeypatch):
    """Rows that record AL's per-epoch target entropy add a panel (registry label) to geometry_over_training.png."""
    from repdegen.reproduce.results.table_figures import render_embedding_figures

    records = [_record(tmp_path, f"h{label}", label, None, 1) for label in ("RE", "REAL")]
    for h in records[1]["history"]:
        h["al_target_entropy"] = 9.2
    calls = {}
    real = ef.plot_metric_over_training

    def spy(*args, **kw):
        calls["args"], calls["kw"] = args, kw
        return real(*args, **kw)

    monkeypatch.setattr(ef, "plot_metric_over_training", spy)
    out = tmp_path / "out"
    out.mkdir()
    written = render_embedding_figures(records, tmp_path / "runs", out, "t")
    assert calls["args"][1] == ["isotropy", "cos_rare_frequent", "al_target_entropy"]
    assert calls["kw"]["labels"]["al_target_entropy"] == "H(y~) of AL's target (nats)"
    assert "H(y~) of AL's target (nats)" in written["geometry_over_training.png"]
