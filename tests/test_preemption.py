"""Preemption: a run stopped in the middle of an epoch (``trainer.stop_after_updates``, or a real
SIGUSR1) writes a checkpoint from which ``trainer.resume=true`` continues to the bit-identical result
of an uninterrupted run (CPU): the epoch's batches and their order, the updates done, the partial
sums, the RNG states and the recurrent state carried across BPTT segments all survive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from repdegen.reproduce.settings.config import finalize
from repdegen.reproduce.train import EXIT_PREEMPTED, load_any_corpus, train

REPO = Path(__file__).resolve().parents[1]
TIMING = ("epoch_seconds", "tokens_per_s", "valid_seconds")
# AWD-LSTM: variable BPTT lengths (the epoch's draw must be repeated), dropout everywhere (RNG states),
# NT-ASGD and the finetune stage; 10 columns x ~20 steps: ~15 updates per epoch on the tiny corpus
AWD = ("experiment=gao2019/awd_lstm_wt2", "scale=smoke", "scale.max_epochs=2", "trainer.batch_size=10",
       "trainer.bptt=20", "trainer.eval_batch_size=10", "trainer.cache.enabled=false", "optim.nonmono=0")
# a Transformer LM with AGG: shuffled blocks, 2 micro-batches per update, the counter memory in the checkpoint
TLM = ("model=transformer_lm6", "dataset=wikitext2_bpe", "dataset.bpe_vocab_size=60", "model.d_model=32",
       "model.n_layers=2", "model.n_heads=4", "model.d_ffn=64", "trainer.bptt=16", "trainer.batch_size=4",
       "trainer.eval_bptt=16", "trainer.eval_batch_size=4", "trainer.test_batch_size=4", "trainer.update_freq=2",
       "optim.warmup_updates=5", "trainer.device=cpu", "trainer.max_epochs=2", "objective=agg")


def without_timing(record: dict) -> list[dict]:
    return [{k: v for k, v in h.items() if k not in TIMING} for h in record["history"]]


def run_dir(record: dict, out: Path) -> Path:
    return out / "runs" / record["config_hash"]


def assert_same_files(a: Path, b: Path, names) -> None:
    for name in names:
        ta = torch.load(a / name, weights_only=False)
        tb = torch.load(b / name, weights_only=False)
        for part in ("model", "objective"):
            assert ta[part].keys() == tb[part].keys()
            for key in ta[part]:
                assert torch.equal(ta[part][key], tb[part][key]), f"{name}: {part}.{key} differs"


def stop_points(record: dict) -> list[int]:
    """Update counts in the middle of the second training epoch and of the first finetune epoch (if any)."""
    ends = [h["updates"] for h in record["history"]]
    points = [ends[0] + (ends[1] - ends[0]) // 2]
    if len(ends) > 2:
        points.append(ends[1] + (ends[2] - ends[1]) // 2)
    return points


@pytest.mark.parametrize("preset", [AWD, TLM], ids=["awd_lstm_variable_bptt_finetune", "transformer_lm_agg"])
def test_mid_epoch_stop_and_resume_is_bit_identical(compose_cfg, tmp_path, monkeypatch, preset):
    a, b = tmp_path / "a", tmp_path / "b"
    straight = train(compose_cfg(*preset, output_dir=a))
    assert straight["status"] == "complete"
    points = stop_points(straight)
    assert not set(points) & {h["updates"] for h in straight["history"]}  # inside epochs, not at their ends
    for n_stops, k in enumerate(points, start=1):
        stopped = train(compose_cfg(*preset, f"trainer.stop_after_updates={k}", "trainer.resume=true", output_dir=b))
        assert stopped["status"] == "preempted" and "trainer.stop_after_updates" in stopped["preempted"]
        assert stopped["config_hash"] == straight["config_hash"]
        on_disk = json.loads((run_dir(stopped, b) / "result.json").read_text())
        assert on_disk["status"] == "preempted" and len(on_disk["history"]) == n_stops  # k is inside epoch n_stops + 1
        ckpt = torch.load(run_dir(stopped, b) / "checkpoint.pt", weights_only=False)
        inside = straight["history"][n_stops]  # the epoch the stop falls in
        assert ckpt["run_state"]["updates"] == k
        assert (ckpt["mid_epoch"]["stage"], ckpt["mid_epoch"]["epoch"]) == (inside["stage"], inside["epoch"])
        assert ckpt["mid_epoch"]["epoch_updates"] == k - straight["history"][n_stops - 1]["updates"] > 0
    # the last leg resumes as a requeued SLURM job does: without trainer.resume=true
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    resumed = train(compose_cfg(*preset, output_dir=b))
    assert resumed["status"] == "complete" and "preempted" not in resumed
    assert resumed["metrics"] == straight["metrics"]
    assert without_timing(resumed) == without_timing(straight)
    assert resumed.get("trace") == straight.get("trace")
    names = ["checkpoint.pt", "best.pt"] + (["best_finetune.pt"] if len(points) > 1 else [])
    assert_same_files(run_dir(straight, a), run_dir(resumed, b), names)


def test_sigusr1_checkpoints_marks_preempted_requeues_and_resumes(tiny_data, compose_cfg, tmp_path):
    """A real SIGUSR1 to `repdegen train` under a (fake) SLURM job: checkpoint, status
    "preempted", `scontrol requeue <job>`, exit status EXIT_PREEMPTED; trainer.resume=true finishes it."""
    over = ("experiment=inan2017/small", "scale=smoke", "scale.max_epochs=30", "trainer.max_epochs=30",
            "trainer.early_stopping=null")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scontrol.log"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", SLURM_JOB_ID="777",
               PATH=f"{bin_dir}:{os.environ['PATH']}")
    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_RESTART_COUNT"):
        env.pop(key, None)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "repdegen.reproduce.train", *over, "trainer.progress=false",
                             f"dataset.data_dir={tiny_data}", f"paths.output_dir={out}", f"hydra.run.dir={tmp_path}/h"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list((out / "runs").glob("*/checkpoint.pt")) and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR1)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, output[-3000:]
    assert "stopped by a preemption signal" in output and "Traceback" not in output
    run = next((out / "runs").iterdir())
    record = json.loads((run / "result.json").read_text())
    assert record["status"] == "preempted" and 1 <= len(record["history"]) < 30
    ckpt = torch.load(run / "checkpoint.pt", weights_only=False)
    done = ckpt["run_state"]["updates"]
    assert done >= 5 * len(record["history"])  # 5 updates per epoch; the stop is at or after an epoch's end
    assert log.read_text().split() == ["requeue", "777"]
    resumed = train(compose_cfg(*over, "trainer.resume=true", output_dir=out))
    assert resumed["status"] == "complete" and len(resumed["history"]) == 30
    assert resumed["history"][-1]["updates"] == 30 * 5


@pytest.mark.parametrize("preset", [("experiment=inan2017/small",), ("experiment=gao2019/awd_lstm_wt2",)],
                         ids=["lstm_state_batch_first", "awd_state_batch_second"])
def test_carried_state_is_resharded_for_another_world_size(compose_cfg, preset):
    """A mid-epoch checkpoint written by 2 ranks, resumed by 1, 4 or 5: rank r continues with columns
    r::W of the whole batch's recurrent state."""
    from repdegen.models import build_model
    from repdegen.reproduce.engine.tasks import LMTask, _map_state

    cfg = finalize(compose_cfg(*preset, "scale=smoke", "trainer.batch_size=20"))
    corpus = load_any_corpus(cfg.dataset, cfg.paths.cache_dir)
    model = build_model(cfg.model, len(corpus.vocab), cfg.model.tie_weights)
    task = LMTask(cfg, corpus, model, torch.device("cpu"))
    torch.manual_seed(0)
    full = _map_state(lambda x: torch.randn_like(x), model.init_state(20, torch.device("cpu")))
    dims = task.batch_dims

    def columns(state, start, step):
        return _map_state(lambda d, x: x.index_select(d, torch.arange(start, x.size(d), step)), dims, state)

    written = [columns(full, r, 2) for r in range(2)]
    for world in (1, 2, 4, 5):
        for rank in range(world):
            task.rank, task.world = rank, world
            task.restore_carried_state(written)
            expected = columns(full, rank, world)
            _map_state(lambda x, y: torch.testing.assert_close(x, y, rtol=0, atol=0), task.state, expected)


