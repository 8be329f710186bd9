"""Beam and greedy search against exhaustive search, a plain-Python transcription of fairseq's beam
search run one sentence at a time, and the step functions' own tables; the seq2seq adapter against
full-prefix recomputation without a cache; LM continuation against a recompute-everything loop."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from repdegen.models import build_model
from repdegen.models.base import ModelOutput
from repdegen.models.generation import (
    Hypothesis,
    beam_search,
    greedy_search,
    length_penalty_factor,
    lm_continue,
    output_max_lens,
    translate,
)
from repdegen.models.lstm_lm import LSTMLMConfig
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.settings.schema import GenerationConfig
from torch import nn

PAD, EOS = 0, 1


def penalty(length: int, lp: float, form: str) -> float:
    return length**lp if form == "fairseq" else ((5 + length) / 6) ** lp


def markov_table(vocab: int, seed: int, eos_bias: float = 0.0) -> torch.Tensor:
    """log p(y | last token) for last tokens 0..vocab (row ``vocab`` is bos), float32."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab + 1, vocab, generator=g) * 2
    logits[:, EOS] += eos_bias
    return torch.log_softmax(logits, dim=1)


class MarkovStep:
    """Log-probs depend on the last token only; bos is id ``vocab``."""

    def __init__(self, table: torch.Tensor):
        self.table = table
        self.bos = table.size(0) - 1

    def logp(self, prefix: tuple[int, ...]) -> list[float]:
        return self.table[prefix[-1] if prefix else self.bos].tolist()

    def __call__(self, tokens, reorder):
        return self.table[tokens[:, -1]]


class PrefixStep:
    """Log-probs depend on the whole generated prefix (seeded by it, so independent of call order)."""

    def __init__(self, vocab: int, seed: int):
        self.vocab, self.seed, self.bos = vocab, seed, vocab
        self.memo: dict[tuple[int, ...], np.ndarray] = {}

    def logp(self, prefix: tuple[int, ...]) -> list[float]:
        if prefix not in self.memo:
            x = np.random.default_rng([self.seed, len(prefix), *prefix]).normal(size=self.vocab) * 2
            self.memo[prefix] = torch.log_softmax(torch.tensor(x, dtype=torch.float32), 0).numpy()
        return self.memo[prefix].tolist()

    def __call__(self, tokens, reorder):
        return torch.tensor(np.stack([self.logp(tuple(row[1:])) for row in tokens.tolist()]))


class TrackingStep:
    """Per-sentence Markov tables; follows each row's sentence and prefix through ``reorder`` alone
    and checks that the rows it is given continue the rows it saw before."""

    def __init__(self, tables: torch.Tensor, beam: int):
        self.tables, self.beam = tables, beam
        self.sent: torch.Tensor | None = None
        self.prev: torch.Tensor | None = None
        self.sizes: list[int] = []

    def __call__(self, tokens, reorder):
        if self.sent is None:
            assert reorder is None and tokens.size(1) == 1
            assert tokens.size(0) == self.tables.size(0) * self.beam
            self.sent = torch.arange(self.tables.size(0)).repeat_interleave(self.beam)
        else:
            index = torch.arange(self.prev.size(0)) if reorder is None else reorder
            self.sent = self.sent[index]
            assert torch.equal(self.prev[index], tokens[:, :-1])  # the cache, reordered, is the prefix
        assert tokens.size(0) == self.sent.numel()
        self.prev = tokens.clone()
        self.sizes.append(tokens.size(0))
        return self.tables[self.sent, tokens[:, -1]]  # bos is the last row of each table


