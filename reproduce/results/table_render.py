"""A table's rendering from the ledger: each cell's record collected into its row (:func:`collect_rows`: the
cell's metrics, its seeds' mean, the gains over the baseline), the claims judged, and ``<paths.tables_dir>/<table>/
<scale>/`` written (:func:`render`: ``table.md``, ``table.csv``, ``table.tex``, ``cells.json``, ``claims.json`` and
the figures) with each cell's provenance; :func:`render_latest` re-renders only when a record changed."""

from __future__ import annotations

import datetime as dt
import math
import os
import statistics
from pathlib import Path

from omegaconf import DictConfig
from repdegen.analysis.figures import plot_validation_curves
from repdegen.core.files import atomic_write_bytes, atomic_write_json
from repdegen.core.provenance import command_line, hardware_summary
from repdegen.reproduce.results.metrics import from_source
from repdegen.reproduce.results.provenance import (
    cell_provenance,
    complete_hashes,
    records_git,
    training_command,
    unchanged_generated,
)
from repdegen.reproduce.results.render import RenderedRow, to_csv, to_latex, to_markdown
from repdegen.reproduce.results.table_figures import (
    render_embedding_figures,
    render_panel_figures,
    render_sweep_figures,
)
from repdegen.reproduce.runs.archive import (
    ARCHIVE_DIR,
    ARCHIVED_SCALES,
    archive_records,
    archived_records,
)
from repdegen.reproduce.runs.cells import Cell, seeds_at
from repdegen.reproduce.runs.ledger import STATUS_COMPLETE, Ledger
from repdegen.reproduce.runs.status import _fmt_seconds
from repdegen.reproduce.runs.trained import analysis_values

SCALE_NOTES = {
    "paper": "the papers' hyperparameters",
    "lite": "the claims on a 2-core CPU in <= 60 min a table: the rows the claims need, small budgets, fixed seeds",
    "smoke": "minutes on a CPU: widths x0.1, 1 epoch on 30k tokens (3k sentence pairs), 5k evaluation tokens (100 pairs); "
             "checks plumbing, not numbers",
}


def run_label_of(rows, indices: list[int]) -> str:
    """A run shared by several rows is named by what their labels have in common
    ("AWD-LSTM (w.o. finetune)", "AWD-LSTM + cache" -> "AWD-LSTM")."""
    labels = [rows[i].label for i in indices]
    if len(labels) == 1:
        return labels[0]
    common = os.path.commonprefix(labels).rstrip(" (+-")
    return common or labels[0]


def _cell_values(record: dict, stage: str) -> dict[str, float | None]:
    """A complete cell's numbers at a row's stage: every metric the stage recorded, and ``params``."""
    from repdegen.reproduce.results.metrics import derived

    recorded = record["metrics"].get(stage, {})
    values = {k: v for k, v in recorded.items() if isinstance(v, (int, float))}
    values["params"] = record["parameters"]["total"] / 1e6
    for k, v in derived(record, recorded).items():  # the registry's metrics derived from the record
        values.setdefault(k, v)
    return values


def _row_status(statuses: list[str]) -> str:
    if all(s == STATUS_COMPLETE for s in statuses):
        return STATUS_COMPLETE
    for worst in ("failed", "running", "interrupted", "preempted", "missing"):
        if worst in statuses:
            return worst
    return next(s for s in statuses if s != STATUS_COMPLETE)


