"""A paper-scale rendering keeps each complete cell's SVD projection beside its record (records/<hash>/
svd_projection.npz), so a row restored into a lost ledger still draws its panel; and a figure that drew a row no
rendering can draw again (its weights lost with a work tree before the projection was kept) is kept aside as drawn
(reproduce/runs/archive.py). Found 2026-11-29: each lane restart after a lost work tree dropped the SVD panels of the
restored rows and would have overwritten the committed figure with the rows trained since."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import repdegen.analysis.embedding_figures as ef
import torch
from repdegen.reproduce.results.table_figures import render_embedding_figures
from repdegen.reproduce.runs.archive import (
    PROJECTION_FILE,
    archive_records,
    keep_figure_aside,
    read_projection,
    restore_records,
    svd_caption,
)


def brute_projection(w: torch.Tensor) -> np.ndarray:
    """W on its top-2 right singular vectors by numpy's SVD, each axis signed so its mean coordinate is >= 0."""
    a = w.double().numpy()
    _, _, vt = np.linalg.svd(a, full_matrices=False)
    c = a @ vt[:2].T
    return c * np.where(c.mean(0) < 0, -1.0, 1.0)


def trained(runs: Path, h: str, label: str, started: str = "2026-11-29T10:00:00", seed: int = 0) -> tuple[dict, torch.Tensor]:
    run = runs / h
    run.mkdir(parents=True)
    w = torch.randn(40, 5, generator=torch.Generator().manual_seed(seed)) + 1.0
    torch.save({"model": {"embedding.weight": w}}, run / "best.pt")
    torch.save(torch.arange(40, 0, -1), run / "vocab_counts.pt")
    rec = {"config_hash": h, "status": "complete", "started": started, "config": {"model": {"tie_weights": True}},
           "metrics": {"final": {"valid_ppl": 90.0, "weights": "best.pt"}}, "history": []}
    return dict(rec, _row_label=label, _row_group=None, _seed=None), w


def spy_panels(monkeypatch) -> list:
    calls = []
    real = ef.plot_svd_projections

    def spy(panels, *args, **kw):
        calls.append(panels)
        return real(panels, *args, **kw)

    monkeypatch.setattr(ef, "plot_svd_projections", spy)
    return calls


def test_a_restored_row_draws_its_panel_from_the_kept_projection(tmp_path, monkeypatch):
    runs, tables = tmp_path / "runs", tmp_path / "tables"
    out = tables / "t1" / "paper"
    rec, w = trained(runs, "aaaa", "MLE")
    written = archive_records(out, [rec], runs)
    kept = out / "records" / "aaaa" / PROJECTION_FILE
    assert kept in written and archive_records(out, [rec], runs) == []  # the same again: nothing rewritten
    coords, counts, started = read_projection(kept, rec["started"])
    np.testing.assert_allclose(coords.coords, brute_projection(w), rtol=1e-5, atol=1e-5)  # float32 kept
    assert counts.tolist() == list(range(40, 0, -1)) and started == rec["started"]
    assert read_projection(kept, "2026-11-30T00:00:00") is None  # another run's projection is not this one's

    fresh = tmp_path / "fresh"  # a lost work tree: a new ledger, no weights
    said = []
    cell = SimpleNamespace(config_hash="aaaa", label="MLE")
    assert restore_records(tables, fresh, [cell], log=said.append) == ["aaaa"]
    assert "weights are not on this machine" not in said[0]
    assert not (fresh / "aaaa" / "best.pt").exists()
    calls = spy_panels(monkeypatch)
    figures = render_embedding_figures([rec], fresh, tmp_path / "render", "t")
    assert figures["svd_projection.png"] == svd_caption(["MLE"])
    np.testing.assert_allclose(ef.svd_projection(calls[0]["MLE"][0]), brute_projection(w), rtol=1e-5, atol=1e-5)