def reference_beam(logp, beam, max_len, lp=1.0, form="fairseq", min_len=0, eos=EOS, pad=PAD):
    """fairseq's beam search for one sentence, in plain Python (float32 sums as fairseq)."""
    live = [((), np.float32(0.0), ())]
    finished = []
    for t in range(max_len):
        cands = []
        for toks, s, pos in live:
            for y, l in enumerate(logp(toks)):
                if y == pad or (t + 1 == max_len and y != eos) or (t < min_len and y == eos and t + 1 < max_len):
                    continue
                total = np.float32(s + np.float32(l))
                if np.isfinite(total):
                    cands.append((toks + (y,), total, pos + (l,)))
        cands.sort(key=lambda c: -c[1])
        cands = cands[: 2 * beam]
        for toks, s, pos in cands[:beam]:
            if toks[-1] == eos and len(finished) < beam:
                finished.append(Hypothesis(list(toks), float(s) / penalty(len(toks), lp, form), float(s), list(pos)))
        live = [c for c in cands if c[0][-1] != eos][:beam]
        if len(finished) >= beam or not live:
            break
    return sorted(finished, key=lambda h: -h.score)


def exhaustive(logp, vocab, max_len, lp, form, eos=EOS, pad=PAD):
    """Every output: words^k + eos for k < max_len, scored as beam search scores a finished one."""
    words = [y for y in range(vocab) if y not in (eos, pad)]
    out = []
    for k in range(max_len):
        for seq in itertools.product(words, repeat=k):
            toks = (*seq, eos)
            pos = [logp(toks[:i])[y] for i, y in enumerate(toks)]
            total = float(np.sum(np.array(pos, dtype=np.float64)))
            out.append((total / penalty(len(toks), lp, form), toks))
    return sorted(out, reverse=True)


def assert_same(a: list[list[Hypothesis]], b: list[list[Hypothesis]], exact=False):
    assert len(a) == len(b)
    for ha, hb in zip(a, b):
        assert [h.tokens for h in ha] == [h.tokens for h in hb]
        for x, y in zip(ha, hb):
            if exact:
                assert (x.score, x.logprob, x.positional_logprobs) == (y.score, y.logprob, y.positional_logprobs)
            else:
                assert x.score == pytest.approx(y.score, rel=1e-6, abs=1e-6)
                assert x.logprob == pytest.approx(y.logprob, rel=1e-6, abs=1e-6)
                assert x.positional_logprobs == pytest.approx(y.positional_logprobs, rel=1e-6, abs=1e-6)


# ---- search ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("lp,form", [(0.0, "fairseq"), (0.6, "fairseq"), (1.0, "fairseq"), (2.0, "fairseq"),
                                     (0.6, "gnmt"), (1.5, "gnmt")])
@pytest.mark.parametrize("kind", ["markov", "prefix"])
def test_large_beam_finds_every_output_in_exhaustive_order(lp, form, kind):
    # 3 words + eos (+ pad), max length 4: 1 + 3 + 9 + 27 = 40 outputs; at most 9 x 4 = 36 finite
    # candidates per step, so beam 40 prunes nothing and keeps every output
    vocab, max_len = 5, 4
    step = MarkovStep(markov_table(vocab, seed=3)) if kind == "markov" else PrefixStep(vocab, seed=4)
    truth = exhaustive(step.logp, vocab, max_len, lp, form)
    assert len(truth) == 40
    (hyps,) = beam_search(step, 1, 40, torch.tensor([max_len]), step.bos, EOS, PAD, lp, form)
    assert [tuple(h.tokens) for h in hyps] == [toks for _, toks in truth]
    assert [h.score for h in hyps] == pytest.approx([s for s, _ in truth], rel=1e-5)


@pytest.mark.parametrize("beam", [1, 2, 3, 5])
@pytest.mark.parametrize("lp,form,min_len", [(1.0, "fairseq", 0), (0.6, "gnmt", 0), (0.0, "fairseq", 2), (2.0, "fairseq", 1)])
def test_beam_search_equals_fairseq_transcription(beam, lp, form, min_len):
    vocab = 7
    markov, prefix = MarkovStep(markov_table(vocab, seed=beam, eos_bias=-1.0)), PrefixStep(vocab, seed=10 + beam)
    for step in (markov, prefix):
        max_lens = [1, 3, 6, 8]
        got = beam_search(step, 4, beam, torch.tensor(max_lens), step.bos, EOS, PAD, lp, form, min_len)
        want = [reference_beam(step.logp, beam, m, lp, form, min_len) for m in max_lens]
        assert_same(got, want)
        assert all(len(h) == beam for h in got[1:])  # max_len 1 has a single output, [eos]
        assert [h.tokens for h in got[0]] == [[EOS]]


