"""Distributed training: ``torchrun --nproc_per_node=2`` (gloo, CPU) trains the same model as one process.

The config's batch is the global batch, sharded over the ranks (LM: BPTT columns r::W; translation:
the sentences of each bucket r::W), so a 2-rank run and a 1-process run of one config must agree --
up to float rounding, since a rank sums its half of the columns (or sentences) in another order.
Dropout is off: each rank draws its own masks for its shard, which no single process reproduces.
The comparisons can fail: training moves the weights by orders of magnitude more than the tolerance
(checked), and any error in the sharding, the loss weighting or the gradient sum shows at once.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from repdegen.reproduce.engine import distributed as dist
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.settings.config import finalize
from repdegen.reproduce.train import train

REPO = Path(__file__).resolve().parents[1]
TOL = 1e-5  # relative, on NLLs, I(W) and weights (the measured differences are ~1e-7)

# an LSTM LM with AGG on the tiny PTB corpus: 2 micro-batches per update (accumulation), sharded validation
# (eval batch 20 = 2 x 10 columns) and whole-split test on every rank (test batch 1), AGG's counter all-reduced
LSTM_AGG = ("experiment=inan2017/small", "scale=smoke", "objective=agg", "model.dropout=0", "scale.max_epochs=2",
            "trainer.max_epochs=2", "trainer.update_freq=2", "trainer.device=cpu",
            "trainer.progress=false")
# a tiny encoder-decoder with AGG; one training pair is too long to share its bucket, so rank 1's shard of
# that bucket is empty (it must still call AGG's all-reduce)
MT_AGG = ("model=transformer_base", "dataset=multi30k_en_de", "dataset.bpe_vocab_size=100", "model.d_model=32",
          "model.d_ffn=64", "model.encoder_layers=1", "model.decoder_layers=1", "model.n_heads=4", "model.dropout=0",
          "objective=agg", "objective.alpha=0.08", "trainer.max_tokens=64", "trainer.max_epochs=2",
          "trainer.average_last=0", "optim.warmup_updates=10", "trainer.device=cpu", "trainer.progress=false",
          "trainer.generation.batch_size=8", "trainer.generation.max_len_b=4", "trainer.generation.beam=1")
WORDS = "red blue green cat dog bird runs sits sleeps big small the a on under".split()


def torchrun(overrides, data_dir: Path, out: Path, nproc: int = 2) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "repdegen.reproduce.train", *overrides, f"dataset.data_dir={data_dir}", f"paths.output_dir={out}",
           f"hydra.run.dir={out}/hydra"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def the_run_dir(out: Path) -> Path:
    runs = [p for p in (out / "runs").iterdir()]
    assert len(runs) == 1, f"one run directory, not one per rank: {runs}"
    return runs[0]


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def weights_rel_diff(a: dict, b: dict) -> float:
    """The largest difference of a weight tensor relative to its largest entry. Attention key biases are left
    out: softmax is shift-invariant, so their gradient is exactly zero but for rounding, which Adam scales up
    to steps of size lr -- in one process as in two, so they drift apart without any effect on the outputs."""
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp(min=1e-12)).item()
               for k in a if a[k].is_floating_point() and not k.endswith("k_proj.bias"))


def compare(single: dict, multi: dict, dir_single: Path, dir_multi: Path) -> dict:
    """The largest relative differences between the two runs (asserted below TOL by the callers)."""
    assert single["config_hash"] == multi["config_hash"]
    fs, fm = single["metrics"]["final"], multi["metrics"]["final"]
    diffs = {k: rel(fm[k], fs[k]) for k in ("valid_nll", "test_nll", "isotropy", "mean_cos")}
    diffs["history"] = max(rel(hm[k], hs[k]) for hs, hm in zip(single["history"], multi["history"])
                           for k in ("train_nll", "valid_nll", "isotropy"))
    ws = torch.load(dir_single / fs["weights"], weights_only=False)
    wm = torch.load(dir_multi / fm["weights"], weights_only=False)
    diffs["weights"] = weights_rel_diff(wm["model"], ws["model"])
    print("torchrun (2 ranks) vs one process, relative differences:", json.dumps(diffs))
    return diffs


def assert_one_writer(proc: subprocess.CompletedProcess, run_dir: Path, epochs: int) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "complete" and record["distributed"]["world_size"] == 2
    # rank 0 alone prints and writes: one summary, one line per epoch, no renamed or temporary ledger files
    assert proc.stdout.count("repdegen: done ") == 1
    assert sum(line.startswith("[train epoch") for line in proc.stdout.splitlines()) == epochs
    assert sorted(p.name for p in run_dir.glob("result*")) == ["result.json"]
    assert not list(run_dir.glob(".*.tmp"))
    return record


def lstm_torchrun_vs_one_process(compose_cfg, tiny_data, tmp_path, overrides):
    """(single record, multi record, single dir, multi dir) of one config run in one process and by torchrun."""
    single = train(compose_cfg(*overrides, output_dir=tmp_path / "one"))
    proc = torchrun(overrides, tiny_data, tmp_path / "two")
    dir_multi, dir_single = the_run_dir(tmp_path / "two"), the_run_dir(tmp_path / "one")
    multi = assert_one_writer(proc, dir_multi, epochs=2)
    diffs = compare(single, multi, dir_single, dir_multi)
    assert max(diffs.values()) < TOL, diffs
    assert [h["updates"] for h in multi["history"]] == [h["updates"] for h in single["history"]]
    return single, multi, dir_single, dir_multi


@pytest.mark.e2e  # torchrun ranks through a helper of this module
def test_lstm_agg_torchrun_equals_one_process(compose_cfg, tiny_data, tmp_path):
    single, multi, dir_single, dir_multi = lstm_torchrun_vs_one_process(compose_cfg, tiny_data, tmp_path, LSTM_AGG)
    # AGG's token counter saw the global batches: the integer memory is identical, not merely close
    ca = torch.load(dir_single / "checkpoint.pt", weights_only=False)["objective"]
    cb = torch.load(dir_multi / "checkpoint.pt", weights_only=False)["objective"]
    for key in ("counts", "total", "slot_step"):
        assert torch.equal(ca[key], cb[key]), key
    # by hand: the memory spans one epoch (K = its 3 updates), so it holds the counts of every target of the stream
    from repdegen.data.batching import batchify
    from repdegen.models import build_model
    from repdegen.reproduce.train import load_any_corpus

    cfg = finalize(compose_cfg(*LSTM_AGG))
    corpus = load_any_corpus(cfg.dataset, cfg.paths.cache_dir)
    targets = batchify(corpus.train, cfg.trainer.batch_size)[1:].reshape(-1)
    assert torch.equal(cb["total"], torch.bincount(targets, minlength=len(corpus.vocab)))
    assert single["trace"]["rare_count"] == multi["trace"]["rare_count"]
    # the tolerance is tight: training moved the weights far more than it allows
    torch.manual_seed(cfg.seed)
    init = build_model(cfg.model, len(corpus.vocab), cfg.model.tie_weights).state_dict()
    trained = torch.load(dir_single / "best.pt", weights_only=False)["model"]
    assert weights_rel_diff(trained, init) > 1000 * TOL


@pytest.mark.e2e  # torchrun ranks through a helper of this module
def test_lstm_cosreg_torchrun_equals_one_process(compose_cfg, tiny_data, tmp_path):
    """CosReg's penalty is added once per update after the all-reduce: not once per rank, not per micro-batch."""
    overrides = tuple(o for o in LSTM_AGG if o != "objective=agg") + ("objective=cosreg", "objective.gamma=50",
                                                                      "objective.tie_weights=true")
    single, *_ = lstm_torchrun_vs_one_process(compose_cfg, tiny_data, tmp_path, overrides)
    # the penalty mattered: the same run without it ends elsewhere by far more than the tolerance
    plain = train(compose_cfg(*overrides, "objective.gamma=0", output_dir=tmp_path / "plain"))
    assert rel(plain["metrics"]["final"]["mean_cos"], single["metrics"]["final"]["mean_cos"]) > 1000 * TOL


