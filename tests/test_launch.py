"""The scheduler (repdegen.reproduce.runs.launch) and the ledger under concurrency: cells run in their own
processes, a failing cell does not stop the others, an interrupted table continues with only its
missing cells, several tables share their cells, and concurrent writers never lose or corrupt an entry."""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from repdegen.reproduce.errors import EXIT_OK, EXIT_USER_ERROR, CorruptFile
from repdegen.reproduce.runs.cell_progress import Job
from repdegen.reproduce.runs.cells import expand_cells, parse_table_names
from repdegen.reproduce.runs.launch import LaunchConfig, LocalScheduler
from repdegen.reproduce.runs.ledger import Ledger, RunLocked
from repdegen.reproduce.runs.slurm import SubmititScheduler
from repdegen.reproduce.runs.tables import run_table, run_tables
from repdegen.reproduce.settings.config import CONF_DIR, compose_config

REPO = Path(__file__).resolve().parents[1]


def compose_app(table: str, tmp_path: Path, data_dir: Path, *extra: str):
    app = compose("table_app", overrides=[f"table={table}", "scale=smoke", f"paths.output_dir={tmp_path}/out",
                                         f"paths.tables_dir={tmp_path}/tables", "progress=false", *extra])
    app.overrides = [f"dataset.data_dir={data_dir}", "trainer.progress=false"]
    return app


def headers(log: Path) -> int:
    """Attempts recorded in a cell's log (one header line per start)."""
    return log.read_text().count("===== repdegen:") if log.is_file() else 0


def test_local_backend_isolates_a_failing_cell(tiny_data, tmp_path, capsys):
    """Each cell is a process; one that diverges fails alone, with its log path, and the exit
    status says the table is incomplete."""
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose_app("inan2016_t1", tmp_path, tiny_data, "launch.backend=local")
        app.table.rows[1].overrides = [*app.table.rows[1].overrides, "optim.lr=1e30", "optim.clip_grad_norm=null"]
        cells = expand_cells(app)
        assert run_table(app) == 1
    out = capsys.readouterr()
    ledger = Ledger(app.paths.runs_dir)
    statuses = sorted(ledger.is_complete(c.config_hash) for c in cells)
    assert statuses == [False, True, True, True]
    bad = next(c for c in cells if not ledger.is_complete(c.config_hash))
    log = ledger.run_dir(bad.config_hash) / "train.log"
    # lr 1e30 diverges either in training (a NaN loss) or at validation (a finite loss, a model predicting
    # nothing), depending on float summation order (thread count): both are the divergence path
    text = log.read_text()
    assert f"log: {log}" in out.err and ("diverged" in text or "became NaN or infinite" in text)
    assert headers(log) == 1
    md = (Path(app.paths.tables_dir) / "inan2016_t1" / "smoke" / "table.md").read_text()
    assert "(failed)" in md


def test_interrupted_table_resumes_only_the_missing_cells(tiny_data, tmp_path):
    """Ctrl-C on `repdegen.reproduce.table` stops the running cell; the same command again runs only the
    cells that had not completed, and the table completes."""
    cmd = [sys.executable, "-m", "repdegen.reproduce.table", "table=inan2016_t1", "scale=smoke", "scale.max_epochs=3",
           f"paths.output_dir={tmp_path}/out", f"paths.tables_dir={tmp_path}/tables", f"hydra.run.dir={tmp_path}/h",
           f"dataset.data_dir={tiny_data}", "trainer.progress=false", "progress=false", "launch.grace_seconds=30"]
    runs = tmp_path / "out" / "runs"
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not any(Ledger(runs).is_complete(p.name) for p in runs.glob("*") if p.is_dir()):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    first, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, first[-3000:]
    ledger = Ledger(runs)
    done_before = {p.name for p in runs.glob("*") if ledger.is_complete(p.name)}
    cell_dirs = {p.name for p in runs.glob("*") if (p / "cell.yaml").is_file()}
    assert len(cell_dirs) == 4 and 1 <= len(done_before) < 4, first[-3000:]
    mtimes = {h: (runs / h / "result.json").stat().st_mtime_ns for h in done_before}

    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"4 cells, {len(done_before)} already complete, {4 - len(done_before)} to run" in second.stdout
    for h in cell_dirs - done_before:  # the stopped cell ran twice, the others once
        assert ledger.is_complete(h) and headers(runs / h / "train.log") in (1, 2)
    for h in done_before:  # finished cells were not touched again
        assert (runs / h / "result.json").stat().st_mtime_ns == mtimes[h]
        assert headers(runs / h / "train.log") == 1


