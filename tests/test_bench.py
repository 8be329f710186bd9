"""scripts/bench.py times the trainer's own update (Trainer.train_update), not a copy of it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import bench  # noqa: E402
from repdegen.reproduce.engine.trainer import Trainer  # noqa: E402

from tests.conftest import REAL_DATA, requires_real_data  # noqa: E402


def test_bench_times_trainer_train_update_interleaved(tmp_path, monkeypatch):
    calls = []
    original = Trainer.train_update

    def counting(self, group, step_lr):
        calls.append((self.cfg.objective.name, len(group)))
        return original(self, group, step_lr)

    monkeypatch.setattr(Trainer, "train_update", counting)
    out = tmp_path / "bench.json"
    report = bench.main(["--models", "transformer_lm6", "--objectives", "ul", "--smoke", "--vocab", "300",
                         "--steps", "2", "--warmup", "1", "--rounds", "2", "--update-freq", "2", "--out", str(out)])
    # MLE is added as the reference; per round and objective: 1 warmup + 2 timed updates of 2 micro-batches
    assert [c[0] for c in calls] == (["mle"] * 3 + ["ul"] * 3) * 2
    assert all(n == 2 for _, n in calls)
    on_disk = json.loads(out.read_text())
    assert on_disk["results"] == report["results"] and len(report["results"]) == 4
    assert [r["round"] for r in report["results"]] == [0, 0, 1, 1]
    for r in report["results"]:
        assert r["tokens_per_update"] == 2 * 2 * 64 and r["micro_batches"] == 2
        ref = next(x for x in report["results"] if x["round"] == r["round"] and x["objective"] == "mle")
        assert r["step_time_vs_mle"] == r["step_time_s"] / ref["step_time_s"]
    summary = {s["objective"]: s for s in report["summary"]}
    assert summary["mle"]["step_time_vs_mle"] == 1.0
    assert summary["ul"]["ratios"] == [r["step_time_vs_mle"] for r in report["results"] if r["objective"] == "ul"]
    assert report["threads"] >= 1 and "load_average" in report


def test_synthetic_corpus_holds_one_update_and_the_vocabulary():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"trainer": {"batch_size": 3, "bptt": 5, "update_freq": 2, "max_tokens": 40}})
    lm = bench.synthetic_corpus("lm", cfg, 50, 8, 10)
    assert len(lm.vocab) == 50 and lm.train.numel() == 3 * 5 * 2 + 3 and int(lm.train.min()) >= 4
    mt = bench.synthetic_corpus("translation", cfg, 50, 8, 10)
    assert len(mt.train) == (40 // 10) * 2 and mt.train.tgt[0].numel() == 10 and mt.train.src[0].numel() == 8


def test_zipf_corpus_has_fewer_distinct_tokens_weighted_by_rank():
    """--zipf: a 700-token batch of a 10,000-word vocabulary drawn ~ 1 / rank holds about as many distinct targets
    as PTB's (~360; uniform draws: ~680), and rank 1 is the most frequent token; specials are never drawn."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"trainer": {"batch_size": 20, "bptt": 35, "update_freq": 1}})
    uniform = bench.synthetic_corpus("lm", cfg, 10000, 8, 10).train
    zipf = bench.synthetic_corpus("lm", cfg, 10000, 8, 10, zipf=True).train
    assert zipf.numel() == uniform.numel() == 720 and int(zipf.min()) >= 4
    assert uniform.unique().numel() > 600 and 250 < zipf.unique().numel() < 450
    assert int(torch.bincount(zipf).argmax()) == 4