def test_the_record_is_written_at_the_start_and_an_empty_one_does_not_linger(compose_cfg, tmp_path, monkeypatch):
    """A run's record exists from its start (status "running", no epoch, its start listed), so `repdegen.reproduce.status` shows
    it during a long first epoch; a run stopped before any checkpoint leaves only that empty record, which the next
    start replaces (nothing in it to keep: no ``result.<status>-<time>.json`` beside it)."""
    from repdegen.reproduce.engine.trainer import Trainer
    from repdegen.reproduce.errors import SimulatedInterrupt

    over = ("experiment=inan2017/small", "scale=smoke", "trainer.max_epochs=1")
    seen = {}

    def stop_at_once(self):
        seen.update(json.loads((self.run_dir / "result.json").read_text()))
        raise SimulatedInterrupt("stopped before the first update")

    with monkeypatch.context() as m:
        m.setattr(Trainer, "fit", stop_at_once)
        first = train(compose_cfg(*over))
    assert seen["status"] == "running" and seen["history"] == [] and len(seen["starts"]) == 1
    run = tmp_path / "out" / "runs" / first["config_hash"]
    assert not (run / "checkpoint.pt").exists()
    done = train(compose_cfg(*over, "trainer.resume=true"))
    assert done["status"] == "complete" and len(done["history"]) >= 1 and len(done["starts"]) == 1
    assert sorted(p.name for p in run.glob("result*.json")) == ["result.json"]


