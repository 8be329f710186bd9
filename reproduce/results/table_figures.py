"""A table's embedding figures: the singular-value spectra and the 2-D projections of its cells' output embeddings
(Gao et al. 2019 Fig. 1, Yu et al. 2022 Fig. 2), from the records and checkpoints in the ledger."""

from __future__ import annotations

import math
from pathlib import Path

from omegaconf import OmegaConf
from repdegen.reproduce.runs.archive import (
    ensure_projection,
    keep_figure_aside,
    read_projection,
    svd_caption,
)


def render_embedding_figures(records: list[dict], runs_dir: Path, out: Path, title: str) -> dict[str, str]:
    """The papers' embedding figures for the cells of a table, next to it; {file name: caption} of those written.

    A row is keyed by (group, label) (two rows "MLE" of different groups are two rows), named "group / label" in
    the figures when the rows shown are of more than one group, and has one colour in every figure. A row run with
    several seeds is drawn as the mean over its seeds with a min–max band (``records``: every seed's record).

    * ``singular_values.png``: normalised singular values of each row's final output embedding (Gao Fig. 2(b),
      Yu Fig. 3(c));
    * ``geometry_over_training.png``: I(W), I(W) of the rare and frequent groups and the rare-frequent mean cosine
      at every evaluation (Yu Fig. 2), and AL's target entropy where rows record it, one panel each in a grid;
    * the traces of an objective, e.g. ``rare_group_size.png``: AGG's rare group size over the first updates (Yu
      Fig. 4);
    * ``svd_projection.png``: each row's output embedding (its lowest seed whose weights, or whose projection kept
      with its record, are here) projected on its top-2 singular directions, coloured by frequency group, one panel
      per row on the same axis limits (Gao Figs 1(a), 2(a); Yu Figs 1, 3). The per-row ``svd_<k>.png`` of earlier
      renderings are removed; one that drew a row this one cannot is kept aside as drawn
      (:func:`repdegen.reproduce.runs.archive.keep_figure_aside`).
    """
    from repdegen.analysis.embedding_figures import plot_metric_over_training, plot_singular_values, plot_svd_projections
    from repdegen.analysis.figures import Seeds, row_colors, row_name
    from repdegen.losses import OBJECTIVES
    from repdegen.reproduce.results.metrics import label as metric_label

    rows: dict[tuple[str | None, str], list[dict]] = {}
    for r in records:
        rows.setdefault((r.get("_row_group"), r["_row_label"]), []).append(r)
    for seeds in rows.values():
        seeds.sort(key=lambda r: (r.get("_seed") is None, r.get("_seed") or 0))
    with_group = len({g for g, _ in rows}) > 1
    name = {key: row_name(key[0], key[1], with_group) for key in rows}
    colors = {name[key]: c for key, c in row_colors(list(rows)).items()}
    groups = [g for g, _ in rows if g]
    if groups and not with_group:  # one group: the title says which
        title = f"{title}, {groups[0]}"
    seeds = sorted({r["_seed"] for r in records if r.get("_seed") is not None})
    over = f" (line: mean over seeds {', '.join(map(str, seeds))}; band: min–max)" if len(seeds) > 1 else ""
    written: dict[str, str] = {}
    spectra = {name[key]: Seeds(r["metrics"]["final"]["singular_values"] for r in rs
                                if r["metrics"].get("final", {}).get("singular_values"))
               for key, rs in rows.items()}
    spectra = {n: s for n, s in spectra.items() if s}
    if spectra:
        plot_singular_values(spectra, out / "singular_values.png", f"Singular values of the output embedding W — {title}",
                             colors=colors)
        written["singular_values.png"] = ("Normalised singular values of each row's output embedding (Gao Fig. 2b, Yu "
                                          f"Fig. 3c){over}")
    keys = [k for k in ("isotropy", "isotropy_rare", "isotropy_frequent", "cos_rare_frequent", "al_target_entropy",
                        "subspace_distance")
            if any(k in h for r in records for h in r.get("history", []))]
    if keys:
        histories = {name[key]: Seeds([dict(h, step=h.get("updates", i + 1)) for i, h in enumerate(r.get("history", []))]
                                      for r in rs) for key, rs in rows.items()}
        plot_metric_over_training(histories, keys, out / "geometry_over_training.png",
                                  f"Embedding geometry during training — {title}", x_key="step", colors=colors,
                                  labels={k: metric_label(k) for k in keys}, x_label="training updates")
        written["geometry_over_training.png"] = ("Embedding geometry of each row at every evaluation: "
                                                 f"{', '.join(metric_label(k) for k in keys)} (Yu Fig. 2){over}")
    for trace, (filename, what) in sorted({k: v for cls in OBJECTIVES.classes() for k, v in cls.traces.items()}.items()):
        traces = {name[key]: Seeds([{"step": s, trace: v} for s, v in r["trace"][trace]] for r in rs
                                   if r.get("trace", {}).get(trace))
                  for key, rs in rows.items()}
        traces = {n: t for n, t in traces.items() if t}
        if traces:
            plot_metric_over_training(traces, trace, out / filename, f"{what} over the first updates — {title}",
                                      x_key="step", colors=colors, labels={trace: what}, x_label="training updates")
            written[filename] = f"{what} over the first updates of each row that records it (Yu Fig. 4){over}"
    panels, shown = {}, []
    for key, rs in rows.items():
        for r in rs:  # the lowest seed whose weights, or whose kept projection, are on this machine
            # the projection kept beside the run (computed once from its weights: the archive copies the same file)
            kept = ensure_projection(runs_dir / r["config_hash"], r)
            kept = read_projection(kept, r.get("started")) if kept is not None else None
            found = kept[:2] if kept is not None else None
            if found is None:
                continue  # neither is on this machine: the table still renders
            seed = f" — seed {r['_seed']}" if r.get("_seed") is not None else ""
            panels[f"{name[key]}{seed}"] = found
            shown.append(name[key] + (f" (seed {r['_seed']})" if r.get("_seed") is not None else ""))
            break
    keep_figure_aside(out, shown)  # the figure there drew a row this one cannot: kept as it was drawn
    if panels:
        plot_svd_projections(panels, out / "svd_projection.png",
                             f"Output embedding on its top-2 singular directions, one seed per row — {title}",
                             max_points=20000)
        for old in out.glob("svd_*.png"):  # the per-row files of earlier renderings (svd_1.png, ...): replaced
            if old.stem[4:].isdigit():
                old.unlink()
        written["svd_projection.png"] = svd_caption(shown)
    return written