@pytest.fixture(scope="module")
def mt_data(tmp_path_factory) -> Path:
    """200 / 20 / 20 pairs of 3-6 words (German: the words in reverse order) and one 40-word pair."""
    rng = random.Random(0)

    def line(lo, hi):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    root = tmp_path_factory.mktemp("mt")
    d = root / "multi30k"
    d.mkdir()
    splits = {"train": [line(3, 6) for _ in range(200)] + [line(40, 40)], "val": [line(3, 6) for _ in range(20)],
              "test_2016_flickr": [line(3, 6) for _ in range(20)]}
    for name, lines in splits.items():
        (d / f"{name}.en").write_text("".join(f"{s}\n" for s in lines))
        (d / f"{name}.de").write_text("".join(" ".join(reversed(s.split())) + "\n" for s in lines))
    return root


def test_translation_agg_torchrun_equals_one_process(compose_cfg, mt_data, tmp_path):
    single = train(compose_cfg(*MT_AGG, data_dir=mt_data, output_dir=tmp_path / "one"))
    # the second run finds the BPE model and the corpus in the cache the first one filled
    shutil.copytree(tmp_path / "one" / "cache", tmp_path / "two" / "cache")
    proc = torchrun(MT_AGG, mt_data, tmp_path / "two")
    dir_multi, dir_single = the_run_dir(tmp_path / "two"), the_run_dir(tmp_path / "one")
    multi = assert_one_writer(proc, dir_multi, epochs=2)
    diffs = compare(single, multi, dir_single, dir_multi)
    assert max(diffs.values()) < TOL, diffs
    ca = torch.load(dir_single / "checkpoint.pt", weights_only=False)["objective"]
    cb = torch.load(dir_multi / "checkpoint.pt", weights_only=False)["objective"]
    assert torch.equal(ca["total"], cb["total"]) and torch.equal(ca["counts"], cb["counts"])
    # BLEU (rank 0 only) decodes the same hypotheses
    tag = Path(single["metrics"]["final"]["weights"]).stem
    assert (dir_single / f"hyp.{tag}.test.de").read_text() == (dir_multi / f"hyp.{tag}.test.de").read_text()