def test_tables_share_their_cells_and_lists_parse(tiny_data, tmp_path, capsys):
    """Two tables asked for together: a cell both need runs once; `all` and lists name tables."""
    assert parse_table_names("all") == sorted(p.stem for p in (CONF_DIR / "table").glob("*.yaml"))
    assert parse_table_names("[inan2017_t1, gao2019_t1]") == ["inan2017_t1", "gao2019_t1"]
    with pytest.raises(Exception, match="nope.*is not a table"):
        parse_table_names("inan2017_t1,nope")
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        a = compose_app("inan2016_t1", tmp_path, tiny_data, "launch.backend=inline")
        b = compose_app("inan2016_t1", tmp_path, tiny_data, "launch.backend=inline")
        b.table.name = "inan2016_t1_copy"  # the same cells under another name
        assert run_tables([a, b]) == 0
    out = capsys.readouterr().out
    assert "4 cells, 0 already complete, 4 to run" in out and "2 tables, 4 distinct cells: 4 complete" in out
    for name in ("inan2016_t1", "inan2016_t1_copy"):
        assert (tmp_path / "tables" / name / "smoke" / "table.md").is_file()


def test_table_cli_exit_status_for_an_unknown_table(tmp_path):
    out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.table", "table=inan2017_t1,nope",
                          f"hydra.run.dir={tmp_path}/h"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "nope" in out.stderr and "Traceback" not in out.stderr


def test_gpu_scheduling_hands_out_free_gpus(monkeypatch, tmp_path):
    """With 3 (pretend) GPUs: a 2-GPU cell runs under torchrun on two, a 1-GPU cell beside it on the
    third; a cell asking for more GPUs than exist gets them all. The commands, not real GPUs, are
    checked: each fake process records what it was started with."""
    import repdegen.reproduce.runs.launch as launch

    monkeypatch.setattr(launch, "visible_gpus", lambda requested: [0, 1, 2])
    started = []

    class FakeProc:
        def __init__(self, cmd, env, **kw):
            started.append((cmd, env.get("CUDA_VISIBLE_DEVICES")))
            self.pid, self.returncode = 0, EXIT_OK

        def poll(self):
            return self.returncode

    monkeypatch.setattr(launch.subprocess, "Popen", FakeProc)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    jobs = [Job(f"h{i}", f"cell{i}", tmp_path / f"c{i}.yaml", tmp_path / f"h{i}" / "train.log", gpus=g)
            for i, g in enumerate((2, 1, 8))]
    launch_cfg = LaunchConfig(poll_seconds=0.01)
    status = LocalScheduler(jobs, launch_cfg, progress=False).run()
    assert set(status.values()) == {"complete"}
    assert started[0][1] == "0,1" and "torch.distributed.run" in started[0][0] and "--nproc_per_node=2" in started[0][0]
    assert started[1][1] == "2" and "torch.distributed.run" not in started[1][0]
    assert started[2][1] == "0,1,2" and "--nproc_per_node=3" in started[2][0]


def fake_popen(monkeypatch, launch, record):
    """Replaces the scheduler's Popen by a process that ends after 3 polls: (started, live), the ``record(cmd, env)``
    of every start and the fake processes, each with ``peak``, how many were running when it started."""
    started, live = [], []

    class FakeProc:
        def __init__(self, cmd, env, **kw):
            started.append(record(cmd, env))
            self.pid, self.returncode, self.polls = 0, None, 0
            live.append(self)
            self.peak = sum(p.returncode is None for p in live)

        def poll(self):
            self.polls += 1
            if self.polls > 3:
                self.returncode = EXIT_OK
            return self.returncode

    monkeypatch.setattr(launch.subprocess, "Popen", FakeProc)
    return started, live


