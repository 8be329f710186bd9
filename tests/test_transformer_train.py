"""Transformer training end to end on tiny generated data: a copy task that must be learned, kill-and-resume
(translation and LM), gradient accumulation against a hand-computed update, checkpoint averaging, the
translate entrypoint, the gao2019_t2 table at smoke scale, the inverse-sqrt schedule and label smoothing.

The translation corpora are written in the Multi30k local layout (``<root>/multi30k/{train,val,test_2016_flickr}.{en,de}``)
and read through ``dataset=multi30k_en_de dataset.data_dir=<root>``, as a real run would read them.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from repdegen.reproduce.engine.trainer import Trainer
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.settings.config import CONF_DIR, compose_config, finalize
from repdegen.reproduce.settings.schema import GenerationConfig
from repdegen.reproduce.train import load_any_corpus, train
from torch.nn import functional as F

WORDS = "red blue green cat dog bird runs sits sleeps big small the a on under".split()
GERMAN = dict(zip(WORDS, "rot blau gruen katze hund vogel laeuft sitzt schlaeft gross klein der ein auf unter".split()))

# a tiny encoder-decoder with the Transformer recipe (Adam, inverse-sqrt warm-up) on the CPU
MT = ("model=transformer_base", "dataset=multi30k_en_de", "dataset.bpe_vocab_size=100",
      "model.d_model=32", "model.d_ffn=64", "model.encoder_layers=2", "model.decoder_layers=2", "model.n_heads=4",
      "trainer.max_tokens=256", "trainer.update_freq=1", "trainer.average_last=0", "optim.warmup_updates=10",
      "trainer.device=cpu", "trainer.generation.batch_size=8", "trainer.generation.max_len_b=8")
# a tiny Transformer LM (gpt2_medium recipe) on the WikiText-2 layout of the tiny corpus with BPE
LM = ("model=transformer_lm6", "dataset=wikitext2_bpe", "dataset.bpe_vocab_size=60", "model.d_model=32", "model.n_layers=2",
      "model.n_heads=4", "model.d_ffn=64", "trainer.bptt=16", "trainer.batch_size=4", "trainer.eval_bptt=16",
      "trainer.eval_batch_size=4", "trainer.test_batch_size=4", "trainer.update_freq=2", "optim.warmup_updates=5",
      "trainer.device=cpu")
TIMING = ("epoch_seconds", "tokens_per_s", "valid_seconds")


# --------------------------------------------------------------------------------------------------
# data and config helpers
# --------------------------------------------------------------------------------------------------
def sentences(n: int, seed: int, lo: int = 3, hi: int = 6, exclude: set[str] | frozenset = frozenset()) -> list[str]:
    """``n`` distinct-from-``exclude`` sentences of lo..hi words drawn (with repeats) from WORDS."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
        if s not in exclude:
            out.append(s)
    return out


def to_german(line: str) -> str:
    """The 'translation' of the MT corpus: word by word through GERMAN, in reverse order."""
    return " ".join(GERMAN[w] for w in reversed(line.split()))


def write_multi30k(root: Path, train: list[str], valid: list[str], test: list[str], translate) -> Path:
    d = root / "multi30k"
    d.mkdir(parents=True, exist_ok=True)
    for name, lines in (("train", train), ("val", valid), ("test_2016_flickr", test)):
        (d / f"{name}.en").write_text("".join(f"{line}\n" for line in lines))
        (d / f"{name}.de").write_text("".join(f"{translate(line)}\n" for line in lines))
    return root


@pytest.fixture(scope="module")
def mt_corpus(tmp_path_factory) -> Path:
    """400 / 20 / 20 pairs, German = reversed word-by-word translation of the English side."""
    train_lines = sentences(400, 0)
    return write_multi30k(tmp_path_factory.mktemp("mt"), train_lines, sentences(20, 1), sentences(20, 2), to_german)


@pytest.fixture(scope="module")
def copy_corpus(tmp_path_factory) -> Path:
    """10,000 training sentences copied to themselves; valid/test sentences never occur in train."""
    train_lines = sentences(10_000, 0)
    seen = set(train_lines)
    return write_multi30k(tmp_path_factory.mktemp("copy"), train_lines, sentences(30, 1, exclude=seen),
                          sentences(40, 2, exclude=seen), lambda line: line)


