"""Bad inputs, broken files, full disks and concurrent tables, driven through the real entry points:
each gives one ``repdegen: error:`` line naming the bad value or file (exit status 2), and leaves what
was written before as it was (the ledger is hashed before and after)."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from repdegen.reproduce.errors import EXIT_USER_ERROR, ConfigError, as_user_error, condense_hydra_error, exit_on_user_error
from repdegen.reproduce.settings.config import CONF_DIR, compose_config, config_hash, finalize

REPO = Path(__file__).resolve().parents[1]
RUN = ("model=vd_lstm_small", "dataset=ptb", "objective=mle", "scale=smoke", "trainer.progress=false")


def tree_hash(root: Path) -> str:
    """Every file under ``root`` (path and bytes), but the lock files' holder notes."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != ".lock":
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def one_error_line(err: str, *names: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("repdegen: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def call_entry(fn, app, capsys) -> str:
    """Run an entry function as its ``main`` does; its exit status must be 2; return stderr."""
    with pytest.raises(SystemExit) as stop:
        exit_on_user_error(fn)(app)
    assert stop.value.code == EXIT_USER_ERROR
    return capsys.readouterr().err


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    """A complete smoke run on the tiny corpus: (output dir, its config, its run directory)."""
    from repdegen.reproduce.train import train

    out = tmp_path_factory.mktemp("trained") / "out"
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose_config([*RUN, f"paths.output_dir={out}", f"dataset.data_dir={tiny_data}"])
    record = train(cfg)
    assert record["status"] == "complete"
    return out, cfg, out / "runs" / record["config_hash"]


@pytest.fixture
def run_copy(trained, tmp_path):
    """A copy of the trained output dir (its config pointing at the copy) to damage."""
    out, cfg, run_dir = trained
    shutil.copytree(out, tmp_path / "out")
    cfg = OmegaConf.merge(cfg, {"paths": {"output_dir": str(tmp_path / "out")}})
    return tmp_path / "out", cfg, tmp_path / "out" / "runs" / run_dir.name


def set_status(run_dir: Path, status: str) -> None:
    record = json.loads((run_dir / "result.json").read_text())
    record["status"] = status
    (run_dir / "result.json").write_text(json.dumps(record))


# ---- a required value left out --------------------------------------------------------------------------
@pytest.mark.parametrize("entry", ["analyze", "translate"])
def test_no_checkpoint_is_one_line(entry, capsys):
    import repdegen.reproduce.analyze as analyze_mod
    import repdegen.reproduce.translate as translate_mod

    fn = analyze_mod.analyze if entry == "analyze" else translate_mod.run
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose(f"{entry}_app", overrides=["device=cpu"] + (["input=x.txt"] if entry == "translate" else []))
    one_error_line(call_entry(fn, app, capsys), "checkpoint=", "outputs/runs/<hash>")


def test_hydra_errors_are_one_line_and_exit_2(tmp_path):
    """Hydra's own errors (an unknown key, an unknown option, the override grammar) exit as every user error."""
    for args, name in ((["objective=cosreg", "objective.gama=1"], "gama"), (["model=nope"], "model/nope"),
                       (["trainer.batch_size=abc"], "abc")):
        out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.train", *args, f"paths.output_dir={tmp_path}",
                              f"hydra.run.dir={tmp_path}/h"], cwd=REPO, capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert out.returncode == EXIT_USER_ERROR, out.stderr
        one_error_line(out.stderr, name)
    assert not (tmp_path / "runs").exists()


def test_condensed_hydra_messages_say_what_to_do():
    class Fake(Exception):
        pass

    msg = condense_hydra_error(Fake("In 'config': Could not find 'model/nope'\n\nAvailable options in 'model':\n"
                                    "\tawd_lstm\n\tschema_lstm_lm\n\tvd_lstm_small\nConfig search path:\n"
                                    "\tprovider=hydra, path=pkg://hydra.conf\n"))
    assert "\n" not in msg and "awd_lstm, vd_lstm_small" in msg and "schema_" not in msg and "pick one" in msg
    msg = condense_hydra_error(Fake("In 'table_app': Could not find 'scale/papr'\n\nAvailable options in 'scale':\n"
                                    "\tbase_scale\n\tlite\n\tpaper\n\tsmoke\n"))
    assert "the options of scale are lite, paper, smoke" in msg and "base_scale" not in msg


# ---- corrupt ledger entries -----------------------------------------------------------------------------
def table_app(tmp_path: Path, tiny_data: Path, *extra: str):
    app = compose("table_app", overrides=["table=inan2016_t1", "scale=smoke", f"paths.output_dir={tmp_path}/out",
                                         f"paths.tables_dir={tmp_path}/tables", "launch.backend=inline", "progress=false",
                                         *extra])
    app.overrides = [f"dataset.data_dir={tiny_data}", "trainer.progress=false"]
    return app


@pytest.mark.parametrize("content", ['{"status": "comp', "[1, 2]"], ids=["truncated", "list"])
def test_render_only_names_a_corrupt_record_and_changes_nothing(content, tmp_path, tiny_data, capsys):
    from repdegen.reproduce.runs.cells import expand_cells
    from repdegen.reproduce.runs.tables import run_tables

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = table_app(tmp_path, tiny_data, "render_only=true")
        cells = expand_cells(app)
        bad = Path(app.paths.runs_dir) / cells[0].config_hash / "result.json"
        bad.parent.mkdir(parents=True)
        bad.write_text(content)
        before = tree_hash(tmp_path / "out")
        line = one_error_line(call_entry(lambda a: run_tables([a]), app, capsys), str(bad), "without render_only=true")
    assert "truncated" in line or "list" in line
    assert tree_hash(tmp_path / "out") == before and not (tmp_path / "tables").exists()


def test_a_corrupt_record_is_moved_aside_and_its_run_continues(run_copy, capsys):
    from repdegen.reproduce.train import train

    out, cfg, run_dir = run_copy
    (run_dir / "result.json").write_text('{"status": "comp')
    before = tree_hash(out)
    # without trainer.resume: nothing changes, and the message says how to go on
    with pytest.raises(SystemExit) as stop:
        exit_on_user_error(train)(cfg)
    assert stop.value.code == EXIT_USER_ERROR
    one_error_line(capsys.readouterr().err, str(run_dir / "result.json"), "trainer.resume=true")
    assert tree_hash(out) == before
    # on request (trainer.resume=true): moved aside, kept byte for byte, and the run written anew
    record = train(OmegaConf.merge(cfg, {"trainer": {"resume": True}}))
    assert record["status"] == "complete"
    kept = list(run_dir.glob("result.corrupt-*.json"))
    assert len(kept) == 1 and kept[0].read_text() == '{"status": "comp'
    assert "moved it to result.corrupt-" in capsys.readouterr().err


# ---- corrupt checkpoints and weights --------------------------------------------------------------------
def test_a_truncated_checkpoint_is_named_before_anything_is_written(run_copy, capsys):
    from repdegen.reproduce.train import train

    out, cfg, run_dir = run_copy
    set_status(run_dir, "preempted")
    ckpt = run_dir / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:200])
    before = tree_hash(out)
    line = one_error_line(call_entry(train, OmegaConf.merge(cfg, {"trainer": {"resume": True}}), capsys), str(ckpt))
    assert "mv " in line and "start this run over" in line
    assert tree_hash(out) == before


