"""The training loop and the run ledger, end to end on the tiny generated corpus."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import repdegen.reproduce.engine.trainer as trainer_mod
import torch
from hydra.errors import ConfigCompositionException
from repdegen.reproduce.engine.optim import averaged_weights, nonmonotone_trigger
from repdegen.reproduce.errors import ConfigError, TrainingDiverged
from repdegen.reproduce.settings.config import config_hash, finalize, hashed_view
from repdegen.reproduce.train import train

REPO = Path(__file__).resolve().parents[1]
VD_SMOKE = ("experiment=inan2017/small", "scale=smoke")
AWD_SMOKE = ("experiment=gao2019/awd_lstm_wt2", "scale=smoke", "trainer.cache.bptt=50")


def final_numbers(record: dict) -> dict:
    return {stage: {k: v for k, v in m.items() if k != "singular_values"} for stage, m in record["metrics"].items()}


def history_numbers(record: dict) -> list:
    timing = ("epoch_seconds", "tokens_per_s", "valid_seconds")
    return [{k: v for k, v in h.items() if k not in timing} for h in record["history"]]


def test_smoke_run_writes_a_complete_record(compose_cfg, tmp_path):
    rec = train(compose_cfg(*VD_SMOKE, "objective=real", "trainer.max_epochs=2", "scale.max_epochs=2"))
    assert rec["status"] == "complete"
    run_dir = tmp_path / "out" / "runs" / rec["config_hash"]
    on_disk = json.loads((run_dir / "result.json").read_text())
    assert on_disk["config_hash"] == rec["config_hash"] and on_disk["status"] == "complete"
    for key in ("config", "history", "metrics", "parameters", "git", "hardware", "wall_time_s", "corpus", "command"):
        assert key in on_disk
    assert len(on_disk["history"]) == 2
    final = on_disk["metrics"]["final"]
    assert final["test_ppl"] == pytest.approx(math.exp(final["test_nll"]))
    assert 0 < final["isotropy"] <= 1 and len(final["singular_values"]) == on_disk["config"]["model"]["hidden_size"]
    assert on_disk["parameters"]["tie_weights"] is True and on_disk["config"]["model"]["hidden_size"] == 20  # 200 x 0.1
    # REAL's per-epoch diagnostic: the entropy of its target distribution, between 0 and log V
    vocab = torch.load(run_dir / "vocab_counts.pt").numel()
    assert all(0 < h["al_target_entropy"] <= math.log(vocab) + 1e-9 for h in on_disk["history"])
    # the test PPL is that of the best validation epoch's weights
    best = min(on_disk["history"], key=lambda h: h["valid_nll"])
    assert final["valid_nll"] == pytest.approx(best["valid_nll"], rel=1e-6)


def test_a_complete_run_is_not_run_again(compose_cfg, tmp_path, capsys):
    cfg = compose_cfg(*VD_SMOKE)
    first = train(cfg)
    ckpt = tmp_path / "out" / "runs" / first["config_hash"] / "checkpoint.pt"
    stamp = ckpt.stat().st_mtime_ns
    second = train(cfg)
    assert "already complete" in capsys.readouterr().out
    assert second == first and ckpt.stat().st_mtime_ns == stamp


def test_each_start_of_a_cell_keeps_its_commit_and_where_it_resumed(compose_cfg, monkeypatch):
    """A cell stopped after epoch 1 and resumed at another commit: its record lists both starts, each with the
    commit it ran at, the second one "after train epoch 1"; "git" is the latest start's."""
    import repdegen.reproduce.runs.execute as execute

    monkeypatch.setattr(execute, "git_commit", lambda: {"commit": "a" * 40, "dirty": False})
    assert train(compose_cfg(*VD_SMOKE, "scale.max_epochs=2", "trainer.stop_after_epochs=1"))["status"] == "interrupted"
    monkeypatch.setattr(execute, "git_commit", lambda: {"commit": "b" * 40, "dirty": True})
    rec = train(compose_cfg(*VD_SMOKE, "scale.max_epochs=2", "trainer.resume=true"))
    assert rec["status"] == "complete" and len(rec["history"]) >= 2
    assert [s["git"]["commit"][0] for s in rec["starts"]] == ["a", "b"]
    assert [s["from"] for s in rec["starts"]] == ["the start", "after train epoch 1"]
    assert rec["git"] == {"commit": "b" * 40, "dirty": True} and all(s["hardware"] and s["at"] for s in rec["starts"])