def render_sweep_figures(table, rows, out: Path, title: str) -> dict[str, str]:
    """A sweep's figures (a table with ``swept`` keys, its rows generated: repdegen.reproduce.runs.sweeps): per column,
    ``sweep_<metric>.png``, the metric against the first numeric swept key (mean ± sd over each row's runs), one
    curve per value of the other swept keys, rows where that key is not set drawn as horizontal lines (e.g. an MLE
    baseline); a categorical key at positions 0, 1, 2... {file name: caption} of those written (the shape of Yu et al.
    2022 Fig. 5)."""
    from repdegen.analysis.sweep_figures import SweepSeries, plot_sweep_metric
    from repdegen.reproduce.results.metrics import label as metric_label
    from repdegen.reproduce.runs.sweeps import _norm, show

    values = [{k: (tuple(v) if isinstance(v, list) else v)
               for k, v in OmegaConf.to_container(r.sweep_values, resolve=True).items()} for r in table.rows]
    done = [i for i, r in enumerate(rows) if r.extra.get("n_done")]
    if not done:
        return {}
    keys = list(table.swept)

    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    numeric = [k for k in keys if all(number(values[i][k]) or values[i][k] is None for i in done)
               and any(number(values[i][k]) for i in done)]
    x_key = numeric[0] if numeric else (keys[0] if keys else None)
    others = [k for k in keys if k != x_key]
    position = None
    if x_key is not None and x_key not in numeric:  # a categorical key (e.g. objective=mle,agg)
        position = {n: float(k) for k, n in enumerate(sorted({show(_norm(values[i][x_key])) for i in done}))}
    counts = sorted({rows[i].extra["n_done"] for i in done})
    what = ("one run per value" if counts == [1] else
            f"mean ± sd over runs (n = {counts[0]}{f'-{counts[-1]}' if len(counts) > 1 else ''})")
    written = {}
    for m in table.columns:
        series: dict[str, SweepSeries] = {}
        for i in done:
            name = ", ".join(f"{k}={show(_norm(values[i][k]))}" for k in others)
            s = series.setdefault(name, SweepSeries(label=name))
            mean, sd = rows[i].ours.get(m), (rows[i].extra.get("sd") or {}).get(m)
            if mean is None:
                continue
            x = None if x_key is None else values[i][x_key]
            if x is None and x_key is not None:
                s.baseline = (mean, sd)
                continue
            s.x.append(0.0 if x is None else (position[show(_norm(x))] if position else float(x)))
            s.mean.append(mean)
            s.std.append(sd)
        name = "sweep_" + "".join(c if c.isalnum() or c in "._-" else "_" for c in m) + ".png"
        plot_sweep_metric(list(series.values()), out / name, metric_label(m), x_key or "all runs", f"{title}: {what}",
                          categories={v: k for k, v in position.items()} if position else None)
        written[name] = f"{metric_label(m)} against {x_key or 'the runs'} ({what})"
    return written