def test_a_repeated_gpu_id_is_a_slot_and_a_multi_gpu_cell_gets_distinct_ids(monkeypatch, tmp_path):
    """launch.gpus=[0,0,1] (several small cells on one GPU): three 1-GPU cells
    start at once, two on GPU 0 and one on GPU 1; a 2-GPU cell gets GPUs 0 and 1, never "0,0"; a 3-GPU cell on
    these two distinct GPUs gets both."""
    import repdegen.reproduce.runs.launch as launch

    monkeypatch.setattr(launch, "visible_gpus", lambda requested: list(requested))
    started, live = fake_popen(monkeypatch, launch, lambda cmd, env: (cmd, env.get("CUDA_VISIBLE_DEVICES")))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    jobs = [Job(f"h{i}", f"cell{i}", tmp_path / f"c{i}.yaml", tmp_path / f"h{i}" / "train.log", gpus=g)
            for i, g in enumerate((1, 1, 1, 2, 3))]
    status = LocalScheduler(jobs, LaunchConfig(poll_seconds=0.01, gpus=[0, 0, 1]), progress=False).run()
    assert set(status.values()) == {"complete"}
    assert [dev for _, dev in started[:3]] == ["0", "0", "1"] and max(p.peak for p in live[:3]) == 3
    assert started[3][1] == "0,1" and "--nproc_per_node=2" in started[3][0]
    assert started[4][1] == "0,1" and "--nproc_per_node=2" in started[4][0]
    assert launch.take_distinct([0, 0, 1, 1], 2) == ([0, 1], [0, 1])
    assert launch.take_distinct([0, 0], 1) == ([0], [0])
    assert launch.take_distinct([0, 0, 1, 1], 1) == ([0], [0, 1, 1])  # then GPU 1, which has more free slots now
    assert launch.take_distinct([0, 1, 1], 1) == ([1], [0, 1])
    assert launch.take_distinct([2, 0, 1, 1, 2, 2], 2) == ([1, 2], [0, 1, 2, 2])
    launch.validate_launch(OmegaConf.structured(LaunchConfig(gpus=[0, 0, 1])))  # repeated ids: slots, accepted
    launch.validate_launch(LaunchConfig(gpus=[0, 0]))  # the dataclass too