def test_an_unfinished_run_needs_resume_or_a_move(compose_cfg):
    cfg = compose_cfg(*VD_SMOKE, "scale.max_epochs=3", "trainer.stop_after_epochs=1")
    assert train(cfg)["status"] == "interrupted"
    with pytest.raises(ConfigError, match="trainer.resume=true"):
        train(compose_cfg(*VD_SMOKE, "scale.max_epochs=3"))


@pytest.mark.parametrize("preset", [VD_SMOKE, AWD_SMOKE], ids=["vd_lstm_sgd_decay", "awd_lstm_ntasgd_finetune_cache"])
def test_kill_and_resume_gives_the_same_result(compose_cfg, tmp_path, preset):
    extra = ["scale.max_epochs=3", "optim.decay_after_epoch=1", "optim.lr_decay=0.5"] if preset is VD_SMOKE else [
        "scale.max_epochs=3", "trainer.finetune_epochs=2", "optim.nonmono=0"]
    straight = train(compose_cfg(*preset, *extra, output_dir=tmp_path / "a"))
    interrupted = train(compose_cfg(*preset, *extra, "trainer.stop_after_epochs=2", output_dir=tmp_path / "b"))
    assert interrupted["status"] == "interrupted" and len(interrupted["history"]) == 2
    resumed = train(compose_cfg(*preset, *extra, "trainer.resume=true", output_dir=tmp_path / "b"))
    assert resumed["config_hash"] == straight["config_hash"]
    assert final_numbers(resumed) == final_numbers(straight)  # bit-identical on CPU
    assert history_numbers(resumed) == history_numbers(straight)


