"""trainer.early_stopping_on=train: each epoch's mean training objective (``train_loss``) and early stopping on it
with a relative minimum improvement (Inan et al. 2017 Fig. 1's positive control trains to the minimum of J_tot);
hashes of configs that do not use it unchanged; a bad combination is one clear error."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from repdegen.reproduce.engine.checkpoint import RunState
from repdegen.reproduce.engine.stages import Stages
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.settings.config import config_hash, finalize
from repdegen.reproduce.train import train

from .test_train import VD_SMOKE
from .test_trainer_update import make_trainer


def fake_trainer(patience, min_delta, on="train"):
    printed = []
    t = OmegaConf.create({"early_stopping": patience, "early_stopping_on": on, "early_stopping_min_delta": min_delta})
    return SimpleNamespace(state=RunState(), t=t, print=printed.append), printed


def test_counts_only_drops_of_at_least_min_delta_below_the_best_that_counted():
    tr, printed = fake_trainer(patience=2, min_delta=0.001)
    # 10 counts (from inf); 9.995 is 0.05 % below 10: not counted; 9.98 is 0.2 % below 10: counted (the reference
    # is the best that counted, 10, not the last epoch's 9.995); then three epochs within 0.1 % of 9.98 -> stop
    # on the third (more than 2 without an improvement)
    losses = [10.0, 9.995, 9.98, 9.975, 9.971, 9.972]
    stops = [Stages.train_objective_stops(tr, x, e + 1) for e, x in enumerate(losses)]
    assert stops == [False, False, False, False, False, True]
    assert tr.state.best_train_loss == 9.98
    assert tr.state.epochs_since_train_best == 3
    assert "epoch   6" in printed[-1] and "0.1 %" in printed[-1]


def test_an_objective_below_zero_must_fall_min_delta_of_its_size_below_the_best():
    """J_tot of Inan 2017 Fig. 1 at its float noise floor goes below 0: -0.5376 is the best; -0.5373 (above it) and
    -0.5378 (0.04 % below) do not count, -0.5385 (0.17 % below) does."""
    tr, _ = fake_trainer(patience=5, min_delta=0.001)
    for e, x in enumerate([0.2, -0.5376, -0.5373, -0.5378, -0.5385], 1):
        Stages.train_objective_stops(tr, x, e)
    assert tr.state.best_train_loss == -0.5385 and tr.state.epochs_since_train_best == 0
    tr, _ = fake_trainer(patience=5, min_delta=0.001)
    for e, x in enumerate([-0.5376, -0.5373, -0.5378], 1):
        Stages.train_objective_stops(tr, x, e)
    assert tr.state.best_train_loss == -0.5376 and tr.state.epochs_since_train_best == 2


def test_nan_loss_is_no_improvement_and_valid_mode_counts_nothing():
    tr, _ = fake_trainer(patience=0, min_delta=0.0)
    assert not Stages.train_objective_stops(tr, 5.0, 1)
    assert Stages.train_objective_stops(tr, math.nan, 2)  # NaN < best is False: one epoch without, more than 0
    tr, _ = fake_trainer(patience=0, min_delta=0.0, on="valid")
    assert not Stages.train_objective_stops(tr, 5.0, 1) and not Stages.train_objective_stops(tr, 6.0, 2)
    assert tr.state.best_train_loss == math.inf  # untouched


def test_train_loss_of_mle_is_its_nll_per_token(compose_cfg):
    """Hand-worked: MLE's objective is the NLL, so the objective summed over the target tokens equals the NLL sum
    under the mean reduction, and is ``bptt`` times it under sum_over_time (summed over the steps, averaged over
    the batch: per token, ``bptt`` times the mean)."""
    for reduction, factor in (("mean", 1.0), ("sum_over_time", 7.0)):
        t = make_trainer(compose_cfg, "objective=mle", "optim.name=sgd", "optim.lr=0.5", "trainer.update_freq=1",
                         f"trainer.loss_reduction={reduction}")
        t.model.train()
        t.task.begin_epoch(t.model)
        for b in t.task.train_batches(1, "train"):
            _, nll_sum, n, loss_sum = t.train_update([b], 0.5)
            t.state.updates += 1
            assert float(loss_sum) == pytest.approx(factor * float(nll_sum), rel=1e-6)


def test_run_stops_on_the_training_objective_and_records_it(compose_cfg):
    # a 50 % drop an epoch never happens after the first epoch: epoch 1 counts, epochs 2-4 do not; more than
    # 2 without -> stops after epoch 4 of 20, whatever validation does
    rec = train(compose_cfg(*VD_SMOKE, "scale.max_epochs=20", "trainer.early_stopping=2",
                            "trainer.early_stopping_on=train", "trainer.early_stopping_min_delta=0.5"))
    assert rec["status"] == "complete" and rec["stopped_early"]
    hist = rec["history"]
    assert len(hist) == 4
    assert all(math.isfinite(h["train_loss"]) for h in hist)


def test_hash_unchanged_at_defaults_and_changed_when_used(compose_cfg):
    base = finalize(compose_cfg(*VD_SMOKE))
    same = finalize(compose_cfg(*VD_SMOKE, "trainer.early_stopping_on=valid", "trainer.early_stopping_min_delta=0"))
    used = finalize(compose_cfg(*VD_SMOKE, "trainer.early_stopping_on=train"))
    assert config_hash(base) == config_hash(same) != config_hash(used)


@pytest.mark.parametrize("overrides, needle", [
    (("trainer.early_stopping_on=training",), "trainer.early_stopping_on='training' is not one of valid, train"),
    (("trainer.early_stopping_min_delta=0.001",), "applies to trainer.early_stopping_on=train only"),
    (("trainer.early_stopping_on=train", "trainer.early_stopping_min_delta=1.5"), "trainer.early_stopping_min_delta"),
])
def test_bad_settings_are_one_clear_error(compose_cfg, overrides, needle):
    with pytest.raises(ConfigError) as e:
        finalize(compose_cfg(*VD_SMOKE, *overrides))
    assert needle in str(e.value)