def compose_train(*overrides: str, data_dir: Path, output_dir: Path):
    base = [f"paths.output_dir={output_dir}", f"dataset.data_dir={data_dir}", "trainer.progress=false"]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose_config([*base, *overrides])


def run_dir_of(record: dict, output_dir: Path) -> Path:
    return output_dir / "runs" / record["config_hash"]


def split_lines(root: Path, lang: str) -> list[str]:
    return (root / "multi30k" / f"test_2016_flickr.{lang}").read_text().splitlines()


def without_timing(record: dict) -> list[dict]:
    return [{k: v for k, v in h.items() if k not in TIMING} for h in record["history"]]


def model_tensors(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def assert_same_weights(a: Path, b: Path) -> None:
    ta, tb = model_tensors(a), model_tensors(b)
    assert ta.keys() == tb.keys()
    for key in ta:
        assert torch.equal(ta[key], tb[key]), f"{a.name}: {key} differs"


def fairseq_inverse_sqrt(update: int, lr: float, warmup: int, init_lr: float) -> float:
    """fairseq/optim/lr_scheduler/inverse_square_root_schedule.py, the lr set after ``update`` updates."""
    if update < warmup:
        return init_lr + update * (lr - init_lr) / warmup
    return lr * math.sqrt(warmup) * update**-0.5


# --------------------------------------------------------------------------------------------------
# 1-2. a copy task is learned; greedy and beam search reproduce held-out sources
# --------------------------------------------------------------------------------------------------
# Tuned on 2 CPU threads: ~300 updates (~5 s) reach BLEU 100 on held-out sentences for seeds 1-3. What matters is
# that every word is one BPE piece (bpe_vocab_size=100 in MT): with 40-60 pieces words split into sub-words and even
# 1,000 updates of a 2+2-layer model stayed at BLEU 50-90. One layer each, d_model 64, lr 5e-3, 1,024-token batches.
COPY = (*MT, "model.d_model=64", "model.d_ffn=128", "model.encoder_layers=1", "model.decoder_layers=1",
        "model.dropout=0", "trainer.label_smoothing=0", "optim.lr=5e-3", "optim.warmup_updates=100",
        "trainer.max_updates=300", "trainer.max_tokens=1024", "trainer.generation.beam=1", "trainer.final_weights=last")


@pytest.fixture(scope="module")
def copy_run(copy_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("copyrun")
    record = train(compose_train(*COPY, data_dir=copy_corpus, output_dir=out))
    return record, run_dir_of(record, out)


def exact(hyps: list[str], refs: list[str]) -> float:
    assert len(hyps) == len(refs)
    return sum(h == r for h, r in zip(hyps, refs)) / len(refs)


@pytest.mark.e2e  # its fixture trains the copy task (about 100 s on 2 busy cores)
def test_copy_task_is_learned(copy_run, copy_corpus):
    from repdegen.reproduce.translate import load_translator, translate_lines

    record, run_dir = copy_run
    assert record["status"] == "complete" and record["history"][-1]["updates"] == 300
    final = record["metrics"]["final"]
    assert final["weights"] == "last.pt"
    assert final["bleu"] > 90 and final["bleu_tok"] > 90
    sources = split_lines(copy_corpus, "en")
    greedy = (run_dir / "hyp.last.test.de").read_text().splitlines()  # beam=1 in the run
    assert exact(greedy, sources) >= 0.9
    model, tokenizer, cfg, _ = load_translator(str(run_dir), torch.device("cpu"))
    gen = OmegaConf.merge(OmegaConf.structured(GenerationConfig), cfg.trainer.generation)
    gen.beam = 4
    beam = translate_lines(model, tokenizer, sources, gen, torch.device("cpu"), progress=False)
    assert exact(beam, sources) >= 0.9
    # control: the same architecture untrained copies nothing
    from repdegen.models import build_model

    torch.manual_seed(0)
    untrained = build_model(cfg.model, len(tokenizer), cfg.model.tie_weights).eval()
    assert exact(translate_lines(untrained, tokenizer, sources, gen, torch.device("cpu"), progress=False), sources) == 0


# --------------------------------------------------------------------------------------------------
# 3. kill and resume: bit-identical on the CPU
# --------------------------------------------------------------------------------------------------
def test_mt_resume_gives_the_same_result(mt_corpus, tmp_path):
    # dropout > 0 so the restored RNG state matters; averaging so the kept epoch list must survive too
    over = (*MT, "trainer.max_epochs=2", "model.dropout=0.1", "trainer.average_last=2")
    a, b = tmp_path / "a", tmp_path / "b"
    straight = train(compose_train(*over, data_dir=mt_corpus, output_dir=a))
    interrupted = train(compose_train(*over, "trainer.stop_after_epochs=1", data_dir=mt_corpus, output_dir=b))
    assert interrupted["status"] == "interrupted" and len(interrupted["history"]) == 1
    resumed = train(compose_train(*over, "trainer.resume=true", data_dir=mt_corpus, output_dir=b))
    assert resumed["status"] == straight["status"] == "complete"
    assert resumed["config_hash"] == straight["config_hash"]
    fa, fb = straight["metrics"]["final"], resumed["metrics"]["final"]
    for key in ("valid_nll", "test_nll", "bleu", "bleu_tok", "bleu_signature", "weights", "singular_values"):
        assert fa[key] == fb[key], key
    assert straight["metrics"] == resumed["metrics"]
    assert without_timing(straight) == without_timing(resumed)
    ra, rb = run_dir_of(straight, a), run_dir_of(resumed, b)
    for name in ("last.pt", "best.pt", "averaged.pt", "epoch1.pt", "epoch2.pt"):
        assert_same_weights(ra / name, rb / name)
    assert (ra / "hyp.averaged.test.de").read_text() == (rb / "hyp.averaged.test.de").read_text()
    # the schedule in the records is fairseq's inverse_sqrt: the lr of an epoch's last update
    cfg = straight["config"]["optim"]
    for h in straight["history"]:
        assert h["lr"] == pytest.approx(fairseq_inverse_sqrt(h["updates"] - 1, cfg["lr"], cfg["warmup_updates"],
                                                             cfg["warmup_init_lr"]), rel=1e-12)


def test_transformer_lm_resume_gives_the_same_result(tiny_data, tmp_path):
    over = (*LM, "trainer.max_epochs=2")
    a, b = tmp_path / "a", tmp_path / "b"
    straight = train(compose_train(*over, data_dir=tiny_data, output_dir=a))
    interrupted = train(compose_train(*over, "trainer.stop_after_epochs=1", data_dir=tiny_data, output_dir=b))
    assert interrupted["status"] == "interrupted"
    resumed = train(compose_train(*over, "trainer.resume=true", data_dir=tiny_data, output_dir=b))
    assert straight["status"] == resumed["status"] == "complete"
    assert straight["metrics"] == resumed["metrics"]
    assert without_timing(straight) == without_timing(resumed)
    assert straight["history"][-1]["updates"] > straight["history"][0]["updates"] > 0
    assert_same_weights(run_dir_of(straight, a) / "best.pt", run_dir_of(resumed, b) / "best.pt")
    ckpt_a = torch.load(run_dir_of(straight, a) / "checkpoint.pt", weights_only=False)
    ckpt_b = torch.load(run_dir_of(resumed, b) / "checkpoint.pt", weights_only=False)
    for key in ckpt_a["model"]:
        assert torch.equal(ckpt_a["model"][key], ckpt_b["model"][key]), key


# --------------------------------------------------------------------------------------------------
# 4. gradient accumulation = one update on the union of the micro-batches
# --------------------------------------------------------------------------------------------------
def test_update_freq_equals_one_update_on_the_union(mt_corpus, tmp_path):
    from repdegen.data.translation import PAD, collate
    from repdegen.losses import build_objective
    from repdegen.models import build_model

    lr = 0.5
    cfg = finalize(compose_train(*MT, "model.dropout=0", "trainer.label_smoothing=0", "optim.name=sgd", "optim.schedule=epoch",
                                 f"optim.lr={lr}", "optim.clip_grad_norm=null", "trainer.update_freq=2",
                                 data_dir=mt_corpus, output_dir=tmp_path))
    corpus = load_any_corpus(cfg.dataset, cfg.paths.cache_dir)
    torch.manual_seed(0)
    model = build_model(cfg.model, len(corpus.vocab), cfg.model.tie_weights)
    objective = build_objective(cfg.objective, len(corpus.vocab), cfg.trainer.label_smoothing)
    start = copy.deepcopy(model)
    trainer = Trainer(cfg, model, objective, corpus, tmp_path, torch.device("cpu"))
    # two micro-batches with very different target token counts (2 short vs 6 long sentences)
    by_len = sorted(range(len(corpus.train)), key=lambda i: corpus.train.tgt[i].numel())
    a, b = by_len[:2], by_len[-6:]
    n_a, n_b = (sum(corpus.train.tgt[i].numel() for i in part) for part in (a, b))
    assert n_b > 4 * n_a
    trainer.task.train_batches = lambda epoch, stage: [a, b]
    trainer.train_epoch(1)
    assert trainer.state.updates == 1

    def sgd_step(loss_fn) -> dict[str, torch.Tensor]:
        m = copy.deepcopy(start)
        loss_fn(m).backward()
        return {k: (p - lr * p.grad).detach() for k, p in m.named_parameters()}

    def batch_nll(m, indices, reduction="mean"):
        batch = collate(corpus.train, indices)
        hidden = m(batch.src, batch.prev).hidden
        mask = batch.target != PAD
        return F.cross_entropy(m.logits(hidden[mask]), batch.target[mask], reduction=reduction)

    # by hand: the mean NLL over every target token of A and B, in one padded batch
    expected = sgd_step(lambda m: batch_nll(m, a + b))
    got = dict(model.named_parameters())
    for key, value in expected.items():
        assert torch.allclose(got[key].detach(), value, atol=1e-6, rtol=0), key
    # the comparison can fail: averaging the two micro-batch means (ignoring their sizes) is another update
    naive = sgd_step(lambda m: (batch_nll(m, a) + batch_nll(m, b)) / 2)
    assert max((got[k].detach() - naive[k]).abs().max().item() for k in naive) > 1e-4


# --------------------------------------------------------------------------------------------------
# 5. checkpoint averaging
# --------------------------------------------------------------------------------------------------
def test_average_last_is_the_mean_of_the_last_epochs(mt_corpus, tmp_path):
    from repdegen.data.translation import PAD, collate
    from repdegen.models import build_model

    over = (*MT, "trainer.max_epochs=3", "trainer.average_last=2")
    first = train(compose_train(*over, "trainer.stop_after_epochs=2", data_dir=mt_corpus, output_dir=tmp_path))
    run_dir = run_dir_of(first, tmp_path)
    after2 = torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]  # the weights after epoch 2
    assert (run_dir / "epoch1.pt").is_file() and (run_dir / "epoch2.pt").is_file()
    record = train(compose_train(*over, "trainer.resume=true", data_dir=mt_corpus, output_dir=tmp_path))
    assert record["status"] == "complete" and len(record["history"]) == 3
    final = record["metrics"]["final"]
    assert final["weights"] == "averaged.pt"
    assert not (run_dir / "epoch1.pt").exists()  # only the last average_last epochs are kept
    after3 = model_tensors(run_dir / "last.pt")
    for key, value in after2.items():
        assert torch.equal(model_tensors(run_dir / "epoch2.pt")[key], value)
        assert torch.equal(model_tensors(run_dir / "epoch3.pt")[key], after3[key])
    averaged = model_tensors(run_dir / "averaged.pt")
    assert averaged.keys() == after3.keys()
    for key in averaged:
        assert torch.allclose(averaged[key], (after2[key] + after3[key]) / 2, atol=1e-7, rtol=0), key
    assert any(not torch.equal(after2[k], after3[k]) for k in after3)
    # the final metrics are those of the averaged weights: valid NLL by hand, in one padded batch
    corpus_cfg = finalize(compose_train(*over, data_dir=mt_corpus, output_dir=tmp_path))
    corpus = load_any_corpus(corpus_cfg.dataset, corpus_cfg.paths.cache_dir)  # the run's cached BPE and sentences
    cfg = OmegaConf.create(record["config"])
    model = build_model(cfg.model, len(corpus.vocab), cfg.model.tie_weights)
    model.load_state_dict(averaged)
    model.eval()
    batch = collate(corpus.valid, range(len(corpus.valid)))
    with torch.no_grad():
        hidden = model(batch.src, batch.prev).hidden
        mask = batch.target != PAD
        nll = F.cross_entropy(model.logits(hidden[mask]), batch.target[mask]).item()
    assert final["valid_nll"] == pytest.approx(nll, rel=1e-5)
    assert final["valid_nll"] != record["history"][-1]["valid_nll"]
    assert (run_dir / "hyp.averaged.test.de").is_file()


# --------------------------------------------------------------------------------------------------
# 6. the translate entrypoint
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mt_run(mt_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("mtrun")
    record = train(compose_train(*MT, "trainer.max_epochs=2", data_dir=mt_corpus, output_dir=out))
    return record, run_dir_of(record, out)


def translate_app(**kwargs):
    from repdegen.reproduce.translate import TranslateConfig

    return OmegaConf.merge(OmegaConf.structured(TranslateConfig), {"device": "cpu", **kwargs})


def test_translate_entrypoint_reproduces_the_runs_hypotheses(mt_run, mt_corpus, tmp_path, capsys):
    from repdegen.reproduce.translate import run

    record, run_dir = mt_run
    final = record["metrics"]["final"]
    tag = Path(final["weights"]).stem
    saved = (run_dir / f"hyp.{tag}.test.de").read_text().splitlines()
    assert len(saved) == 20
    src = mt_corpus / "multi30k" / "test_2016_flickr.en"
    ref = mt_corpus / "multi30k" / "test_2016_flickr.de"
    out = tmp_path / "hyp.de"
    hyps = run(translate_app(checkpoint=str(run_dir), input=str(src), output=str(out), reference=str(ref)))
    assert hyps == saved and out.read_text().splitlines() == saved
    err = capsys.readouterr().err
    assert f"SacreBLEU {final['bleu']:.2f}" in err and final["bleu_signature"] in err
    # a weights file works as well, and decoding overrides reach the search (at most one BPE piece out)
    same = run(translate_app(checkpoint=str(run_dir / final["weights"]), input=str(src), output=str(tmp_path / "w.de")))
    assert same == saved
    short = run(translate_app(checkpoint=str(run_dir), input=str(src), output=str(tmp_path / "s.de"), max_len_a=0.0,
                              max_len_b=1, beam=1))
    assert all(len(h.split()) <= 1 for h in short) and short != saved
    # bad checkpoints are configuration errors naming the problem
    with pytest.raises(ConfigError, match="neither a run directory nor a weights file"):
        run(translate_app(checkpoint=str(tmp_path / "nowhere"), input=str(src)))
    with pytest.raises(ConfigError, match="no result.json"):
        run(translate_app(checkpoint=str(tmp_path), input=str(src)))


# --------------------------------------------------------------------------------------------------
# 7. gao2019_t2 at smoke scale, end to end on the tiny corpus
# --------------------------------------------------------------------------------------------------
def test_gao2019_t2_smoke_table_end_to_end(mt_corpus, tmp_path):
    from repdegen.reproduce.runs.tables import run_table

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose("table_app", overrides=["table=gao2019_t2", "scale=smoke", f"paths.output_dir={tmp_path}/out",
                                              f"paths.tables_dir={tmp_path}/tables"])
        app.overrides = [f"dataset.data_dir={mt_corpus}", "trainer.progress=false", "trainer.device=cpu"]
        assert run_table(app) == 0
    out = tmp_path / "tables" / "gao2019_t2" / "smoke"
    md = (out / "table.md").read_text()
    for header in ("BLEU tokenized (13a, approx.) (paper)", "BLEU tokenized (13a, approx.) (ours)", "SacreBLEU (ours)",
                   "Params (M) (ours)"):
        assert header in md
    assert "SacreBLEU signature: `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in md
    rows = list(csv.DictReader(io.StringIO((out / "table.csv").read_text())))
    assert len(rows) == 10 and all(r["status"] in ("complete", "paper-only") for r in rows)
    ours = [r for r in rows if r["status"] == "complete"]
    assert len(ours) == 6 and len({r["config_hash"] for r in ours}) == 6
    for r in ours:
        assert 0 <= float(r["bleu_ours"]) <= 100 and 0 <= float(r["bleu_tok_ours"]) <= 100
        record = json.loads((tmp_path / "out" / "runs" / r["config_hash"] / "result.json").read_text())
        cfg, final = record["config"], record["metrics"]["final"]
        # each cell: the smoke budget on the tiny Multi30k stand-in, in the row's direction and size
        assert record["scale"] == "smoke" and cfg["dataset"]["data_dir"] == str(mt_corpus)
        assert cfg["dataset"]["name"] == ("multi30k_de_en" if "German → English" in r["group"] else "multi30k_en_de")
        assert cfg["model"]["d_model"] == (96 if "Big" in r["label"] else 48)  # 1024 / 512 x 0.1, a multiple of the heads
        assert cfg["objective"]["name"] == ("cosreg" if "CosReg" in r["label"] else "mle")
        assert float(r["bleu_ours"]) == pytest.approx(final["bleu"], abs=0.01)
        # the compound split is the En->De convention: German output only
        from repdegen.analysis.bleu import PLAIN_TOKENIZED_DESCRIPTION, TOKENIZED_DESCRIPTION

        german = cfg["dataset"]["tgt_lang"] == "de"
        assert final["bleu_tok_description"] == (TOKENIZED_DESCRIPTION if german else PLAIN_TOKENIZED_DESCRIPTION)


# --------------------------------------------------------------------------------------------------
# 8-9. units: the inverse-sqrt schedule, label smoothing
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("init_lr", [0.0, 1e-7])
def test_inverse_sqrt_schedule_is_fairseqs(init_lr):
    lr, warmup = 7e-4, 4000
    from repdegen.reproduce.engine.optim import lr_for_update

    o = SimpleNamespace(lr=lr, warmup_updates=warmup, warmup_init_lr=init_lr)
    for update in (0, 1, warmup // 2, warmup - 1, warmup, 4 * warmup, 100_000):
        got = lr_for_update(o, update)
        assert got == pytest.approx(fairseq_inverse_sqrt(update, lr, warmup, init_lr), rel=1e-12, abs=1e-15)
    assert lr_for_update(o, 0) == init_lr
    assert lr_for_update(o, warmup // 2) == pytest.approx((init_lr + lr) / 2)
    assert lr_for_update(o, warmup) == pytest.approx(lr)
    assert lr_for_update(o, 4 * warmup) == pytest.approx(lr / 2)
    # Vaswani et al.: d^-0.5 * min(step^-0.5, step * warmup^-1.5) with lr = (d * warmup)^-0.5, from 0
    if init_lr == 0.0:
        d = 512
        o.lr = (d * warmup) ** -0.5
        for step in (1, 100, warmup, 3 * warmup):
            assert lr_for_update(o, step) == pytest.approx(d**-0.5 * min(step**-0.5, step * warmup**-1.5))


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_is_torchs(eps):
    from repdegen.losses import Objective, build_objective

    torch.manual_seed(0)
    logits = torch.randn(37, 11) * 3
    targets = torch.randint(0, 11, (37,))
    objective = Objective()
    objective.label_smoothing = eps
    a = logits.clone().requires_grad_(True)
    loss, nll = objective.token_nll(a, targets)
    b = logits.clone().requires_grad_(True)
    ref = F.cross_entropy(b, targets, label_smoothing=eps)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert nll.item() == pytest.approx(F.cross_entropy(logits, targets).item(), rel=1e-6)
    assert not nll.requires_grad
    loss.backward()
    ref.backward()
    assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7)
    # the trainer's label smoothing reaches the objective
    mle = build_objective(OmegaConf.create({"name": "mle", "tie_weights": None}), 11, eps)
    assert mle.label_smoothing == eps
