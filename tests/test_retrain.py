"""trainer.retrain_sessions (Inan et al. 2017, footnote 5): a second training session from the first one's best
weights, the schedule restarted; both sessions' results recorded; resumable; hashes of other configs unchanged."""

from __future__ import annotations

import math

import pytest
import torch
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.settings.config import config_hash, finalize
from repdegen.reproduce.train import train

from .test_train import VD_SMOKE, final_numbers, history_numbers, scripted_validation

RETRAIN = (*VD_SMOKE, "scale.max_epochs=3", "optim.lr=1.0", "optim.lr_decay=0.5", "optim.decay_after_epoch=1",
           "trainer.retrain_sessions=1")


def test_second_session_restarts_the_schedule_from_the_first_sessions_best_weights(compose_cfg, tmp_path):
    rec = train(compose_cfg(*RETRAIN))
    assert rec["status"] == "complete"
    hist = rec["history"]
    # 3 epochs a session; the lr schedule starts over in session 2 (1, 0.5, 0.25 twice)
    assert [h["session"] for h in hist] == [1, 1, 1, 2, 2, 2]
    assert [h["lr"] for h in hist] == [1.0, 0.5, 0.25, 1.0, 0.5, 0.25]
    first = min(h["valid_nll"] for h in hist[:3])
    m = rec["metrics"]
    # session 1's own result is its best epoch's weights
    assert m["session1"]["valid_nll"] == pytest.approx(first, rel=1e-6)
    assert m["session1"]["weights"] == "best_session1.pt"
    # the final weights are the best over session 2, which starts at session 1's best: never worse than it
    best_overall = min([first] + [h["valid_nll"] for h in hist[3:]])
    assert m["final"]["valid_nll"] == pytest.approx(best_overall, rel=1e-6)
    assert m["final"]["valid_nll"] <= m["session1"]["valid_nll"] + 1e-9
    assert m["final"]["test_ppl"] == pytest.approx(math.exp(m["final"]["test_nll"]))
    run = tmp_path / "out" / "runs" / rec["config_hash"]
    assert (run / "best_session1.pt").exists()


def test_session_two_starts_from_session_ones_best_weights(compose_cfg, tmp_path, monkeypatch):
    """The weights session 2 trains from are byte-equal to the first session's best (best_session1.pt)."""
    import repdegen.reproduce.engine.stages as stages

    seen = {}
    real = stages.Stages.start_next_session

    def spy(tr):
        real(tr)
        seen["start"] = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}

    monkeypatch.setattr(stages.Stages, "start_next_session", spy)
    rec = train(compose_cfg(*RETRAIN))
    saved = torch.load(tmp_path / "out" / "runs" / rec["config_hash"] / "best_session1.pt", weights_only=False)
    model_state = saved["model"] if "model" in saved else saved
    for k, v in seen["start"].items():
        assert torch.equal(v, model_state[k]), k


def test_stopped_in_the_second_session_resumes_to_the_same_result(compose_cfg, tmp_path):
    straight = train(compose_cfg(*RETRAIN, output_dir=tmp_path / "a"))
    stopped = train(compose_cfg(*RETRAIN, "trainer.stop_after_epochs=4", output_dir=tmp_path / "b"))
    assert stopped["status"] == "interrupted" and len(stopped["history"]) == 4
    resumed = train(compose_cfg(*RETRAIN, "trainer.resume=true", output_dir=tmp_path / "b"))
    assert final_numbers(resumed) == final_numbers(straight)  # bit-identical on the CPU
    assert history_numbers(resumed) == history_numbers(straight)


def test_retrain_sessions_zero_keeps_the_hash_and_a_negative_count_is_refused(compose_cfg):
    base = config_hash(finalize(compose_cfg(*VD_SMOKE)))
    assert base == config_hash(finalize(compose_cfg(*VD_SMOKE, "trainer.retrain_sessions=0")))
    assert base != config_hash(finalize(compose_cfg(*VD_SMOKE, "trainer.retrain_sessions=1")))
    with pytest.raises(ConfigError,
                       match=r"retrain_sessions=-1 is outside its domain: expected an integer >= 0 \(0: one training session"):
        finalize(compose_cfg(*VD_SMOKE, "trainer.retrain_sessions=-1"))