def test_analyze_a_truncated_best_pt_names_it_and_the_other_weights(run_copy, capsys):
    from repdegen.reproduce.analyze import analyze

    out, _, run_dir = run_copy
    best = run_dir / "best.pt"
    best.write_bytes(best.read_bytes()[:200])
    before = tree_hash(out)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose("analyze_app", overrides=[f"checkpoint={run_dir}", "device=cpu"])
    line = one_error_line(call_entry(analyze, app, capsys), str(best))
    assert f"checkpoint={run_dir / 'checkpoint.pt'}" in line
    assert tree_hash(out) == before and not (run_dir / "analysis").exists()


# ---- disks --------------------------------------------------------------------------------------------
def test_a_full_disk_is_one_line_and_leaves_no_temporary_file(compose_cfg, tmp_path, monkeypatch, capsys):
    import shutil as shutil_mod

    import torch
    from repdegen.reproduce.train import train

    real_save = torch.save

    def save_half(obj, f, *a, **k):  # what torch.save does on a full disk: a partial file, then an error
        real_save(obj, f, *a, **k)
        if isinstance(f, (str, Path)) and "corpora" in str(f):
            Path(f).write_bytes(Path(f).read_bytes()[:100])
            raise RuntimeError("basic_ios::clear: iostream error")

    Usage = type(shutil_mod.disk_usage("/"))
    monkeypatch.setattr(torch, "save", save_half)
    monkeypatch.setattr(shutil_mod, "disk_usage", lambda p: Usage(10**6, 10**6, 0))
    cfg = compose_cfg(*RUN)
    line = one_error_line(call_entry(train, cfg, capsys), "no space left", str(tmp_path / "out" / "cache" / "corpora"))
    assert "paths.output_dir" in line
    assert not [p for p in (tmp_path / "out").rglob("*") if ".tmp" in p.name]