def collect_rows(app: DictConfig, cells: list[Cell], ledger: Ledger,
                 run_status: dict[str, str] | None = None) -> tuple[list[RenderedRow], list[dict]]:
    """One rendered row per table row (the mean over its seeds, with their sd and per-seed values in
    ``extra["seeds"]``), and the ledger records of the complete cells (once each)."""
    by_row: dict[int, list[Cell]] = {}
    for c in cells:
        for i in c.rows:
            by_row.setdefault(i, []).append(c)
    rows, records, seen = [], [], set()
    scale = app.scale.name
    for i, row in enumerate(app.table.rows):
        paper = {k: (float(v) if v is not None else None) for k, v in (row.paper or {}).items()}
        row_cells = by_row.get(i)
        if not row_cells:
            status = "paper-only" if row.experiment is None else "not-at-scale"
            rows.append(RenderedRow(row.label, row.group, paper, {}, status, row.note, extra={"scale": scale}))
            continue
        per_seed: dict = {}
        seed_status: dict = {}
        for cell in row_cells:
            record = ledger.load(cell.config_hash)
            status = "missing" if record is None else record.get("status", "missing")
            if record is None and (run_status or {}).get(cell.config_hash) == "failed":
                status = "failed"
            seed_status[cell.seed] = status
            per_seed[cell.seed] = None
            if record is not None and status == STATUS_COMPLETE:
                per_seed[cell.seed] = _cell_values(record, row.stage)
                analysed, when = analysis_values(ledger.run_dir(cell.config_hash), app.table.get("analyses"))
                per_seed[cell.seed].update(analysed)
                if cell.config_hash not in seen:
                    seen.add(cell.config_hash)
                    label = run_label_of(app.table.rows, cell.rows)
                    records.append(dict(record, _row_label=label, _row_group=row.group, _seed=cell.seed,
                                        _first_seed=cell.seed == row_cells[0].seed, _analysed=when,
                                        _rows=list(cell.rows)))
        done = [v for v in per_seed.values() if v is not None]
        ours: dict[str, float | None] = {}
        sd: dict[str, float | None] = {}
        for col in app.table.columns:
            vals = [v[col] for v in done if v.get(col) is not None and math.isfinite(v[col])]
            ours[col] = statistics.fmean(vals) if vals else None
            sd[col] = statistics.stdev(vals) if len(vals) > 1 else None
        hashes = "+".join(c.config_hash for c in row_cells)
        rows.append(RenderedRow(row.label, row.group, paper, ours, _row_status(list(seed_status.values())), row.note, hashes,
                                extra={"seeds": per_seed, "statuses": seed_status, "sd": sd,
                                       "n_seeds": len(row_cells), "n_done": len(done), "scale": scale}))
    return rows, records


def cell_index(rows: list[RenderedRow], runs_dir: str | Path) -> list[dict]:
    """cells.json's ``cells``: each seed of each row with its own status (a row's seeds can be complete, running
    and not run at once), hash and run directory; a row without cells once, with the row's status."""
    out = []
    for r in rows:
        statuses = r.extra.get("statuses", {})
        for seed, h in zip(r.extra.get("seeds", {}), (r.config_hash or "").split("+")):
            if h:
                status = STATUS_COMPLETE if r.extra["seeds"][seed] is not None else statuses.get(seed, r.status)
                out.append({"label": r.label, "seed": seed, "status": status, "config_hash": h,
                            "run_dir": str(Path(runs_dir) / h)})
        if not r.config_hash:
            out.append({"label": r.label, "status": r.status, "config_hash": None, "run_dir": None})
    return out


def attach_baselines(table, rows: list[RenderedRow]) -> None:
    """Each run row's baseline row (``extra["baseline"]``: its index), for the smoke/lite view."""
    from repdegen.reproduce.results.claims import resolve_row

    for i, row in enumerate(table.rows):
        ref = row.get("baseline") or table.get("baseline")
        if ref and row.experiment:
            j = resolve_row(table, ref, f"the baseline of row {row.label!r}", row.get("group"))
            if j != i:
                rows[i].extra["baseline"] = j


def claim_inputs(table, rows: list[RenderedRow]) -> tuple[dict[int, dict], dict[int, dict]]:
    """(ours, paper) for repdegen.reproduce.results.claims.evaluate_claims: ours[row][seed] = metrics or None."""
    ours = {i: r.extra.get("seeds", {}) for i, r in enumerate(rows)}
    paper = {i: dict(r.paper) for i, r in enumerate(rows)}
    add_gains(rows, ours, paper)
    return ours, paper


GAIN_METRICS = ("valid_ppl", "test_ppl")


