"""Checkpoints every N updates (``trainer.save_interval_updates``): the interval weights kept on disk are the last
``average_last`` (by update count), the final weights are the plain mean of exactly those (computed here from copies
of the weights taken after every update), and a run stopped in the middle of an epoch, at an epoch's end, or killed
around an interval checkpoint resumes to the same files and the same averaged weights (bit-identical on a CPU)."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
import torch
from repdegen.reproduce.engine.trainer import Trainer
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.settings.config import finalize, hashed_view
from repdegen.reproduce.train import train

# a tiny Transformer LM (smoke-like size): 2 micro-batches of 4 x 16 tokens per update, 16 updates an epoch on the
# first 2,000 tokens of the tiny corpus, 2 epochs; dropout on, so the restored RNG states matter on a resume
TLM = ("model=transformer_lm6", "dataset=wikitext2_bpe", "dataset.train_tokens=2000", "dataset.bpe_vocab_size=60",
       "model.d_model=32", "model.n_layers=2", "model.n_heads=4", "model.d_ffn=64", "trainer.bptt=16",
       "trainer.batch_size=4", "trainer.eval_bptt=16", "trainer.eval_batch_size=4", "trainer.test_batch_size=4",
       "trainer.update_freq=2", "optim.warmup_updates=5", "trainer.device=cpu", "trainer.max_epochs=2",
       "model.dropout=0.1")
EVERY, KEEP = 3, 4
INTERVAL = (*TLM, f"trainer.save_interval_updates={EVERY}", f"trainer.average_last={KEEP}")
TIMING = ("epoch_seconds", "tokens_per_s", "valid_seconds")


def run_dir(record: dict, out: Path) -> Path:
    return out / "runs" / record["config_hash"]


def interval_files(directory: Path) -> list[int]:
    """The update counts of the interval weights in ``directory``, ascending."""
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := re.fullmatch(r"update(\d+)\.pt", p.name)))


def blob(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def assert_same_tensors(a: dict, b: dict, what: str) -> None:
    for part in ("model", "objective"):
        assert a[part].keys() == b[part].keys(), what
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), f"{what}: {part}.{key} differs"


def without_timing(record: dict) -> list[dict]:
    return [{k: v for k, v in h.items() if k not in TIMING} for h in record["history"]]


@pytest.fixture
def weights_after_each_update(monkeypatch) -> dict[int, dict]:
    """{update count: copies of the model's and objective's tensors right after that update}, filled while a run
    trains (the trainer counts an update just after ``train_update`` returns)."""
    seen: dict[int, dict] = {}
    original = Trainer.train_update

    def recording(self, group, step_lr):
        out = original(self, group, step_lr)
        seen[self.state.updates + 1] = {"model": copy.deepcopy(self.model.state_dict()),
                                        "objective": copy.deepcopy(self.objective.state_dict())}
        return out

    monkeypatch.setattr(Trainer, "train_update", recording)
    return seen


def test_the_last_interval_checkpoints_are_kept_and_averaged(compose_cfg, tmp_path, weights_after_each_update,
                                                            monkeypatch):
    out = tmp_path / "a"
    checkpoints: list[tuple[int, bool]] = []  # (update count, mid-epoch) of every resume checkpoint written
    save_checkpoint = Trainer.save_checkpoint

    def recording(self, mid_epoch=None):
        checkpoints.append((self.state.updates, mid_epoch is not None))
        save_checkpoint(self, mid_epoch)

    monkeypatch.setattr(Trainer, "save_checkpoint", recording)
    record = train(compose_cfg(*INTERVAL, output_dir=out))
    assert record["status"] == "complete"
    total = record["history"][-1]["updates"]
    first_epoch = record["history"][0]["updates"]
    assert total >= 30 and total % EVERY and first_epoch % EVERY  # a few dozen updates; the epochs end off the grid
    expected = [u for u in range(EVERY, total + 1, EVERY)][-KEEP:]
    assert expected[0] > first_epoch  # the kept ones are all in the last epoch, written inside it
    d = run_dir(record, out)
    assert interval_files(d) == expected
    assert not list(d.glob("epoch*.pt"))  # the interval checkpoints replace the per-epoch ones
    assert sorted(weights_after_each_update) == list(range(1, total + 1))
    for u in expected:  # each file holds the weights after its update
        assert_same_tensors(blob(d / f"update{u}.pt"), weights_after_each_update[u], f"update{u}.pt")
    assert record["metrics"]["final"]["weights"] == "averaged.pt"
    averaged = blob(d / "averaged.pt")
    states = [weights_after_each_update[u] for u in expected]
    for part in ("model", "objective"):
        assert averaged[part].keys() == states[-1][part].keys()
        for key, value in averaged[part].items():
            if torch.is_floating_point(value):  # by brute force: the plain mean of the 4 state dicts
                mean = torch.stack([s[part][key].double() for s in states]).mean(0).to(value.dtype)
                assert torch.allclose(value, mean, rtol=0, atol=1e-7), f"{part}.{key}"
            else:
                assert torch.equal(value, states[-1][part][key]), f"{part}.{key}"
    moved = [k for k in averaged["model"] if not torch.equal(states[0]["model"][k], states[-1]["model"][k])]
    assert moved  # the 4 differ, so the mean is none of them
    assert any(not torch.equal(averaged["model"][k], states[-1]["model"][k]) for k in moved)
    # a resume checkpoint with every interval checkpoint (mid-epoch), besides the epochs' own; the last one's state
    # names the kept updates
    ends = [h["updates"] for h in record["history"]]
    assert checkpoints == sorted([(u, True) for u in range(EVERY, total + 1, EVERY)] + [(u, False) for u in ends])
    assert blob(d / "checkpoint.pt")["run_state"]["saved_updates"] == expected


def test_a_stopped_run_resumes_to_the_same_interval_checkpoints(compose_cfg, tmp_path, monkeypatch):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    straight = train(compose_cfg(*INTERVAL, output_dir=a))
    total, first_epoch = straight["history"][-1]["updates"], straight["history"][0]["updates"]
    # b: stopped inside epoch 1 just after an interval checkpoint, then inside epoch 2 between two of them; then a
    # kill around an interval checkpoint is staged on disk: the weights of an update after the stop written without
    # their checkpoint, and a file the stop's state had rotated out but not yet deleted
    k1 = EVERY * (first_epoch // EVERY)
    k2 = first_epoch + EVERY * 2 + 1
    assert 0 < k1 < first_epoch < k2 < total and k2 % EVERY
    for k in (k1, k2):
        stopped = train(compose_cfg(*INTERVAL, f"trainer.stop_after_updates={k}", "trainer.resume=true", output_dir=b))
        assert stopped["status"] == "preempted" and stopped["config_hash"] == straight["config_hash"]
        d = run_dir(stopped, b)
        kept = [u for u in range(EVERY, k + 1, EVERY)][-KEEP:]
        assert interval_files(d) == kept
        assert blob(d / "checkpoint.pt")["run_state"]["saved_updates"] == kept
    shutil.copy(d / f"update{kept[-1]}.pt", d / f"update{kept[-1] + EVERY}.pt")
    shutil.copy(d / f"update{kept[-1]}.pt", d / f"update{kept[0] - EVERY}.pt")
    resumed = train(compose_cfg(*INTERVAL, "trainer.resume=true", output_dir=b))
    # c: stopped at the end of epoch 1 (an epoch checkpoint), then resumed
    interrupted = train(compose_cfg(*INTERVAL, "trainer.stop_after_epochs=1", output_dir=c))
    assert interrupted["status"] == "interrupted"
    across = train(compose_cfg(*INTERVAL, "trainer.resume=true", output_dir=c))
    da = run_dir(straight, a)
    for record, out in ((resumed, b), (across, c)):
        assert record["status"] == "complete"
        assert record["metrics"] == straight["metrics"]
        assert without_timing(record) == without_timing(straight)
        d = run_dir(record, out)
        assert interval_files(d) == interval_files(da)
        for name in [f"update{u}.pt" for u in interval_files(da)] + ["averaged.pt", "last.pt"]:
            assert_same_tensors(blob(d / name), blob(da / name), name)


def test_interval_checkpoints_need_averaging_and_leave_default_hashes_alone(compose_cfg):
    with pytest.raises(ConfigError, match=r"trainer\.save_interval_updates=3 with trainer\.average_last=1.*"
                                          r"trainer\.average_last to the number to average"):
        finalize(compose_cfg(*TLM, "trainer.save_interval_updates=3", "trainer.average_last=1"))
    with pytest.raises(ConfigError, match=r"trainer\.save_interval_updates"):
        finalize(compose_cfg(*TLM, "trainer.save_interval_updates=0", "trainer.average_last=2"))
    default = hashed_view(finalize(compose_cfg(*TLM)))
    assert "save_interval_updates" not in default["trainer"]  # at its default the key is not hashed: hashes stay
    assert hashed_view(finalize(compose_cfg(*INTERVAL)))["trainer"]["save_interval_updates"] == EVERY