def test_a_read_only_directory_is_one_line(compose_cfg, tmp_path, monkeypatch, capsys):
    from repdegen.reproduce.runs import ledger as ledger_mod
    from repdegen.reproduce.train import train

    def read_only(self, h):
        raise PermissionError(errno.EROFS, "Read-only file system", str(self.run_dir(h)))

    monkeypatch.setattr(ledger_mod.Ledger, "lock", read_only)
    line = one_error_line(call_entry(train, compose_cfg(*RUN), capsys), str(tmp_path / "out" / "runs"), "Read-only")
    assert "paths.output_dir" in line


def test_os_errors_that_are_not_the_users_stay_bugs():
    assert as_user_error(OSError(errno.EBADF, "Bad file descriptor")) is None
    assert as_user_error(KeyError("x")) is None


# ---- stray temporary files ------------------------------------------------------------------------------
def test_the_next_start_removes_what_a_killed_write_left(run_copy, capsys):
    import socket

    from repdegen.reproduce.train import train

    out, cfg, run_dir = run_copy
    set_status(run_dir, "preempted")
    for name in (".best.pt.abc123.tmp", ".checkpoint.pt.x.tmp", ".cell.yaml.y.tmp"):
        (run_dir / name).write_bytes(b"half")
    host = socket.gethostname().replace("-", "_").replace(".", "_")
    corpora = out / "cache" / "corpora"
    cache = next(corpora.glob("ptb-*.pt"))
    dead = cache.with_name(f"{cache.name}.{host}-999999999.tmp")
    live = cache.with_name(f"{cache.name}.{host}-{os.getpid()}.tmp")
    dead.write_bytes(b"half")
    live.write_bytes(b"being written")
    assert train(OmegaConf.merge(cfg, {"trainer": {"resume": True}}))["status"] == "complete"
    assert sorted(p.name for p in run_dir.glob(".*.tmp")) == [".cell.yaml.y.tmp"]  # the table's, not the run's
    assert not dead.exists() and live.exists()
    assert "removed 2 temporary file(s)" in capsys.readouterr().out


# ---- the weight-tying message at smoke --------------------------------------------------------------------
def test_the_tying_error_names_the_users_widths_and_its_fix_works(compose_cfg):
    over = ("model=vd_lstm_small", "objective=real", "scale=smoke")
    with pytest.raises(ConfigError) as err:
        finalize(compose_cfg(*over, "model.embedding_size=50"))
    assert "embedding_size=50 and hidden_size=200" in str(err.value) and "model.embedding_size=200" in str(err.value)
    finalize(compose_cfg(*over, "model.embedding_size=200"))  # the fix it suggests


# ---- the table's overrides= syntax ------------------------------------------------------------------------
def test_table_overrides_list_syntax():
    from repdegen.reproduce.table import split_cell_args

    for arg in ("overrides=[trainer.device=cpu,model.foo=[1,2]]", 'overrides=["trainer.device=cpu","model.foo=[1,2]"]'):
        own, cell = split_cell_args(["table=x", arg])
        assert own == ["table=x"] and cell == ["trainer.device=cpu", "model.foo=[1,2]"]


# ---- concurrent tables ------------------------------------------------------------------------------------
def test_a_rendering_is_never_replaced_by_a_less_complete_one(tmp_path, tiny_data, monkeypatch, capsys):
    import repdegen.reproduce.results.table_render as table_mod
    from repdegen.reproduce.runs.cells import expand_cells

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = table_app(tmp_path, tiny_data, "render_only=true")
        cells = expand_cells(app)
    out = Path(app.paths.tables_dir) / "inan2016_t1" / "smoke"
    hashes = [c.config_hash for c in cells]

    def fake_render(app, rows, records, ledger=None):
        out.mkdir(parents=True, exist_ok=True)
        (out / "cells.json").write_text(json.dumps({"cells": [{"config_hash": r["config_hash"], "status": "complete"}
                                                              for r in records]}))
        return out

    monkeypatch.setattr(table_mod, "render", fake_render)
    for complete in (hashes, hashes[:-1]):  # all complete, then (a process that read the ledger earlier) one less
        monkeypatch.setattr(table_mod, "collect_rows", lambda *a, c=complete: ([], [{"config_hash": h} for h in c]))
        table_mod.render_latest(app, cells, None)
    assert table_mod.complete_hashes(out / "cells.json") == set(hashes)
    assert "already holds a more complete rendering" in capsys.readouterr().out
    # a ledger that lost one cell's record (a fresh work tree) and gained none: still not replaced; nor when the
    # rendering had fewer cells but one this ledger lacks (it would drop that result while adding others)
    (out / "cells.json").write_text(json.dumps({"cells": [{"config_hash": h, "status": "complete"} for h in hashes[:2]]}))
    monkeypatch.setattr(table_mod, "collect_rows", lambda *a: ([], [{"config_hash": h} for h in hashes[1:]]))
    assert table_mod.render_latest(app, cells, None) is None
    assert table_mod.complete_hashes(out / "cells.json") == set(hashes[:2])
    msg = capsys.readouterr().out
    assert f"[{hashes[0]}]" in msg and "left it as it is" not in msg and "copy their run records back" in msg
    monkeypatch.setattr(table_mod, "collect_rows", lambda *a: ([], [{"config_hash": h} for h in hashes]))
    table_mod.render_latest(app, cells, None)  # the lacking cell is back: the fuller rendering replaces it
    assert table_mod.complete_hashes(out / "cells.json") == set(hashes)
    # a cell of the rendering whose config has changed since (another hash: not a cell of the table now) is no loss
    (out / "cells.json").write_text(json.dumps({"cells": [{"config_hash": h, "status": "complete"}
                                                          for h in [*hashes, "0123456789abcdef"]]}))
    table_mod.render_latest(app, cells, None)
    assert table_mod.complete_hashes(out / "cells.json") == set(hashes)