def test_validation_curves_continue_the_axis_into_the_second_session(tmp_path, monkeypatch):
    """The re-training session's epochs follow the first session's on the x axis (epochs 4-5 after 1-3), dotted."""
    import matplotlib.axes
    import repdegen.analysis.figures as figures

    calls = []
    real_plot = matplotlib.axes.Axes.plot

    def spy(self, xs, ys, style, **kw):
        calls.append((list(xs), list(ys), style))
        return real_plot(self, xs, ys, style, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    history = [{"stage": "train", "session": s, "epoch": e, "valid_ppl": p}
               for s, e, p in ((1, 1, 300.0), (1, 2, 200.0), (1, 3, 150.0), (2, 1, 140.0), (2, 2, 135.0))]
    assert figures.plot_validation_curves([("MLE", None, history)], tmp_path / "c.png", "t").exists()
    assert calls == [([1, 2, 3], [300.0, 200.0, 150.0], "-"), ([4, 5], [140.0, 135.0], ":")]
    # at paper the training PPL is drawn too, in the same style, where the records have it
    calls.clear()
    for h, t in zip(history, (400.0, 180.0, 120.0, 110.0, 100.0)):
        h["train_ppl"] = t
    figures.plot_validation_curves([("MLE", None, history)], tmp_path / "d.png", "t", show_train=True)
    assert calls == [([1, 2, 3], [300.0, 200.0, 150.0], "-"), ([1, 2, 3], [400.0, 180.0, 120.0], "-"),
                     ([4, 5], [140.0, 135.0], ":"), ([4, 5], [110.0, 100.0], ":")]


def test_early_stopping_counts_from_the_sessions_own_best():
    """Hand-worked: the count of epochs since the session's best, the current epoch last; other sessions' and stages'
    records are not counted; a tie or NaN is no improvement."""
    from repdegen.reproduce.engine.stages import epochs_since_session_best

    hist = [{"stage": "train", "session": 1, "valid_nll": v} for v in (5.0, 4.0, 4.1)]
    assert epochs_since_session_best(hist, 1, 4.2) == 2  # 4.0 at the 2nd of 4 epochs
    assert epochs_since_session_best(hist, 1, 3.9) == 0
    assert epochs_since_session_best(hist, 1, 4.0) == 2  # a tie is not better
    assert epochs_since_session_best(hist, 1, math.nan) == 2
    # session 2 starts anew, though all of it is worse than session 1's best (4.0)
    hist += [{"stage": "train", "session": 2, "valid_nll": v} for v in (4.5, 4.4)]
    assert epochs_since_session_best(hist, 2, 4.3) == 0
    assert epochs_since_session_best(hist, 2, 4.45) == 1
    # records without a session (trainer.retrain_sessions=0) are session 1's; finetune records are another stage
    plain = [{"stage": "train", "valid_nll": 4.0}, {"stage": "finetune", "valid_nll": 1.0}]
    assert epochs_since_session_best(plain, 1, 4.2) == 1
    assert epochs_since_session_best([], 1, 9.0) == 0


def test_a_retraining_session_is_not_stopped_by_the_first_sessions_best(compose_cfg, monkeypatch):
    """Footnote 5 as the official code runs it: the second session's early stopping counts from its own best. Scripted
    validation NLLs (the training is real): session 1 5.0 4.0 4.1 4.2 stops at its 4th epoch (2 > early_stopping=1
    epochs without a better one); session 2 4.5 4.4 4.6 4.7, all worse than session 1's 4.0, runs 4 epochs (counted
    against 4.0 it would stop at its 2nd, before its learning rate decays). best.pt stays session 1's."""
    scripted_validation(monkeypatch, [5.0, 4.0, 4.1, 4.2, 4.5, 4.4, 4.6, 4.7, 4.8, 4.9])
    rec = train(compose_cfg(*VD_SMOKE, "scale.max_epochs=6", "trainer.early_stopping=1", "trainer.retrain_sessions=1"))
    assert rec["status"] == "complete"
    assert [(h["session"], h["valid_nll"]) for h in rec["history"]] == [
        (1, 5.0), (1, 4.0), (1, 4.1), (1, 4.2), (2, 4.5), (2, 4.4), (2, 4.6), (2, 4.7)]
    m = rec["metrics"]
    assert m["final"]["valid_nll"] == pytest.approx(m["session1"]["valid_nll"], rel=1e-9)  # the same weights


def test_stopped_in_finetuning_after_a_retrain_resumes_to_the_same_result(compose_cfg, tmp_path):
    """Re-training sessions, then AWD-LSTM's finetuning: a run stopped inside finetuning goes on from its own
    checkpointed weights, not from the first session's best (which the per-session metrics load)."""
    from .test_train import AWD_SMOKE

    args = (*AWD_SMOKE, "scale.max_epochs=2", "trainer.finetune_epochs=3", "optim.nonmono=0",
            "trainer.retrain_sessions=1")
    straight = train(compose_cfg(*args, output_dir=tmp_path / "a"))
    assert [h["stage"] for h in straight["history"]][4:6] == ["finetune", "finetune"]  # stopped after the 1st
    stopped = train(compose_cfg(*args, "trainer.stop_after_epochs=5", output_dir=tmp_path / "b"))
    assert stopped["status"] == "interrupted" and [h["stage"] for h in stopped["history"]][-1] == "finetune"
    resumed = train(compose_cfg(*args, "trainer.resume=true", output_dir=tmp_path / "b"))
    assert final_numbers(resumed) == final_numbers(straight)  # bit-identical on the CPU
    assert history_numbers(resumed) == history_numbers(straight)


def test_a_run_started_over_sets_the_earlier_starts_session_weights_aside(compose_cfg, tmp_path):
    """Started over (its checkpoint moved aside, as a corrupt checkpoint's error says), a run's session 2 starts
    from its own best weights: the earlier start's best_session1.pt is renamed, kept, not reused."""
    stopped = train(compose_cfg(*RETRAIN, "trainer.stop_after_epochs=4"))
    run = tmp_path / "out" / "runs" / stopped["config_hash"]
    earlier = (run / "best_session1.pt").read_bytes()
    (run / "checkpoint.pt").rename(run / "checkpoint.pt.bad")
    again = train(compose_cfg(*RETRAIN, "trainer.stop_after_epochs=2"))
    assert again["status"] == "interrupted"
    kept = sorted(run.glob("best_session1.earlier-*.pt"))
    assert len(kept) == 1 and kept[0].read_bytes() == earlier
    assert not (run / "best_session1.pt").exists()  # the new start has not reached its second session yet


def test_retrain_sessions_refuse_what_does_not_restart_with_them(compose_cfg):
    """Checkpoint averaging and update-counted budgets or schedules do not restart with a re-training session:
    one clear error naming the setting."""
    for extra, key in ((("trainer.average_last=2",), "trainer.average_last=2"),
                       (("trainer.max_updates=50",), "trainer.max_updates=50")):
        with pytest.raises(ConfigError, match=rf"retrain_sessions=1 with {key}: .* Set trainer.retrain_sessions=0"):
            finalize(compose_cfg(*RETRAIN, *extra))