def test_sigkill_then_resume_gives_the_same_result(tiny_data, tmp_path):
    """A real kill -9 after the first checkpoint: the atomic checkpoint and resume hold."""
    args = [sys.executable, "-m", "repdegen.reproduce.train", *VD_SMOKE, "scale.max_epochs=4", "trainer.progress=false",
            f"dataset.data_dir={tiny_data}", "optim.decay_after_epoch=1", "optim.lr_decay=0.7"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    straight = subprocess.run([*args, f"paths.output_dir={tmp_path}/a", f"hydra.run.dir={tmp_path}/h"], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr[-2000:]
    proc = subprocess.Popen([*args, f"paths.output_dir={tmp_path}/b", f"hydra.run.dir={tmp_path}/h",
                             "trainer.log_interval=1"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = tmp_path / "b" / "runs"
    deadline = time.time() + 240
    while time.time() < deadline and not list(runs.glob("*/checkpoint.pt")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    resumed = subprocess.run([*args, f"paths.output_dir={tmp_path}/b", f"hydra.run.dir={tmp_path}/h", "trainer.resume=true"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = json.loads(next((tmp_path / "a" / "runs").glob("*/result.json")).read_text())
    b = json.loads(next(runs.glob("*/result.json")).read_text())
    assert b["status"] == "complete" and final_numbers(a) == final_numbers(b)


def test_nan_loss_stops_with_a_message_and_keeps_the_last_good_checkpoint(compose_cfg, tmp_path, monkeypatch):
    cfg = compose_cfg(*VD_SMOKE, "scale.max_epochs=3")
    from repdegen.losses.mle import RE

    calls = {"n": 0}
    real_forward = RE.forward

    def forward(self, hidden, targets, model, step=0, layout=None):
        out = real_forward(self, hidden, targets, model, step)
        calls["n"] += 1
        if calls["n"] > 12:  # into epoch 3 (5 batches per epoch on the tiny corpus)
            out.token_loss = out.token_loss * float("nan")
        return out

    monkeypatch.setattr(RE, "forward", forward)
    with pytest.raises(TrainingDiverged, match=r"NaN or infinite at train epoch 3.*after epoch 2"):
        train(compose_cfg(*VD_SMOKE, "scale.max_epochs=3", "objective=re"))
    run_dir = next((tmp_path / "out" / "runs").iterdir())
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "failed" and "NaN" in record["error"]
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert ckpt["run_state"]["epoch"] == len(record["history"]) >= 1
    assert all(math.isfinite(v) for v in ckpt["model"]["embedding.weight"].flatten().tolist())
    del cfg


def test_nonmonotone_trigger_rule():
    hist = [5.0, 4.0, 3.0, 2.9, 2.8, 2.7]
    assert not nonmonotone_trigger(hist[:5], 3.5, 5)  # needs more than nonmono earlier values
    assert not nonmonotone_trigger(hist, 4.5, 5)  # best of all but the last 5 is 5.0
    assert nonmonotone_trigger(hist, 5.1, 5)
    assert nonmonotone_trigger([3.0, 2.0, 2.5], 2.1, 1) and not nonmonotone_trigger([3.0, 2.0, 2.5], 1.9, 1)
    assert nonmonotone_trigger([3.0, 2.0], 2.5, 0) and not nonmonotone_trigger([3.0, 2.0], 1.5, 0)


def scripted_validation(monkeypatch, losses: list[float]):
    it = iter(losses)

    def validate(self):
        self.seen_params = [p.detach().clone() for p in self.params]
        if isinstance(self.optimizer, torch.optim.ASGD):
            self.seen_averaged = all(torch.equal(p, self.optimizer.state[p]["ax"]) for p in self.params)
        return {"valid_nll": next(it), "valid_ppl": 1.0, "isotropy": 0.5, "mean_cos": 0.0}

    monkeypatch.setattr(trainer_mod.Trainer, "validate", validate)


def test_ntasgd_switches_when_the_rule_says(compose_cfg, monkeypatch, capsys):
    # epochs 1-3 improve, 4 is worse than the best of all but the last 1 -> switch after epoch 4
    scripted_validation(monkeypatch, [3.0, 2.0, 1.5, 2.5, 1.4, 1.3])
    rec = train(compose_cfg("experiment=gao2019/awd_lstm_wt2", "scale=smoke", "scale.max_epochs=6",
                            "trainer.finetune_epochs=0", "trainer.cache.enabled=false", "optim.nonmono=1"))
    assert rec["asgd_epoch"] == 4
    assert "switching to ASGD" in capsys.readouterr().out


def test_validation_after_the_switch_uses_averaged_weights():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5))
    opt = torch.optim.ASGD([w], lr=0.1, t0=0, lambd=0.0)
    iterates = []
    for _ in range(4):
        opt.zero_grad()
        (w ** 2).sum().backward()
        opt.step()
        iterates.append(w.detach().clone())
    raw = w.detach().clone()
    with averaged_weights([w], opt):
        # torch's ASGD (like the 2018 one AWD-LSTM used) updates mu one step late, so with t0=0 the
        # average runs over iterates 2..k
        assert torch.allclose(w, torch.stack(iterates[1:]).mean(0), atol=1e-6)
    assert torch.equal(w, raw)


def test_early_stopping(compose_cfg, monkeypatch):
    scripted_validation(monkeypatch, [3.0, 2.0, 2.1, 2.2, 2.3, 9.9, 9.9])
    rec = train(compose_cfg(*VD_SMOKE, "scale.max_epochs=7", "trainer.early_stopping=2"))
    assert rec["stopped_early"] and len(rec["history"]) == 5  # best at 2, then 3 epochs without improvement


def test_lr_schedule(compose_cfg, monkeypatch):
    scripted_validation(monkeypatch, [5.0, 4.0, 3.0, 2.0])
    rec = train(compose_cfg(*VD_SMOKE, "scale.max_epochs=4", "optim.lr=1.0", "optim.lr_decay=0.5", "optim.decay_after_epoch=2"))
    assert [h["lr"] for h in rec["history"]] == [1.0, 1.0, 0.5, 0.25]


def test_sum_over_time_scales_the_gradient_by_the_bptt_length(compose_cfg, tmp_path):
    from repdegen.data.corpus import load_corpus
    from repdegen.losses import build_objective
    from repdegen.models import build_model

    grads = {}
    for reduction in ("mean", "sum_over_time"):
        cfg = finalize(compose_cfg(*VD_SMOKE, f"trainer.loss_reduction={reduction}", "optim.clip_grad_norm=null",
                                   "model.dropout=0", "trainer.bptt=7"))
        torch.manual_seed(0)
        corpus = load_corpus(cfg.dataset)
        model = build_model(cfg.model, len(corpus.vocab), True)
        obj = build_objective(cfg.objective, len(corpus.vocab))
        t = trainer_mod.Trainer(cfg, model, obj, corpus, tmp_path / reduction, torch.device("cpu"))
        before = [p.detach().clone() for p in t.params]
        t.task.stream = t.task.stream[:8]  # exactly one 7-step segment
        t.train_epoch(1)
        grads[reduction] = [b - p.detach() for b, p in zip(before, t.params)]
    for g_mean, g_sum in zip(grads["mean"], grads["sum_over_time"]):
        assert torch.allclose(g_sum, 7 * g_mean, rtol=1e-4, atol=1e-7)


def test_config_hash_ignores_run_control_and_canonicalises_tying(compose_cfg, tmp_path):
    a = finalize(compose_cfg(*VD_SMOKE, "objective=mle"))
    b = finalize(compose_cfg(*VD_SMOKE, "objective=mle", "objective.tie_weights=false", "trainer.resume=true",
                             "trainer.device=cpu", output_dir=tmp_path / "elsewhere"))
    c = finalize(compose_cfg(*VD_SMOKE, "objective=mle", "seed=2"))
    assert config_hash(a) == config_hash(b) != config_hash(c)
    # how the same function is computed (row-chunked loss, torch.compile) is not the experiment: same hash
    d = finalize(compose_cfg(*VD_SMOKE, "objective=mle", "objective.chunk_rows=256", "trainer.compile=true"))
    assert d.objective.chunk_rows == 256 and config_hash(d) == config_hash(a)


def test_scale_is_applied_once(compose_cfg):
    cfg = finalize(compose_cfg("experiment=inan2017/large", "scale=smoke"))
    assert cfg.model.hidden_size == 150 and cfg.trainer.max_epochs == 1 and cfg.dataset.train_tokens == 30000
    with pytest.raises(ValueError, match="read-only: finalized already"):  # a finalized config is not scaled twice
        finalize(cfg)


def test_experiment_specialisations_compose(compose_cfg):
    cfg = finalize(compose_cfg("experiment=inan2016/h650", "objective=real"))
    assert (cfg.objective.alpha, cfg.objective.form, cfg.objective.temperature) == (0.35, "ce", 1.0)
    cfg = finalize(compose_cfg("experiment=inan2016/h650", "objective=real", "objective.alpha=0.2"))
    assert cfg.objective.alpha == 0.2  # the command line wins
    cfg = finalize(compose_cfg("experiment=gao2019/awd_lstm_wt2", "objective=cosreg"))
    assert cfg.objective.gamma == 1.0 and cfg.seed == 1882 and cfg.model.tie_weights


@pytest.mark.parametrize("override,key", [("objective.gama=1", "gama"), ("trainer.max_epoch=3", "max_epoch"),
                                          ("model.hiden_size=3", "hiden_size")])
def test_config_typos_are_rejected_naming_the_key(compose_cfg, override, key):
    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg("objective=cosreg", override)
    assert key in str(err.value) + str(err.value.__cause__)


def test_wrong_types_and_values_are_rejected(compose_cfg):
    with pytest.raises(ConfigCompositionException):
        compose_cfg("trainer.max_epochs=many")
    with pytest.raises(ConfigError, match="optim.name='adamw' is not one of"):
        finalize(compose_cfg("optim.name=adamw"))
    with pytest.raises(ConfigError, match="model.dropout=1.5"):
        finalize(compose_cfg("model.dropout=1.5"))
    with pytest.raises(ConfigError, match="embedding_size=30 and hidden_size=200"):
        finalize(compose_cfg("objective=re", "model.embedding_size=30"))  # before any data is loaded


def test_cli_typo_fails_before_any_work(tmp_path):
    out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.train", "objective=cosreg", "objective.gama=1",
                          f"paths.output_dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "gama" in out.stderr
    assert not (tmp_path / "runs").exists()


def test_cli_user_error_is_one_line_without_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.train", "dataset.source=local",
                          f"dataset.data_dir={tmp_path}/none",
                          f"paths.output_dir={tmp_path}", f"hydra.run.dir={tmp_path}/h"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert "repdegen: error:" in out.stderr and "does not exist" in out.stderr and "Traceback" not in out.stderr


def test_test_every_epoch_and_wandb_logger(compose_cfg, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    rec = train(compose_cfg(*VD_SMOKE, "scale.max_epochs=2", "trainer.test_every_epoch=true", "logger=wandb",
                            "logger.mode=disabled"))
    assert rec["status"] == "complete"
    assert all("test_ppl" in h for h in rec["history"])
    best = min(rec["history"], key=lambda h: h["valid_nll"])
    assert rec["metrics"]["final"]["test_ppl"] == pytest.approx(best["test_ppl"], rel=1e-9)


def test_group_geometry_trace_at_update_0_and_every_n(compose_cfg, tmp_path):
    """Yu Fig. 1's trace: the groups' I(W) at update 0 (the initial weights) and every N updates, each value equal
    to a direct computation on the weights saved at that point (the initial embedding; the last epoch's)."""
    from repdegen.analysis.groups import frequency_groups, group_isotropy

    rec = train(compose_cfg(*VD_SMOKE, "trainer.max_epochs=2", "scale.max_epochs=2", "trainer.analysis.geometry_every=5"))
    trace = rec["trace"]
    updates = [u for u, _ in trace["geom_isotropy_rare"]]
    assert updates == list(range(0, rec["history"][-1]["updates"] + 1, 5))
    assert set(trace) >= {f"geom_isotropy_{g}" for g in ("frequent", "medium", "rare")} | {"geom_cos_rare_frequent"}
    run_dir = tmp_path / "out" / "runs" / rec["config_hash"]
    init = torch.load(run_dir / "init_embedding.pt")
    groups = frequency_groups(torch.load(run_dir / "vocab_counts.pt"))
    direct = group_isotropy(init.float(), groups)
    for g in ("frequent", "medium", "rare"):
        assert trace[f"geom_isotropy_{g}"][0][1] == pytest.approx(direct[g], rel=1e-6)
    # the last point: the weights after the last update, as the end-of-training checkpoint holds them (SGD: no
    # averaged weights); a trace taken before the optimizer step, or of stale weights, would be one update behind
    from repdegen.analysis.groups import group_cosines

    last = rec["history"][-1]["updates"]
    if last % 5:  # the trace's last point is the last multiple of 5: it must be the final weights' update
        pytest.fail(f"the run ends at update {last}, not a multiple of 5: pick geometry_every to divide it")
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]
    final = saved.get("output_weight", saved["embedding.weight"]).float()  # the output embedding (untied: W)
    assert not torch.equal(final, init.float())
    direct = group_isotropy(final, groups)
    for g in ("frequent", "medium", "rare"):
        assert trace[f"geom_isotropy_{g}"][-1] == [last, pytest.approx(direct[g], rel=1e-6)]
    assert trace["geom_cos_rare_frequent"][-1] == [last, pytest.approx(group_cosines(final, groups)["rare_frequent"],
                                                                         rel=1e-6, abs=1e-9)]
    # the trace leaves the hash of an untraced run alone (its default is left out of the hash)
    plain = compose_cfg(*VD_SMOKE, "trainer.max_epochs=2", "scale.max_epochs=2")
    assert config_hash(finalize(plain)) != rec["config_hash"]
    assert "geometry_every" not in json.dumps(hashed_view(finalize(plain)))