def test_a_cell_trained_elsewhere_is_waited_for_not_failed(trained, tmp_path, capsys):
    from repdegen.reproduce.runs.cell_progress import Job
    from repdegen.reproduce.runs.launch import LaunchConfig, LocalScheduler, write_cell_config
    from repdegen.reproduce.runs.ledger import Ledger

    out, cfg, run_dir = trained
    cfg = finalize(cfg)
    h = config_hash(cfg)
    path = write_cell_config(cfg, h, out / "runs")
    job = Job(h, "the cell", path, tmp_path / "train.log")
    launch = OmegaConf.structured(LaunchConfig(poll_seconds=0.2))
    result = {}
    with Ledger(out / "runs").lock(h):  # "another process" trains it
        thread = threading.Thread(target=lambda: result.update(LocalScheduler([job], launch, progress=False).run()))
        thread.start()
        for _ in range(100):
            if job.status == "elsewhere":
                break
            time.sleep(0.1)
        assert job.status == "elsewhere" and job.started is None
    thread.join(timeout=120)
    assert result == {h: "complete"}  # once the lock is free: started here, found complete
    printed = capsys.readouterr().out
    assert "running elsewhere; waiting for it" in printed and "[0/1 done" in printed and "[1/1 done" in printed
    assert "failed" not in printed


def test_cells_die_with_a_killed_table_process(tmp_path):
    """A cell process gets SIGTERM (it checkpoints and exits; the next run resumes it) when the
    scheduler that started it is killed, even by SIGKILL."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from repdegen.reproduce.runs.launch import _die_with_parent\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True,"
        " preexec_fn=_die_with_parent())\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n")], cwd=REPO, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:  # a zombie waiting for init to reap it counts as gone
            if f.read().split(")")[-1].split()[0] == "Z":
                break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the cell outlived its table process")


# ---- progress in a log ----------------------------------------------------------------------------------
def test_progress_in_a_log_is_lines_not_carriage_returns():
    from repdegen.reproduce.engine.progress import progress_bar

    log = io.StringIO()
    bar = progress_bar(total=200, desc="train epoch 1", unit="update", file=log, min_seconds=0)
    for _ in range(200):
        bar.update(1)
    bar.set_postfix(loss="1.000")
    bar.close()
    text = log.getvalue()
    assert "\r" not in text and 10 <= text.count("\n") <= 11 and "train epoch 1: 200/200 (100%)" in text


# ---- what Hydra lets through without a word -------------------------------------------------------------
@pytest.mark.parametrize("override,name,near", [
    ("experiment=inan2017/smal", "experiment=inan2017/smal does not exist", "experiment=inan2017/small"),
    ("scale=base_scale", "scale=base_scale is the schema", "scale=lite"),
    ("model=schema_lstm_lm", "model=schema_lstm_lm is the schema", "ls conf/model"),
])
def test_an_optional_group_typo_or_a_schema_is_refused_not_run(override, name, near):
    """``optional experiment`` skips an option that does not exist (the defaults would train under the misspelled
    name), and a group's schema node would be taken as an option: both one error with the options nearest."""
    from repdegen.reproduce.settings.config import compose_with_choices

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        with pytest.raises(ConfigError) as err:
            compose_with_choices([override, "scale=smoke"] if not override.startswith("scale=") else [override])
    assert name in str(err.value) and near in str(err.value)