def add_gains(rows: list[RenderedRow], ours: dict[int, dict], paper: dict[int, dict]) -> None:
    """``<metric>_gain`` = 1 − metric(row) / metric(its baseline row), per seed (ours) and on the paper's numbers; 0 for
    the baseline row itself (Inan et al. 2017: "most of the improvement" from RE alone)."""
    def gain(a, b):
        ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (a, b)) and b
        return 1.0 - a / b if ok else None

    for i, r in enumerate(rows):
        j = r.extra.get("baseline", i if r.extra.get("seeds") else None)
        if j is None:
            continue
        for m in GAIN_METRICS:
            p = gain(paper[i].get(m), paper[j].get(m))
            if p is not None:
                paper[i][f"{m}_gain"] = p
            for seed, values in ours.get(i, {}).items():
                base = ours.get(j, {}).get(seed)
                if values is not None and base is not None:
                    g = gain(values.get(m), base.get(m))
                    values[f"{m}_gain"] = float("nan") if g is None else g


def paper_short(source: str) -> str:
    """"Inan, Khosravi & Socher (2017), Tying word vectors ..., Table 1" -> "Inan, Khosravi & Socher (2017), Table 1"."""
    import re

    m = re.match(r"^(.*?\(\d{4}\))", source)
    table = re.search(r"(Table\s+\S+)\s*$", source)
    return ", ".join(x for x in (m.group(1) if m else source, table.group(1) if table else "") if x)


def scale_differences(records: list[dict]) -> str:
    """What the cells of a table ran, in a line per distinct setting (corpus, vocabulary, model, budget),
    read from their records: the header of a smoke/lite table says how it differs from the paper."""
    described = []
    for r in records:
        cfg, corpus = r.get("config", {}), r.get("corpus", {}) or {}
        d, m, t = cfg.get("dataset", {}), cfg.get("model", {}), cfg.get("trainer", {})
        parts = [str(d.get("name", "?"))]
        used, total = (corpus.get("used_tokens") or {}).get("train"), (corpus.get("tokens") or {}).get("train")
        if used and total and used < total:
            parts.append(f"the first {used:,} of {total:,} training tokens")
        elif d.get("train_pairs"):
            parts.append(f"the first {d['train_pairs']:,} training pairs")
        if corpus.get("vocab_size"):
            parts.append(f"vocabulary {corpus['vocab_size']:,}")
        width = next((f"{k} {m[k]}" for k in ("hidden_size", "d_model", "embedding_size") if m.get(k)), "")
        parts.append(f"model {m.get('name', '?')}" + (f" ({width})" if width else ""))
        budget = f"{t.get('max_epochs')} epochs" + (f", at most {t['max_updates']:,} updates" if t.get("max_updates") else "")
        parts.append(budget)
        text = ", ".join(parts)
        if text not in described:
            described.append(text)
    return "; ".join(described)


def judge_registration(app: DictConfig, verdicts: list, rows: list[RenderedRow], records: list[dict],
                       ledger: Ledger | None = None) -> None:
    """Mark each verdict that is not a pre-registered one (``Verdict.registration``, rendered ⚠): its claim's
    definition or a cell it read was registered after the cell started, or a cell it waits for replaces a
    registered cell that ran with another config (reproduce/runs/registration.py)."""
    from repdegen.reproduce.results.claims import UNDECIDED, resolve_row
    from repdegen.reproduce.results.claims_text import NA, shown_state
    from repdegen.reproduce.runs import registration

    t, scale = app.table, app.scale.name
    reg = registration.load(registration.path_of(app.paths.tables_dir, t.name, scale))
    started = {r["config_hash"]: r.get("started") for r in records}
    analysed = {r["config_hash"]: r.get("_analysed") for r in records}
    analysis_only = set(from_source("analysis"))
    seeds = seeds_at(t, scale)
    for v in verdicts:
        if shown_state(v) == NA:
            continue
        # a claim on analysis metrics only waits for the analysis, not the training: registered before it is computed
        when = analysed if {c.metric for c in v.claim.checks} <= analysis_only else started
        idx = sorted({resolve_row(t, c.row, "a claim") for c in v.claim.checks}
                     | {resolve_row(t, c.than, "a claim") for c in v.claim.checks if c.get("than") is not None})
        cells = [(i, s, h) for i in idx
                 for s, h in zip(rows[i].extra.get("seeds", {}), (rows[i].config_hash or "").split("+")) if h]
        if v.state != UNDECIDED:
            needed = [(h, when.get(h), f"{registration.row_name(t.rows[i])} (seed {s})") for i, s, h in cells]
            v.registration = registration.judge(v.claim, seeds, reg, needed, scale, t.get("analyses"))
            continue
        for i, s, h in cells:
            if ledger is None or rows[i].extra["seeds"].get(s) is not None:
                continue
            ran = [o for o in registration.replaced_cells(reg, {registration.row_name(t.rows[i])}, s, h)
                   if ledger.is_complete(o)]
            if ran:
                v.registration = (f"changed after run: the config of {registration.row_name(t.rows[i])} (seed {s}) "
                                  f"changed after its registered cell [{ran[0]}] ran; the cell as configured now [{h}] "
                                  f"has not run")
                break