def test_a_cell_trained_again_keeps_the_earlier_runs_projection_beside_it(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "t1" / "paper"
    first, _ = trained(runs / "1", "aaaa", "MLE", started="2026-11-27T10:00:00", seed=1)
    archive_records(out, [first], runs / "1")
    again, w = trained(runs / "2", "aaaa", "MLE", started="2026-11-29T08:00:00", seed=2)
    archive_records(out, [again], runs / "2")
    folder = out / "records" / "aaaa"
    np.testing.assert_allclose(read_projection(folder / PROJECTION_FILE, again["started"])[0].coords, brute_projection(w),
                               rtol=1e-5, atol=1e-5)
    assert read_projection(folder / "svd_projection.2026-11-27T100000.npz", first["started"]) is not None


def test_an_unreadable_kept_projection_is_a_warning_and_the_table_renders_without_it(tmp_path, capsys):
    runs, tables = tmp_path / "runs", tmp_path / "tables"
    rec, _ = trained(runs, "aaaa", "MLE")
    archive_records(tables / "t1" / "paper", [rec], runs)
    kept = tables / "t1" / "paper" / "records" / "aaaa" / PROJECTION_FILE
    kept.write_bytes(b"not an npz")
    restore_records(tables, tmp_path / "fresh", [SimpleNamespace(config_hash="aaaa", label="MLE")], log=lambda _: None)
    assert render_embedding_figures([rec], tmp_path / "fresh", tmp_path / "render", "t") == {}
    err = capsys.readouterr().err
    assert f"{tmp_path / 'fresh' / 'aaaa' / PROJECTION_FILE}: not a readable SVD projection" in err and "git checkout" in err


def rendering(out: Path, shown: list[str] | None, png: bytes = b"\x89PNG drawn before") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "svd_projection.png").write_bytes(png)
    figures = {"curves": "Validation PPL"} | ({"svd_projection": svd_caption(shown)} if shown is not None else {})
    (out / "cells.json").write_text(json.dumps({"cells": [], "figures": figures}))


def test_a_figure_that_drew_a_row_this_rendering_cannot_is_kept_aside_as_drawn(tmp_path, capsys):
    runs, out = tmp_path / "runs", tmp_path / "t1" / "paper"
    rendering(out, ["AL only", "MLE"])  # AL only's weights were lost with a work tree, before projections were kept
    rec, _ = trained(runs, "bbbb", "MLE")
    figures = render_embedding_figures([rec], runs, out, "t")
    said = [x for x in capsys.readouterr().out.splitlines() if "svd_projection.png drew" in x]
    (folder,) = (out / "records").glob("figures-*")
    assert (folder / "svd_projection.png").read_bytes() == b"\x89PNG drawn before"  # moved, as it was drawn
    assert json.loads((folder / "captions.json").read_text()) == {"svd_projection": svd_caption(["AL only", "MLE"])}
    assert (out / "svd_projection.png").read_bytes().startswith(b"\x89PNG") and figures["svd_projection.png"] == \
        svd_caption(["MLE"])
    assert len(said) == 1 and "drew AL only, which this rendering cannot draw" in said[0]
    # the next rendering draws what the last one drew: nothing more is kept aside
    (out / "cells.json").write_text(json.dumps({"cells": [], "figures": figures}))
    render_embedding_figures([rec], runs, out, "t")
    assert len(list((out / "records").glob("figures-*"))) == 1 and "drew" not in capsys.readouterr().out


@pytest.mark.parametrize("case", ["same rows", "no caption", "no cells.json", "unreadable cells.json", "more rows"])
def test_a_figure_that_loses_no_row_is_not_kept_aside(case, tmp_path):
    out = tmp_path / "t1" / "paper"
    rendering(out, None if case == "no caption" else ["MLE"])
    if case == "no cells.json":
        (out / "cells.json").unlink()
    if case == "unreadable cells.json":
        (out / "cells.json").write_text("{")
    shown = ["MLE", "AGG"] if case == "more rows" else ["MLE"]
    assert keep_figure_aside(out, shown, log=lambda _: pytest.fail("nothing is lost")) is None
    assert (out / "svd_projection.png").is_file() and not (out / "records").exists()


def test_a_second_figure_kept_from_the_same_commit_does_not_overwrite_the_first(tmp_path):
    out = tmp_path / "t1" / "paper"
    rendering(out, ["A", "B"], b"\x89PNG first")
    first = keep_figure_aside(out, ["B"], log=lambda _: None)
    rendering(out, ["B", "C"], b"\x89PNG second")
    second = keep_figure_aside(out, ["B"], log=lambda _: None)
    assert first != second and (first / "svd_projection.png").read_bytes() == b"\x89PNG first"
    assert (second / "svd_projection.png").read_bytes() == b"\x89PNG second"


def test_projected_coordinates_are_drawn_as_they_are():
    c = np.arange(8.0).reshape(4, 2)
    assert np.array_equal(ef.svd_projection(ef.Projected(c)), c)
    with pytest.raises(ValueError, match="cannot be centred"):
        ef.svd_projection(ef.Projected(c), center=True)
    with pytest.raises(ValueError, match=r"expected coordinates of shape \(N, 2\), got \(4, 3\)"):
        ef.Projected(np.zeros((4, 3)))
