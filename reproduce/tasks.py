"""What one training batch is, how its loss is formed, and how a split is evaluated, per kind of data.

The :class:`~reproduce.trainer.Trainer` owns the loop (optimizer, schedule, accumulation, precision,
checkpoints, stages); a task owns the data side:

* :class:`LMTask` -- one token stream per split, cut into ``trainer.batch_size`` columns and read in
  segments of ``trainer.bptt`` tokens. Recurrent models carry their state across segments (truncated
  BPTT); stateless models (Transformer LMs) see contiguous blocks of ``bptt`` tokens, in shuffled
  order when ``trainer.shuffle_blocks`` (fairseq ``--sample-break-mode none``).
* :class:`TranslationTask` -- sentence pairs bucketed by length into batches of at most
  ``trainer.max_tokens`` padded tokens, shuffled per epoch; validation/test loss is teacher-forced
  NLL over the target tokens; BLEU comes from beam search on the raw references.

``loss(model, objective, batch, update)`` returns ``(loss, nll_sum, n_targets)``: the differentiable
loss averaged over the batch's target tokens (plus once-per-step penalties), the detached plain-NLL
sum (for the progress bar and the epoch's training PPL), and the number of target tokens.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from analysis.evaluate import evaluate_nll
from data.batching import batchify, bptt_segments, get_batch
from losses import TokenLayout


def group_geometry(task, model) -> dict:
    """I(W) of the rare and frequent output embeddings and their mean cosine, per evaluation (Yu et
    al. 2022 Fig. 2); empty when ``trainer.analysis.groups`` is off."""
    if not task.t.analysis.groups:
        return {}
    from analysis.groups import group_cosines, group_isotropy

    groups = task.groups()
    weight = model.output_embedding.detach().float()
    iso = group_isotropy(weight, {k: groups[k] for k in ("frequent", "rare")})
    return {"isotropy_frequent": iso["frequent"], "isotropy_rare": iso["rare"],
            "cos_rare_frequent": group_cosines(weight, groups)["rare_frequent"]}


class LMTask:
    def __init__(self, cfg, corpus, model, device):
        self.cfg, self.t, self.corpus, self.device = cfg, cfg.trainer, corpus, device
        self.stream = batchify(corpus.train, self.t.batch_size).to(device)
        self.bptt_rng = np.random.default_rng(cfg.seed)
        self.stateless = model.init_state(1, torch.device("cpu")) is None
        self.state = None

    # -- checkpointed randomness ------------------------------------------------------------------
    def rng_state(self) -> dict:
        return self.bptt_rng.bit_generator.state

    def set_rng_state(self, state: dict) -> None:
        self.bptt_rng.bit_generator.state = state

    # -- training ---------------------------------------------------------------------------------
    def train_batches(self, epoch: int, stage: str) -> list:
        t = self.t
        rng = self.bptt_rng if t.variable_bptt else None
        max_len = t.bptt + 10 if (t.variable_bptt and stage == "finetune") else None
        segments = list(bptt_segments(self.stream, t.bptt, rng, max_len))
        if self.stateless and t.shuffle_blocks:
            order = np.random.default_rng([self.cfg.seed, epoch]).permutation(len(segments))
            segments = [segments[k] for k in order]
        return segments

    def updates_per_epoch(self) -> int:
        n_segments = math.ceil((self.stream.size(0) - 1) / self.t.bptt)
        return max(1, math.ceil(n_segments / self.t.update_freq))

    def lr_scale(self, batch) -> float:
        """AWD-LSTM scales the step's lr by seq_len / bptt under variable BPTT."""
        return batch[1] / self.t.bptt if self.t.variable_bptt else 1.0

    def begin_epoch(self, model) -> None:
        self.state = model.init_state(self.t.batch_size, self.device)

    def n_targets(self, batch) -> int:
        return batch[1] * self.stream.size(1)

    def loss(self, model, objective, batch, update: int):
        i, seq_len = batch
        x, y = get_batch(self.stream, i, seq_len)
        self.state = model.detach_state(self.state)
        out = model(x, self.state)
        self.state = out.state
        layout = TokenLayout.time_major(y.size(0), y.size(1), y.device)
        result = objective(out.hidden.reshape(-1, out.hidden.size(-1)), y.reshape(-1), model, update, layout=layout)
        scale = seq_len if self.t.loss_reduction == "sum_over_time" else 1.0
        loss = result.token_loss * scale + result.reg_loss + model.regularization(out)
        self.last_logs = result.logs
        return loss, result.nll.double() * y.numel(), y.numel()

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self, model, split: str, batch_size: int | None = None) -> dict:
        t = self.t
        bs = batch_size or (t.eval_batch_size if split == "valid" else t.test_batch_size)
        bptt = t.eval_bptt if (bs > 1 or self.stateless) else max(t.eval_bptt, 256)
        return evaluate_nll(model, self.corpus.split(split), bs, bptt, self.device)

    def groups(self):
        from analysis.groups import frequency_groups

        return frequency_groups(self.corpus.vocab.counts, cutoffs=self.t.analysis.group_cutoffs,
                                n_specials=4 if self.corpus.tokenizer is not None else 0)

    def group_geometry(self, model) -> dict:
        return group_geometry(self, model)

    def final_extras(self, model, run_dir: Path, tag: str) -> dict:
        """The degeneration metrics of ``trainer.analysis`` on the test split (Yu et al. 2022)."""
        a = self.t.analysis
        out: dict = {}
        if a.groups:
            from analysis.groups import group_cosines, group_isotropy, group_metrics

            vocab = self.corpus.vocab
            groups = self.groups()
            bs = self.t.test_batch_size
            bptt = self.t.eval_bptt if (bs > 1 or self.stateless) else max(self.t.eval_bptt, 256)
            forbid = [vocab.stoi["<pad>"]] if "<pad>" in vocab.stoi else []
            m = group_metrics(model, self.corpus.test, groups, bs, bptt, self.device, forbid=forbid)
            out["uniq"] = m["uniq"]
            for name, g in m["groups"].items():
                out[f"ppl_{name}"], out[f"uniq_{name}"] = g["ppl"], g["uniq"]
            weight = model.output_embedding.detach().float()
            for name, value in group_isotropy(weight, groups).items():
                if name != "total":
                    out[f"isotropy_{name}"] = value
            out["cos_rare_frequent"] = group_cosines(weight, groups)["rare_frequent"]
        if model.output_embedding is not model.input_embedding:  # untied: Inan 2017 Fig. 1
            from analysis.inspection import subspace_distance

            out["subspace_distance"] = subspace_distance(model.input_embedding.detach().double().cpu(),
                                                         model.output_embedding.detach().double().cpu())
        if a.wordsim:
            from analysis.wordsim import evaluate_wordsim, load_wordsim_datasets

            lookup = self.corpus.tokenizer if self.corpus.tokenizer is not None else self.corpus.vocab
            for name, r in evaluate_wordsim(model.output_embedding.detach().float(), lookup,
                                            load_wordsim_datasets()).items():
                out[f"wordsim_{name.lower()}"] = r["spearman"]
        return out