@pytest.mark.parametrize("form", ["fairseq", "gnmt"])
def test_hypotheses_are_consistent_with_the_step_function(form):
    vocab, lp = 9, 0.8
    for step in (MarkovStep(markov_table(vocab, seed=7, eos_bias=-2.0)), PrefixStep(vocab, seed=8)):
        max_lens = torch.tensor([2, 5, 7])
        results = beam_search(step, 3, 4, max_lens, step.bos, EOS, PAD, lp, form, min_len=1)
        for hyps, m in zip(results, max_lens.tolist()):
            scores = [h.score for h in hyps]
            assert scores == sorted(scores, reverse=True)
            for h in hyps:
                assert h.tokens[-1] == EOS and EOS not in h.tokens[:-1] and PAD not in h.tokens
                assert 2 <= len(h.tokens) <= m  # min_len=1: at least one word before eos
                want = [step.logp(tuple(h.tokens[:i]))[y] for i, y in enumerate(h.tokens)]
                assert h.positional_logprobs == pytest.approx(want, abs=1e-6)
                assert h.logprob == pytest.approx(sum(h.positional_logprobs), abs=1e-5)
                assert h.score == pytest.approx(h.logprob / penalty(len(h.tokens), lp, form), abs=1e-5)
            assert len({tuple(h.tokens) for h in hyps}) == len(hyps)


def test_eos_is_forced_at_the_maximum_length():
    table = markov_table(6, seed=1, eos_bias=-30.0)  # eos all but impossible
    results = beam_search(MarkovStep(table), 2, 3, torch.tensor([3, 5]), 6, EOS, PAD)
    for hyps, m in zip(results, (3, 5)):
        assert len(hyps) == 3 and all(len(h.tokens) == m for h in hyps)
        assert all(h.positional_logprobs[-1] == pytest.approx(float(table[h.tokens[-2], EOS])) for h in hyps)
    greedy = greedy_search(MarkovStep(table), 2, torch.tensor([3, 5]), 6, EOS, PAD)
    assert [len(h[0].tokens) for h in greedy] == [3, 5]


@pytest.mark.parametrize("lp,form,min_len", [(1.0, "fairseq", 0), (0.6, "gnmt", 0), (0.0, "fairseq", 2)])
def test_greedy_equals_beam_one_exactly(lp, form, min_len):
    for seed in range(4):
        for step in (MarkovStep(markov_table(12, seed=seed, eos_bias=-1.5)), PrefixStep(12, seed=seed)):
            max_lens = torch.tensor([1, 4, 9, 12, 7, 20])
            greedy = greedy_search(step, 6, max_lens, step.bos, EOS, PAD, lp, form, min_len)
            beam1 = beam_search(step, 6, 1, max_lens, step.bos, EOS, PAD, lp, form, min_len)
            assert_same(greedy, beam1, exact=True)
            assert all(len(h) == 1 for h in greedy)
            # and greedy is the argmax path
            for hyps in greedy:
                toks = hyps[0].tokens
                for i, y in enumerate(toks[:-1]):
                    row = np.array(step.logp(tuple(toks[:i])))
                    row[PAD] = -np.inf
                    if i < min_len:
                        row[EOS] = -np.inf
                    assert y == int(row.argmax())


@pytest.mark.parametrize("beam", [1, 3])
def test_batched_search_equals_each_sentence_alone_and_follows_reorder(beam):
    vocab = 8
    tables = torch.stack([markov_table(vocab, seed=20 + i, eos_bias=-1.0) for i in range(5)])
    max_lens = [2, 9, 4, 12, 1]
    search = (lambda st, n, m: greedy_search(st, n, m, vocab, EOS, PAD, 0.6)) if beam == 1 else (
        lambda st, n, m: beam_search(st, n, beam, m, vocab, EOS, PAD, 0.6))
    batched_step = TrackingStep(tables, beam)
    batched = search(batched_step, 5, torch.tensor(max_lens))
    alone = [search(TrackingStep(tables[i : i + 1], beam), 1, torch.tensor([m]))[0] for i, m in enumerate(max_lens)]
    assert_same(batched, alone, exact=True)
    sizes = batched_step.sizes
    assert len(sizes) <= max(max_lens)
    # finished sentences leave the batch (the max_len 1 sentence after the first step)
    assert sizes[0] == 5 * beam and sizes[1] <= 4 * beam and sizes == sorted(sizes, reverse=True)


