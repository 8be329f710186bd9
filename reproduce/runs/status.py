"""What the run ledger holds now: every run that is training, stopped part-way or failed (``--all``: the complete
ones too), with its epoch, best validation PPL, how many epochs since that best (against early stopping's
patience), the time an epoch takes and the time left at most, and how to continue a run that stopped.

It reads ``<runs_dir>/<hash>/result.json`` (written at its start and rewritten after every epoch) and asks each run's lock
(:meth:`repdegen.reproduce.runs.ledger.Ledger.holder`) whether a live process trains it; it writes nothing, so it is safe
beside running cells (``repdegen status``). A record that cannot be read, or whose fields are not of their
types (:func:`check_progress`), is listed as one line naming the file, the field and its value, and how to recover it;
the other runs are listed on, and the exit status is then 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path

from repdegen.core.errors import CorruptFile
from repdegen.core.files import output_problem
from repdegen.reproduce.errors import EXIT_USER_ERROR
from repdegen.reproduce.runs.ledger import STATUS_COMPLETE, Ledger, read_record

EPILOG = """\
examples:
  repdegen status                          # runs training, stopped or failed in outputs/runs
  repdegen status --scale paper --all      # every paper-scale run, complete ones included
  repdegen status --json                   # the same facts, one JSON object per run
  repdegen status --plot outputs/curves.png  # and their learning curves so far
  make status