@pytest.mark.parametrize("argv, words", [
    (["--smoke", "--steps", "-1"], ["argument --steps: '-1' is not an integer >= 1", "--steps 20"]),
    (["--steps", "0", "--models", "nope"], ["argument --steps: '0' is not an integer >= 1"]),
    (["--warmup", "-1"], ["argument --warmup: '-1' is not an integer >= 0", "--warmup 5"]),
    (["--update-freq", "0"], ["argument --update-freq: '0'", "--update-freq 1"]),
    (["--batch-size", "0"], ["argument --batch-size: '0'"]),
    (["--max-tokens", "-5"], ["argument --max-tokens: '-5'"]),
    (["--bptt", "x"], ["argument --bptt: 'x' is not an integer >= 1"]),
    (["--src-len", "0"], ["argument --src-len: '0'"]),
    (["--tgt-len", "0"], ["argument --tgt-len: '0'"]),
    (["--vocab", "4"], ["argument --vocab: '4' is not an integer >= 5", "4 special tokens"]),
    (["--rounds", "0"], ["argument --rounds: '0'"]),
    (["--profile", "-2"], ["argument --profile: '-2' is not an integer >= 0"]),
    (["--precision", "fp8"], ["argument --precision: invalid choice: 'fp8'"]),
    (["--device", "quantum"], ["argument --device: 'quantum' is not a device", "--device cpu"]),
    (["--models", "transformer_lm6", "nope:d_model=8"], ["--models nope:d_model=8: not an option of conf/model",
                                                         "transformer_lm6, vd_lstm_large"]),
    (["--objectives", "ul", "bogus"], ["--objectives bogus: not an option of conf/objective", "agg, al, cosreg"]),
    (["--compile-mode", "reduce-overhead"], ["--compile-mode reduce-overhead: a mode of torch.compile", "add --compile"]),
    (["--compile", "--compile-mode", "fast"], ["--compile-mode: invalid choice: 'fast'", "reduce-overhead"]),
])
def test_a_flag_outside_its_domain_is_one_line_before_anything_runs(argv, words, capsys, monkeypatch, tmp_path):
    """Every numeric flag in its domain, the models and objectives among the configs, the device a device: one
    `repdegen: error:` line naming the value, what was expected and a value that fits, exit status 2, and nothing
    composed, built or timed (no Hydra traceback, no statistics error after the run)."""
    monkeypatch.setattr(bench, "register_all", lambda: pytest.fail("ran past the argument checks"))
    with pytest.raises(SystemExit) as exit_:
        bench.main([*argv, "--out", str(tmp_path / "b.json")])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.startswith("repdegen: error: ") and captured.err.count("\n") == 1
    for w in words:
        assert w in captured.err
    assert not (tmp_path / "b.json").exists()


def test_an_out_folder_or_a_missing_gpu_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    kept = tmp_path / "earlier.json"
    kept.write_text('{"a measured result": 1}\n')
    for argv, words in ((["--out", str(tmp_path)], f"--out {tmp_path} is a folder"),
                        (["--out", str(kept)], f"--out {kept} exists; expected a new path"),
                        (["--out", str(kept / "b.json")], f"{kept} is a file, not a folder"),
                        (["--device", "cuda:0"], "--device cuda:0: no CUDA device is available here; use --device cpu")):
        with pytest.raises(SystemExit) as exit_:
            bench.main(argv)
        assert exit_.value.code == 2 and words in capsys.readouterr().err
    assert kept.read_text() == '{"a measured result": 1}\n'  # an earlier result is never overwritten


def test_each_model_benches_in_its_own_setting():
    """The default vocabulary is the model's own corpus's, not one size for every LM."""
    assert bench.own_shape("vd_lstm_small", "lm") == ("ptb", 10000)
    assert bench.own_shape("zaremba_lstm_medium", "lm") == ("ptb", 10000)
    assert bench.own_shape("inan2016_lstm_300", "lm") == ("ptb", 10000)
    assert bench.own_shape("awd_lstm", "lm") == ("wikitext2", 33278)
    assert bench.own_shape("gpt2_medium", "lm") == ("wikitext103", 44256)
    assert bench.own_shape("transformer_base", "translation") == ("wmt14_en_de", 40624)


@requires_real_data("ptb", "wikitext-2")
def test_the_own_vocabulary_sizes_are_the_corpora_s():
    """PTB's and WikiText-2's word types (plus the end-of-sentence token), counted from the files themselves."""
    for name, files in (("ptb", "ptb.train.txt"), ("wikitext-2", "train.txt")):
        words = {w for line in (REAL_DATA / name / files).read_text().splitlines() for w in line.split()}
        dataset = {"ptb": "ptb", "wikitext-2": "wikitext2"}[name]
        size = {d: v for d, v in bench.OWN_SHAPE.values()}[dataset]
        assert len(words | {"<eos>"}) == size, name