def test_invalid_arguments_are_config_errors():
    step = MarkovStep(markov_table(5, seed=0))
    with pytest.raises(ConfigError, match="beam=0"):
        beam_search(step, 1, 0, torch.tensor([3]), 5, EOS, PAD)
    with pytest.raises(ConfigError, match="length_penalty_form='wu'"):
        beam_search(step, 1, 2, torch.tensor([3]), 5, EOS, PAD, length_penalty_form="wu")
    with pytest.raises(ConfigError, match="max_lens"):
        greedy_search(step, 2, torch.tensor([3]), 5, EOS, PAD)
    with pytest.raises(ConfigError, match="< 1"):
        greedy_search(step, 1, torch.tensor([0]), 5, EOS, PAD)
    with pytest.raises(ConfigError, match="length_penalty_form"):
        length_penalty_factor(3, 1.0, "wu")
    assert length_penalty_factor(4, 0.5) == 2.0 and length_penalty_factor(7, 1.0, "gnmt") == 2.0


# ---- seq2seq adapter -------------------------------------------------------------------------------


class EncOut(SimpleNamespace):
    def index_select(self, index):
        return EncOut(memory=self.memory.index_select(0, index), pad_mask=self.pad_mask.index_select(0, index))


class FakeSeq2Seq(nn.Module):
    """A GRU decoder over the masked mean of the embedded source; its cache holds the GRU state and
    the tokens it has read, so a wrong reorder is caught."""

    def __init__(self, vocab: int, d: int = 16, max_positions: int = 64, pad: int = PAD):
        super().__init__()
        self.cfg = SimpleNamespace(max_positions=max_positions)
        self.pad = pad
        self.src_emb, self.tgt_emb = nn.Embedding(vocab, d), nn.Embedding(vocab, d)
        self.cell = nn.GRUCell(2 * d, d)
        self.out = nn.Linear(d, vocab)
        self.drop = nn.Dropout(0.5)
        with torch.no_grad():
            self.out.weight.mul_(4)

    def encode(self, src):
        return EncOut(memory=self.src_emb(src), pad_mask=src.eq(self.pad))

    def _run(self, tokens, enc, h):
        keep = (~enc.pad_mask).unsqueeze(2).float()
        ctx = (enc.memory * keep).sum(1) / keep.sum(1)
        outs = []
        for t in range(tokens.size(1)):
            h = self.cell(torch.cat([self.tgt_emb(tokens[:, t]), ctx], dim=1), h)
            outs.append(h)
        return torch.stack(outs, dim=1), h

    def decode(self, prev, enc, cache=None):
        assert prev.size(1) <= self.cfg.max_positions
        h0 = torch.zeros(prev.size(0), self.cell.hidden_size)
        if cache is None:
            return self._run(prev, enc, h0)[0]
        if "h" in cache:
            assert torch.equal(cache["read"], prev[:, :-1])
            h0 = cache["h"]
        out, h = self._run(prev[:, -1:], enc, h0)
        cache["h"], cache["read"] = h, prev.clone()
        return out

    def reorder_cache(self, cache, index):
        cache["h"], cache["read"] = cache["h"].index_select(0, index), cache["read"].index_select(0, index)

    def logits(self, h):
        return self.out(self.drop(h))