where next:
  repdegen table --help (a table's cells and their progress); docs/cli.md (every entry point);
  docs/compute.md (what a table costs on this CPU)"""


def _fmt_seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def record_fix(run_dir: Path) -> str:
    """How to recover a run whose ``result.json`` is corrupt."""
    return (f"restore it from a copy, or move {run_dir} aside and train the run again (rerun its table cell, or its "
            f"repdegen train command)")


# what epoch_facts and the listing read of a record, and their domains: (types, the expected words, lowest value)
_INT, _NUMBER = (int,), (int, float)
RECORD_FIELDS = {"label": ((str,), "a string", None), "scale": ((str,), "a string", None)}
TRAINER_FIELDS = {"max_epochs": (_INT, "an integer >= 0 or null", 0),
                  "retrain_sessions": (_INT, "an integer >= 0 or null", 0),
                  "early_stopping": (_INT, "an integer >= 0 or null", 0),
                  "finetune_epochs": (_INT, "an integer >= 0 or null", 0)}
HISTORY_FIELDS = {"stage": ((str,), "a string", None), "epoch": (_INT, "an integer >= 0", 0),
                  "session": (_INT, "an integer >= 1", 1), "epoch_seconds": (_NUMBER, "a number >= 0", 0),
                  "valid_seconds": (_NUMBER, "a number >= 0", 0), "valid_ppl": (_NUMBER, "a number or null", None),
                  "train_ppl": (_NUMBER, "a number or null", None)}


def check_progress(record: dict, path: str | Path, fix: str) -> None:
    """The fields of a run record that :func:`epoch_facts` and the listing read, each of its type and in its domain
    (``config.trainer``'s epoch counts, each ``history`` entry an object with an integer ``epoch``, numeric times and
    PPLs); :class:`CorruptFile` naming the file, the field and its value, and ``fix`` for the first that is not."""
    def check(where: str, obj: dict, fields: dict, required: tuple[str, ...] = ()) -> None:
        for key, (types, expected, low) in fields.items():
            value = obj.get(key)
            if value is None and key not in required:
                continue
            if (not isinstance(value, types) or isinstance(value, bool)
                    or (low is not None and value < low)):
                raise corrupt(f"{where}{key}", value if key in obj else _MISSING, expected)

    def corrupt(where: str, value, expected: str) -> CorruptFile:
        return CorruptFile(path, f"{path}: {where} is {_shown(value)}, expected {expected}; the record is corrupt: {fix}")

    check("", record, RECORD_FIELDS)
    if not isinstance(record.get("history") or [], list):
        raise corrupt("history", record["history"], "a list of per-epoch objects")
    if not isinstance(record.get("config") or {}, dict):
        raise corrupt("config", record["config"], "an object")
    trainer = (record.get("config") or {}).get("trainer") or {}
    if not isinstance(trainer, dict):
        raise corrupt("config.trainer", trainer, "an object")
    check("config.trainer.", trainer, TRAINER_FIELDS)
    for i, h in enumerate(record.get("history") or []):
        if not isinstance(h, dict):
            raise corrupt(f"history[{i}]", h, "an object (one epoch's record)")
        check(f"history[{i}].", h, HISTORY_FIELDS, required=("epoch",))


_MISSING = object()


def _shown(value) -> str:
    text = "missing" if value is _MISSING else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def epoch_facts(record: dict, path: str | Path = "the run record", fix: str = "restore it, or train the run again"
                ) -> dict | None:
    """A run's progress from its record: the last training epoch, its session, the epoch time (median of the last
    5, validation included: one epoch stretched by a stop, a pause or a restart does not move it), the epochs left
    at most (every epoch up to ``trainer.max_epochs`` in every training session, then every one of
    ``trainer.finetune_epochs``; early stopping, and finetuning's non-monotone trigger, may end it sooner) and the best
    validation PPL so far; in the finetune stage (AWD-LSTM's finetune.py) also its epoch. None before the first
    epoch. A record whose fields are not of their types raises :class:`CorruptFile` (:func:`check_progress`: naming
    ``path`` and ``fix``)."""
    check_progress(record, path, fix)
    every = record.get("history") or []
    history = [h for h in every if h.get("stage", "train") == "train"]
    if not history:
        return None
    finetune = [h for h in every if h.get("stage") == "finetune"]
    trainer = (record.get("config") or {}).get("trainer") or {}
    max_epochs = int(trainer.get("max_epochs") or 0)
    finetune_epochs = int(trainer.get("finetune_epochs") or 0)
    sessions = int(trainer.get("retrain_sessions") or 0) + 1
    last = history[-1]
    session = int(last.get("session", 1))
    timed = finetune or history  # the stage running now sets the pace
    seconds = [h["epoch_seconds"] + h.get("valid_seconds", 0.0) for h in timed if "epoch_seconds" in h]
    per_epoch = statistics.median(seconds[-5:]) if seconds else 0.0
    if finetune:
        left = max(finetune_epochs - int(finetune[-1]["epoch"]), 0)
    else:
        left = max(max_epochs - int(last["epoch"]), 0) + (sessions - session) * max_epochs + finetune_epochs
    if finetune:
        # finetune.py starts from the training's best weights and keeps a finetune epoch's only when it beats them:
        # the bar is the training's best (over every session), the count is in finetune epochs, no patience
        trained = [h for h in history if _number(h.get("valid_ppl"))]
        tuned = [h for h in finetune if _number(h.get("valid_ppl"))]  # stage "finetune" already
        candidates = ([min(trained, key=lambda h: h["valid_ppl"])] if trained else []) + tuned
        best = min(candidates, key=lambda h: h["valid_ppl"]) if candidates else None
        best_stage = best.get("stage", "train") if best else "train"
        done = int(finetune[-1]["epoch"])
        since = done - int(best["epoch"]) if best and best_stage == "finetune" else done
        patience, kept = None, None
    else:
        this_session = [h for h in history if int(h.get("session", 1)) == session and _number(h.get("valid_ppl"))]
        best = min(this_session, key=lambda h: h["valid_ppl"]) if this_session else None
        # the earlier sessions' best: the weights kept unless this session beats them (footnote 5's re-training)
        earlier = [h for h in history if int(h.get("session", 1)) < session and _number(h.get("valid_ppl"))]
        kept = min(earlier, key=lambda h: h["valid_ppl"]) if earlier else None
        since = int(last["epoch"]) - int(best["epoch"]) if best else None
        patience, best_stage = trainer.get("early_stopping"), "train"
    now = finetune[-1] if finetune else last
    return {"epoch": int(last["epoch"]), "max_epochs": max_epochs, "session": session, "sessions": sessions,
            "valid_ppl": now.get("valid_ppl") if _number(now.get("valid_ppl")) else None,
            "finetune_epoch": int(finetune[-1]["epoch"]) if finetune else None, "finetune_epochs": finetune_epochs,
            "epoch_seconds": per_epoch, "epochs_left_at_most": left, "seconds_left_at_most": left * per_epoch,
            "best_valid_ppl": best["valid_ppl"] if best else None, "best_epoch": int(best["epoch"]) if best else None,
            "best_stage": best_stage, "since_best": since, "patience": patience,
            "earlier_best_valid_ppl": kept["valid_ppl"] if kept else None,
            "earlier_best_session": int(kept.get("session", 1)) if kept else None,
            "earlier_best_epoch": int(kept["epoch"]) if kept else None}


def progress_where(f: dict, session_joint: str = ", session ") -> str:
    """Where a run is, from :func:`epoch_facts`: "epoch 4/100" (", session 2/2"; ", finetune epoch 3/750")."""
    where = f"epoch {f['epoch']}/{f['max_epochs']}" + (f"{session_joint}{f['session']}/{f['sessions']}"
                                                       if f["sessions"] > 1 else "")
    if f.get("finetune_epoch") is not None:
        where += f", finetune epoch {f['finetune_epoch']}/{f['finetune_epochs']}"
    return where


def progress_left(f: dict) -> str:
    """The time left at most, from :func:`epoch_facts`, and what may end the run sooner."""
    if f.get("finetune_epoch") is not None:
        sooner = ", or sooner when validation stops improving (finetuning's non-monotone trigger)"
    elif f.get("finetune_epochs"):
        sooner = (f" (finetuning's {f['finetune_epochs']} epochs included), or sooner by "
                  f"{'early stopping and ' if f['patience'] is not None else ''}finetuning's non-monotone trigger")
    else:
        sooner = ", or sooner by early stopping" if f["patience"] is not None else ""
    return f"at most {_fmt_seconds(f['seconds_left_at_most'])} left{sooner}"


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def run_state(record: dict, holder: str | None) -> str:
    """training (pid N on host) | stopped (the record says running, no process holds it) | preempted | interrupted |
    failed | complete."""
    status = record.get("status", "unknown")
    if holder is not None:
        return f"training ({holder})"
    if status == "running":
        return "stopped"
    return status


def since_start(record: dict, now: dt.datetime | None = None) -> float | None:
    """Seconds since the run's latest (re)start (``starts[-1].at``, local time as the trainer wrote it); None when
    the record has no such time (records from before the list began) or it does not parse."""
    starts = record.get("starts")
    at = starts[-1].get("at") if isinstance(starts, list) and starts and isinstance(starts[-1], dict) else None
    try:
        began = dt.datetime.fromisoformat(at) if isinstance(at, str) else None
    except ValueError:
        return None
    return None if began is None else max(((now or dt.datetime.now()) - began).total_seconds(), 0.0)


CORRUPT = "corrupt record"  # the state of a run whose result.json cannot be read (its row's error says why)


def collect(runs_dir: str | Path, scale: str | None = None, include_complete: bool = False,
            tables_dir: str | Path = "results/tables") -> list[dict]:
    """One dict per run of the ledger (sorted: training first, then by label), its facts, its state and, for a
    paper-scale run a table registered, the paper's validation PPL of its row (:func:`paper_valid_targets`)."""
    ledger = Ledger(runs_dir)
    rows = []
    root = Path(runs_dir)
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        path = run_dir / "result.json"
        if not path.is_file():
            continue
        try:
            record = read_record(path, record_fix(run_dir))
            if scale is not None and record.get("scale") != scale:
                continue
            if record.get("status") == STATUS_COMPLETE and not include_complete:
                continue
            facts = epoch_facts(record, path, record_fix(run_dir))
        except CorruptFile as err:  # listed as it is, with how to recover it; the others are listed on
            rows.append({"hash": run_dir.name, "label": "?", "scale": "?", "state": CORRUPT, "facts": None,
                         "resume": None, "error": " ".join(str(err).split())})
            continue
        state = run_state(record, ledger.holder(run_dir.name))
        resume = None
        if state in ("stopped", "preempted", "interrupted", "failed"):
            resume = f"python -m repdegen.reproduce.runs.launch {run_dir / 'cell.yaml'}" if (run_dir / "cell.yaml").is_file() \
                else f"repdegen train ... trainer.resume=true (the command in {run_dir / 'result.json'})"
        rows.append({"hash": run_dir.name, "label": record.get("label", "?"), "scale": record.get("scale", "?"),
                     "state": state, "facts": facts, "resume": resume, "running_s": since_start(record),
                     "paper_valid_ppl": paper_valid_targets(record, tables_dir),
                     "restored": restored_line(record, run_dir),
                     "error": record.get("error") if state == "failed" else None})
    rows.sort(key=lambda r: (not r["state"].startswith("training"), r["label"], r["hash"]))
    return rows


def _final_ppls(record: dict) -> str:
    """The PPLs of a record's final metrics, "valid_ppl 92.44, test_ppl 87.81" ("" when it holds none)."""
    final = (record.get("metrics") or {}).get("final") or {}
    return ", ".join(f"{k} {v:.2f}" for k, v in final.items() if k.endswith("_ppl") and isinstance(v, (int, float)))


def restored_line(record: dict, run_dir: Path) -> str | None:
    """How a run restored from a table's archived records is listed (reproduce/runs/archive.py); None for the others."""
    from repdegen.reproduce.runs.archive import restored_from

    source = restored_from(run_dir)
    if source is None:
        return None
    shown = _final_ppls(record)
    what = ("record recovered from the committed rendering, its history lost" if record.get("recovered")
            else "its weights are not on this machine")
    return f"restored from {source} ({what})" + (f"; final {shown}" if shown else "")




def format_row(row: dict) -> str:
    if row["state"] == CORRUPT:
        return row["error"]  # one line: the file, the field and its value, how to recover it
    f = row["facts"]
    head = f"{row['hash']}  {row['label']} ({row['scale']})  {row['state']}"
    if f is None and row.get("restored"):
        body = row["restored"]
    elif f is None:
        body = "no epoch finished yet" + (f" (started {_fmt_seconds(row['running_s'])} ago)"
                                          if row.get("running_s") is not None else "")
    else:
        where = progress_where(f)
        valid = f", valid PPL {f['valid_ppl']:.2f}" if f["valid_ppl"] is not None else ""
        if row.get("paper_valid_ppl") is not None:
            valid += f" (the paper's final: {row['paper_valid_ppl']:.2f})"
        best = ""
        if f["best_valid_ppl"] is not None:
            patience = f"; early stopping after {f['patience']}" if f["patience"] is not None else ""
            at = (f"finetune epoch {f['best_epoch']}" if f.get("best_stage") == "finetune" else
                  f"epoch {f['best_epoch']}" + (" of training" if f.get("finetune_epoch") is not None else ""))
            counted = " finetune" if f.get("finetune_epoch") is not None else ""
            best = (f", best {f['best_valid_ppl']:.2f} at {at} ({f['since_best']}{counted} "
                    f"epoch{'s' if f['since_best'] != 1 else ''} without a better one{patience})")
        if f.get("earlier_best_valid_ppl") is not None:
            best += (f"; session {f['earlier_best_session']}'s best {f['earlier_best_valid_ppl']:.2f} (epoch "
                     f"{f['earlier_best_epoch']}) stays the result unless this session beats it")
        timing = f" | {_fmt_seconds(f['epoch_seconds'])} an epoch"
        if row["state"] != STATUS_COMPLETE:
            timing += f" | {progress_left(f)}"
        body = where + valid + best + timing
    lines = [head, "    " + body]
    if f is not None and row.get("restored"):
        lines.append("    " + row["restored"])
    if row.get("error"):
        lines.append(f"    error: {row['error']}")
    if row.get("resume"):
        lines.append(f"    continue: {row['resume']}")
    return "\n".join(lines)


def _table_rows(path: Path) -> list:
    from omegaconf import OmegaConf

    return list(OmegaConf.load(path).get("rows") or [])


def paper_valid_targets(record: dict, tables_dir: str | Path = "results/tables", conf_dir: Path | None = None
                        ) -> float | None:
    """The paper's validation PPL for a paper-scale run: its cell's config hash is looked up in the tables'
    pre-registrations (``<tables_dir>/<table>/paper/registration.json``: each registered cell with the rows it
    serves), and the rows' paper ``valid_ppl`` read from ``conf/table/<table>.yaml`` (rows of the final stage only:
    the first-session, finetuning and cache rows are other stages of the same run). One number when the rows agree;
    else, or for a run no table registered, None."""
    from repdegen.reproduce.runs.registration import row_name
    from repdegen.reproduce.settings.config import CONF_DIR

    if record.get("scale") != "paper" or not record.get("config_hash"):
        return None
    found = set()
    for reg_path in sorted(Path(tables_dir).glob("*/paper/registration.json")):
        try:
            reg = json.loads(reg_path.read_text())
            names = set(reg["cells"][record["config_hash"]]["rows"])
            table = Path(conf_dir or CONF_DIR / "table") / f"{reg['table']}.yaml"
        except (OSError, ValueError, KeyError, TypeError):  # not this table's cell, or an unreadable file: no line
            continue
        if not table.is_file():
            continue
        for row in _table_rows(table):
            target = (row.get("paper") or {}).get("valid_ppl")
            if row_name(row) in names and row.get("stage", "final") == "final" and _number(target):
                found.add(float(target))
    return found.pop() if len(found) == 1 else None


def plot_runs(runs_dir: str | Path, rows: list[dict], path: str | Path, tables_dir: str | Path = "results/tables"
              ) -> Path | None:
    """The runs' learning curves so far (repdegen.analysis.figures.plot_validation_curves: one line a run, re-training
    sessions dotted, training PPL faint; a paper-scale run's paper validation PPL as a line across,
    :func:`paper_valid_targets`); None (and a line saying so) when no run has finished an epoch."""
    from repdegen.analysis.figures import plot_validation_curves

    ledger = Ledger(runs_dir)
    series, targets = [], {}
    for row in rows:
        if row["facts"] is None:
            continue
        record = ledger.load(row["hash"]) or {}
        name = f"{row['label']} [{row['hash'][:8]}]"
        series.append((name, None, record.get("history") or []))
        target = row["paper_valid_ppl"] if "paper_valid_ppl" in row else paper_valid_targets(record, tables_dir)
        if target is not None:
            targets[(None, name)] = target
    out = plot_validation_curves(series, Path(path), f"{runs_dir}: learning curves so far", show_train=True,
                                 targets=targets) if series else None
    print(f"repdegen: wrote {out}" if out else f"repdegen: no run has finished an epoch yet; {path} not written",
          file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="repdegen status", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="What the run ledger holds now: the runs training, stopped part-way or failed, each with its\n"
                    "epoch, best validation PPL, epochs since it (early stopping's patience), time an epoch and time\n"
                    "left, and how to continue it. It reads the ledger only (safe beside running cells).",
        epilog=EPILOG)
    parser.add_argument("--runs-dir", default="outputs/runs", help="the run ledger (default: outputs/runs)")
    parser.add_argument("--scale", choices=["smoke", "lite", "paper"], help="only runs of this scale")
    parser.add_argument("--all", action="store_true", help="the complete runs too")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
    parser.add_argument("--plot", metavar="PNG", help="also draw the listed runs' validation (and faint training) PPL "
                                                     "per epoch so far into this PNG, a paper-scale run's paper "
                                                     "validation PPL (that of the table row it is registered for) as "
                                                     "a dotted line across")
    parser.add_argument("--tables-dir", default="results/tables",
                        help="where the tables' registrations are, for the paper's validation PPL of a paper-scale "
                             "run's row (in the listing, and as --plot's lines; default: results/tables)")
    args = parser.parse_args(argv)
    problem = output_problem(args.plot, "--plot") if args.plot else None
    if problem:
        parser.error(problem)
    if not Path(args.runs_dir).is_dir():
        print(f"repdegen: no run ledger at {args.runs_dir!r} (no run has been trained there yet); pass the folder "
              f"with --runs-dir (the `paths.runs_dir` the runs used)", file=sys.stderr)
        return 2
    rows = collect(args.runs_dir, args.scale, args.all, args.tables_dir)
    if args.plot:
        plot_runs(args.runs_dir, rows, args.plot, args.tables_dir)
    corrupt = sum(r["state"] == CORRUPT for r in rows)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return _corrupt_note(args.runs_dir, corrupt)
    if not rows:
        what = "no runs" if args.all else "no run training, stopped or failed (--all lists the complete ones)"
        print(f"repdegen: {args.runs_dir}: {what}" + (f" at scale {args.scale}" if args.scale else ""))
        return 0
    training = sum(r["state"].startswith("training") for r in rows)
    try:
        what = f"{len(rows)} run(s)" if args.all else f"{len(rows)} run(s) not complete (--all lists the complete ones too)"
        print(f"repdegen: {args.runs_dir}: {what}, {training} training now")
        for row in rows:
            print(format_row(row), flush=True)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - no flush error at exit
    return _corrupt_note(args.runs_dir, corrupt)


def _corrupt_note(runs_dir: str, corrupt: int) -> int:
    """After the listing: one line on stderr when records are corrupt (exit status 2), else nothing."""
    if corrupt:
        print(f"repdegen: error: {corrupt} run record(s) in {runs_dir} are corrupt (listed above, each with how to "
              f"recover it); the other runs are listed as they are", file=sys.stderr, flush=True)
    return EXIT_USER_ERROR if corrupt else 0