def test_best_weights_of_an_epoch_killed_before_its_checkpoint_are_dropped(compose_cfg, tmp_path, monkeypatch):
    """Killed after an epoch kept new best weights but before its checkpoint: the resumed run reruns that epoch, and on
    a GPU the rerun need not validate the same. Here it validates worse (scripted), so best.pt must be epoch 1's
    weights, the ones the record calls best, not the killed epoch's (which the pending-name scheme drops)."""
    import repdegen.reproduce.engine.trainer as trainer_mod
    from repdegen.reproduce.errors import SimulatedInterrupt

    from .test_train import VD_SMOKE

    losses, seen = iter([3.0, 2.0, 3.5, 4.0]), []  # epoch 1, epoch 2 (killed), epoch 2 again, epoch 3

    def validate(self):
        seen.append({k: v.detach().clone() for k, v in self.model.state_dict().items()})
        return {"valid_nll": next(losses), "valid_ppl": 1.0, "isotropy": 0.5, "mean_cos": 0.0}

    real_save = trainer_mod.Trainer.save_checkpoint

    def save_checkpoint(self, mid_epoch=None):
        if mid_epoch is None and len(self.state.history) == 2 and not getattr(trainer_mod, "_killed", False):
            trainer_mod._killed = True
            raise SimulatedInterrupt("killed between epoch 2's best weights and its checkpoint")
        real_save(self, mid_epoch)

    monkeypatch.setattr(trainer_mod.Trainer, "validate", validate)
    monkeypatch.setattr(trainer_mod.Trainer, "save_checkpoint", save_checkpoint)
    monkeypatch.setattr(trainer_mod, "_killed", False, raising=False)
    args = (*VD_SMOKE, "scale.max_epochs=3", "trainer.early_stopping=null")
    assert train(compose_cfg(*args))["status"] == "interrupted"
    rec = train(compose_cfg(*args, "trainer.resume=true"))
    assert rec["status"] == "complete"
    assert [h["valid_nll"] for h in rec["history"]] == [3.0, 3.5, 4.0]
    run = tmp_path / "out" / "runs" / rec["config_hash"]
    best = torch.load(run / "best.pt", weights_only=False)["model"]
    assert all(torch.equal(best[k], seen[0][k]) for k in best)  # epoch 1's weights
    assert not any(torch.equal(best[k], seen[1][k]) for k in best if best[k].is_floating_point() and best[k].numel() > 1)
    assert not list(run.glob("*.pending-*.pt"))
