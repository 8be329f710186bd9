"""``repdegen embeddings``: the report of any embedding matrix. Positive and negative controls (an isotropic Gaussian
matrix against an independent Monte-Carlo of I(W), a cone against its closed form), a trained run whose report equals
its own record, each input format, and each bad input as one error line with exit status 2."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from repdegen.analysis.report import embedding_report, sampled_cosines
from repdegen.reproduce.embeddings import build_report, main

ROOT = Path(__file__).resolve().parents[1]
HAS_SAFETENSORS = importlib.util.find_spec("safetensors") is not None
HAS_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None
V, D = 2000, 64


def gaussian(seed: int = 123, scale: float = 1.0, v: int = V, d: int = D) -> torch.Tensor:
    return torch.randn(v, d, generator=torch.Generator().manual_seed(seed)) * scale


def cone(seed: int = 5, norm: float = 5.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(D, generator=g)
    return c / c.norm() * norm + 0.01 * torch.randn(V, D, generator=g)


def zipf_counts(v: int = V) -> list[int]:
    return [int(1e6 / (i + 1)) for i in range(v)]


def numpy_isotropy(w: np.ndarray) -> float:
    """I(W) written again from the definition (Mu & Viswanath 2018), in numpy, sharing no code with the product."""
    _, vecs = np.linalg.eigh(w.T @ w)
    proj = w @ np.concatenate([vecs, -vecs], axis=1)
    top = proj.max(axis=0)
    log_z = top + np.log(np.exp(proj - top).sum(axis=0))
    return float(np.exp(log_z.min() - log_z.max()))


def run_main(args, capsys) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in args])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---- the controls ----------------------------------------------------------------------------------------------------
def test_an_isotropic_gaussian_measures_what_monte_carlo_expects():
    # the expected I(W) of a 2000 x 64 matrix of N(0, 1) entries: 30 draws of numpy's generator (not torch's), through
    # numpy_isotropy; the matrix under test is another draw. First order (Marchenko-Pastur edges of W^T W / V):
    # I ~ exp(-2 sqrt(d/V)) = 0.699; sampling noise puts the real mean a little below it.
    rng = np.random.default_rng(2024)
    mc = np.array([numpy_isotropy(rng.standard_normal((V, D))) for _ in range(30)])
    mu, sd = mc.mean(), mc.std(ddof=1)
    assert 0.6 < mu < math.exp(-2 * math.sqrt(D / V)) + 0.01 and sd < 0.03
    r = embedding_report(gaussian(), with_isoscore=False)
    assert abs(r["isotropy"] - mu) <= max(4 * sd, 0.02), (r["isotropy"], mu, sd)  # tolerance: 4 sd of the draws
    assert r["isotropy"] == pytest.approx(numpy_isotropy(gaussian().double().numpy()), rel=1e-9)
    assert r["isotropic_reference"] == pytest.approx(math.exp(-2 * math.sqrt(D / V)), abs=0.01)
    assert abs(r["mean_cos"]) < 0.005 and abs(r["cosines"]["frac_positive"] - 0.5) < 0.01
    assert r["centroid_ratio"] < 0.05 and r["sv_ratio_1_2"] < 1.2
    # entries of sd s = 0.1: near 1, below the first-order exp(-2 s^2 sqrt(d/V)) = 0.9964 and above it less the mean
    # row's term, 2 s sqrt(2 ln(2d) / V) (the largest of 2d projections of a mean row of sd s / sqrt(V), both signs)
    s = 0.1
    small = embedding_report(gaussian(scale=s), with_isoscore=False)["isotropy"]
    upper = math.exp(-2 * s * s * math.sqrt(D / V))
    assert upper * math.exp(-2 * s * math.sqrt(2 * math.log(2 * D) / V)) < small < upper


def test_a_cone_measures_near_zero():
    # every row = c + small noise, |c| = 5: Z(c/|c|) ~ V e^5 and Z(-c/|c|) ~ V e^-5, so I(W) ~ e^-10 = 4.5e-5
    r = embedding_report(cone(), {"frequent": slice(0, 600), "medium": slice(600, 1600), "rare": slice(1600, V)},
                         with_isoscore=False)
    assert r["isotropy"] == pytest.approx(math.exp(-10), rel=0.05)
    assert r["mean_cos"] > 0.99 and r["cosines"]["frac_positive"] == 1.0 and r["centroid_ratio"] > 0.99
    assert all(g["isotropy"] < 1e-3 and g["mean_cos"] > 0.99 for g in r["groups"].values())
    assert r["cos_rare_frequent"] > 0.99 and r["sv_ratio_1_2"] > 100


def test_the_report_of_the_two_controls(tmp_path, capsys):
    torch.save(gaussian(), tmp_path / "gauss.pt")
    torch.save({"embedding.weight": cone(), "bias": torch.zeros(V)}, tmp_path / "cone.pt")
    (tmp_path / "counts.json").write_text(json.dumps(zipf_counts()))
    for name in ("gauss", "cone"):
        rc, out, err = run_main([tmp_path / f"{name}.pt", "--counts", tmp_path / "counts.json", "--out",
                                 tmp_path / name], capsys)
        assert rc == 0, err
        assert "I(W)" in out and "report.md" in out
    gauss, cone_md = (tmp_path / "gauss" / "report.md").read_text(), (tmp_path / "cone" / "report.md").read_text()
    assert "matrix `(tensor)`: the only tensor" in gauss
    assert "matrix `embedding.weight`: the input embedding" in cone_md
    for text in (gauss, cone_md):
        assert "1 = isotropic" in text and "## Per frequency group" in text and "Rare-frequent cosine" in text
        assert "Gao et al. 2019 (Sec. 1, 3)" in text and "Yu et al. 2022 Sec. 3.1" in text
        assert "IsoScore" in text
    m = json.loads((tmp_path / "cone" / "metrics.json").read_text())
    assert m["isotropy"] < 1e-3 and m["source"]["key"] == "embedding.weight" and m["counts"]["total"] > 0
    assert set(m["groups"]) == {"frequent", "medium", "rare"} and m["groups"]["rare"]["size"] == 400
    for f in ("singular_values.png", "svd_projection.png", "cosines.png", "groups.png"):
        assert (tmp_path / "cone" / f).stat().st_size > 1000


def test_without_counts_there_are_no_group_numbers(tmp_path):
    torch.save(gaussian(v=300), tmp_path / "w.pt")
    m = build_report(tmp_path / "w.pt", tmp_path / "r")
    assert "groups" not in m and m["counts"] is None and "groups" not in m["figures"]
    assert "no per-group numbers" in (tmp_path / "r" / "report.md").read_text()


def test_every_pair_on_request_and_sampled_pairs_otherwise():
    w = gaussian(v=400, d=16)
    exact = embedding_report(w, all_pairs=True, with_isoscore=False)["cosines"]
    assert not exact["sampled"] and exact["pairs"] == 400 * 399 and sum(exact["histogram"]) == 400 * 399
    u = torch.nn.functional.normalize(w.double(), dim=1)
    full = (u @ u.T).numpy()[~np.eye(400, dtype=bool)]
    assert exact["frac_positive"] == pytest.approx((full > 0).mean(), abs=1e-12)
    sampled = embedding_report(w, sample_pairs=10_000, with_isoscore=False)["cosines"]
    assert sampled["sampled"] and sampled["pairs"] == 10_000
    assert sampled["frac_positive"] == pytest.approx(exact["frac_positive"], abs=0.03)
    ab = sampled_cosines(w.double(), 2500, rows=torch.arange(0, 100), cols=torch.arange(100, 400))
    assert ab.size == 2500


def test_isoscore_when_the_package_is_there(monkeypatch):
    assert embedding_report(gaussian(v=200, d=8))["isoscore_note"].startswith("not computed")  # not installed here
    pkg, mod = types.ModuleType("IsoScore"), types.ModuleType("IsoScore.IsoScore")
    mod.IsoScore = lambda cloud: 0.25 if cloud.shape == (8, 200) else -1.0  # its point cloud: one column a point
    pkg.IsoScore = mod
    monkeypatch.setitem(sys.modules, "IsoScore", pkg)
    monkeypatch.setitem(sys.modules, "IsoScore.IsoScore", mod)
    r = embedding_report(gaussian(v=200, d=8))
    assert r["isoscore"] == 0.25 and r["isoscore_note"] == "IsoScore package"


# ---- a trained run: the report equals the run's own record ---------------------------------------------------------
def test_the_report_of_a_run_equals_its_record(compose_cfg, tiny_data, tmp_path, monkeypatch):
    from repdegen.reproduce.settings.config import finalize
    from repdegen.reproduce.train import train

    cfg = finalize(compose_cfg("experiment=inan2017/small", "scale=smoke", "objective=mle"))
    record = train(cfg)
    run = Path(cfg.paths.runs_dir) / record["config_hash"]
    monkeypatch.chdir(Path(cfg.paths.output_dir).parent)  # the run's relative cache dir resolves as in training
    m = build_report(run, tmp_path / "report")
    final = record["metrics"]["final"]
    assert m["source"]["kind"] == "run folder" and m["run_record"]["weights"] == final["weights"]
    assert m["source"]["key"] == ("embedding.weight" if cfg.model.tie_weights else "output_weight")
    assert m["isotropy"] == pytest.approx(final["isotropy"], rel=1e-9)
    assert m["mean_cos"] == pytest.approx(final["mean_cos"], rel=1e-9)
    for g in ("frequent", "medium", "rare"):
        assert m["groups"][g]["isotropy"] == pytest.approx(final[f"isotropy_{g}"], rel=1e-9)
    assert m["cos_rare_frequent"] == pytest.approx(final["cos_rare_frequent"], rel=1e-9, abs=1e-12)
    assert m["singular_values"] == pytest.approx(final["singular_values"], rel=1e-6)
    if record["history"][-1].get("isotropy") is not None and final["weights"] == "best.pt" and len(record["history"]) == 1:
        assert m["isotropy"] == pytest.approx(record["history"][-1]["isotropy"], rel=1e-9)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "the run's own training counts" in text and "## The run's own record" in text
    # a text corpus, read with the run's own vocabulary (words, <eos> a line)
    (tmp_path / "corpus.txt").write_text("w1 w2 w1\nw3 nope\n")
    m = build_report(run, tmp_path / "report2", counts=tmp_path / "corpus.txt")
    assert m["counts"]["total"] == 5 + 2 and "run's vocabulary" in m["counts"]["description"]


# ---- the input formats -----------------------------------------------------------------------------------------------
def test_a_state_dict_picks_the_output_embedding_and_key_picks_another(tmp_path):
    sd = {"transformer.wte.weight": gaussian(1, v=50, d=8), "lm_head.weight": gaussian(2, v=50, d=8),
          "transformer.h.0.bias": torch.zeros(8)}
    torch.save({"model": sd}, tmp_path / "w.pt")
    m = build_report(tmp_path / "w.pt", tmp_path / "a")
    assert m["source"]["key"] == "lm_head.weight" and "output embedding" in m["source"]["why"]
    assert m["source"]["others"] == ["transformer.wte.weight"]
    m = build_report(tmp_path / "w.pt", tmp_path / "b", key="transformer.wte.weight")
    assert m["source"]["key"] == "transformer.wte.weight" and m["source"]["why"] == "chosen with --key"
    assert m["isotropy"] == pytest.approx(numpy_isotropy(sd["transformer.wte.weight"].double().numpy()), rel=1e-9)


@pytest.mark.parametrize("kind", ["json", "lines", "pt"])
def test_counts_files(tmp_path, kind):
    torch.save(gaussian(v=100, d=8), tmp_path / "w.pt")
    counts = list(range(100, 0, -1))
    path = tmp_path / {"json": "c.json", "lines": "c.txt", "pt": "c.pt"}[kind]
    if kind == "json":
        path.write_text(json.dumps(counts))
    elif kind == "lines":
        path.write_text("\n".join(map(str, counts)) + "\n")
    else:
        torch.save(torch.tensor(counts), path)
    m = build_report(tmp_path / "w.pt", tmp_path / "r", counts=path)
    assert m["counts"]["total"] == sum(counts)
    assert [g["size"] for g in m["groups"].values()] == [30, 50, 20]


def _hf_folder(folder: Path, fmt: str, tied: bool = False) -> dict:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 60}))
    sd = {"transformer.wte.weight": gaussian(3, v=60, d=8), "transformer.ln_f.weight": torch.ones(8)}
    if not tied:
        sd["lm_head.weight"] = gaussian(4, v=60, d=8)
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(folder / "model.safetensors"))
    else:
        torch.save(sd, folder / "pytorch_model.bin")
    return sd


@pytest.mark.parametrize("fmt", [
    pytest.param("safetensors", marks=pytest.mark.skipif(not HAS_SAFETENSORS, reason="safetensors is not installed")),
    "bin"])
def test_a_hugging_face_folder(tmp_path, fmt):
    sd = _hf_folder(tmp_path / "model", fmt)
    m = build_report(tmp_path / "model", tmp_path / "r")
    assert m["source"]["kind"] == "Hugging Face model folder" and m["source"]["key"] == "lm_head.weight"
    assert m["isotropy"] == pytest.approx(numpy_isotropy(sd["lm_head.weight"].double().numpy()), rel=1e-9)
    _hf_folder(tmp_path / "tied", fmt, tied=True)
    m = build_report(tmp_path / "tied", tmp_path / "r2")
    assert m["source"]["key"] == "transformer.wte.weight" and "input embedding" in m["source"]["why"]


@pytest.mark.skipif(not HAS_SAFETENSORS, reason="safetensors is not installed")
def test_a_safetensors_file(tmp_path):
    from safetensors.torch import save_file

    save_file({"decoder.weight": gaussian(5, v=40, d=8), "encoder.weight": gaussian(6, v=40, d=8)},
              str(tmp_path / "m.safetensors"))
    m = build_report(tmp_path / "m.safetensors", tmp_path / "r")
    assert m["source"]["key"] == "decoder.weight" and m["source"]["kind"] == "safetensors file"


@pytest.mark.skipif(not HAS_TOKENIZERS, reason="tokenizers is not installed")
def test_a_hugging_face_tokenizer_counts_a_text_corpus(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    _hf_folder(tmp_path / "model", "bin")
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(59)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "model" / "tokenizer.json"))
    (tmp_path / "corpus.txt").write_text("w1 w1 w2\nw3 zzz w1\n")
    m = build_report(tmp_path / "model", tmp_path / "r", counts=tmp_path / "corpus.txt")
    assert m["counts"]["total"] == 6 and m["counts"]["seen"] == 4 and "tokenizer.json" in m["counts"]["description"]


# ---- bad input: one error line, exit status 2 ----------------------------------------------------------------------
def _write(tmp_path: Path) -> dict[str, Path]:
    w = gaussian(v=50, d=8)
    bad = w.clone()
    bad[3, 0], bad[7, 2], bad[11, 1] = math.nan, math.inf, -math.inf
    paths = {"sd": tmp_path / "sd.pt", "vec": tmp_path / "vec.pt", "nan": tmp_path / "nan.pt",
             "npy": tmp_path / "w.npy", "counts": tmp_path / "c.json", "text": tmp_path / "corpus.txt",
             "names": tmp_path / "names.pt", "ints": tmp_path / "ints.pt"}
    torch.save({"embedding.weight": w, "norm.weight": torch.ones(8)}, paths["sd"])
    torch.save(torch.zeros(50), paths["vec"])
    torch.save(bad, paths["nan"])
    np.save(paths["npy"], w.numpy())
    paths["counts"].write_text(json.dumps(list(range(49, 0, -1))))
    paths["text"].write_text("the cat sat\non the mat\n")
    torch.save({"foo": w, "bar": w}, paths["names"])
    torch.save(torch.ones(50, 8, dtype=torch.long), paths["ints"])
    return paths


BAD = {
    "missing key": (["sd", "--key", "nope"], ["has no tensor 'nope'", "embedding.weight (50, 8)"], ["norm.weight"]),
    "1-D tensor": (["vec"], ["is 1-D (shape (50,))", "2-D"], []),
    "1-D key": (["sd", "--key", "norm.weight"], ["'norm.weight' is 1-D", "embedding.weight (50, 8)"], []),
    "counts of another size": (["sd", "--counts", "counts"], ["49 counts for a matrix of 50 rows"], []),
    "nan rows": (["nan"], ["3 of 50 rows with NaN or inf", "first ids: 3, 7, 11"], []),
    "unknown file type": (["npy"], ["unknown file type '.npy'"], []),
    "text without a tokenizer": (["sd", "--counts", "text"], ["whitespace words are not row ids", "counts file"], []),
    "no embedding by name": (["names"], ["no embedding matrix found by name", "--key", "foo (50, 8)"], []),
    "integer matrix": (["ints"], ["holds int64 values"], []),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_error_line(tmp_path, capsys, case):
    paths = _write(tmp_path)
    args, want, unwanted = BAD[case]
    rc, out, err = run_main([paths.get(a, a) for a in args] + ["--out", tmp_path / "r"], capsys)
    assert rc == 2 and not out
    assert err.startswith("repdegen: error: ") and err.count("\n") == 1, err
    for w in want:
        assert w in err, err
    for w in unwanted:
        assert w not in err, err
    assert not (tmp_path / "r" / "report.md").exists()


def test_missing_packages_are_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)  # an import of it fails as if it were not installed
    (tmp_path / "m.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    rc, _, err = run_main([tmp_path / "m.safetensors", "--out", tmp_path / "r"], capsys)
    assert rc == 2 and "pip install safetensors" in err
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    _hf_folder(tmp_path / "model", "bin")
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    (tmp_path / "corpus.txt").write_text("w1 w2\n")
    rc, _, err = run_main([tmp_path / "model", "--counts", tmp_path / "corpus.txt", "--out", tmp_path / "r"], capsys)
    assert rc == 2 and "pip install tokenizers" in err and err.count("\n") == 1


def test_the_command_line(tmp_path):
    """Through ``repdegen embeddings`` as a user runs it: --help, and a bad file as one line without a traceback."""
    (tmp_path / "w.npy").write_bytes(b"")
    env_cmd = [sys.executable, "-c", "from repdegen.reproduce.cli import main; main()", "embeddings"]
    bad = subprocess.run([*env_cmd, str(tmp_path / "w.npy"), "--out", str(tmp_path / "r")], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
    helped = subprocess.run([*env_cmd, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert helped.returncode == 0 and "Examples:" in helped.stdout and "docs/" in helped.stdout
    examples = [line for line in helped.stdout.splitlines() if line.strip().startswith("repdegen embeddings ")]
    assert len(examples) >= 3
    usage = subprocess.run([*env_cmd], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert usage.returncode == 2 and usage.stderr.startswith("repdegen: error: ") and usage.stderr.count("\n") == 1