def _select(node, dotted: str):
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def panel_points(table, rows, records: list[dict]) -> list[dict]:
    """The numbers a figure table's panels draw (``table.panels``): per panel and curve, each row's x (its cells'
    config value of ``panel.x``), the mean, sd and per-seed values of ``panel.metric`` and the paper's number; the
    random-subspace level sqrt(1 - k / |V|) (k: the number of singular values of the final output embedding, |V|:
    the vocabulary) where asked for."""
    from repdegen.reproduce.results.claims import resolve_row

    config_of: dict[int, dict] = {}  # a row's config (its seeds differ only in the seed)
    for r in records:
        for i in r.get("_rows", []):
            config_of.setdefault(i, r.get("config") or {})
    level = None
    for r in records:
        k, n = len(r["metrics"].get("final", {}).get("singular_values") or []), (r.get("corpus") or {}).get("vocab_size")
        if k and n:
            level = math.sqrt(1 - k / n)
            break
    out = []
    for panel in table.panels:
        curves = []
        for curve in panel.curves:
            points = []
            for ref in curve.rows:
                i = resolve_row(table, ref, f"panel {panel.title!r}")
                x = _select(config_of.get(i), panel.x)
                seeds = {s: (v or {}).get(panel.metric) for s, v in rows[i].extra.get("seeds", {}).items()}
                seeds = {s: v for s, v in seeds.items() if v is not None}
                if x is None or not seeds:
                    continue  # not run at this scale, or no complete seed yet
                points.append({"row": ref, "x": float(x), "mean": rows[i].ours.get(panel.metric),
                               "sd": (rows[i].extra.get("sd") or {}).get(panel.metric), "n": len(seeds),
                               "seeds": {str(s): v for s, v in seeds.items()}, "paper": rows[i].paper.get(panel.metric)})
            seen = {p["row"] for c in curves if c["drawn"] for p in c["points"]}
            # a curve whose every point another curve draws already (a shared row, the other rows not run) is not drawn
            curves.append({"label": curve.label, "points": sorted(points, key=lambda p: p["x"]),
                           "drawn": bool(points) and not {p["row"] for p in points} <= seen})
        out.append({"title": panel.title, "x": panel.x, "metric": panel.metric, "curves": curves,
                    "random_level": level if panel.random_level else None})
    return out


def render_panel_figures(table, rows, records: list[dict], out: Path, title: str) -> dict[str, str]:
    """A figure table's panels (``table.panels``) as ``figure.png``, their numbers as ``figure.json``
    (:func:`panel_points`); {file name: caption} of the figure, empty when no panel has a point."""
    import matplotlib.pyplot as plt
    from repdegen.analysis.embedding_figures import _save
    from repdegen.core.files import atomic_write_json
    from repdegen.reproduce.results.metrics import label as metric_label

    panels = panel_points(table, rows, records)
    if not any(p["points"] for panel in panels for p in panel["curves"]):
        return {}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for c, curve in enumerate(panel["curves"]):
            pts, color = curve["points"], f"C{c % 10}"
            if not curve["drawn"]:
                continue
            xs = [p["x"] for p in pts]
            ax.errorbar(xs, [p["mean"] for p in pts], yerr=[p["sd"] or 0.0 for p in pts], color=color, marker="o",
                        ms=4, capsize=3, lw=1.4, label=f"{curve['label']} (mean ± sd)")
            for p in pts:
                ax.scatter([p["x"]] * p["n"], list(p["seeds"].values()), s=9, color=color, alpha=0.35, lw=0)
        papers = {(p["x"], p["paper"]) for curve in panel["curves"] for p in curve["points"] if p["paper"] is not None}
        if papers:
            ax.scatter(*zip(*sorted(papers)), marker="D", s=36, facecolors="none", edgecolors="k", label="paper", zorder=5)
        if panel["random_level"] is not None:
            ax.axhline(panel["random_level"], color="0.4", ls=":", lw=1,
                       label=f"random subspaces ({panel['random_level']:.5f})")
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xlabel(panel["x"])
        ax.set_ylabel(metric_label(panel["metric"]))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    _save(fig, out / "figure.png")
    atomic_write_json(out / "figure.json", {"panels": panels})
    n = sorted({p["n"] for panel in panels for curve in panel["curves"] for p in curve["points"]})
    runs = f"{n[0]}" if len(n) == 1 else f"{n[0]}–{n[-1]}"
    return {"figure.png": f"The figure's panels: mean ± sd over {runs} run(s) a point, each run a dot; ◇ the paper's "
                          f"number; dotted, two random subspaces (numbers: figure.json)"}
