"""Frequency groups of the vocabulary and per-group metrics (Yu et al. 2022, Sec. 3 and 5.1).

Groups (Yu et al. 2022, Sec. 3.1): "Based on the appearance frequency in the training corpus, the 30%,
50%, and 20% tokens are assigned to the frequent, medium, and rare group". The official AGG code
(ysw1021/AGG, ``fairseq/custom/evaluation.py`` and ``fairseq_cli/eval_lm.py``) cuts the frequency-sorted
fairseq dictionary by index instead: frequent = index < 13,000, medium = 13,000 <= index < 36,000, rare =
index >= 36,000 (about 30/50/20% of its 44,256 entries). Its two scripts disagree on index 13,000
(``tokens <= 13000`` in eval_lm.py, ``[:13000]`` in evaluation.py); we use ``< 13000`` throughout.

Per-group evaluation (Yu Tables 1-4, official ``eval_lm.py`` / ``evaluation.py``):

* PPL of a group = exp(mean NLL over the predicted positions whose *target* token is in the group);
  the total PPL is over every position (equal to :func:`repdegen.analysis.evaluate.evaluate_nll`).
* Uniq (Welleck et al. 2020; Yu: "the number of unique next-token predictions") = the number of
  distinct argmax next-token predictions over the split; a group's Uniq counts the distinct predicted
  tokens that belong to the group (so the groups' Uniq add up to the total). The "Human" row of Yu
  Table 3 is the same count over the targets (``uniq_target`` here).

Geometry per group (Yu Tables 1, 2, 10, 11 and Fig. 2): I(W) of the group's own rows (the eigenvectors
are those of ``W_g^T W_g``), and mean cosine similarities within and between groups.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from repdegen.analysis.evaluate import scored_segments
from repdegen.analysis.metrics import isotropy, perplexity
from torch import nn

GROUP_NAMES = ("frequent", "medium", "rare")
AGG_CUTOFFS = (13000, 36000)

Group = slice | torch.Tensor


def _counts_of(counts) -> torch.Tensor:
    """A 1-D tensor of counts from a tensor/sequence, or from an object with ``.counts`` (Vocab, BPETokenizer)."""
    if hasattr(counts, "counts"):
        counts = counts.counts
    t = torch.as_tensor(counts).detach().cpu().reshape(-1)
    return t.to(torch.float64)


def frequency_groups(counts, fractions: Sequence[float] = (0.3, 0.5, 0.2), cutoffs: Sequence[int] | None = None,
                     n_specials: int | None = None) -> dict[str, Group]:
    """The frequent / medium / rare groups of type ids, by training frequency (Yu et al. 2022, Sec. 3.1).

    ``counts``: the training count of each id (a tensor/sequence, or a ``repdegen.data.vocab.Vocab`` or
    ``repdegen.data.bpe.BPETokenizer``, whose ``.counts`` are used). Our vocabularies are sorted by training
    frequency, so groups are contiguous id ranges and are returned as ``slice`` objects:

    * ``fractions=(f, m, r)`` (default 30/50/20%, the paper's definition): frequent = the first
      ``round(f * V)`` ids, medium = up to ``round((f + m) * V)``, rare = the rest. The fractions are of
      all ``V`` types, specials included.
    * ``cutoffs=(c1, c2)`` (the official AGG code: ``AGG_CUTOFFS = (13000, 36000)``): frequent = id < c1,
      medium = c1 <= id < c2, rare = id >= c2 (clipped to ``V``; a group may be empty).

    Specials and zero-count types are grouped by their position, as the official code does with its
    fairseq dictionary: the BPE specials ``<pad> <s> </s> <unk>`` (ids 0-3) come first and so fall in the
    frequent group (AGG also forces specials to be non-rare), whatever their count (``<pad>``/``<s>`` count
    0); types that never occur in the training data (BPE pieces that are only intermediate merges) come
    last and fall in the rare group (AGG treats a zero-count token as rare). Word-level vocabularies have
    no leading specials (``<eos>``/``<unk>`` are sorted in by their counts).

    ``n_specials``: how many leading ids are specials exempt from the sortedness check (default: 4 when
    ``counts`` is an object whose ``itos`` starts with the BPE specials, else 0). When the counts after
    them are not non-increasing (a vocabulary not sorted by frequency), the ids are ranked by count
    (stable: ties keep id order, specials stay first) and the groups are returned as ``LongTensor`` id
    sets of that ranking instead of slices.
    """
    if n_specials is None:
        from repdegen.data.bpe import SPECIALS

        itos = getattr(counts, "itos", None)
        n_specials = len(SPECIALS) if itos is not None and tuple(itos[: len(SPECIALS)]) == SPECIALS else 0
    c = _counts_of(counts)
    v = c.numel()
    if cutoffs is not None:
        if len(cutoffs) != 2 or not 0 <= cutoffs[0] <= cutoffs[1]:
            raise ValueError(f"cutoffs={tuple(cutoffs)}: expected two index cut-offs 0 <= c1 <= c2")
        b1, b2 = min(int(cutoffs[0]), v), min(int(cutoffs[1]), v)
    else:
        if len(fractions) != 3 or any(f < 0 for f in fractions) or not math.isclose(sum(fractions), 1.0, abs_tol=1e-9):
            raise ValueError(f"fractions={tuple(fractions)}: expected three non-negative fractions summing to 1")
        b1 = int(round(fractions[0] * v))
        b2 = int(round((fractions[0] + fractions[1]) * v))
    bounds = ((0, b1), (b1, b2), (b2, v))
    tail = c[n_specials:]
    if tail.numel() < 2 or bool((tail[1:] <= tail[:-1]).all()):
        return {name: slice(lo, hi) for name, (lo, hi) in zip(GROUP_NAMES, bounds)}
    order = torch.cat([torch.arange(n_specials), n_specials + torch.sort(-tail, stable=True).indices])
    return {name: order[lo:hi].clone() for name, (lo, hi) in zip(GROUP_NAMES, bounds)}


def group_ids(group: Group, vocab_size: int) -> torch.Tensor:
    """The ids of a group (slice or id tensor) as a LongTensor."""
    if isinstance(group, slice):
        return torch.arange(vocab_size)[group]
    return torch.as_tensor(group, dtype=torch.long).reshape(-1)


def group_masks(groups: Mapping[str, Group], vocab_size: int) -> torch.Tensor:
    """(G, V) bool: row k marks the ids of the k-th group (in ``groups``' order). Groups may overlap."""
    masks = torch.zeros((len(groups), vocab_size), dtype=torch.bool)
    for k, group in enumerate(groups.values()):
        masks[k, group_ids(group, vocab_size)] = True
    return masks


@torch.no_grad()
def group_metrics(model, ids: torch.Tensor, groups: Mapping[str, Group], batch_size: int, bptt: int, device,
                  forbid: Sequence[int] = (), mass_sets: Mapping[str, Sequence[int]] | None = None,
                  context: int = 0) -> dict:
    """Total and per-group PPL and Uniq of ``ids`` (1-D), in one pass (Yu et al. 2022, Tables 1-4).

    The stream is read exactly as :func:`repdegen.analysis.evaluate.evaluate_nll` reads it (``batch_size``
    columns, ``bptt`` segments, the recurrent state carried across segments or each segment read after ``context``
    preceding tokens, eval mode: :func:`repdegen.analysis.evaluate.scored_segments`), so the total PPL equals its
    PPL. Per position: NLL = the plain softmax cross-entropy of ``model.logits`` (nats); the prediction is the
    argmax of the logits over the vocabulary, never one of ``forbid`` (the official AGG code masks ``<pad>`` before
    its argmax; pass ``forbid=[PAD]`` to do the same).

    Returns plain numbers::

        {"nll", "ppl", "tokens",            # every position
         "uniq",                            # distinct argmax predictions
         "uniq_target",                     # distinct targets (Yu Table 3's "Human" row)
         "groups": {name: {"nll", "ppl", "tokens", "uniq", "uniq_target"}}}

    A group's nll/ppl are over the positions whose target is in the group (NaN when there are none);
    its uniq / uniq_target count the distinct predicted / target tokens that belong to the group.
    ``groups`` is usually :func:`frequency_groups`; any named id sets work (they may overlap, e.g. a
    "non-rare" set, or the rare group of AGG's dynamic grouping).

    ``mass_sets`` ({name: ids}) adds ``"mass": {name: m}``: the mean, over the positions whose target is not in the
    set, of the probability the softmax of the logits (untempered, before ``forbid``) puts on the set (Inan et al.
    2017, Sec. 6.4: the probability of ``<unk>``, of "a"/"an"/"the", where they are not the next word).
    """
    vocab = masks = None
    g_nll = torch.zeros(len(groups), dtype=torch.float64, device=device)
    g_cnt = torch.zeros(len(groups), dtype=torch.long, device=device)
    nll_sum, count = 0.0, 0
    predicted = target_seen = None
    forbid = list(forbid)
    sets = {name: torch.as_tensor(list(v), dtype=torch.long, device=device) for name, v in (mass_sets or {}).items()}
    mass_sum = {name: 0.0 for name in sets}
    mass_cnt = {name: 0 for name in sets}
    for hidden, y in scored_segments(model, ids, batch_size, bptt, device, context=context):
        logits = model.logits(hidden.reshape(-1, hidden.size(-1))).float()
        y = y.reshape(-1)
        if vocab is None:
            vocab = logits.size(-1)
            masks = group_masks(groups, vocab).to(device)
            predicted = torch.zeros(vocab, dtype=torch.bool, device=device)
            target_seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        nll = nn.functional.cross_entropy(logits, y, reduction="none")
        nll_sum += nll.sum().item()
        count += y.numel()
        if sets:
            probs = torch.softmax(logits, dim=-1)
            for name, set_ids in sets.items():
                other = ~torch.isin(y, set_ids)
                mass_sum[name] += float(probs[other][:, set_ids].sum(dim=1).double().sum())
                mass_cnt[name] += int(other.sum())
        in_group = masks[:, y]  # (G, positions): is the target in group k?
        g_nll += (in_group * nll.double()).sum(dim=1)
        g_cnt += in_group.sum(dim=1)
        if forbid:
            logits[:, forbid] = float("-inf")
        predicted[logits.argmax(dim=-1)] = True
        target_seen[y] = True
    if count == 0:
        raise ValueError("the stream has no predicted positions")
    out_groups = {}
    for k, name in enumerate(groups):
        gid = masks[k]
        n = int(g_cnt[k])
        mean = float(g_nll[k]) / n if n else math.nan
        out_groups[name] = {
            "nll": mean,
            "ppl": perplexity(mean) if n else math.nan,
            "tokens": n,
            "uniq": int(predicted[gid].sum()),
            "uniq_target": int(target_seen[gid].sum()),
        }
    mean = nll_sum / count
    return {
        "nll": mean,
        "ppl": perplexity(mean),
        "tokens": count,
        "uniq": int(predicted.sum()),
        "uniq_target": int(target_seen.sum()),
        "groups": out_groups,
        **({"mass": {name: mass_sum[name] / mass_cnt[name] if mass_cnt[name] else math.nan for name in sets}}
           if sets else {}),
    }


@torch.no_grad()
def group_isotropy(weight: torch.Tensor, groups: Mapping[str, Group]) -> dict[str, float]:
    """I(W) (:func:`repdegen.analysis.metrics.isotropy`) of each group's rows of ``weight`` (N x d), and of all
    rows under ``"total"`` (Yu et al. 2022, Tables 1, 2, 10, 11). A group's I(W) uses the eigenvectors of
    its own ``W_g^T W_g``. NaN for an empty group."""
    w = weight.detach()
    out = {}
    for name, group in groups.items():
        rows = w[group_ids(group, w.size(0)).to(w.device)]
        out[name] = isotropy(rows) if rows.size(0) else math.nan
    out["total"] = isotropy(w)
    return out


@torch.no_grad()
def group_cosines(weight: torch.Tensor, groups: Mapping[str, Group],
                  between: Sequence[tuple[str, str]] = (("rare", "frequent"),)) -> dict[str, float]:
    """Mean cosine similarities of embedding rows within and between groups (Yu et al. 2022, Fig. 2:
    "the average cosine similarity between the rare and frequent group embeddings").

    * ``out[g]`` for each group g: mean of cos(w_i, w_j) over the ordered pairs i != j of g
      (as :func:`repdegen.analysis.metrics.mean_cosine`); NaN with fewer than 2 rows.
    * ``out["a_b"]`` for each pair (a, b) in ``between`` (default rare-frequent): mean of cos(w_i, w_j)
      over i in a, j in b.

    O(N d) through sums of the normalised rows: sum_{i != j} cos = |s|^2 - n within a group, and
    s_a . s_b between groups. A zero row has cosine 0 with everything (it normalises to 0).
    """
    w = nn.functional.normalize(weight.detach().to(torch.float64), dim=1)
    sums, sizes, out = {}, {}, {}
    for name, group in groups.items():
        rows = w[group_ids(group, w.size(0)).to(w.device)]
        n = rows.size(0)
        s = rows.sum(0)
        sums[name], sizes[name] = s, n
        out[name] = float((s.dot(s) - (rows * rows).sum()) / (n * (n - 1))) if n > 1 else math.nan
    for a, b in between:
        if a not in sums or b not in sums:
            raise KeyError(f"group_cosines: no group {a!r} or {b!r} in {list(groups)}")
        n = sizes[a] * sizes[b]
        out[f"{a}_{b}"] = float(sums[a].dot(sums[b]) / n) if n else math.nan
    return out