def paper_valid_lines(rows, records: list[dict], scale: str) -> dict[tuple[str | None, str], float]:
    """{(group, label) as the curves name a run: the paper's validation PPL} for the curves at paper scale (at lite
    and smoke, budgets that are not the paper's, none). A run serves the rows of its cell (``_rows``: their indices
    in ``rows``); the number is that of its final-stage rows (not the first-session, finetuning or cache rows, other
    stages of the same run), when they print one and agree."""
    out = {}
    for r in records if scale == "paper" else []:
        values = {float(rows[i].paper["valid_ppl"]) for i in r.get("_rows", [])
                  if rows[i].get("stage", "final") == "final" and (rows[i].paper or {}).get("valid_ppl") is not None}
        if len(values) == 1:
            out[(r["_row_group"], r["_row_label"])] = values.pop()
    return out


def render(app: DictConfig, rows: list[RenderedRow], records: list[dict], ledger: Ledger | None = None,
           out: Path | None = None, extra: dict | None = None) -> Path:
    """Write the table's files into ``out`` (default ``<paths.tables_dir>/<table>/<scale>/``); ``extra``: more of
    what made it, kept in ``cells.json`` (a sweep's jobs)."""
    from repdegen.reproduce.results.claims import evaluate_claims
    from repdegen.reproduce.results.claims_text import (
        claims_console,
        claims_csv,
        claims_latex,
        claims_markdown,
        summary_line,
        verdict_record,
    )

    t = app.table
    scale = app.scale.name
    hw = sorted({hardware_summary(r["hardware"]) for r in records}) or ["n/a"]
    git = records_git(records)
    seeds = seeds_at(t, scale)
    swept = list(t.get("swept") or [])  # a sweep's table: ours only, no baseline to compare with
    relative = scale != "paper" and not swept
    meta = {
        "title": t.title,
        "source": t.source,
        "scale": scale,
        "scale_note": SCALE_NOTES.get(scale, ""),
        "git": git,
        "hardware": "; ".join(hw),
        "wall_time": _fmt_seconds(sum(r.get("wall_time_s", 0.0) for r in records)),
        "generated": dt.datetime.now().isoformat(timespec="seconds"),
        "seeds": [s for s in seeds if s is not None],
    }
    if relative:
        ran = scale_differences(records)
        meta["differences"] = " ".join(x for x in (f"Ours ran: {ran}." if ran else "", t.differences.get(scale, "")) if x)
    out = Path(out) if out is not None else Path(app.paths.tables_dir) / t.name / scale
    columns = list(t.columns)
    notes = list(t.notes)
    if swept and records:
        notes.append(f"Ours ran: {scale_differences(records)}.")
    signatures = sorted({r["metrics"].get("final", {}).get("bleu_signature") for r in records} - {None})
    if signatures:
        meta["bleu_signature"] = signatures
        notes.append("SacreBLEU signature: " + "; ".join(f"`{sig}`" for sig in signatures))
    attach_baselines(t, rows)
    ours, paper = claim_inputs(t, rows)
    verdicts = evaluate_claims(t, ours, seeds, paper, scale)
    judge_registration(app, verdicts, rows, records, ledger)
    claims_md = claims_markdown(verdicts, paper_short(t.source), scale, seeds)
    # at paper scale each cell's provenance: its rows are built one by one, over sessions and machines
    provenance = [cell_provenance(r) for r in records] if scale in ARCHIVED_SCALES else []
    markdown = to_markdown(t.title, columns, rows, meta, notes, relative=relative, claims=claims_md, cells=provenance,
                           paper=not swept, first_column=" / ".join(swept) or "Model")
    latex = to_latex(t.title, columns, rows, meta, relative=relative, claims=claims_latex(verdicts, scale))
    atomic_write_bytes(out / "table.csv", lambda f: f.write(to_csv(columns, rows).encode()))
    atomic_write_bytes(out / "claims.csv", lambda f: f.write(claims_csv(verdicts, scale).encode()))
    # a row is (group, label); its seeds are one line (their mean) and a min-max band; at paper scale the paper's
    # validation PPL of each row is a line across its panel (a lite budget is not the paper's: no target there)
    targets = paper_valid_lines(t.rows, records, scale)
    curves = plot_validation_curves([(r["_row_label"], r["_row_group"], r["history"]) for r in records],
                                    out / "curves.png", f"{t.title} — scale {scale}", show_train=scale == "paper",
                                    targets=targets)
    figures = render_embedding_figures(records, Path(app.paths.runs_dir), out, f"{paper_short(t.source)}, scale {scale}")
    if swept:  # each column against the swept value
        figures |= render_sweep_figures(t, rows, out, f"{t.source} ({scale})")
    if t.get("panels"):  # a figure table's own panels
        figures |= render_panel_figures(t, rows, records, out, f"{t.title}, scale {scale}")
    ran = sorted({r["_seed"] for r in records if r.get("_seed") is not None})
    # {figure's file stem: caption}, in the order to show them (reproduce/results/report.py embeds them)
    figure_captions = ({"curves": "Validation perplexity per epoch of each row" + (
        f" (line: mean over seeds {', '.join(map(str, ran))}; band: min–max)" if len(ran) > 1 else "") + (
        "; dotted across: the paper's validation PPL of the row" if targets else "")} if curves else {})
    figure_captions |= {Path(f).stem: caption for f, caption in figures.items()}
    if "figure" in figure_captions:  # a figure table's own panels first
        figure_captions = {"figure": figure_captions.pop("figure"), **figure_captions}
    cells_out = cell_index(rows, app.paths.runs_dir)
    # cells.json's `command` is the one that trains the cells (the one to rerun); a render-only pass keeps
    # the training command already there and says in `rendered_by` how this rendering was made
    this_command = command_line()
    by_hash = {p["config_hash"]: p for p in provenance}
    for c in cells_out:
        if c.get("config_hash") in by_hash:
            c["provenance"] = {k: v for k, v in by_hash[c["config_hash"]].items() if k not in ("row", "config_hash")}
    cells_record = {"table": t.name, "scale": scale, "command": this_command,
                    "meta": meta, "cells": cells_out, "figures": figure_captions, **(extra or {})}
    if app.render_only:
        default = f"repdegen table table={t.name} scale={scale}"
        cells_record["command"] = training_command(out / "cells.json") or default
        cells_record["rendered_by"] = this_command
    kept = unchanged_generated(out / "cells.json", cells_record)
    if kept:  # the same rendering as the one there: keep its time, so the files stay as they are (nothing to commit)
        markdown, latex = markdown.replace(meta["generated"], kept), latex.replace(meta["generated"], kept)
        meta["generated"] = kept
    atomic_write_bytes(out / "table.md", lambda f: f.write(markdown.encode()))
    atomic_write_bytes(out / "table.tex", lambda f: f.write(latex.encode()))
    atomic_write_json(out / "cells.json", cells_record)
    if scale in ARCHIVED_SCALES and not swept:  # the records it was made from, committed with it (reproduce/runs/archive.py)
        archived = archive_records(out, records, Path(app.paths.runs_dir))
        if archived:
            print(f"repdegen: kept {len(archived)} run record file(s) of complete cells under {out / ARCHIVE_DIR}/ "
                  f"(commit them with the table: restore=true brings them back into a lost ledger)")
    atomic_write_json(out / "claims.json", {"table": t.name, "title": t.title, "scale": scale,
                                            "seeds": meta["seeds"], "claims": [verdict_record(v) for v in verdicts]})
    print(markdown)
    print(f"repdegen: wrote {out}/table.{{md,csv,tex}}, claims.{{json,csv}}, curves.png" + "".join(f", {f}" for f in figures))
    if verdicts:
        print(claims_console(verdicts, paper_short(t.source), scale, seeds))
        print(summary_line(verdicts, t.name, scale))
    return out


