"""Analysis helpers (frequency groups, word similarity, embedding figures, inspection) against
independent brute-force computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from repdegen.analysis.embedding_figures import (
    normalized_singular_values,
    plot_metric_over_training,
    plot_rare_group_size,
    plot_singular_values,
    plot_svd_projection,
    plot_token_frequency,
    svd_projection,
)
from repdegen.analysis.evaluate import evaluate_nll
from repdegen.analysis.groups import AGG_CUTOFFS, frequency_groups, group_cosines, group_isotropy, group_metrics
from repdegen.analysis.inspection import (
    continuation_uniq,
    nearest_neighbours,
    principal_angles,
    subspace_distance,
    top_predictions,
)
from repdegen.analysis.wordsim import evaluate_wordsim, load_wordsim, rankdata, spearman, word_vector
from repdegen.data.batching import batchify
from repdegen.data.vocab import Vocab
from repdegen.models import build_model
from repdegen.models.generation import lm_continue
from repdegen.models.lstm_lm import LSTMLMConfig

V = 20


def tiny_lm(seed: int = 0, tie: bool = True):
    torch.manual_seed(seed)
    return build_model(LSTMLMConfig(name="t", hidden_size=16, init_scale=0.5), vocab_size=V, tie_weights=tie).eval()


def zipf_stream(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = 1.0 / torch.arange(1, V + 1, dtype=torch.float64)
    return torch.multinomial(p / p.sum(), n, replacement=True, generator=g)


# ---- frequency groups -------------------------------------------------------------------------------


def test_frequency_groups_fractions_are_slices_of_the_sorted_ids():
    counts = torch.tensor([50, 40, 30, 20, 10, 9, 8, 7, 2, 1])
    g = frequency_groups(counts)
    assert g == {"frequent": slice(0, 3), "medium": slice(3, 8), "rare": slice(8, 10)}
    g = frequency_groups(counts, fractions=(0.5, 0.3, 0.2))
    assert (g["frequent"], g["medium"], g["rare"]) == (slice(0, 5), slice(5, 8), slice(8, 10))
    # the official AGG dictionary: 44,256 entries; 30% = 13,276.8 -> 13,277 and 80% = 35,404.8 -> 35,405
    big = torch.arange(44256, 0, -1)
    assert frequency_groups(big) == {"frequent": slice(0, 13277), "medium": slice(13277, 35405), "rare": slice(35405, 44256)}
    with pytest.raises(ValueError):
        frequency_groups(counts, fractions=(0.3, 0.3, 0.3))


def test_frequency_groups_official_cutoffs():
    big = torch.arange(44256, 0, -1)
    g = frequency_groups(big, cutoffs=AGG_CUTOFFS)
    assert g == {"frequent": slice(0, 13000), "medium": slice(13000, 36000), "rare": slice(36000, 44256)}
    ids = torch.arange(44256)
    assert ids[g["frequent"]].max() == 12999 and ids[g["medium"]].min() == 13000 and ids[g["rare"]].min() == 36000
    small = frequency_groups(torch.arange(20000, 0, -1), cutoffs=AGG_CUTOFFS)
    assert small["medium"] == slice(13000, 20000) and torch.arange(20000)[small["rare"]].numel() == 0


def test_frequency_groups_keep_leading_specials_and_trailing_zero_counts_by_position():
    # BPE layout: <pad> <s> </s> <unk> (counts 0, 0, 40, 3), pieces by frequency, never-seen pieces last
    counts = torch.tensor([0, 0, 40, 3, 100, 90, 80, 50, 20, 0])
    g = frequency_groups(counts, n_specials=4)
    assert g == {"frequent": slice(0, 3), "medium": slice(3, 8), "rare": slice(8, 10)}
    vocab = Vocab(["<pad>", "<s>", "</s>", "<unk>"] + [f"p{i}" for i in range(6)], counts)
    assert frequency_groups(vocab) == g  # n_specials detected from itos
    # a vocabulary not sorted by frequency: ids ranked by count (stable), returned as id tensors
    g = frequency_groups(torch.tensor([5, 9, 1, 9, 3, 7, 0, 2, 8, 4]))
    assert g["frequent"].tolist() == [1, 3, 8]
    assert g["medium"].tolist() == [5, 0, 9, 4, 7]
    assert g["rare"].tolist() == [2, 6]


# ---- per-group PPL and Uniq -------------------------------------------------------------------------


def position_log_probs(model, ids, batch_size):
    """(target, log-probabilities) of every predicted position, one token at a time down each column."""
    stream = batchify(ids, batch_size)
    with torch.no_grad():
        for b in range(batch_size):
            col = stream[:, b]
            state = model.init_state(1)
            for t in range(col.numel() - 1):
                out = model(col[t].view(1, 1), state)
                state = out.state
                yield int(col[t + 1]), torch.log_softmax(model.logits(out.hidden[0, 0]).double(), -1)


def brute_force_positions(model, ids, batch_size):
    """(target, nll, argmax) of every predicted position."""
    return [(y, float(-lp[y]), int(lp.argmax())) for y, lp in position_log_probs(model, ids, batch_size)]


def test_group_metrics_match_a_per_token_loop_and_evaluate_nll():
    model = tiny_lm()
    ids = zipf_stream(240)
    groups = frequency_groups(torch.arange(V, 0, -1))  # frequent 0-5, medium 6-15, rare 16-19
    members = {"frequent": set(range(6)), "medium": set(range(6, 16)), "rare": set(range(16, 20))}
    got = group_metrics(model, ids, groups, batch_size=3, bptt=7, device="cpu")
    rows = brute_force_positions(model, ids, 3)

    ref = evaluate_nll(model, ids, 3, 7, "cpu")
    assert got["tokens"] == ref["tokens"] == len(rows)
    assert got["ppl"] == pytest.approx(ref["ppl"], rel=1e-6)
    assert got["nll"] == pytest.approx(sum(r[1] for r in rows) / len(rows), rel=1e-5)
    assert got["uniq"] == len({r[2] for r in rows})
    assert got["uniq_target"] == len({r[0] for r in rows})
    for name, ids_in in members.items():
        sel = [r for r in rows if r[0] in ids_in]
        assert sel, name
        g = got["groups"][name]
        assert g["tokens"] == len(sel)
        assert g["ppl"] == pytest.approx(math.exp(sum(r[1] for r in sel) / len(sel)), rel=1e-5)
        assert g["uniq"] == len({r[2] for r in rows if r[2] in ids_in})
        assert g["uniq_target"] == len({r[0] for r in rows if r[0] in ids_in})
    assert sum(g["uniq"] for g in got["groups"].values()) == got["uniq"]
    assert sum(g["tokens"] for g in got["groups"].values()) == got["tokens"]
    # forbidden ids are never predicted; the PPL does not change
    top = max(range(V), key=lambda i: sum(r[2] == i for r in rows))
    probe = {"top": torch.tensor([top]), "all": slice(0, V)}  # groups may be any (overlapping) id sets
    plain = group_metrics(model, ids, probe, batch_size=3, bptt=7, device="cpu")
    masked = group_metrics(model, ids, probe, batch_size=3, bptt=7, device="cpu", forbid=[top])
    assert plain["groups"]["top"]["uniq"] == 1 and masked["groups"]["top"]["uniq"] == 0
    assert masked["ppl"] == pytest.approx(got["ppl"], rel=1e-9) and masked["groups"]["all"]["tokens"] == got["tokens"]


def mass_by_loop(model, ids, batch_size, sets) -> dict:
    """{name: the mean probability of the set's ids over the positions whose target is not one of them}, one token
    at a time."""
    expected = {name: [] for name in sets}
    for y, lp in position_log_probs(model, ids, batch_size):
        for name, members in sets.items():
            if y not in members:
                expected[name].append(float(lp.exp()[members].sum()))
    return {name: sum(values) / len(values) for name, values in expected.items()}


def test_mass_on_a_set_where_it_is_not_the_target_matches_a_per_token_loop():
    model = tiny_lm()
    ids = zipf_stream(240)
    sets = {"one": [4], "three": [0, 1, 2]}
    expected = mass_by_loop(model, ids, 3, sets)
    got = group_metrics(model, ids, {}, batch_size=3, bptt=7, device="cpu", forbid=[4], mass_sets=sets)["mass"]
    for name, value in expected.items():  # before forbid: the forbidden id's probability still counts
        assert got[name] == pytest.approx(value, rel=1e-5)
    assert "mass" not in group_metrics(model, ids, {}, batch_size=3, bptt=7, device="cpu")


def test_group_metrics_of_an_empty_group_is_nan_and_restores_training_mode():
    model = tiny_lm().train()
    ids = torch.randint(0, 10, (200,), generator=torch.Generator().manual_seed(1))
    got = group_metrics(model, ids, {"low": slice(0, 10), "high": slice(10, 20)}, batch_size=2, bptt=5, device="cpu")
    assert model.training
    assert got["groups"]["high"]["tokens"] == 0 and math.isnan(got["groups"]["high"]["ppl"])
    assert got["groups"]["low"]["ppl"] == pytest.approx(got["ppl"], rel=1e-6)  # float64 vs per-batch float32 sums


# ---- group geometry ---------------------------------------------------------------------------------


def isotropy_by_definition(W: np.ndarray) -> float:
    _, vecs = np.linalg.eigh(W.T @ W)
    zs = [sum(math.exp(float(w @ (s * vecs[:, k]))) for w in W) for k in range(vecs.shape[1]) for s in (1.0, -1.0)]
    return min(zs) / max(zs)


def test_group_isotropy_and_cosines_match_pairwise_loops():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(13, 4)) + np.array([0.6, 0.0, 0.0, 0.0])
    W[12] = 0.0  # a zero row has cosine 0 with everything
    groups = {"frequent": slice(0, 4), "medium": slice(4, 9), "rare": torch.tensor([9, 10, 11, 12])}
    sets = {"frequent": list(range(4)), "medium": list(range(4, 9)), "rare": [9, 10, 11, 12]}
    iso = group_isotropy(torch.tensor(W), groups)
    for name, rows in sets.items():
        assert iso[name] == pytest.approx(isotropy_by_definition(W[rows]), rel=1e-9)
    assert iso["total"] == pytest.approx(isotropy_by_definition(W), rel=1e-9)

    def cos(i, j):
        ni, nj = np.linalg.norm(W[i]), np.linalg.norm(W[j])
        return 0.0 if ni == 0 or nj == 0 else float(W[i] @ W[j] / (ni * nj))

    got = group_cosines(torch.tensor(W), groups, between=(("rare", "frequent"), ("medium", "rare")))
    for name, rows in sets.items():
        pairs = [cos(i, j) for i in rows for j in rows if i != j]
        assert got[name] == pytest.approx(np.mean(pairs), abs=1e-12)
    assert got["rare_frequent"] == pytest.approx(np.mean([cos(i, j) for i in sets["rare"] for j in sets["frequent"]]), abs=1e-12)
    assert got["medium_rare"] == pytest.approx(np.mean([cos(i, j) for i in sets["medium"] for j in sets["rare"]]), abs=1e-12)


# ---- word similarity --------------------------------------------------------------------------------


def test_rankdata_and_spearman_with_ties_by_hand():
    assert rankdata([10, 20, 20, 20, 5]).tolist() == [2.0, 4.0, 4.0, 4.0, 1.0]
    # x ranks (1, 2.5, 2.5, 4), y ranks (1, 3, 2, 4): cov 4.5, var 4.5 and 5 -> rho = sqrt(0.9)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(math.sqrt(0.9), abs=1e-12)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    # many ties, against a brute-force Spearman: average ranks by counting (O(n^2)), then Pearson in plain Python
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 5, 40).tolist(), rng.integers(0, 7, 40).tolist()

    def avg_ranks(v):
        return [1 + sum(u < a for u in v) + (sum(u == a for u in v) - 1) / 2 for a in v]

    def pearson(a, b):
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        cov = sum((p - ma) * (q - mb) for p, q in zip(a, b))
        return cov / math.sqrt(sum((p - ma) ** 2 for p in a) * sum((q - mb) ** 2 for q in b))

    assert rankdata(x).tolist() == avg_ranks(x)
    assert spearman(x, y) == pytest.approx(pearson(avg_ranks(x), avg_ranks(y)), abs=1e-12)


def test_wordsim_end_to_end_word_level(tmp_path):
    words = ["the", "cat", "dog", "house", "car", "tree", "jerusalem", "<unk>"]
    vocab = Vocab(words, torch.arange(len(words), 0, -1))
    torch.manual_seed(0)
    W = torch.randn(len(words), 6, dtype=torch.float64)
    Wn = W / W.norm(dim=1, keepdim=True)
    pairs = [("cat", "dog"), ("cat", "house"), ("tree", "car"), ("the", "dog"), ("house", "tree"), ("car", "cat")]
    # scores increasing with the true cosine (a monotone transform): Spearman 100
    exact = tmp_path / "exact.txt"
    lines = ["# a comment line"] + [f"{a}\t{b}\t{3 * float(Wn[words.index(a)] @ Wn[words.index(b)]) + 7:.12f}" for a, b in pairs]
    exact.write_text("\r\n".join(lines) + "\r\n")
    assert len(load_wordsim(exact)) == len(pairs)
    other = tmp_path / "other.txt"
    other.write_text("cat dog 1.0\nJerusalem tree 4\nzebra cat 2\ncat house 3\nhouse car 0.5\n")
    res = evaluate_wordsim(W, vocab, {"exact": exact, "other": other})
    assert res["exact"] == {"spearman": pytest.approx(100.0), "pairs": 6, "total": 6, "oov": 0}
    assert res["other"]["total"] == 5 and res["other"]["oov"] == 1 and res["other"]["pairs"] == 4
    used = [("cat", "dog", 1.0), ("jerusalem", "tree", 4.0), ("cat", "house", 3.0), ("house", "car", 0.5)]
    sims = [float(Wn[words.index(a)] @ Wn[words.index(b)]) for a, b, _ in used]
    assert res["other"]["spearman"] == pytest.approx(100 * spearman(sims, [s for *_, s in used]), abs=1e-9)
    # oov="unk": the pair with the unknown word uses the <unk> row
    res_unk = evaluate_wordsim(W, vocab, {"other": other}, oov="unk")["other"]
    assert res_unk["pairs"] == 5 and res_unk["oov"] == 1
    assert torch.equal(word_vector("zebra", vocab, W, oov="unk"), W[7])
    assert word_vector("zebra", vocab, W) is None
    assert torch.equal(word_vector("Jerusalem", vocab, W), W[6])  # case-sensitive first, then lowercase


def test_wordsim_bpe_averages_the_word_initial_pieces(tmp_path):
    from repdegen.data.bpe import train_bpe

    base = ["the cat sat on the mat", "a dog played with the cats", "playing dogs and sitting cats",
            "the house of the dog", "trees and houses by the road", "the cat is playing in the house"]
    lines = [" ".join(np.random.default_rng(i).permutation(base[i % len(base)].split())) for i in range(60)]
    tok = train_bpe(lines, vocab_size=30, cache_dir=tmp_path / "cache", name="tiny")
    torch.manual_seed(0)
    W = torch.randn(len(tok), 5, dtype=torch.float64)
    multi = [w for w in ("playing", "houses", "sitting", "played", "trees") if len(tok.encode(w)) > 1]
    assert multi, "the tiny BPE model should split some word into several pieces"
    for word in multi + ["cat"]:
        ids = tok.encode(word)
        assert tok.itos[ids[0]].startswith("\u2581")  # word-initial piece
        assert torch.allclose(word_vector(word, tok, W), W[ids].mean(0))
    pairs = [("cat", "dog", 1.0), ("playing", "sitting", 2.0), ("houses", "trees", 3.0), ("cat", "zebra\u2603", 4.0)]
    res = evaluate_wordsim(W, tok, {"d": pairs})["d"]
    assert res["total"] == 4 and res["oov"] == 1 and res["pairs"] == 3  # the snowman is outside the model: <unk>
    vecs = [(word_vector(a, tok, W), word_vector(b, tok, W)) for a, b, _ in pairs[:3]]
    sims = [float(u @ v / (u.norm() * v.norm())) for u, v in vecs]
    assert res["spearman"] == pytest.approx(100 * spearman(sims, [1.0, 2.0, 3.0]))
    assert evaluate_wordsim(W, tok, {"d": pairs}, oov="unk")["d"]["pairs"] == 4


# ---- inspection -------------------------------------------------------------------------------------


def test_nearest_neighbours_match_brute_force():
    torch.manual_seed(0)
    W = torch.randn(12, 3, dtype=torch.float64)
    itos = [f"t{i}" for i in range(12)]
    got = nearest_neighbours(W, [0, "t5"], k=4, itos=itos, exclude=[1])
    for q in (0, 5):
        cos = [(float(W[q] @ W[j] / (W[q].norm() * W[j].norm())), j) for j in range(12) if j not in (q, 1)]
        want = sorted(cos, reverse=True)[:4]
        assert [n for n, _ in got[f"t{q}"]] == [f"t{j}" for _, j in want]
        assert [c for _, c in got[f"t{q}"]] == pytest.approx([c for c, _ in want], abs=1e-12)
    assert list(nearest_neighbours(W, [3], k=2)) == [3]


def test_top_predictions_match_the_step_by_step_distribution():
    model = tiny_lm(1)
    prefix = torch.tensor([3, 1, 4, 1, 5, 9])
    got = top_predictions(model, prefix, k=10, itos=[f"w{i}" for i in range(V)])
    with torch.no_grad():
        state = model.init_state(1)
        for t in prefix:
            out = model(t.view(1, 1), state)
            state = out.state
        p = torch.softmax(model.logits(out.hidden[0, 0]).double(), -1)
    want = sorted(((float(p[i]), i) for i in range(V)), reverse=True)[:10]
    assert [w for w, _ in got] == [f"w{i}" for _, i in want]
    assert [q for _, q in got] == pytest.approx([q for q, _ in want], abs=1e-6)


def test_subspace_distance_zero_max_and_basis_invariant():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(10, 3, generator=g, dtype=torch.float64)
    R = torch.randn(3, 3, generator=g, dtype=torch.float64) + 3 * torch.eye(3, dtype=torch.float64)
    assert subspace_distance(A, A) == pytest.approx(0.0, abs=1e-7)
    assert subspace_distance(A, A @ R) == pytest.approx(0.0, abs=1e-7)
    E = torch.eye(10, dtype=torch.float64)
    assert subspace_distance(E[:, :3], E[:, 3:6] @ R) == pytest.approx(1.0, abs=1e-12)
    B = torch.randn(10, 3, generator=g, dtype=torch.float64)
    d = subspace_distance(A, B)
    assert 0.0 < d < 1.0
    assert subspace_distance(A @ R, 5 * B) == pytest.approx(d, abs=1e-12)
    assert subspace_distance(B, A) == pytest.approx(d, abs=1e-12)
    # the normalised projection distance ||P_A - P_B||_F / sqrt(2k), projections from pinv
    PA, PB = A @ torch.linalg.pinv(A), B @ torch.linalg.pinv(B)
    assert d == pytest.approx(float(torch.linalg.norm(PA - PB) / math.sqrt(6)), abs=1e-10)
    assert d == pytest.approx(math.sqrt(float(torch.sin(principal_angles(A, B)).pow(2).mean())), abs=1e-10)
    # two lines in the plane at angle theta: d = sin(theta)
    th = 0.3
    assert subspace_distance(torch.tensor([[1.0], [0.0]]), torch.tensor([[math.cos(th)], [math.sin(th)]])) == pytest.approx(
        math.sin(th), abs=1e-7)
    # a rank-deficient matrix spans its column space only; a space inside a larger one is at distance 0
    assert subspace_distance(torch.cat([A, A[:, :1] * 2], 1), A) == pytest.approx(0.0, abs=1e-7)
    assert subspace_distance(A[:, :2], A) == pytest.approx(0.0, abs=1e-7)


def test_continuation_uniq_equals_lm_continue_per_prefix():
    model = tiny_lm(2)
    ids = zipf_stream(47, seed=3)
    got = continuation_uniq(model, ids, prefix_len=5, steps=12, n=7, batch_size=3, decode=lambda c: " ".join(map(str, c)))
    assert len(got["continuations"]) == 7 and got["prefixes"][2] == ids[10:15].tolist()
    for i in range(7):
        want = lm_continue(model, ids[5 * i : 5 * i + 5].view(5, 1), 12).tokens[:, 0].tolist()
        assert got["continuations"][i] == want
        assert got["uniq"][i] == len(set(want))
    assert got["mean_uniq"] == pytest.approx(np.mean(got["uniq"]))
    assert got["uniq_total"] == len({t for c in got["continuations"] for t in c})
    assert got["texts"][0] == " ".join(map(str, got["continuations"][0]))
    assert len(continuation_uniq(model, ids, prefix_len=5, steps=2)["uniq"]) == 9  # all full chunks


# ---- figures ----------------------------------------------------------------------------------------


def is_png(path) -> bool:
    return path.is_file() and path.stat().st_size > 100 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_svd_projection_and_normalised_spectrum():
    torch.manual_seed(0)
    W = torch.randn(30, 5, dtype=torch.float64) + 4.0  # a cone away from the origin
    c = svd_projection(W)
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    assert np.allclose(np.abs(c), np.abs((U[:, :2] * S[:2]).numpy()))
    assert c[:, 0].mean() > 0
    s = normalized_singular_values(W)
    assert s[0] == 1.0 and np.allclose(s, (S / S[0]).numpy())


def test_figures_write_png_files(tmp_path):
    torch.manual_seed(0)
    W = torch.randn(50, 6)
    counts = torch.arange(50, 0, -1)
    assert is_png(plot_svd_projection(W, counts, tmp_path / "a" / "svd.png", "svd"))
    assert is_png(plot_svd_projection(W, frequency_groups(counts), tmp_path / "svd_c.png", "svd", center=True, max_points=20))
    assert is_png(plot_singular_values({"MLE": W, "AGG": torch.randn(50, 6)}, tmp_path / "sv.png", "sv"))
    assert is_png(plot_token_frequency(torch.cat([counts, torch.zeros(3)]), tmp_path / "freq.png", "freq"))
    assert is_png(plot_token_frequency({"a": counts, "b": counts * 2}, tmp_path / "freq2.png"))
    hist = {"MLE": [{"step": s, "iso": {"rare": 1 / s, "frequent": 0.5}} for s in (1, 2, 3)],
            "Freeze": [{"iso": {"rare": 0.9}}, {"other": 1}]}
    assert is_png(plot_metric_over_training(hist, ["iso.rare", "iso.frequent"], tmp_path / "hist.png", "I(W)"))
    assert is_png(plot_rare_group_size([1, 2, 3], [500, 300, 350], tmp_path / "rare.png"))
    # Yu Fig. 5: a metric against alpha, mean +- sample std over seeds (a sweep table's figure)
    import statistics

    from repdegen.analysis.sweep_figures import SweepSeries, plot_sweep_metric

    rows = [{"alpha": a, "seed": s, "ppl": 20 + a + s, "uniq": 100 * a, "isotropy": 0.5} for a in (0.01, 0.03) for s in (1, 2)]
    alphas = sorted({r["alpha"] for r in rows})
    stats = [(statistics.fmean(v), statistics.stdev(v)) for v in ([r["ppl"] for r in rows if r["alpha"] == a] for a in alphas)]
    m, sd = [x for x, _ in stats], [y for _, y in stats]
    n = [sum(r["alpha"] == a for r in rows) for a in alphas]
    assert alphas == [0.01, 0.03] and m == pytest.approx([21.51, 21.53]) and n == [2, 2]
    assert sd == pytest.approx([math.sqrt(0.5)] * 2)
    assert is_png(plot_sweep_metric([SweepSeries("AGG", alphas, m, sd)], tmp_path / "alpha.png", "PPL", "alpha"))


def test_hidden_states_of_the_segments_are_one_long_forward_and_frac_negative_counts_them():
    """``lm_hidden_states`` in BPTT segments with the state carried = the hidden states of one forward over the
    whole batchified stream (the model in eval mode); ``frac_negative`` = a per-row count of h . d < 0."""
    from repdegen.analysis.evaluate import frac_negative, lm_hidden_states
    from repdegen.data.batching import batchify

    model = tiny_lm(1).train()
    ids = torch.randint(0, V, (203,), generator=torch.Generator().manual_seed(3))
    blocks = list(lm_hidden_states(model, ids, 4, 7, torch.device("cpu")))
    assert model.training  # restored
    stream = batchify(ids, 4)
    model.eval()
    with torch.no_grad():
        whole = model(stream[:-1], model.init_state(4, torch.device("cpu"))).hidden
    assert torch.allclose(torch.cat(blocks), whole.reshape(-1, whole.size(-1)), atol=1e-6)
    d = torch.randn(whole.size(-1), generator=torch.Generator().manual_seed(4))
    rows = whole.reshape(-1, whole.size(-1))
    want = sum(1 for r in rows if float(r.double() @ d.double()) < 0) / rows.size(0)
    assert frac_negative(blocks, d) == pytest.approx(want)
    assert math.isnan(frac_negative([], d))


def test_mean_unseen_drift_by_hand():
    from repdegen.analysis.geometry import MIN_GROUP, mean_unseen_drift

    n = MIN_GROUP + 10
    counts = torch.tensor([5, 0, 3] + [0] * (n - 3))  # ids 1, 3.. unseen; id 0 a special
    init = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    weight = init + torch.arange(n, dtype=torch.float32)[:, None] * torch.tensor([1.0, -1.0, 0.0, 2.0])
    unseen = [1] + list(range(3, n))
    want = torch.tensor([sum(unseen) / len(unseen) * c for c in (1.0, -1.0, 0.0, 2.0)], dtype=torch.float64)
    assert torch.allclose(mean_unseen_drift(weight, init, counts, specials=[0]), want)
    assert mean_unseen_drift(weight[:10], init[:10], counts[:10], specials=[0]) is None  # under MIN_GROUP unseen rows


# ---- the final metrics of a trained LM (analysis/final.py) --------------------------------------------------------


def test_lm_final_metrics_match_the_per_token_loop_and_the_formulas():
    """On a tiny untied word-level LM whose vocabulary has <unk> and the articles: the group metrics are
    group_metrics' own, the non-target masses those of a per-token loop, the subspace distance the formula's, and a
    tied model or a vocabulary without the words drops those entries."""
    from types import SimpleNamespace

    from repdegen.analysis.final import lm_final_metrics

    words = ["the", "<unk>", "a", "<eos>", "an"] + [f"w{i}" for i in range(V - 5)]
    vocab = Vocab(words, torch.arange(V, 0, -1))
    test = zipf_stream(240, seed=3)
    corpus = SimpleNamespace(vocab=vocab, test=test, tokenizer=None)
    groups = frequency_groups(vocab.counts)
    model = tiny_lm(tie=False)
    got = lm_final_metrics(model, corpus, groups, [], (3, 7, 0), "cpu")

    ref = group_metrics(model, test, groups, batch_size=3, bptt=7, device="cpu")
    assert got["uniq"] == ref["uniq"] and got["ppl_rare"] == ref["groups"]["rare"]["ppl"]
    assert got["uniq_rare_over_human"] == pytest.approx(ref["groups"]["rare"]["uniq"] / ref["groups"]["rare"]["uniq_target"])
    expected = mass_by_loop(model, test, 3, {"p_unk_nontarget": [1], "p_articles_nontarget": [2, 4, 0]})
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-5)
    L, W = model.input_embedding.detach().double(), model.output_embedding.detach().double()
    ql, qw = np.linalg.qr(L.numpy())[0], np.linalg.qr(W.numpy())[0]
    cosines = np.clip(np.linalg.svd(ql.T @ qw, compute_uv=False), 0, 1)  # of the principal angles
    assert got["subspace_distance"] == pytest.approx(float(np.sqrt(np.mean(1 - cosines**2))), abs=1e-9)

    tied = lm_final_metrics(tiny_lm(tie=True), SimpleNamespace(vocab=Vocab([f"w{i}" for i in range(V)], vocab.counts),
                                                                test=test, tokenizer=None), None, [], (3, 7, 0), "cpu")
    assert tied == {}