def test_the_long_pair_is_alone_in_its_bucket(compose_cfg, mt_data, tmp_path):
    """The premise of the test above: a bucket with one sentence, so one of two ranks has none."""
    from repdegen.reproduce.train import load_any_corpus

    cfg = finalize(compose_cfg(*MT_AGG, data_dir=mt_data, output_dir=tmp_path))
    corpus = load_any_corpus(cfg.dataset, cfg.paths.cache_dir)
    from repdegen.data.translation import token_batches

    lens = [len(s) for s in corpus.train.src], [len(s) for s in corpus.train.tgt]
    assert min(len(b) for b in token_batches(*lens, cfg.trainer.max_tokens, shuffle=False)) == 1


# --------------------------------------------------------------------------------------------------
# units: launcher environments, the sharding check
# --------------------------------------------------------------------------------------------------
def fake_scontrol(tmp_path: Path, monkeypatch) -> Path:
    """An ``scontrol`` on PATH that logs its arguments and answers ``show hostnames`` with two hosts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scontrol.log"
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$1" = show ] && printf "gpu17\\ngpu18\\n"\nexit 0\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def test_launcher_environments(tmp_path, monkeypatch):
    torchrun_env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert dist.launcher_env(torchrun_env) == {"rank": 3, "world_size": 4, "local_rank": 1, "launcher": "torchrun",
                                               "master_addr": None, "master_port": None}  # torchrun wins
    log = fake_scontrol(tmp_path, monkeypatch)
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "123456",
             "SLURM_JOB_NODELIST": "gpu[17-18]"}
    assert dist.launcher_env(slurm) == {"rank": 5, "world_size": 8, "local_rank": 1, "launcher": "slurm",
                                        "master_addr": "gpu17", "master_port": str(10000 + 123456 % 20000)}
    assert log.read_text().split() == ["show", "hostnames", "gpu[17-18]"]
    # what the job script set is kept
    kept = dist.launcher_env(dict(slurm, MASTER_ADDR="head", MASTER_PORT="29500"))
    assert kept["master_addr"] is None and kept["master_port"] is None
    assert dist.launcher_env({}) is None
    assert dist.launcher_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})["world_size"] == 1


def test_requeue_only_under_slurm(tmp_path, monkeypatch):
    log = fake_scontrol(tmp_path, monkeypatch)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert not dist.requeue_if_slurm() and not log.exists()
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert dist.requeue_if_slurm()
    assert log.read_text().split() == ["requeue", "4242"]


def test_lm_batch_must_divide_by_the_world_size(compose_cfg):
    from repdegen.reproduce.engine.tasks import check_world_size

    cfg = finalize(compose_cfg("experiment=inan2017/small"))
    check_world_size(cfg, 4)  # 20 columns: 5 per rank
    with pytest.raises(ConfigError, match=r"trainer.batch_size=20 .* over 3 ranks.*\(1, 2, 4, 5, 10, 20\)"):
        check_world_size(cfg, 3)


def test_single_process_has_no_process_group():
    info = dist.init_distributed(use_cuda=False)
    assert (info.world_size, info.rank, info.backend) == (1, 0, None) and dist.is_main()
    assert not torch.distributed.is_initialized()
    assert dist.sum_over_ranks(1.5, 2) == [1.5, 2.0] and dist.broadcast_object({"a": 1}) == {"a": 1}
