"""Decoding: beam search and greedy search over any step function, a seq2seq adapter and greedy
continuation of decoder-only language models.

Beam search follows fairseq's ``SequenceGenerator`` (Ott et al. 2019, ``fairseq/sequence_generator.py``
and ``fairseq/search.py:BeamSearch``), sentence by sentence of a batch that advances together:

* At step t (t = 0, 1, ...; t tokens generated so far) every live row r has a cumulative log-prob
  s_r. The step function gives log p(y | prefix_r) for all y; pad is never chosen (log p = -inf),
  eos is blocked while t < ``min_len``, and at the sentence's maximum length eos is forced (every
  other token -inf; forcing wins over ``min_len``). The log-probs are not renormalized after masking.
* Candidates are s_r + log p(y | prefix_r) over the sentence's ``beam`` rows and all y; the best
  ``2 * beam`` are kept, sorted. At t = 0 all rows hold the same prefix [bos], so only the first row
  counts (the others start at -inf), as fairseq's ``lprobs[:, ::beam_size]``.
* Eos candidates among the first ``beam`` of them (and with a finite score) are finished
  hypotheses, in order, until the sentence has ``beam``. Their score is the length-normalized
  log-prob ``sum log p / penalty(len)``, len = generated tokens including eos, with
  ``fairseq``: ``penalty(len) = len ** length_penalty`` (fairseq ``--lenpen``) or
  ``gnmt``: ``penalty(len) = ((5 + len) / 6) ** length_penalty`` (Wu et al. 2016).
* The first ``beam`` non-eos candidates become the live rows of step t + 1.
* Stopping rule (fairseq's; its old ``--no-early-stop`` is gone): a sentence is done as soon as it has
  ``beam`` finished hypotheses, or at its maximum length (where every live row ends in eos). A live
  hypothesis that could still beat a finished one after normalization (length_penalty > 0 rewards
  length) is not searched; with ``length_penalty = 0`` the scores are plain log-probs and extending
  a hypothesis never raises its score. repdegen also stops a sentence when none of its live rows has
  a finite score (nothing more can finish; the result is the same as running on).
* A finished sentence leaves the batch at once: the step function is called with the rows of the
  sentences still running only.

Greedy search takes the argmax of the same masked log-probs; it is beam search with ``beam = 1``
(identical tokens and scores, up to how ties between exactly equal log-probs are broken).

Step-function protocol: ``step(tokens, reorder) -> log_probs``. ``tokens`` (N, t + 1) holds bos and
the t tokens so far of every live row; N = (sentences still running) x beam, so the first call has
N = batch_size * beam rows, all [bos], with rows ``i * beam ... (i + 1) * beam - 1`` belonging to
sentence i, in order (greedy search: beam = 1). ``reorder`` (LongTensor (N,)) says for each row which
row of the previous call it continues: a cache from the previous call becomes the current one by
``cache.index_select(0, reorder)``. It is None on the first call and, in greedy search only, when
every row continues itself (no sentence finished), so a caller can skip an identity reorder.
``log_probs``: (N, V) log-probabilities (any float dtype; taken as float32, NaN as -inf).

``translate`` runs a seq2seq model with an incremental decoder cache; its maximum output length per
sentence is ``int(max_len_a * src_len + max_len_b)`` tokens plus the final eos (fairseq's
``SequenceGenerator``: ``max_len`` excludes eos), with ``src_len`` the sentence's own non-pad source
tokens (fairseq uses the padded length of the batch), capped so that bos + the output fit into
``model.cfg.max_positions`` (fairseq: ``max_decoder_positions - 1``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from repdegen.core.errors import ConfigError

StepFn = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]

LENGTH_PENALTY_FORMS = ("fairseq", "gnmt")


@dataclass
class Hypothesis:
    """One finished output. ``tokens``: generated tokens (no bos; the final eos included).
    ``logprob``: sum of ``positional_logprobs`` (the log-prob of each token, eos included).
    ``score``: ``logprob / penalty(len(tokens))``, the value hypotheses are ranked by."""

    tokens: list[int]
    score: float
    logprob: float
    positional_logprobs: list[float] = field(default_factory=list)


def length_penalty_factor(length: int, length_penalty: float, form: str = "fairseq") -> float:
    """``len ** lp`` (fairseq) or ``((5 + len) / 6) ** lp`` (gnmt); a score is ``logprob / factor``."""
    if form == "fairseq":
        return float(length) ** length_penalty
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** length_penalty
    raise ConfigError(
        f"length_penalty_form={form!r} is not known; expected one of {LENGTH_PENALTY_FORMS} "
        "(generation.length_penalty_form=fairseq or gnmt)"
    )


def _check_search_args(batch_size: int, beam: int, max_lens: Any, eos: int, pad: int, form: str, min_len: int) -> torch.Tensor:
    if beam < 1:
        raise ConfigError(f"beam={beam} must be >= 1 (generation.beam=1 is greedy search)")
    if form not in LENGTH_PENALTY_FORMS:
        raise ConfigError(
            f"length_penalty_form={form!r} is not known; expected one of {LENGTH_PENALTY_FORMS} "
            "(generation.length_penalty_form=fairseq or gnmt)"
        )
    if min_len < 0:
        raise ConfigError(f"min_len={min_len} must be >= 0 (the fewest tokens before eos may be chosen)")
    if eos == pad:
        raise ConfigError(f"eos and pad are the same id ({eos}); eos could never be chosen. Pass the dictionary's own ids")
    max_lens = torch.as_tensor(max_lens, dtype=torch.long)
    if max_lens.dim() != 1 or max_lens.numel() != batch_size:
        raise ConfigError(
            f"max_lens has shape {tuple(max_lens.shape)}; expected ({batch_size},), one maximum output length per sentence"
        )
    if batch_size > 0 and int(max_lens.min()) < 1:
        raise ConfigError(
            f"max_lens has a value {int(max_lens.min())} < 1; every output needs room for its eos "
            "(raise generation.max_len_b)"
        )
    return max_lens


def _mask_log_probs(lp: torch.Tensor, t: int, at_max: torch.Tensor | None, eos: int, pad: int, min_len: int) -> torch.Tensor:
    """Float32 copy of ``lp`` with NaN -> -inf, pad never chosen, eos blocked while t < min_len and
    forced in the rows where ``at_max`` (a bool (N,) tensor, or None when no row is at its maximum)."""
    lp = lp.to(torch.float32, copy=True)
    lp.masked_fill_(lp.isnan(), float("-inf"))
    lp[:, pad] = float("-inf")
    eos_lp = lp[:, eos].clone()
    if t < min_len:
        lp[:, eos] = float("-inf")
    if at_max is not None:
        lp.masked_fill_(at_max.unsqueeze(1), float("-inf"))
        lp[:, eos] = torch.where(at_max, eos_lp, lp[:, eos])
    return lp


def _call_step(step: StepFn, tokens: torch.Tensor, reorder: torch.Tensor | None) -> torch.Tensor:
    lp = step(tokens, reorder)
    if lp.dim() != 2 or lp.size(0) != tokens.size(0):
        raise ValueError(f"the step function returned shape {tuple(lp.shape)}; expected ({tokens.size(0)}, vocab) log-probs")
    return lp


def _sort(finalized: list[list[Hypothesis]]) -> list[list[Hypothesis]]:
    return [sorted(hyps, key=lambda h: h.score, reverse=True) for hyps in finalized]


def beam_search(
    step: StepFn,
    batch_size: int,
    beam: int,
    max_lens: torch.Tensor,
    bos: int,
    eos: int,
    pad: int,
    length_penalty: float = 1.0,
    length_penalty_form: str = "fairseq",
    min_len: int = 0,
) -> list[list[Hypothesis]]:
    """Fairseq beam search (see the module docstring) of ``batch_size`` sentences at once.

    ``max_lens`` (batch,): the most tokens each output may have, eos included (bos excluded).
    ``min_len``: the fewest non-eos tokens before eos may be chosen. Returns, per sentence, up to
    ``beam`` finished hypotheses sorted by score, best first. Tensors are made on ``max_lens``' device.
    """
    max_lens = _check_search_args(batch_size, beam, max_lens, eos, pad, length_penalty_form, min_len)
    device = max_lens.device
    finalized: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    if batch_size == 0:
        return finalized
    max_list = max_lens.tolist()
    sents = list(range(batch_size))  # original index of each running sentence
    n = batch_size
    tokens = torch.full((n * beam, 1), bos, dtype=torch.long, device=device)
    positional = torch.zeros((n * beam, 0), dtype=torch.float32, device=device)
    scores = torch.zeros((n, beam), dtype=torch.float32, device=device)
    scores[:, 1:] = float("-inf")  # step 0: only the first row of each sentence
    scores = scores.view(-1)
    reorder: torch.Tensor | None = None
    t = 0
    while True:
        lp = _call_step(step, tokens, reorder)
        at_max_sent = [t + 1 >= max_list[s] for s in sents]
        at_max = None
        if any(at_max_sent):
            at_max = torch.tensor(at_max_sent, device=device).repeat_interleave(beam)
        lp = _mask_log_probs(lp, t, at_max, eos, pad, min_len)
        vocab = lp.size(1)
        cand = (scores.unsqueeze(1) + lp).view(n, beam * vocab)
        k = min(2 * beam, beam * vocab)
        top_scores, top_idx = cand.topk(k, dim=1)  # sorted, best first
        top_rows = torch.div(top_idx, vocab, rounding_mode="floor") + torch.arange(n, device=device).unsqueeze(1) * beam
        top_tok = top_idx % vocab
        is_eos = top_tok.eq(eos)
        finish = (is_eos & top_scores.isfinite())[:, :beam]
        # the first `beam` non-eos candidates live on (fairseq's active_mask trick)
        key = is_eos.long() * k + torch.arange(k, device=device)
        live_pos = key.topk(beam, dim=1, largest=False).indices
        live_rows = top_rows.gather(1, live_pos)
        live_tok = top_tok.gather(1, live_pos)
        live_scores = top_scores.gather(1, live_pos)

        if bool(finish.any()):
            pairs = finish.nonzero()
            rows = top_rows[pairs[:, 0], pairs[:, 1]]
            hyp_tokens = tokens[rows, 1:].tolist()
            hyp_pos = torch.cat([positional[rows], lp[rows, eos].unsqueeze(1)], dim=1).tolist()
            hyp_scores = top_scores[pairs[:, 0], pairs[:, 1]].tolist()
            for (i, _), toks, pos, s in zip(pairs.tolist(), hyp_tokens, hyp_pos, hyp_scores):
                done_list = finalized[sents[i]]
                if len(done_list) < beam:
                    norm = length_penalty_factor(t + 1, length_penalty, length_penalty_form)
                    done_list.append(Hypothesis(toks + [eos], s / norm, s, pos))
        any_live = live_scores.isfinite().any(dim=1).tolist()
        keep = [
            i for i, s in enumerate(sents) if len(finalized[s]) < beam and not at_max_sent[i] and any_live[i]
        ]
        if not keep:
            break
        if len(keep) < n:
            keep_t = torch.tensor(keep, device=device)
            live_rows, live_tok, live_scores = live_rows[keep_t], live_tok[keep_t], live_scores[keep_t]
            sents = [sents[i] for i in keep]
            n = len(keep)
        reorder = live_rows.reshape(-1)
        new_tok = live_tok.reshape(-1, 1)
        tokens = torch.cat([tokens.index_select(0, reorder), new_tok], dim=1)
        positional = torch.cat([positional.index_select(0, reorder), lp.index_select(0, reorder).gather(1, new_tok)], dim=1)
        scores = live_scores.reshape(-1)
        t += 1
    return _sort(finalized)


def greedy_search(
    step: StepFn,
    batch_size: int,
    max_lens: torch.Tensor,
    bos: int,
    eos: int,
    pad: int,
    length_penalty: float = 1.0,
    length_penalty_form: str = "fairseq",
    min_len: int = 0,
) -> list[list[Hypothesis]]:
    """The argmax of the masked log-probs at every step; one hypothesis per sentence.

    Same arguments and masking as ``beam_search``; equals ``beam_search(beam=1)``. ``reorder`` is None
    while every sentence is still running (the rows continue themselves) and selects the rows of the
    running sentences after one finishes.
    """
    max_lens = _check_search_args(batch_size, 1, max_lens, eos, pad, length_penalty_form, min_len)
    device = max_lens.device
    finalized: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    if batch_size == 0:
        return finalized
    max_list = max_lens.tolist()
    sents = list(range(batch_size))
    tokens = torch.full((batch_size, 1), bos, dtype=torch.long, device=device)
    positional = torch.zeros((batch_size, 0), dtype=torch.float32, device=device)
    scores = torch.zeros(batch_size, dtype=torch.float32, device=device)
    reorder: torch.Tensor | None = None
    t = 0
    while True:
        lp = _call_step(step, tokens, reorder)
        at_max_sent = [t + 1 >= max_list[s] for s in sents]
        at_max = torch.tensor(at_max_sent, device=device) if any(at_max_sent) else None
        lp = _mask_log_probs(lp, t, at_max, eos, pad, min_len)
        cand = scores.unsqueeze(1) + lp  # the same sums beam search ranks
        scores, tok = cand.max(dim=1)
        tokens = torch.cat([tokens, tok.unsqueeze(1)], dim=1)
        positional = torch.cat([positional, lp.gather(1, tok.unsqueeze(1))], dim=1)
        ended = tok.eq(eos)
        finite = scores.isfinite()
        ended_l, finite_l = ended.tolist(), finite.tolist()
        fin_rows = [i for i in range(len(sents)) if ended_l[i] and finite_l[i]]
        if fin_rows:
            idx = torch.tensor(fin_rows, device=device)
            hyp_tokens, hyp_pos, hyp_scores = tokens[idx, 1:].tolist(), positional[idx].tolist(), scores[idx].tolist()
            norm = length_penalty_factor(t + 1, length_penalty, length_penalty_form)
            for i, toks, pos, s in zip(fin_rows, hyp_tokens, hyp_pos, hyp_scores):
                finalized[sents[i]].append(Hypothesis(toks, s / norm, s, pos))
        keep = [i for i in range(len(sents)) if not ended_l[i] and finite_l[i] and not at_max_sent[i]]
        if not keep:
            break
        if len(keep) < len(sents):
            reorder = torch.tensor(keep, device=device)
            tokens, positional, scores = tokens[reorder], positional[reorder], scores[reorder]
            sents = [sents[i] for i in keep]
        else:
            reorder = None
        t += 1
    return finalized


# ---- seq2seq ------------------------------------------------------------------------------------


def _check_generation_config(gen_cfg: Any) -> None:
    if int(gen_cfg.beam) < 1:
        raise ConfigError(f"generation.beam={gen_cfg.beam} must be >= 1 (1 is greedy search)")
    if gen_cfg.length_penalty_form not in LENGTH_PENALTY_FORMS:
        raise ConfigError(
            f"generation.length_penalty_form={gen_cfg.length_penalty_form!r} is not known; expected one of "
            f"{LENGTH_PENALTY_FORMS}"
        )
    if float(gen_cfg.max_len_a) < 0 or float(gen_cfg.max_len_b) < 0:
        raise ConfigError(
            f"generation.max_len_a={gen_cfg.max_len_a}, max_len_b={gen_cfg.max_len_b}: both must be >= 0 "
            "(the output may have max_len_a * source_len + max_len_b tokens)"
        )
    if int(gen_cfg.batch_size) < 1:
        raise ConfigError(f"generation.batch_size={gen_cfg.batch_size} must be >= 1 (sentences per generation batch)")


def output_max_lens(
    src: torch.Tensor, pad: int, max_len_a: float, max_len_b: float, max_positions: int | None = None
) -> list[int]:
    """Per sentence: ``int(max_len_a * src_len + max_len_b)`` tokens plus eos, src_len = non-pad source
    tokens; with ``max_positions`` at most ``max_positions`` (bos + output must fit the decoder)."""
    lens = []
    for src_len in src.ne(pad).sum(dim=1).tolist():
        n = int(max_len_a * src_len + max_len_b)
        if max_positions is not None:
            n = min(n, int(max_positions) - 1)
        lens.append(max(n, 0) + 1)
    return lens


@torch.no_grad()
def translate(
    model: Any, src: torch.Tensor, gen_cfg: Any, bos: int, eos: int, pad: int, min_len: int = 1
) -> list[list[Hypothesis]]:
    """Beam search (greedy when ``gen_cfg.beam == 1``) of a seq2seq model over source batch ``src`` (B, S).

    Model API: ``enc = model.encode(src)`` (``.memory`` (B, S, d), ``.pad_mask``, ``.index_select``);
    ``h = model.decode(prev_tokens (N, t), enc, cache)`` -> (N, 1, d) with a cache dict (only the last
    position computed); ``model.reorder_cache(cache, index)``; ``model.logits(h)`` -> (N, 1, V). The
    log-probs are ``log_softmax`` of the float32 logits. ``src`` is split into chunks of
    ``gen_cfg.batch_size`` sentences. ``min_len=1`` as fairseq-generate (no empty outputs). The
    model runs in eval mode under no_grad; its training flag is restored afterwards.
    Returns up to ``beam`` hypotheses per source sentence, best first (tokens end in eos).
    """
    _check_generation_config(gen_cfg)
    if src.dim() != 2:
        raise ValueError(f"src has shape {tuple(src.shape)}; expected (batch, source_len) token ids")
    beam = int(gen_cfg.beam)
    max_positions = getattr(getattr(model, "cfg", None), "max_positions", None)
    was_training = model.training
    model.eval()
    try:
        results: list[list[Hypothesis]] = []
        chunk = int(gen_cfg.batch_size)
        for start in range(0, src.size(0), chunk):
            part = src[start : start + chunk]
            max_lens = torch.tensor(
                output_max_lens(part, pad, float(gen_cfg.max_len_a), float(gen_cfg.max_len_b), max_positions),
                device=src.device,
            )
            results.extend(_translate_batch(model, part, beam, max_lens, gen_cfg, bos, eos, pad, min_len))
        return results
    finally:
        model.train(was_training)


def _translate_batch(model, src, beam, max_lens, gen_cfg, bos, eos, pad, min_len) -> list[list[Hypothesis]]:
    b = src.size(0)
    enc = model.encode(src)
    enc = enc.index_select(torch.arange(b, device=src.device).repeat_interleave(beam))
    cache: dict = {}
    state = {"enc": enc}

    def step(tokens: torch.Tensor, reorder: torch.Tensor | None) -> torch.Tensor:
        if reorder is not None:
            model.reorder_cache(cache, reorder)
            # rows of one sentence share their encoder output: it only changes when sentences leave
            if reorder.numel() != state["enc"].memory.size(0):
                state["enc"] = state["enc"].index_select(reorder)
        h = model.decode(tokens, state["enc"], cache)
        logits = model.logits(h)[:, -1]
        return torch.log_softmax(logits.float(), dim=-1)

    kwargs = dict(
        length_penalty=float(gen_cfg.length_penalty), length_penalty_form=gen_cfg.length_penalty_form, min_len=min_len
    )
    if beam == 1:
        return greedy_search(step, b, max_lens, bos, eos, pad, **kwargs)
    return beam_search(step, b, beam, max_lens, bos, eos, pad, **kwargs)


# ---- decoder-only language models ---------------------------------------------------------------


@dataclass
class Continuation:
    """``tokens`` (steps, B): the greedy continuation; ``logprobs`` (steps, B): log p of each token."""

    tokens: torch.Tensor
    logprobs: torch.Tensor


def _greedy(model: Any, hidden: torch.Tensor, steps: int, forbid: list[int], advance, batch: int,
            device) -> Continuation:
    """The greedy loop: from the last position's state ``hidden`` (B, d) take the most likely token (``forbid``
    excluded), then ``advance(token)`` gives the next position's state; ``steps`` tokens."""
    tokens, logprobs = [], []
    for i in range(steps):
        lp = torch.log_softmax(model.logits(hidden).float(), dim=-1)
        if forbid:
            lp[:, forbid] = float("-inf")
        best, nxt = lp.max(dim=-1)
        tokens.append(nxt)
        logprobs.append(best)
        if i < steps - 1:
            hidden = advance(nxt)
    if not tokens:
        return Continuation(torch.zeros((0, batch), dtype=torch.long, device=device), torch.zeros((0, batch), device=device))
    return Continuation(torch.stack(tokens), torch.stack(logprobs))


