"""``repdegen status``: the ledger's runs as hand-made records say they are (hand-worked numbers), which of
them a live process trains (the run's lock, held here), how to continue the others, and one clear line for a
missing ledger or a corrupt record."""

from __future__ import annotations

import json
import os
import socket

import pytest
from repdegen.reproduce.runs.ledger import Ledger
from repdegen.reproduce.runs.status import collect, epoch_facts, main


def _epoch(epoch, ppl, session=1, seconds=100.0):
    return {"stage": "train", "epoch": epoch, "session": session, "valid_ppl": ppl, "epoch_seconds": seconds,
            "valid_seconds": 20.0}


TRAINER = {"max_epochs": 10, "retrain_sessions": 1, "early_stopping": 5}


def _write(root, h, status, history, label="inan2017/small/mle", scale="paper", trainer=TRAINER, cell=True):
    run = root / h
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps({"status": status, "label": label, "scale": scale, "config_hash": h,
                                                 "config": {"trainer": trainer}, "history": history}))
    if cell:
        (run / "cell.yaml").write_text("{}\n")
    return run


def test_epoch_facts_hand_worked():
    """Session 2 of 2 at epoch 3 of 10: its best is epoch 2's 90.0 (session 1's 80.0 does not count: the second
    session's early stopping starts anew), 1 epoch without a better one, at most 7 epochs x 120 s = 840 s left."""
    history = [_epoch(1, 100.0), _epoch(2, 80.0), {"stage": "test", "epoch": 2, "valid_ppl": 1.0},
               _epoch(1, 95.0, session=2), _epoch(2, 90.0, session=2), _epoch(3, 91.0, session=2)]
    f = epoch_facts({"config": {"trainer": TRAINER}, "history": history})
    assert (f["epoch"], f["session"], f["sessions"]) == (3, 2, 2)
    assert (f["best_valid_ppl"], f["best_epoch"], f["since_best"]) == (90.0, 2, 1)
    assert f["epochs_left_at_most"] == 7 and f["seconds_left_at_most"] == pytest.approx(840.0)
    assert f["epoch_seconds"] == pytest.approx(120.0) and f["patience"] == 5
    assert epoch_facts({"config": {}, "history": []}) is None


def test_epoch_time_ignores_one_stretched_epoch():
    """The median of the last 5 epochs' times: an epoch that a stop or a pause stretched to 900 s (as a resumed
    epoch's wall time is) leaves the estimate at the others' 120 s, where a mean would say 276 s."""
    history = [_epoch(1, 100.0), _epoch(2, 99.0, seconds=880.0), _epoch(3, 98.0), _epoch(4, 97.0), _epoch(5, 96.0)]
    f = epoch_facts({"config": {"trainer": TRAINER}, "history": history})
    assert f["epoch_seconds"] == pytest.approx(120.0)
    assert f["seconds_left_at_most"] == pytest.approx((5 + 10) * 120.0)


def test_states_and_the_continue_command(tmp_path):
    _write(tmp_path, "aaaa", "running", [_epoch(1, 200.0), _epoch(2, 150.0)])            # its process died
    _write(tmp_path, "bbbb", "running", [_epoch(1, 210.0)], label="inan2017/small/re")  # trained now (lock below)
    _write(tmp_path, "cccc", "complete", [_epoch(1, 120.0)])
    _write(tmp_path, "dddd", "preempted", [], label="inan2016/h200/mle", scale="lite")
    failed = _write(tmp_path, "eeee", "failed", [_epoch(1, 300.0)], cell=False)
    rec = json.loads((failed / "result.json").read_text())
    (failed / "result.json").write_text(json.dumps(dict(rec, error="loss is nan at update 12")))
    with Ledger(tmp_path).lock("bbbb"):
        rows = {r["hash"]: r for r in collect(tmp_path)}
        assert rows["bbbb"]["state"] == f"training (pid {os.getpid()} on {socket.gethostname()})"
        assert rows["bbbb"]["resume"] is None
    assert "cccc" not in rows  # complete: only with --all
    assert rows["aaaa"]["state"] == "stopped"
    assert rows["aaaa"]["resume"] == f"python -m repdegen.reproduce.runs.launch {tmp_path / 'aaaa' / 'cell.yaml'}"
    assert rows["dddd"]["state"] == "preempted" and rows["dddd"]["facts"] is None
    assert rows["eeee"]["state"] == "failed" and rows["eeee"]["error"] == "loss is nan at update 12"
    assert "trainer.resume=true" in rows["eeee"]["resume"]
    assert list(rows)[0] == "bbbb"  # training first
    assert {r["hash"] for r in collect(tmp_path, include_complete=True)} == {"aaaa", "bbbb", "cccc", "dddd", "eeee"}
    assert {r["hash"] for r in collect(tmp_path, scale="lite")} == {"dddd"}