@pytest.mark.parametrize("override,message", [
    ("+trainer.foo=1", "trainer.foo is not a setting of trainer (TrainerConfig): remove it"),
    ("+trainer.max_epoch=3", "did you mean trainer.max_epochs?"),
    ("+trainer.analysis.geometry_evry=3", "did you mean trainer.analysis.geometry_every"),
    ("+objective.alpah=1", "did you mean objective.alpha?"),
    ("trainer.stop_after_epochs=-1", "trainer.stop_after_epochs=-1 is outside its domain"),
    ("optim.betas=[2.0]", "optim.betas=[2.0]: expected two numbers in [0, 1)"),
    ("optim.betas=[0.9,1.0]", "set optim.betas=[0.9,0.999]"),
])
def test_appended_keys_and_unchecked_values_are_refused(compose_cfg, override, message):
    """A key appended with ``+`` to a section with a schema (no code reads it; it would change the hash), and values
    whose domains were not declared before: one ConfigError naming the key and the fix."""
    extra = ["optim=adam"] if "betas" in override else []
    with pytest.raises(ConfigError, match=None) as err:
        finalize(compose_cfg(*RUN, "objective=al" if "objective" in override else "objective=mle", *extra, override))
    assert message in str(err.value)


def test_an_unknown_key_names_the_nearest_setting_not_the_plus_form():
    class Fake(Exception):
        pass

    msg = condense_hydra_error(Fake("Could not override 'trainer.max_epoch'.\nTo append to your config use "
                                    "+trainer.max_epoch=1\nKey 'max_epoch' not in 'TrainerConfig'\n"
                                    "    full_key: trainer.max_epoch\n    object_type=TrainerConfig"))
    assert "did you mean trainer.max_epochs?" in msg and "+trainer" not in msg and "\n" not in msg


@pytest.mark.parametrize("override,message", [
    ("launch.parallel=0", "launch.parallel=0 is outside its domain: expected an integer > 0 (cells at a time on the "
                          "CPU, each given cores / N threads); set launch.parallel=<a value in it>, e.g. launch.parallel=1"),
    ("launch.poll_seconds=0", "launch.poll_seconds=0.0 is outside its domain: expected a number > 0"),
    ("launch.grace_seconds=-1", "launch.grace_seconds=-1.0 is outside its domain: expected a number >= 0"),
    ("launch.backend=bogus", "launch.backend='bogus' is not one of auto, local, slurm, inline; set launch.backend="),
    ("launch.gpus=[0,-1]", "expected a non-empty list of GPU ids >= 0"),
    ("launch.gpus=[]", "expected a non-empty list of GPU ids >= 0"),
])
def test_launch_settings_are_checked_before_anything_is_registered(override, message, tmp_path, tiny_data):
    from repdegen.reproduce.runs.tables import run_table

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = table_app(tmp_path, tiny_data, override)
        with pytest.raises(ConfigError) as err:
            run_table(app)
    assert message in str(err.value)
    assert not (tmp_path / "tables").exists() and not (tmp_path / "out").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_a_missing_device_is_an_error_before_the_run_directory_exists(compose_cfg, tmp_path):
    from repdegen.reproduce.train import train

    with pytest.raises(ConfigError, match="trainer.device=cuda but no CUDA device is available"):
        train(compose_cfg(*RUN, "trainer.device=cuda"))
    assert not (tmp_path / "out" / "runs").exists() or not any((tmp_path / "out" / "runs").iterdir())


@pytest.mark.parametrize("argv,bad", [(["--bogus"], "--bogus"), (["--max-epochs", "3"], "--max-epochs"),
                                      (["--cfg", "job", "--nope=1"], "--nope=1"), (["-x"], "-x")])
def test_an_unknown_option_is_one_line_not_argparse_usage(argv, bad, capsys):
    from repdegen.reproduce.errors import check_flags

    with pytest.raises(SystemExit) as ex:
        check_flags(argv)
    err = capsys.readouterr().err
    assert ex.value.code == EXIT_USER_ERROR and err.count("\n") == 1 and f"unknown option {bad!r}" in err
    assert "key=value overrides" in err


def test_hydras_own_flags_and_overrides_pass_the_option_check():
    from repdegen.reproduce.errors import check_flags

    for argv in (["--help"], ["--cfg", "job", "scale=smoke"], ["-c", "hydra"], ["-m", "objective=mle,al"],
                 ["--config-name=config", "-p", "trainer"], ["--info"], ["--info", "config"], ["~trainer.gpus"],
                 ["+trainer.analysis.groups=true", "hydra/launcher=submitit_slurm"]):
        check_flags(argv)  # no SystemExit