def _continue_cached(model: Any, prefix: torch.Tensor, steps: int, forbid: list[int]) -> Continuation:
    """:func:`lm_continue` for a Transformer LM with an incremental cache (``model.decode(prev (B, t), cache)`` computes
    position t - 1 only): the prefix is fed one position at a time, then each generated token; the same greedy
    continuation as rerunning the whole sequence each step when it fits in the model's positions, O(T + steps)
    positions instead of O(steps * (T + steps))."""
    history = prefix.t().contiguous()  # (B, T)
    cache: dict = {}
    for t in range(1, history.size(1) + 1):
        hidden = model.decode(history[:, :t], cache)

    def advance(nxt: torch.Tensor) -> torch.Tensor:
        nonlocal history
        history = torch.cat([history, nxt.unsqueeze(1)], dim=1)
        return model.decode(history, cache)[:, -1]

    return _greedy(model, hidden[:, -1], steps, forbid, advance, prefix.size(1), prefix.device)


@torch.no_grad()
def lm_continue(model: Any, prefix: torch.Tensor, steps: int, state: Any = None, forbid: Sequence[int] = ()) -> Continuation:
    """Greedy continuation of a (time, batch) language model: ``model(tokens (T, B), state)`` ->
    ``ModelOutput(hidden (T, B, d), state)``, ``model.logits(hidden)``.

    The prefix (T, B) is run once from ``state`` (default ``model.init_state(B)``; None for stateless
    models). A model that returns a state (RNNs) is then fed one token per step with it: O(T + steps)
    token positions. A model that returns ``state=None`` (Transformers) is rerun on the whole
    sequence each step, cropped to its last ``model.cfg.max_positions`` tokens when it has that
    field and starts from no state: O(steps * (T + steps)) positions (and quadratic attention on top), fine for short
    samples -- unless it decodes incrementally (``model.incremental_lm``: the Transformer LM's key/value cache) and
    the whole sequence fits in its positions: then O(T + steps) (:func:`_continue_cached`). ``forbid``: ids never
    generated (e.g. ``<unk>``). No early stop at eos: an LM's eos is an
    ordinary token. Eval mode under no_grad; the training flag is restored afterwards.
    """
    if prefix.dim() != 2 or prefix.size(0) < 1:
        raise ConfigError(f"prefix has shape {tuple(prefix.shape)}; expected (time >= 1, batch) token ids")
    if steps < 0:
        raise ConfigError(f"steps={steps} must be >= 0 (the number of tokens to generate)")
    batch = prefix.size(1)
    max_positions = getattr(getattr(model, "cfg", None), "max_positions", None)
    forbid = list(forbid)
    was_training = model.training
    model.eval()
    try:
        if state is None and hasattr(model, "init_state"):
            try:
                state = model.init_state(batch, prefix.device)
            except NotImplementedError:
                state = None
        # a stateless model sees at most its last max_positions tokens (a recurrent one all of them)
        crop = int(max_positions) if max_positions is not None and state is None else None
        if getattr(model, "incremental_lm", False) and state is None and (crop is None or prefix.size(0) + steps - 1 <= crop):
            return _continue_cached(model, prefix, steps, forbid)
        out = model(prefix if crop is None else prefix[-crop:], state)
        recurrent = out.state is not None
        history = prefix

        def advance(nxt: torch.Tensor) -> torch.Tensor:
            nonlocal out, history
            if recurrent:
                out = model(nxt.unsqueeze(0), out.state)
            else:
                history = torch.cat([history, nxt.unsqueeze(0)], dim=0)
                out = model(history if crop is None else history[-crop:], None)
            return out.hidden[-1]

        return _greedy(model, out.hidden[-1], steps, forbid, advance, batch, prefix.device)
    finally:
        model.train(was_training)
