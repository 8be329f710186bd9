"""scripts/drift_by_count.py against a hand-worked embedding and a brute-force pairwise mean."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import drift_by_count  # noqa: E402

COUNTS = torch.tensor([0, 0, 0, 1, 1, 5])


def _cell(tmp_path, recorded=None):
    # ids 0-2 never seen; 3, 4 seen once; 5 seen 5 times (d = 2, init at 0 so the drift is the weight)
    w = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0], [3.0, 0.0], [0.0, -2.0], [-1.0, -1.0]])
    torch.save(torch.zeros_like(w), tmp_path / "init_embedding.pt")
    torch.save({"model": {"embedding.weight": w, "rnn.weight": torch.zeros(3, 3)}}, tmp_path / "best.pt")
    if recorded is not None:
        (tmp_path / "result.json").write_text(json.dumps({"metrics": {"final": {"drift_cos_rare_unseen": recorded}}}))
    return w


def _brute_between(w, a, b):
    u = torch.nn.functional.normalize(w.double(), dim=1)
    return sum(float(u[i] @ u[j]) for i in a for j in b) / (len(a) * len(b))


def _brute_within(w, a):
    u = torch.nn.functional.normalize(w.double(), dim=1)
    pairs = [(i, j) for i in a for j in a if i != j]
    return sum(float(u[i] @ u[j]) for i, j in pairs) / len(pairs)


def test_buckets_match_hand_worked_and_brute_force(tmp_path):
    w = _cell(tmp_path, recorded=-0.25)
    r = drift_by_count.analyse(tmp_path, "best.pt", None, COUNTS, [])
    by = {b["count"]: b for b in r["buckets"]}
    # hand-worked: unseen unit drifts (1,0), (1,0), (0,1): pairwise mean 1/3; the count-1 rows (1,0), (0,-1) against
    # the unseen mean (2/3, 1/3): 2/3 and -1/3, mean 1/6; the count-5 row (-1,-1)/sqrt 2: -1/sqrt 2
    assert by["0"]["mean_cos_to_unseen_drift"] == pytest.approx(1 / 3)
    assert by["1"]["mean_cos_to_unseen_drift"] == pytest.approx(1 / 6)
    assert by["4-5"]["mean_cos_to_unseen_drift"] == pytest.approx(-1 / math.sqrt(2))
    assert by["0"]["mean_cos_to_unseen_drift"] == pytest.approx(_brute_within(w, [0, 1, 2]))
    assert by["1"]["mean_cos_to_unseen_drift"] == pytest.approx(_brute_between(w, [3, 4], [0, 1, 2]))
    # along the unit never-seen direction (2, 1)/sqrt 5: the count-1 rows (3,0), (0,-2): 6/sqrt 5 and -2/sqrt 5
    assert by["1"]["mean_drift_along_unseen"] == pytest.approx(2 / math.sqrt(5))
    assert by["2"]["types"] == 0 and math.isnan(by["2"]["mean_cos_to_unseen_drift"])
    # the rare group (the last 20 % of the seen types by count, ties by id): id 4 alone
    assert r["rare_group_size"] == 1 and r["rare_group_counts"] == [1, 1]
    assert r["drift_cos_rare_unseen_recomputed"] == pytest.approx(_brute_between(w, [4], [0, 1, 2]))
    assert r["drift_cos_rare_unseen_recorded"] == -0.25
    assert r["balance_count_T_over_V"] == pytest.approx(7 / 6)


def test_centroids_raw_and_unit_hand_worked(tmp_path):
    _cell(tmp_path)
    (tmp_path / "result.json").write_text(json.dumps({"metrics": {"final": {"centroid_ratio": 0.5}}}))
    c_all = drift_by_count.analyse(tmp_path, "best.pt", None, COUNTS, [])
    assert c_all["centroid_ratio_recorded"] == 0.5
    c = c_all["centroids"]
    # never-seen rows (1,0), (2,0), (0,3): mean (1, 1), mean square norm (1 + 4 + 9) / 3; unit rows (1,0), (1,0), (0,1)
    assert c["unseen"]["centroid_ratio_raw"] == pytest.approx(math.sqrt(2) / math.sqrt(14 / 3))
    assert c["unseen"]["centroid_unit"] == pytest.approx(math.sqrt(5) / 3)
    assert c["unseen"]["mean_row_norm"] == pytest.approx(2.0)
    # seen rows (3,0), (0,-2), (-1,-1): mean (2/3, -1); unit rows' mean (1 - 1/sqrt 2, -1 - 1/sqrt 2) / 3
    r2 = 1 / math.sqrt(2)
    assert c["seen"]["centroid_ratio_raw"] == pytest.approx(math.sqrt(4 / 9 + 1) / math.sqrt((9 + 4 + 2) / 3))
    assert c["seen"]["centroid_unit"] == pytest.approx(math.hypot(1 - r2, -1 - r2) / 3)
    assert c["all"]["rows"] == 6
    # the two groups' raw means (1, 1) and (2/3, -1): cosine (2/3 - 1) / (sqrt 2 * sqrt(13/9))
    assert c_all["cos_mean_unseen_vs_seen"] == pytest.approx((2 / 3 - 1) / (math.sqrt(2) * math.sqrt(13 / 9)))
    # Gao et al.'s R(W) = |sum of unit rows|^2 / N^2 - 1/N, brute force over the ordered pairs i != j
    u = torch.nn.functional.normalize(torch.tensor([[1.0, 0], [2, 0], [0, 3], [3, 0], [0, -2], [-1, -1]]).double(), dim=1)
    brute = sum(float(u[i] @ u[j]) for i in range(6) for j in range(6) if i != j) / 36
    assert c["all"]["centroid_unit"] ** 2 - 1 / 6 == pytest.approx(brute)


def test_no_unseen_types_is_a_clear_error(tmp_path, capsys):
    _cell(tmp_path)
    with pytest.raises(SystemExit) as e:
        drift_by_count.analyse(tmp_path, "best.pt", None, torch.ones(6, dtype=torch.long), [])
    assert "0 types never occur" in str(e.value) and "lite cell" in str(e.value)


def test_missing_weights_name_the_file(tmp_path):
    _cell(tmp_path)
    with pytest.raises(SystemExit) as e:
        drift_by_count.analyse(tmp_path, "last.pt", None, COUNTS, [])
    assert "last.pt" in str(e.value) and "outputs/runs/<hash>" in str(e.value)


def test_cli_writes_json(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    _cell(run)
    monkeypatch.setattr(drift_by_count, "training_counts", lambda r: (COUNTS, []))
    out = tmp_path / "o" / "d.json"
    assert drift_by_count.main([str(run), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data[0]["run"] == "run" and data[0]["unseen_types"] == 3


def test_training_counts_are_the_slice_the_run_trained_on(compose_cfg, tiny_data, monkeypatch):
    from repdegen.reproduce.runs.execute import load_any_corpus
    from repdegen.reproduce.settings.config import finalize
    from repdegen.reproduce.train import train

    cfg = finalize(compose_cfg("experiment=inan2017/small", "scale=smoke", "objective=mle"))
    record = train(cfg)
    run = Path(cfg.paths.runs_dir) / record["config_hash"]
    monkeypatch.chdir(Path(cfg.paths.output_dir).parent)  # the run's relative cache dir resolves as in training
    counts, specials = drift_by_count.training_counts(run)
    corpus = load_any_corpus(cfg.dataset, cfg.paths.cache_dir, verbose=False)
    ids = corpus.train.reshape(-1).tolist()
    brute = [0] * len(corpus.vocab)
    for i in ids:
        brute[i] += 1
    assert counts.tolist() == brute and int(counts.sum()) == len(ids)
    assert specials == []  # a word-level vocabulary