def test_parallel_cpu_cells_share_the_cores(monkeypatch, tmp_path):
    """launch.parallel=2 without GPUs: two cells start at once, each told to use half of the cores
    (OMP_NUM_THREADS), unless the user set OMP_NUM_THREADS; one cell at a time keeps torch's default."""
    import repdegen.reproduce.runs.launch as launch

    monkeypatch.setattr(launch, "visible_gpus", lambda requested: [])
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    started, live = fake_popen(monkeypatch, launch, lambda cmd, env: env.get("OMP_NUM_THREADS"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def jobs(tag):
        return [Job(f"{tag}{i}", f"cell{i}", tmp_path / f"{tag}{i}.yaml", tmp_path / f"{tag}{i}" / "train.log")
                for i in range(4)]

    status = LocalScheduler(jobs("a"), LaunchConfig(poll_seconds=0.01, parallel=2), progress=False).run()
    assert set(status.values()) == {"complete"}
    assert started == ["2"] * 4 and max(p.peak for p in live) == 2
    started.clear(), live.clear()
    LocalScheduler(jobs("b"), LaunchConfig(poll_seconds=0.01), progress=False).run()
    assert started == [None] * 4 and max(p.peak for p in live) == 1
    started.clear(), live.clear()
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    LocalScheduler(jobs("c"), LaunchConfig(poll_seconds=0.01, parallel=2), progress=False).run()
    assert started == ["3"] * 4


def test_submitit_backend_runs_cells_with_its_local_executor(tiny_data, tmp_path):
    """The SLURM path (one submitit job per cell) through submitit's local executor: jobs are
    submitted, waited for, and their results land in the ledger."""
    pytest.importorskip("submitit")
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose_app("inan2016_t1", tmp_path, tiny_data)
        cells = expand_cells(app)[:2]
    from repdegen.reproduce.runs.launch import jobs_for

    jobs = jobs_for(cells, app.paths.runs_dir)
    sched = SubmititScheduler(jobs, LaunchConfig(poll_seconds=0.5), {"_cluster": "local", "timeout_min": 10},
                              tmp_path / "submitit", progress=False)
    status = sched.run()
    assert set(status.values()) == {"complete"}, [j.log_path.read_text()[-2000:] for j in jobs if j.log_path.is_file()]
    ledger = Ledger(app.paths.runs_dir)
    assert all(ledger.is_complete(c.config_hash) for c in cells)


def test_run_cell_exit_status_names_a_bad_config(tmp_path):
    cfg = tmp_path / "cell.yaml"
    cfg.write_text("model: {name: nope}\n")
    out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.runs.launch", str(cfg)], cwd=REPO, capture_output=True,
                         text=True,
                         timeout=60)
    assert out.returncode in (EXIT_USER_ERROR, 1) and out.stderr


# ---- the ledger under concurrency ---------------------------------------------------------------------
def _writer(root: str, worker: int, n: int) -> None:
    ledger = Ledger(root)
    for i in range(n):
        # each worker its own entries, and every worker rewriting one shared entry
        ledger.write(f"w{worker}-{i}", {"status": "complete", "config_hash": f"w{worker}-{i}", "config": {},
                                        "worker": worker, "i": i, "pad": "x" * 20000})
        ledger.write("shared", {"status": "complete", "config_hash": "shared", "config": {}, "worker": worker, "i": i,
                                "pad": "y" * 20000})


def _reader(root: str, seconds: float, q) -> None:
    ledger, bad, reads, end = Ledger(root), 0, 0, time.time() + seconds
    while time.time() < end:
        try:
            rec = ledger.load("shared")
        except (json.JSONDecodeError, CorruptFile):
            bad += 1
            continue
        reads += rec is not None
    q.put((bad, reads))


def test_concurrent_writers_never_lose_or_corrupt_an_entry(tmp_path):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    reader = ctx.Process(target=_reader, args=(str(tmp_path), 3.0, q))
    reader.start()
    writers = [ctx.Process(target=_writer, args=(str(tmp_path), w, 40)) for w in range(4)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(60)
        assert p.exitcode == 0
    reader.join(60)
    bad, reads = q.get(timeout=5)
    assert bad == 0 and reads > 0
    ledger = Ledger(tmp_path)
    for w in range(4):
        for i in range(40):
            assert ledger.load(f"w{w}-{i}") == {"status": "complete", "config_hash": f"w{w}-{i}", "config": {},
                                                "worker": w, "i": i, "pad": "x" * 20000}
    shared = ledger.load("shared")
    assert shared["i"] in range(40) and shared["pad"] == "y" * 20000
    assert not list(tmp_path.rglob("*.tmp"))  # no temporary files left behind


def _hold_lock(root: str, ready, release) -> None:
    with Ledger(root).lock("abc"):
        ready.set()
        release.wait(30)


def test_a_run_is_locked_while_it_trains(tmp_path):
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    holder.start()
    assert ready.wait(30)
    with pytest.raises(RunLocked, match=f"pid {holder.pid}"):
        with Ledger(tmp_path).lock("abc"):
            pass
    release.set()
    holder.join(30)
    with Ledger(tmp_path).lock("abc"):  # released with its process
        pass


def _probe_lock(root: str, ready, seconds: float) -> None:
    """What Ledger.holder() does (a shared lock, to see whether a live process holds the run), held longer."""
    import fcntl
    import os
    import time

    fd = os.open(Path(root) / "abc" / ".lock", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    ready.set()
    time.sleep(seconds)
    os.close(fd)


def test_a_status_probe_of_the_lock_does_not_make_a_start_fail(tmp_path):
    """A start that meets holder()'s momentary shared lock (a status listing, the scheduler) waits it out (up to
    ~1 s) instead of failing as "locked" by whichever process last wrote the lock file."""
    with Ledger(tmp_path).lock("abc"):  # the lock file exists, naming an earlier (now finished) holder
        pass
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    probe = ctx.Process(target=_probe_lock, args=(str(tmp_path), ready, 0.2))
    probe.start()
    assert ready.wait(30)
    with Ledger(tmp_path).lock("abc"):
        assert Ledger(tmp_path).holder("abc") is not None  # held by this process now
    probe.join(30)


@pytest.mark.parametrize("papers", [("inan", "gao"), ("yu",)])
def test_every_table_completes_at_smoke(papers, tiny_data, tmp_path):
    """`make reproduce-table TABLE=all SCALE=smoke`, on the tiny generated corpora (BPE of 60 pieces,
    3 updates per cell), through the command line and the process-per-cell scheduler, two one-thread cells at a
    time as on a 2-core machine (launch.parallel=2): every cell of every table completes and every table renders.
    Split in two (Inan and Gao's tables; Yu's), so the suite's two workers share it; the tables of one paper share
    cells, so each paper's tables stay together. (The same command on the real corpora: results/tables/*/smoke.)"""
    import shutil

    from tests.test_transformer_train import sentences, to_german, write_multi30k

    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    write_multi30k(data, sentences(200, 0), sentences(10, 1), sentences(10, 2), to_german)
    names = [n for n in parse_table_names("all") if n.startswith(papers)]
    assert names
    out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.table", f"table={','.join(names)}", "scale=smoke",
                          "progress=false", "launch.parallel=2", f"paths.output_dir={tmp_path}/out",
                          f"paths.tables_dir={tmp_path}/tables", f"hydra.run.dir={tmp_path}/h", f"dataset.data_dir={data}",
                          "dataset.bpe_vocab_size=60", "trainer.max_updates=3", "trainer.progress=false"],
                         cwd=REPO, capture_output=True, text=True, timeout=3000)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"{len(names)} tables," in out.stdout and " 0 not " in out.stdout
    for name in names:
        md = (tmp_path / "tables" / name / "smoke" / "table.md").read_text()
        assert "(failed)" not in md and "(not run)" not in md


def test_every_table_is_in_one_smoke_group():
    assert all(n.startswith(("inan", "gao", "yu")) for n in parse_table_names("all"))


def test_the_ddp_example_preset_is_the_agg_cell_of_the_yu_tables(tmp_path):
    """`torchrun ... experiment=yu2022/gpt2_medium_agg` trains the run the Yu tables' AGG rows name
    (one config hash), as one 8-GPU cell at paper scale and one GPU at lite."""
    from repdegen.reproduce.settings.config import config_hash, finalize

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        alias = finalize(compose_config(["experiment=yu2022/gpt2_medium_agg"]))
        cell = next(c for c in expand_cells(compose_app("yu2022_t3", tmp_path, tmp_path, "scale=paper"))
                    if c.cfg.objective.name == "agg")
        lite = finalize(compose_config(["experiment=yu2022/gpt2_medium_agg", "scale=lite"]))
    assert config_hash(alias) == cell.config_hash
    assert alias.objective.alpha == 0.03 and alias.trainer.gpus == 8 and lite.trainer.gpus == 1


def test_epoch_progress_line_of_a_running_cell():
    """Hand-worked: 2 of 10 epochs done in session 1 of 2, an epoch = 100 s training + 20 s validation, so at most
    (10 - 2) + 10 epochs x 120 s = 36 min left."""
    from repdegen.reproduce.runs.cell_progress import epoch_progress

    record = {"config": {"trainer": {"max_epochs": 10, "retrain_sessions": 1, "early_stopping": 5}},
              "history": [{"stage": "train", "epoch": e, "session": 1, "valid_ppl": p, "epoch_seconds": 100.0,
                           "valid_seconds": 20.0} for e, p in ((1, 200.0), (2, 150.0))]}
    assert epoch_progress(record) == ("epoch 2/10 of session 1/2, valid PPL 150.00 | 2m00s an epoch | at most 36m00s "
                                      "left, or sooner by early stopping")
    # one session, no early stopping, records from before valid_seconds existed: (13 - 4) epochs x 60 s
    train = [{"stage": "train", "epoch": 4, "valid_ppl": 130.0, "epoch_seconds": 60.0}]
    record = {"config": {"trainer": {"max_epochs": 13}}, "history": train}
    assert epoch_progress(record) == "epoch 4/13, valid PPL 130.00 | 1m00s an epoch | at most 9m00s left"
    # finetuning ahead (AWD-LSTM's finetune.py, 10 epochs at most): (13 - 4) + 10 epochs x 60 s
    record = {"config": {"trainer": {"max_epochs": 13, "finetune_epochs": 10}}, "history": train}
    assert epoch_progress(record) == ("epoch 4/13, valid PPL 130.00 | 1m00s an epoch | at most 19m00s left "
                                      "(finetuning's 10 epochs included), or sooner by finetuning's non-monotone "
                                      "trigger")
    # in finetuning (training ended at epoch 4), its epochs at 90 s: (10 - 3) x 90 s, its own validation PPL
    record["history"] = train + [{"stage": "finetune", "epoch": e, "valid_ppl": 130.0 - e, "epoch_seconds": 90.0}
                                 for e in (1, 2, 3)]
    assert epoch_progress(record) == ("epoch 4/13, finetune epoch 3/10, valid PPL 127.00 | 1m30s an epoch | at most "
                                      "10m30s left, or sooner when validation stops improving (finetuning's "
                                      "non-monotone trigger)")
    assert epoch_progress({"config": {}, "history": []}) is None


def test_a_failed_cell_shows_its_own_error_line_on_the_console(tmp_path, capsys):
    """A cell that ends with a user error (e.g. a missing corpus) prints one ``repdegen: error:`` line into its log;
    the table's console line for the failure carries that line (the last one), not only the log's path."""
    from repdegen.reproduce.runs.cell_progress import Job, Progress, last_error_line

    log = tmp_path / "train.log"
    log.write_text("repdegen: vd_lstm_small ...\nrepdegen: error: an earlier line\n"
                   "repdegen: error: dataset.data_dir=/nowhere/ptb holds no ptb.train.txt; set REPDEGEN_DATA_DIR\n")
    job = Job("abcd", "inan2017/small/mle", tmp_path / "cell.yaml", log, status="failed")
    Progress([job], 1, enabled=False).event(job, "failed (user error)")
    out = capsys.readouterr().out
    assert f"-- log: {log}\n    repdegen: error: dataset.data_dir=/nowhere/ptb holds no ptb.train.txt" in out
    assert "an earlier line" not in out
    assert last_error_line(tmp_path / "missing.log") is None


def test_the_tables_eta_ignores_cells_that_ended_at_once(tmp_path):
    """Hand-worked: one cell completed in 600 s, one failed after 1 s (a bad setting), two wait, one slot: the ETA is
    2 x 600 s = 20m00s (with the failure in the mean it would be 2 x 300.5 s = 10m01s)."""
    from repdegen.reproduce.runs.cell_progress import Job, Progress

    def job(name, status, seconds=None):
        j = Job(name, name, tmp_path / f"{name}.yaml", tmp_path / f"{name}.log", status=status)
        if seconds is not None:
            j.started, j.finished = 1000.0, 1000.0 + seconds
        return j

    jobs = [job("a", "complete", 600.0), job("b", "failed", 1.0), job("c", "waiting"), job("d", "waiting")]
    assert Progress(jobs, 1, enabled=False).eta() == "20m00s"