def render_latest(app: DictConfig, cells: list[Cell], ledger: Ledger,
                  run_status: dict[str, str] | None = None) -> tuple[Path, list[RenderedRow]] | None:
    """Render ``app``'s table from the ledger as it stands now; (output directory, rows), or None when
    it was not rendered.

    Renders of one table and scale are serialized (an exclusive ``flock`` on ``.render.lock`` in the
    output directory), and the ledger is read inside that lock, so of two processes rendering the same
    table the later one sees at least what the earlier one saw. A rendering is never replaced by one that
    lacks a complete cell it holds (a less complete one, or one from a ledger that lost that cell's record
    while gaining others): it is left as it is, with a line that names the lacking cells and how to merge."""
    import fcntl

    out = Path(app.paths.tables_dir) / app.table.name / app.scale.name
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / ".render.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        rows, records = collect_rows(app, cells, ledger, run_status)
        ours = {r["config_hash"] for r in records}
        # the cells of the table as it is now (a cell whose config changed since is another cell: not counted)
        there = complete_hashes(out / "cells.json") & {c.config_hash for c in cells}
        lacking = there - ours
        # cells the ledger holds unfinished (restore=true skips them)
        held = {h for h in lacking if ledger is not None and (ledger.run_dir(h) / "result.json").exists()}
        kept = (lacking - held) & set(archived_records(Path(app.paths.tables_dir)))
        restore = (f"repdegen table table={app.table.name} scale={app.scale.name} render_only=true "
                   f"restore=true")
        if there > ours:
            print(f"repdegen: {out} already holds a more complete rendering ({len(there)}/{len(cells)} cells complete, "
                  f"this one {len(ours)}/{len(cells)}); left it as it is" + (
                      f". The ledger lacks {len(kept)} of its cells whose run records are committed with the tables: "
                      f"to bring them back, {restore}" if kept else "") + (
                      f". The ledger holds unfinished runs of {', '.join(sorted(held))}: they render when they finish "
                      f"(repdegen status)" if held else ""))
            return None
        if lacking:  # this one adds cells but would drop results the rendering holds: keep it, say how to merge
            names = [f"{c.label}" + (f" seed {c.seed}" if c.seed is not None else "") + f" [{c.config_hash}]"
                     for c in cells if c.config_hash in lacking]
            where = f" {ledger.root}" if ledger else ""
            how = []
            if kept:
                how.append(f"bring back the {len(kept)} committed with the tables ({restore})")
            if held:
                how.append(f"let the unfinished run(s) the ledger holds of {', '.join(sorted(held))} finish (python -m "
                           f"repdegen.reproduce.status), or move their run directories away and render with restore=true")
            if lacking - kept - held:
                how.append(f"run the lacking cells again (repdegen table table={app.table.name} "
                           f"scale={app.scale.name} rows=[...]) or copy their run records back into the ledger, then "
                           f"render again (render_only=true)")
            print(f"repdegen: {out} holds {len(lacking)} complete cell(s) that the ledger{where} lacks "
                  f"({'; '.join(names) or ', '.join(sorted(lacking))}), so it was left as it is (rendering now "
                  f"would drop their results). The cells of this run are safe in the ledger; to render them with the "
                  f"others, " + "; for the rest, ".join(how))
            return None
        return render(app, rows, records, ledger), rows
    finally:
        os.close(fd)
