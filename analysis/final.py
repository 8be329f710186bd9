"""The degeneration metrics of a trained language model, computed once at the end of its run on the test split (the
``final`` source of the metric registry): objective-independent, like every evaluation.

* with frequency groups (Yu et al. 2022): Uniq and PPL per group, the rare group's distinct predictions against the
  test targets' own (Table 3's "Human" row), each group's I(W), the rare-frequent cosine and the share of rare
  nearest neighbours of rare rows;
* for a word-level vocabulary that has the words (PTB, WikiText-2): the probability mass on ``<unk>`` and on the
  articles where they are not the next word (Inan et al. 2017, Sec. 6.4);
* for an untied model: the subspace distance between the input and output embeddings (Inan et al. 2017, Fig. 1);
* optionally the word-similarity correlations of the output embedding.
"""

from __future__ import annotations

from repdegen.analysis.geometry import finite_only, nn_rare_frac
from repdegen.analysis.groups import group_cosines, group_ids, group_isotropy, group_metrics

# Inan et al. 2017, Sec. 6.4: the probability of <unk>, and of the articles, where they are not the next word
MASS_SETS = {"p_unk_nontarget": ("<unk>",), "p_articles_nontarget": ("a", "an", "the")}


def lm_final_metrics(model, corpus, groups: dict | None, special_ids: list[int], reading: tuple[int, int, int],
                     device, wordsim: bool = False) -> dict:
    """The metrics above for ``model`` on ``corpus.test``, read as its test PPL is (``reading``: batch size, segment
    length, context); ``groups`` (:func:`repdegen.analysis.groups.frequency_groups`, or None: no group metrics) and
    the ``special_ids`` outside every group."""
    bs, bptt, context = reading
    vocab = corpus.vocab
    out: dict = {}
    if groups is not None:
        forbid = [vocab.stoi["<pad>"]] if "<pad>" in vocab.stoi else []
        m = group_metrics(model, corpus.test, groups, bs, bptt, device, forbid=forbid, context=context)
        out["uniq"], out["uniq_target"] = m["uniq"], m["uniq_target"]
        for name, g in m["groups"].items():
            out[f"ppl_{name}"], out[f"uniq_{name}"] = g["ppl"], g["uniq"]
            out[f"uniq_target_{name}"] = g["uniq_target"]
        rare_targets = m["groups"].get("rare", {}).get("uniq_target")
        if rare_targets:  # Yu Table 3: the rare group's distinct predictions against the test targets' own
            out["uniq_rare_over_human"] = out["uniq_rare"] / rare_targets
        weight = model.output_embedding.detach().float()
        for name, value in group_isotropy(weight, groups).items():
            if name != "total":
                out[f"isotropy_{name}"] = value
        out["cos_rare_frequent"] = group_cosines(weight, groups)["rare_frequent"]
        out.update(finite_only({"nn_rare_frac": nn_rare_frac(weight, group_ids(groups["rare"], weight.shape[0]),
                                                             special_ids)}))
    sets = {name: [vocab.stoi[w] for w in words] for name, words in MASS_SETS.items()
            if corpus.tokenizer is None and all(w in vocab.stoi for w in words)}
    if sets:
        out.update(finite_only(group_metrics(model, corpus.test, {}, bs, bptt, device, mass_sets=sets,
                                             context=context)["mass"]))
    from repdegen.analysis.inspection import input_output_distance

    out.update(input_output_distance(model))  # untied: Inan 2017 Fig. 1
    if wordsim:
        from repdegen.analysis.wordsim import evaluate_wordsim, load_wordsim_datasets

        lookup = corpus.tokenizer if corpus.tokenizer is not None else vocab
        for name, r in evaluate_wordsim(model.output_embedding.detach().float(), lookup, load_wordsim_datasets()).items():
            out[f"wordsim_{name.lower()}"] = r["spearman"]
    return out