class TranslationTask:
    def __init__(self, cfg, corpus, model, device):
        from data.translation import PAD

        self.cfg, self.t, self.corpus, self.device = cfg, cfg.trainer, corpus, device
        self.pad = PAD
        self.lens = {}
        for split in ("train", "valid", "test"):
            part = corpus.split(split)
            self.lens[split] = (np.array([len(s) for s in part.src]), np.array([len(s) for s in part.tgt]))

    def rng_state(self) -> None:  # batch order is a pure function of (seed, epoch)
        return None

    def set_rng_state(self, state) -> None:
        pass

    def _batches(self, split: str, shuffle: bool, seed=None) -> list[list[int]]:
        from data.translation import token_batches

        src_lens, tgt_lens = self.lens[split]
        return token_batches(src_lens, tgt_lens, self.t.max_tokens, shuffle=shuffle, seed=seed)

    def train_batches(self, epoch: int, stage: str) -> list:
        return self._batches("train", True, [self.cfg.seed, epoch])

    def updates_per_epoch(self) -> int:
        return max(1, math.ceil(len(self._batches("train", False)) / self.t.update_freq))

    def lr_scale(self, batch) -> float:
        return 1.0

    def begin_epoch(self, model) -> None:
        pass

    def n_targets(self, batch) -> int:
        return int(self.lens["train"][1][batch].sum())

    def _forward(self, model, part, indices):
        from data.translation import collate

        b = collate(part, indices).to(self.device)
        out = model(b.src, b.prev)
        mask = b.target != self.pad
        return out.hidden[mask], b.target[mask], mask

    def loss(self, model, objective, batch, update: int):
        hidden, target, mask = self._forward(model, self.corpus.train, batch)
        result = objective(hidden, target, model, update, layout=TokenLayout.from_mask(mask))
        self.last_logs = result.logs
        return result.token_loss + result.reg_loss, result.nll.double() * target.numel(), target.numel()

    @torch.no_grad()
    def evaluate(self, model, split: str, batch_size: int | None = None) -> dict:
        """Teacher-forced NLL per target token (BPE pieces and EOS) of ``split``."""
        was_training = model.training
        model.eval()
        part = self.corpus.split(split)
        nll_sum, count = 0.0, 0
        for indices in self._batches(split, shuffle=False):
            hidden, target, _ = self._forward(model, part, indices)
            logits = model.logits(hidden)
            nll_sum += nn.functional.cross_entropy(logits.float(), target, reduction="sum").item()
            count += target.numel()
        model.train(was_training)
        mean = nll_sum / max(count, 1)
        return {"nll": mean, "ppl": math.exp(min(mean, 700)), "tokens": count}

    @torch.no_grad()
    def translate_split(self, model, split: str) -> list[str]:
        """Beam search (``trainer.generation``) over ``split``, detokenized, in corpus order."""
        from data.translation import EOS, collate
        from models.generation import translate

        gen = self.t.generation
        part = self.corpus.split(split)
        order = np.argsort(self.lens[split][0], kind="stable")  # similar lengths batch together
        hyps: list[str | None] = [None] * len(part)
        for k in range(0, len(order), gen.batch_size):
            indices = [int(i) for i in order[k : k + gen.batch_size]]
            b = collate(part, indices).to(self.device)
            # the decoder's first input is EOS, as in fairseq
            nbest = translate(model, b.src, gen, bos=EOS, eos=EOS, pad=self.pad)
            for i, hyp in zip(indices, nbest):
                hyps[i] = self.corpus.tokenizer.decode(hyp[0].tokens)
        return hyps

    def groups(self):
        from analysis.groups import frequency_groups

        return frequency_groups(self.corpus.vocab.counts, cutoffs=self.t.analysis.group_cutoffs, n_specials=4)

    def group_geometry(self, model) -> dict:
        return group_geometry(self, model)

    def final_extras(self, model, run_dir: Path, tag: str) -> dict:
        """BLEU on ``trainer.generation.bleu_splits``: SacreBLEU (detokenized, with its signature) and
        the papers' tokenized BLEU with compound splitting. Hypotheses are saved next to the run."""
        from analysis.bleu import bleu_detok, bleu_tokenized

        out = {}
        for split in self.t.generation.bleu_splits:
            hyps = self.translate_split(model, split)
            refs = self.corpus.split(split).tgt_text
            (run_dir / f"hyp.{tag}.{split}.{self.corpus.tgt_lang}").write_text("".join(h + "\n" for h in hyps))
            detok, tok = bleu_detok(hyps, refs), bleu_tokenized(hyps, refs)
            prefix = "" if split == "test" else f"{split}_"
            out[f"{prefix}bleu"] = detok["score"]
            out[f"{prefix}bleu_signature"] = detok["signature"]
            out[f"{prefix}bleu_tok"] = tok["score"]
            out[f"{prefix}bleu_tok_description"] = tok["description"]
        return out


def make_task(cfg, corpus, model, device):
    task_cls = TranslationTask if cfg.dataset.kind == "translation" else LMTask
    return task_cls(cfg, corpus, model, device)