def recompute_search(model, src, gen, bos, eos, pad, min_len=1):
    """Each sentence alone, every step re-decoding the whole prefix without a cache."""
    model.eval()
    results = []
    max_positions = getattr(getattr(model, "cfg", None), "max_positions", None)
    for i in range(src.size(0)):
        row = src[i : i + 1]
        row = row[:, : int(row.ne(pad).sum())]
        enc = model.encode(row)
        m = int(gen.max_len_a * row.size(1) + gen.max_len_b)
        m = min(m, max_positions - 1) + 1

        def step(tokens, reorder, enc=enc):
            e = enc.index_select(torch.zeros(tokens.size(0), dtype=torch.long))
            with torch.no_grad():
                return torch.log_softmax(model.logits(model.decode(tokens, e))[:, -1].float(), -1)

        results.append(beam_search(step, 1, gen.beam, torch.tensor([m]), bos, eos, pad, gen.length_penalty,
                                   gen.length_penalty_form, min_len)[0])
    return results


def padded_sources(vocab, lens, seed, pad=PAD, lo=3):
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lens), max(lens)), pad, dtype=torch.long)
    for i, n in enumerate(lens):
        src[i, :n] = torch.randint(lo, vocab, (n,), generator=g)
    return src


@pytest.mark.parametrize("beam,form", [(1, "fairseq"), (4, "fairseq"), (3, "gnmt")])
def test_translate_equals_uncached_recomputation(beam, form):
    torch.manual_seed(0)
    vocab, bos = 14, 2
    model = FakeSeq2Seq(vocab).train()
    src = padded_sources(vocab, [5, 2, 7, 3, 6], seed=1)
    gen = GenerationConfig(beam=beam, length_penalty=0.6, length_penalty_form=form, max_len_a=0.5, max_len_b=3, batch_size=2)
    got = translate(model, src, gen, bos, EOS, PAD)
    assert model.training  # restored
    assert_same(got, recompute_search(model, src, gen, bos, EOS, PAD))
    for hyps, n in zip(got, [5, 2, 7, 3, 6]):
        assert len(hyps) == beam
        assert all(2 <= len(h.tokens) <= int(0.5 * n + 3) + 1 for h in hyps)  # min_len 1; max_len + eos
    assert output_max_lens(src, PAD, 0.5, 3) == [int(0.5 * n + 3) + 1 for n in [5, 2, 7, 3, 6]]


def test_translate_caps_the_output_at_max_positions():
    torch.manual_seed(1)
    model = FakeSeq2Seq(12, max_positions=4)
    with torch.no_grad():
        model.out.bias[EOS] = -50.0  # never stops by itself
    src = padded_sources(12, [6, 6], seed=2)
    gen = GenerationConfig(beam=2, max_len_a=1.0, max_len_b=10, batch_size=8)
    got = translate(model, src, gen, 2, EOS, PAD)
    assert all(len(h.tokens) == 4 for hyps in got for h in hyps)  # bos + 3 words fill 4 positions, + eos
    with pytest.raises(ConfigError, match="generation.beam=0"):
        translate(model, src, GenerationConfig(beam=0), 2, EOS, PAD)
    with pytest.raises(ConfigError, match="length_penalty_form"):
        translate(model, src, GenerationConfig(length_penalty_form="t2t"), 2, EOS, PAD)


def test_translate_with_the_transformer():
    transformer = pytest.importorskip("repdegen.models.transformer")
    cfg = transformer.TransformerSeq2SeqConfig(d_model=16, encoder_layers=2, decoder_layers=2, n_heads=2, d_ffn=32,
                                               dropout=0.2, max_positions=32, positions="learned")
    torch.manual_seed(1)
    vocab, bos = 20, 2
    model = build_model(cfg, vocab, tie_weights=False)
    with torch.no_grad():
        model.output_weight.mul_(8)  # peaked distributions: hypotheses of varied lengths (4 to 9 tokens)
    src = padded_sources(vocab, [4, 9, 6], seed=3)
    for beam in (1, 3):
        gen = GenerationConfig(beam=beam, length_penalty=1.0, max_len_a=1.0, max_len_b=2, batch_size=3)
        got = translate(model.train(), src, gen, bos, EOS, PAD)
        assert model.training
        want = recompute_search(model, src, gen, bos, EOS, PAD)
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
        for hg, hw in zip(got, want):
            assert [h.score for h in hg] == pytest.approx([h.score for h in hw], abs=1e-4)


# ---- LM continuation -------------------------------------------------------------------------------