def test_text_and_json_output(tmp_path, capsys):
    _write(tmp_path, "aaaa", "running", [_epoch(1, 200.0), _epoch(2, 150.0), _epoch(3, 160.0)])
    assert main(["--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "aaaa  inan2017/small/mle (paper)  stopped" in out
    # at epoch 3 of 10 in session 1 of 2: (10 - 3) + 10 = 17 epochs x 2 min = 34 min at most
    assert ("epoch 3/10, session 1/2, valid PPL 160.00, best 150.00 at epoch 2 (1 epoch without a better one; "
            "early stopping after 5) | 2m00s an epoch | at most 34m00s left, or sooner by early stopping") in out
    assert "continue: python -m repdegen.reproduce.runs.launch" in out
    assert main(["--runs-dir", str(tmp_path), "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["facts"]["best_valid_ppl"] == 150.0 and row["state"] == "stopped"


def test_the_header_says_the_complete_runs_are_left_out_unless_asked_for(tmp_path, capsys):
    _write(tmp_path, "aaaa", "running", [_epoch(1, 200.0)])
    _write(tmp_path, "cccc", "complete", [_epoch(1, 120.0)])
    _write(tmp_path, "dddd", "complete", [_epoch(1, 130.0)])
    assert main(["--runs-dir", str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (f"repdegen: {tmp_path}: 1 run(s) not complete (--all lists the complete ones too), "
                     "0 training now")
    assert main(["--runs-dir", str(tmp_path), "--all"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"repdegen: {tmp_path}: 3 run(s), 0 training now"


def test_a_second_session_shows_the_first_sessions_best_it_must_beat(tmp_path, capsys):
    """In a re-training session (footnote 5) the best and its count are the session's own (its early stopping);
    the earlier session's best, which stays the result unless beaten, is named beside them."""
    _write(tmp_path, "aaaa", "running", [_epoch(1, 200.0), _epoch(2, 91.3), _epoch(3, 92.0),
                                         _epoch(1, 103.0, session=2), _epoch(2, 104.0, session=2)])
    assert main(["--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("epoch 2/10, session 2/2, valid PPL 104.00, best 103.00 at epoch 1 (1 epoch without a better one; "
            "early stopping after 5); session 1's best 91.30 (epoch 2) stays the result unless this session beats it"
            ) in out


def test_in_finetuning_the_best_is_counted_against_the_trainings_best_in_finetune_epochs(tmp_path, capsys):
    """AWD-LSTM's finetune.py starts from the training's best weights (epoch 2's 120.0) and keeps a finetune epoch's
    only when it beats them. Hand-worked: finetune epochs 121.0, 118.0, 119.0: best 118.00 at finetune epoch 2, 1
    finetune epoch without a better one, no patience (the non-monotone trigger ends it); finetune epochs 121.0,
    122.0: the training's 120.00 (epoch 2) stays the best, 2 finetune epochs without a better one."""
    trainer = {"max_epochs": 4, "finetune_epochs": 10, "early_stopping": 5}
    train = [_epoch(1, 130.0), _epoch(2, 120.0), _epoch(3, 125.0), _epoch(4, 126.0)]

    def tune(*ppls):
        return [{"stage": "finetune", "epoch": e, "valid_ppl": p, "epoch_seconds": 90.0}
                for e, p in enumerate(ppls, 1)]

    f = epoch_facts({"config": {"trainer": trainer}, "history": train + tune(121.0, 118.0, 119.0)})
    assert (f["best_valid_ppl"], f["best_epoch"], f["best_stage"], f["since_best"]) == (118.0, 2, "finetune", 1)
    assert f["patience"] is None and f["earlier_best_valid_ppl"] is None
    _write(tmp_path, "aaaa", "running", train + tune(121.0, 118.0, 119.0), trainer=trainer)
    _write(tmp_path, "bbbb", "running", train + tune(121.0, 122.0), trainer=trainer)
    assert main(["--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("epoch 4/4, finetune epoch 3/10, valid PPL 119.00, best 118.00 at finetune epoch 2 (1 finetune epoch "
            "without a better one) | 1m30s an epoch") in out
    assert ("epoch 4/4, finetune epoch 2/10, valid PPL 122.00, best 120.00 at epoch 2 of training (2 finetune "
            "epochs without a better one) | 1m30s an epoch") in out
    # before finetuning, the training's own count and patience, as ever
    f = epoch_facts({"config": {"trainer": trainer}, "history": train})
    assert (f["best_epoch"], f["best_stage"], f["since_best"], f["patience"]) == (2, "train", 2, 5)


def test_a_missing_ledger_and_a_corrupt_record_are_one_clear_line(tmp_path, capsys):
    assert main(["--runs-dir", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "no run ledger at" in err and "--runs-dir" in err and "Traceback" not in err
    (tmp_path / "ffff").mkdir()
    (tmp_path / "ffff" / "result.json").write_text('{"status": "runn')  # truncated
    before = (tmp_path / "ffff" / "result.json").read_text()
    assert main(["--runs-dir", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert f"{tmp_path / 'ffff' / 'result.json'}: not a valid run record (invalid JSON" in out
    assert (tmp_path / "ffff" / "result.json").read_text() == before  # read only: nothing moved or changed
    assert main(["--runs-dir", str(tmp_path / "ffff" / "..")]) == 2


@pytest.mark.parametrize("history, trainer, field, value", [
    ([{"stage": "train", "epoch": "one"}], TRAINER, "history[0].epoch", "'one'"),
    (["x", 3], TRAINER, "history[0]", "'x'"),
    ([{"stage": "train", "valid_ppl": 90.0}], TRAINER, "history[0].epoch", "missing"),
    ([_epoch(1, 100.0), dict(_epoch(2, 90.0), valid_ppl="90")], TRAINER, "history[1].valid_ppl", "'90'"),
    ([dict(_epoch(1, 100.0), epoch_seconds=[1])], TRAINER, "history[0].epoch_seconds", "[1]"),
    ([dict(_epoch(1, 100.0), session=0)], TRAINER, "history[0].session", "0"),
    ([dict(_epoch(1, 100.0), stage=3)], TRAINER, "history[0].stage", "3"),
    ([_epoch(1, 100.0)], dict(TRAINER, max_epochs="many"), "config.trainer.max_epochs", "'many'"),
    ([_epoch(1, 100.0)], dict(TRAINER, retrain_sessions=1.5), "config.trainer.retrain_sessions", "1.5"),
    ([_epoch(1, 100.0)], dict(TRAINER, early_stopping=True), "config.trainer.early_stopping", "True"),
    ([_epoch(1, 100.0)], ["max_epochs"], "config.trainer", "['max_epochs']"),
])
def test_a_malformed_record_is_one_line_and_the_listing_goes_on(tmp_path, capsys, history, trainer, field, value):
    """A result.json that is valid JSON but whose fields status reads are not of their types (every field epoch_facts
    and the listing read): that run is one line naming the file, the field, its value and how to recover it, the
    other runs are listed as usual, and the exit status is 2 at the end; nothing is changed."""
    bad = _write(tmp_path, "aaaa", "running", history, trainer=trainer)
    _write(tmp_path, "bbbb", "running", [_epoch(1, 200.0), _epoch(2, 150.0)])
    before = (bad / "result.json").read_text()
    for argv in ([], ["--all"], ["--json"]):
        assert main(["--runs-dir", str(tmp_path), *argv]) == 2
        captured = capsys.readouterr()
        line = next(x for x in captured.out.splitlines() if "aaaa" in x)
        assert line.startswith(f"{bad / 'result.json'}: {field} is {value}, expected ") or argv == ["--json"]
        assert f"{field} is {value}, expected" in line and "the record is corrupt: restore it from a copy" in line
        assert "bbbb" in captured.out  # the other run is listed
        assert "1 run record(s)" in captured.err and "Traceback" not in captured.err + captured.out
    assert (bad / "result.json").read_text() == before


def test_plot_of_the_learning_curves_so_far(tmp_path, capsys):
    runs = tmp_path / "runs"
    _write(runs, "aaaa", "running", [_epoch(1, 200.0), _epoch(2, 150.0)])
    _write(runs, "bbbb", "preempted", [])  # no epoch yet: not drawn
    png = tmp_path / "curves.png"
    assert main(["--runs-dir", str(runs), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "wrote" in capsys.readouterr().err
    empty = tmp_path / "empty"
    _write(empty, "cccc", "preempted", [])
    assert main(["--runs-dir", str(empty), "--plot", str(tmp_path / "none.png")]) == 0
    assert not (tmp_path / "none.png").exists() and "no run has finished an epoch" in capsys.readouterr().err


def test_a_paper_runs_target_is_the_paper_valid_ppl_of_the_rows_it_is_registered_for(tmp_path):
    """A paper-scale run's target: its config hash in a table's paper registration (the rows its cell serves), and
    those rows' paper validation PPL in the table's config, final-stage rows only. None at lite, for a hash no table
    registered, for rows without a validation PPL, or where two tables disagree."""
    from omegaconf import OmegaConf
    from repdegen.reproduce.runs.status import paper_valid_targets

    conf, tables = tmp_path / "conf", tmp_path / "tables"
    conf.mkdir()
    OmegaConf.save(OmegaConf.create({"rows": [
        {"group": "Small", "label": "MLE", "paper": {"valid_ppl": 92.6}},
        {"group": "Small, first session", "label": "MLE", "stage": "session1", "paper": {"valid_ppl": 1.0}},
        {"label": "RE", "paper": {"test_ppl": 97.6}}, {"label": "AWD", "paper": {"valid_ppl": 68.6}},
        {"label": "AWD + cache", "stage": "cache", "paper": {"valid_ppl": 53.8}}]}), conf / "t1.yaml")

    def register(table, cells):
        (tables / table / "paper").mkdir(parents=True, exist_ok=True)
        (tables / table / "paper" / "registration.json").write_text(json.dumps(
            {"table": table, "scale": "paper", "claims": {}, "cells": {h: {"rows": r} for h, r in cells.items()}}))

    register("t1", {"h1": ["Small / MLE", "Small, first session / MLE"], "h2": ["RE"], "h3": ["AWD", "AWD + cache"]})

    def target(h, scale="paper"):
        return paper_valid_targets({"scale": scale, "config_hash": h}, tables, conf)

    assert target("h1") == 92.6  # not the first-session row's number
    assert target("h3") == 68.6  # the final stage's, not the cache row's
    assert target("h1", scale="lite") is None and target("h2") is None and target("nope") is None
    OmegaConf.save(OmegaConf.create({"rows": [{"label": "Other", "paper": {"valid_ppl": 90.0}}]}), conf / "t2.yaml")
    register("t2", {"h1": ["Other"]})
    assert target("h1") is None  # two tables disagree: no line
    (tables / "t2" / "paper" / "registration.json").write_text("{truncated")
    assert target("h1") == 92.6  # an unreadable registration gives no line, not a crash


def test_a_run_before_its_first_epoch_says_since_when_it_trains(tmp_path, capsys):
    """A record with no epoch yet (what a start writes) is listed with the time since its latest start."""
    import datetime as dt

    from repdegen.reproduce.runs.status import since_start

    run = _write(tmp_path, "aaaa", "running", [])
    rec = json.loads((run / "result.json").read_text())
    at = dt.datetime(2026, 1, 2, 3, 4, 5)
    rec["starts"] = [{"at": "2026-01-01T00:00:00"}, {"at": at.isoformat()}]
    (run / "result.json").write_text(json.dumps(rec))
    assert since_start(rec, now=at + dt.timedelta(seconds=90)) == 90.0  # the latest start counts
    assert since_start({"starts": [{"at": "not a time"}]}) is None and since_start({}) is None
    assert main(["--runs-dir", str(tmp_path)]) == 0
    assert "no epoch finished yet (started " in capsys.readouterr().out


def test_the_listing_shows_a_paper_runs_target_beside_its_valid_ppl(tmp_path, capsys):
    """The committed inan2017_t1 paper registration names d38a88348281a57e for the small VD-LSTM row, whose paper
    validation PPL (conf/table/inan2017_t1.yaml) is 92.6; a lite run of the same hash gets no such number."""
    from pathlib import Path

    tables = Path(__file__).resolve().parents[1] / "results" / "tables"
    _write(tmp_path, "d38a88348281a57e", "running", [_epoch(1, 208.8)])
    _write(tmp_path, "ffff", "running", [_epoch(1, 300.0)], scale="lite")
    assert main(["--runs-dir", str(tmp_path), "--tables-dir", str(tables)]) == 0
    out = capsys.readouterr().out
    assert "valid PPL 208.80 (the paper's final: 92.60), best" in out
    assert "valid PPL 300.00, best" in out


def test_a_nan_validation_loss_is_never_a_new_best():
    """keep_if_best: a NaN validation NLL saves nothing (``NaN >= best`` is False, so a test of ``val >= best`` would
    keep it, and every later epoch would then beat a NaN best)."""
    from repdegen.reproduce.engine.stages import Stages

    assert Stages.keep_if_best(None, float("nan"), 5.0, "best.pt") is False
    assert Stages.keep_if_best(None, 5.0, 5.0, "best.pt") is False