class StatelessLM(nn.Module):
    """The same LSTM LM, but every call starts from the zero state and returns state=None."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, tokens, state):
        out = self.lm(tokens, self.lm.init_state(tokens.size(1)))
        return ModelOutput(out.hidden, None)

    def logits(self, hidden):
        return self.lm.logits(hidden)


def greedy_by_rerunning(run, logits, prefix, steps: int, forbid: list[int]):
    """The reference greedy decoder: rerun the model (``run(seq)``) on the prefix and the continuation so far, take
    the most likely token at the last position, ``forbid`` excluded. Returns (tokens, their log-probabilities)."""
    seq, want, want_lp = prefix, [], []
    with torch.no_grad():
        for _ in range(steps):
            lp = torch.log_softmax(logits(run(seq).hidden[-1]), -1)
            lp[:, forbid] = float("-inf")
            best, nxt = lp.max(-1)
            want.append(nxt)
            want_lp.append(best)
            seq = torch.cat([seq, nxt[None]])
    return torch.stack(want), torch.stack(want_lp)


def test_lm_continue_equals_recomputing_the_whole_sequence():
    torch.manual_seed(0)
    lm = build_model(LSTMLMConfig(hidden_size=12, num_layers=2, dropout=0.5, init_scale=1.0), vocab_size=15).train()
    prefix = torch.randint(0, 15, (4, 3))
    got = lm_continue(lm, prefix, steps=8, forbid=[0])
    assert lm.training and got.tokens.shape == (8, 3) and got.logprobs.shape == (8, 3)
    assert not got.tokens.eq(0).any()
    lm.eval()
    want, want_lp = greedy_by_rerunning(lambda seq: lm(seq, lm.init_state(3)), lm.logits, prefix, 8, forbid=[0])
    assert torch.equal(got.tokens, want)
    assert torch.allclose(got.logprobs, want_lp, atol=1e-5)
    stateless = lm_continue(StatelessLM(lm), prefix, steps=8, forbid=[0])
    assert torch.equal(stateless.tokens, got.tokens)
    assert lm_continue(lm, prefix, steps=0).tokens.shape == (0, 3)
    transformer = pytest.importorskip("repdegen.models.transformer")
    tlm = build_model(transformer.TransformerLMConfig(d_model=16, n_layers=1, n_heads=2, d_ffn=32, max_positions=6,
                                                      positions="learned"), vocab_size=15).eval()
    got = lm_continue(tlm, prefix, steps=5)  # 4 + 5 tokens: the last calls see only the last 6
    seq = prefix
    with torch.no_grad():
        for i in range(5):
            nxt = tlm.logits(tlm(seq[-6:]).hidden[-1]).argmax(-1)
            assert torch.equal(got.tokens[i], nxt)
            seq = torch.cat([seq, nxt[None]])
    with pytest.raises(ConfigError, match="steps=-1"):
        lm_continue(lm, prefix, steps=-1)


def test_a_transformer_lm_continues_with_its_cache_as_if_it_reran_the_sequence(monkeypatch):
    """The incremental path (key/value cache, one position a step) gives the greedy continuation of rerunning the
    whole sequence each step: the same tokens, the same log-probabilities."""
    import repdegen.models.generation as generation
    from repdegen.models.transformer import TransformerLMConfig

    torch.manual_seed(3)
    tlm = build_model(TransformerLMConfig(d_model=16, n_layers=2, n_heads=2, d_ffn=32, max_positions=64,
                                          positions="learned"), vocab_size=15).eval()
    prefix = torch.randint(0, 15, (5, 3))
    used = []
    real = generation._continue_cached
    monkeypatch.setattr(generation, "_continue_cached", lambda *a: used.append(1) or real(*a))
    got = lm_continue(tlm, prefix, steps=9, forbid=[2])
    assert used == [1] and got.tokens.shape == (9, 3) and not got.tokens.eq(2).any()
    want, want_lp = greedy_by_rerunning(tlm, tlm.logits, prefix, 9, forbid=[2])
    assert torch.equal(got.tokens, want)
    assert torch.allclose(got.logprobs, want_lp, atol=1e-5)
    assert lm_continue(tlm, prefix, steps=0).tokens.shape == (0, 3)
