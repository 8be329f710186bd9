"""What one training batch is, how its loss is formed, and how a split is evaluated, per kind of data.

The :class:`~repdegen.reproduce.engine.trainer.Trainer` owns the loop (optimizer, schedule, accumulation, precision,
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

Distributed training (:mod:`repdegen.reproduce.engine.distributed`, ``W`` ranks): ``train_batches`` and ``n_targets``
describe the *global* micro-batches (the same on every rank); ``loss`` computes this rank's shard of
one -- LM: columns ``r::W`` of the BPTT stream (``trainer.batch_size`` must divide by ``W``);
translation: sentences ``r::W`` of the bucket -- and returns the shard's token count, by which the
trainer weights it. Evaluation is sharded the same way (LM: the eval columns ``r::W`` when the eval
batch size divides by ``W``, else every rank reads the whole split; translation: buckets ``r::W``)
and reduced as (NLL sum, token count), so every rank gets the single-process numbers.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from repdegen.analysis.evaluate import evaluate_nll
from repdegen.analysis.metrics import perplexity
from repdegen.data import kinds as data_kinds
from repdegen.data.batching import batchify, bptt_segments, get_batch
from repdegen.losses import TokenLayout
from repdegen.reproduce.engine import distributed as dist
from repdegen.reproduce.errors import ConfigError
from torch import nn


def check_world_size(cfg, world: int) -> None:
    """A ConfigError when the config's global batch cannot be sharded over ``world`` ranks (LMs:
    ``trainer.batch_size`` BPTT columns, ``r::W`` on rank r)."""
    b = cfg.trainer.batch_size
    if data_kinds.get(cfg.dataset.kind).shards_columns and b % world:
        fits = [k for k in range(1, min(b, 64) + 1) if b % k == 0]
        raise ConfigError(
            f"trainer.batch_size={b} BPTT columns cannot be split evenly over {world} ranks (each rank trains on "
            f"columns r::{world}); start a number of ranks that divides {b} ({', '.join(map(str, fits))}), or set "
            f"trainer.batch_size to a multiple of {world} (a different experiment: a different config hash)"
        )


def _map_state(fn, *states):
    """``fn`` applied leaf-wise to recurrent states (None, a tensor, or nested lists/tuples of them) and
    to trees of the same shape with ints as leaves (the batch dimensions)."""
    first = states[0]
    if first is None:
        return None
    if isinstance(first, (torch.Tensor, int)):
        return fn(*states)
    return type(first)(_map_state(fn, *parts) for parts in zip(*states))


def _batch_dims(model):
    """For each tensor of the model's recurrent state, the dimension that indexes the batch columns."""
    one, two = model.init_state(1, torch.device("cpu")), model.init_state(2, torch.device("cpu"))
    return _map_state(lambda a, b: next(d for d in range(a.dim()) if a.size(d) != b.size(d)), one, two)


def group_geometry(task, model) -> dict:
    """I(W) of the rare and frequent output embeddings and their mean cosine, per evaluation (Yu et
    al. 2022 Fig. 2); empty when ``trainer.analysis.groups`` is off."""
    if not task.t.analysis.groups:
        return {}
    return _group_geometry(task, model, ("frequent", "rare"))


def geometry_trace_point(task, model) -> dict:
    """The Fig. 1 trace's values at one update (Yu et al. 2022): each group's I(W) and the rare-frequent cosine."""
    return {f"geom_{k}": v for k, v in _group_geometry(task, model, ("frequent", "medium", "rare")).items()}


def _group_geometry(task, model, names: tuple[str, ...]) -> dict:
    """``isotropy_<g>`` for the named groups and ``cos_rare_frequent`` of the output embedding."""
    from repdegen.analysis.groups import group_cosines, group_isotropy

    groups = task.groups()
    weight = model.output_embedding.detach().float()
    iso = group_isotropy(weight, {k: groups[k] for k in names})
    return {**{f"isotropy_{k}": iso[k] for k in names}, "cos_rare_frequent": group_cosines(weight, groups)["rare_frequent"]}


TASKS: dict[str, type] = {}  # dataset kind -> its task class (data/kinds.py names the kinds)


def task_for_kind(name: str):
    """Register a task class as the one that trains and evaluates corpora of dataset kind ``name``."""
    def wrap(cls: type) -> type:
        TASKS[name] = cls
        return cls

    return wrap


@task_for_kind("lm")
class LMTask:
    def __init__(self, cfg, corpus, model, device):
        self.cfg, self.t, self.corpus, self.device = cfg, cfg.trainer, corpus, device
        self.rank, self.world = dist.rank(), dist.world_size()
        check_world_size(cfg, self.world)
        stream = batchify(corpus.train, self.t.batch_size)  # (T, batch_size): the global batch
        if self.world > 1:
            stream = stream[:, self.rank :: self.world].contiguous()  # this rank's columns
        self.stream = stream.to(device)
        self.bptt_rng = np.random.default_rng(cfg.seed)  # the same draws on every rank
        self.stateless = model.init_state(1, torch.device("cpu")) is None
        self.batch_dims = None if self.stateless else _batch_dims(model)
        self.state = None
        if self.t.test_context and not self.stateless:
            raise ConfigError(f"trainer.test_context={self.t.test_context}: a context window is for stateless models "
                              f"(Transformer LMs); {cfg.model.name} carries its state across segments: set "
                              f"trainer.test_context=0")

    # -- checkpointed randomness ------------------------------------------------------------------
    def rng_state(self) -> dict:
        return self.bptt_rng.bit_generator.state

    def set_rng_state(self, state: dict) -> None:
        self.bptt_rng.bit_generator.state = state

    def carried_state(self):
        """This rank's recurrent state carried into the next BPTT segment (CPU copies; None when stateless)."""
        return _map_state(lambda x: x.detach().cpu(), self.state)

    def restore_carried_state(self, per_rank: list) -> None:
        """Continue from ``per_rank`` (:meth:`carried_state` of each rank that wrote the checkpoint);
        written by another number of ranks, the columns are reassembled and sharded anew."""
        if per_rank[0] is None:
            return
        old = len(per_rank)
        if old == self.world:
            mine = per_rank[self.rank]
        else:
            def reshard(dim, *parts):  # column c = r + old * j was column j of old rank r
                full = torch.stack(parts, dim=dim + 1).flatten(dim, dim + 1)
                return full.index_select(dim, torch.arange(self.rank, full.size(dim), self.world))

            mine = _map_state(reshard, self.batch_dims, *per_rank)
        self.state = _map_state(lambda x: x.to(self.device), mine)

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
        self.state = model.init_state(self.stream.size(1), self.device)

    def n_targets(self, batch) -> int:
        """Target tokens of the global micro-batch ``batch`` (every rank's columns)."""
        return batch[1] * self.t.batch_size

    def loss(self, model, objective, batch, update: int):
        i, seq_len = batch
        x, y = get_batch(self.stream, i, seq_len)
        self.state = model.detach_state(self.state)
        out = model(x, self.state)
        self.state = out.state
        layout = TokenLayout.time_major(y.size(0), y.size(1), y.device)
        result = objective(out.hidden.reshape(-1, out.hidden.size(-1)), y.reshape(-1), model, update, layout=layout)
        scale = seq_len if self.t.loss_reduction == "sum_over_time" else 1.0
        loss = result.token_loss * scale + model.regularization(out)
        self.last_logs = result.logs
        return loss, result.nll.double() * y.numel(), y.numel()

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self, model, split: str, batch_size: int | None = None) -> dict:
        t = self.t
        if split == "test" and batch_size is None:
            bs, bptt, context = self.test_reading()
        else:
            bs = batch_size or (t.eval_batch_size if split == "valid" else t.test_batch_size)
            bptt, context = self.eval_bptt(bs), 0
        if self.world == 1 or bs % self.world:  # one process, or every rank reads the whole split
            return evaluate_nll(model, self.corpus.split(split), bs, bptt, self.device, context=context)
        part = evaluate_nll(model, self.corpus.split(split), bs, bptt, self.device,
                            columns=slice(self.rank, None, self.world), context=context)
        nll_sum, count = dist.sum_over_ranks(part["nll_sum"], part["tokens"])
        return {"nll": nll_sum / count, "ppl": perplexity(nll_sum / count), "tokens": int(count), "nll_sum": nll_sum}

    def groups(self):
        from repdegen.analysis.groups import frequency_groups

        return frequency_groups(self.corpus.vocab.counts, cutoffs=self.t.analysis.group_cutoffs,
                                n_specials=4 if self.corpus.tokenizer is not None else 0)

    def valid_hidden_states(self, model):
        """The softmax inputs at every predicted position of the validation split, read as valid PPL is."""
        from repdegen.analysis.evaluate import lm_hidden_states

        bs = self.t.eval_batch_size
        return lm_hidden_states(model, self.corpus.valid, bs, self.eval_bptt(bs), self.device)

    def eval_bptt(self, batch_size: int) -> int:
        """The segment length a split is read with at ``batch_size``: at batch 1 a recurrent state is carried, so
        longer segments give the same result faster (at least 256)."""
        t = self.t
        return t.eval_bptt if (batch_size > 1 or self.stateless) else max(t.eval_bptt, 256)

    def train_counts(self) -> torch.Tensor:
        """Occurrences of each type in the training tokens this run trains on (after train_start/train_tokens)."""
        return torch.bincount(self.corpus.train.reshape(-1).cpu(), minlength=len(self.corpus.vocab))

    def special_ids(self) -> list[int]:
        """The ids outside every frequency group: a BPE's four specials; none for a word-level vocabulary."""
        return list(range(4)) if self.corpus.tokenizer is not None else []

    def group_geometry(self, model) -> dict:
        """:func:`group_geometry`, and for an untied model the subspace distance between its input and output
        embeddings (Inan et al. 2017, Fig. 1) at every evaluation, as the final analysis reports it at the end."""
        from repdegen.analysis.inspection import input_output_distance

        return {**group_geometry(self, model), **input_output_distance(model)}

    def test_reading(self) -> tuple[int, int, int]:
        """(batch size, segment length, context) the test split is read with: its PPL and the final analysis passes
        (``trainer.test_bptt`` / ``test_context``: fairseq-eval-lm's context window, when set)."""
        t = self.t
        bs = t.test_batch_size
        return bs, t.test_bptt or self.eval_bptt(bs), t.test_context

    def final_extras(self, model, run_dir: Path, tag: str) -> dict:
        """The degeneration metrics of ``trainer.analysis`` on the test split (:mod:`repdegen.analysis.final`)."""
        from repdegen.analysis.final import lm_final_metrics

        a = self.t.analysis
        return lm_final_metrics(model, self.corpus, self.groups() if a.groups else None, self.special_ids(),
                                self.test_reading(), self.device, wordsim=a.wordsim)


@task_for_kind("translation")
class TranslationTask:
    def __init__(self, cfg, corpus, model, device):
        from repdegen.data.translation import PAD

        self.cfg, self.t, self.corpus, self.device = cfg, cfg.trainer, corpus, device
        self.rank, self.world = dist.rank(), dist.world_size()
        self.pad = PAD
        self.lens = {}
        for split in ("train", "valid", "test"):
            part = corpus.split(split)
            self.lens[split] = (np.array([len(s) for s in part.src]), np.array([len(s) for s in part.tgt]))

    def rng_state(self) -> None:  # batch order is a pure function of (seed, epoch)
        return None

    def set_rng_state(self, state) -> None:
        pass

    def carried_state(self) -> None:  # nothing is carried from one batch to the next
        return None

    def restore_carried_state(self, per_rank: list) -> None:
        pass

    def _batches(self, split: str, shuffle: bool, seed=None) -> list[list[int]]:
        from repdegen.data.translation import token_batches

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
        """Target tokens of the global micro-batch ``batch`` (every rank's sentences)."""
        return int(self.lens["train"][1][batch].sum())

    def shard(self, indices: list[int]) -> list[int]:
        """This rank's sentences of a bucket: ``r::W`` (the bucket is sorted by length, so the shards
        are balanced); empty when the bucket has fewer sentences than there are ranks."""
        return indices if self.world == 1 else indices[self.rank :: self.world]

    def _forward(self, model, part, indices):
        from repdegen.data.translation import collate

        b = collate(part, indices)
        # the target rows (non-pad positions, row-major) are found on the host, where the batch is built, so
        # selecting them on the device needs no device-to-host sync (boolean indexing would wait for the GPU)
        seq, pos = (b.target != self.pad).nonzero(as_tuple=True)
        rows = seq * b.target.size(1) + pos
        if self.device.type == "cuda":  # pinned memory: the copies queue behind the running kernels, no wait
            b = b.pin_memory()
            seq, pos, rows = (x.pin_memory() for x in (seq, pos, rows))
        b = b.to(self.device, non_blocking=True)
        seq, pos, rows = (x.to(self.device, non_blocking=True) for x in (seq, pos, rows))
        out = model(b.src, b.prev)
        hidden = out.hidden.reshape(-1, out.hidden.size(-1)).index_select(0, rows)
        return hidden, b.target.reshape(-1).index_select(0, rows), TokenLayout(seq, pos, *b.target.shape)

    def loss(self, model, objective, batch, update: int):
        part = self.shard(batch)
        if not part:
            return self._empty_shard(model, objective, update)
        hidden, target, layout = self._forward(model, self.corpus.train, part)
        result = objective(hidden, target, model, update, layout=layout)
        self.last_logs = result.logs
        return result.token_loss, result.nll.double() * target.numel(), target.numel()

    def _empty_shard(self, model, objective, update: int):
        """A rank without sentences in this micro-batch still calls the objective, on zero rows, so the
        collectives inside objectives (AGG's all-reduce of the batch's counts) stay matched across the
        ranks; it contributes no loss, no tokens and no gradient (``loss`` None)."""
        weight = model.output_embedding
        hidden = weight.new_zeros(0, weight.size(1))
        target = torch.zeros(0, dtype=torch.long, device=weight.device)
        with torch.no_grad():
            result = objective(hidden, target, model, update, layout=TokenLayout(target, target, 0))
        self.last_logs = result.logs
        return None, None, 0

    @torch.no_grad()
    def evaluate(self, model, split: str, batch_size: int | None = None) -> dict:
        """Teacher-forced NLL per target token (BPE pieces and EOS) of ``split``."""
        was_training = model.training
        model.eval()
        part = self.corpus.split(split)
        nll_sum, count = 0.0, 0
        for indices in self._batches(split, shuffle=False)[self.rank :: self.world]:
            hidden, target, _ = self._forward(model, part, indices)
            logits = model.logits(hidden)
            nll_sum += nn.functional.cross_entropy(logits.float(), target, reduction="sum").item()
            count += target.numel()
        model.train(was_training)
        nll_sum, count = dist.sum_over_ranks(nll_sum, count)
        mean = nll_sum / max(count, 1)
        return {"nll": mean, "ppl": math.exp(min(mean, 700)), "tokens": int(count)}

    @torch.no_grad()
    def valid_hidden_states(self, model):
        """The decoder's final outputs at the non-pad target positions of the validation split (what the softmax
        multiplies by W), in eval mode, one block per batch."""
        was_training = model.training
        model.eval()
        part = self.corpus.split("valid")
        try:
            for indices in self._batches("valid", shuffle=False):
                yield self._forward(model, part, indices)[0]
        finally:
            model.train(was_training)

    @torch.no_grad()
    def translate_split(self, model, split: str) -> list[str]:
        """Beam search (``trainer.generation``) over ``split``, detokenized, in corpus order."""
        from repdegen.data.translation import EOS, collate
        from repdegen.models.generation import translate

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
        from repdegen.analysis.groups import frequency_groups

        return frequency_groups(self.corpus.vocab.counts, cutoffs=self.t.analysis.group_cutoffs, n_specials=4)

    def train_counts(self) -> torch.Tensor:
        """Occurrences of each piece on both sides of the training pairs this run trains on."""
        tr = self.corpus.train
        ids = torch.cat([*tr.src, *tr.tgt]) if len(tr) else torch.zeros(0, dtype=torch.long)
        return torch.bincount(ids.cpu(), minlength=len(self.corpus.vocab))

    def special_ids(self) -> list[int]:
        return list(range(4))

    def group_geometry(self, model) -> dict:
        return group_geometry(self, model)

    def final_extras(self, model, run_dir: Path, tag: str) -> dict:
        """BLEU on ``trainer.generation.bleu_splits``: SacreBLEU (detokenized, with its signature) and
        the papers' tokenized BLEU, with compound splitting for German output only (the En->De convention;
        analysis/bleu.py ``splits_compounds``). Hypotheses are saved next to the run."""
        from repdegen.analysis.bleu import bleu_detok, bleu_tokenized, splits_compounds

        out = {}
        for split in self.t.generation.bleu_splits:
            hyps = self.translate_split(model, split)
            refs = self.corpus.split(split).tgt_text
            (run_dir / f"hyp.{tag}.{split}.{self.corpus.tgt_lang}").write_text("".join(h + "\n" for h in hyps))
            detok, tok = bleu_detok(hyps, refs), bleu_tokenized(hyps, refs, splits_compounds(self.corpus.tgt_lang))
            prefix = "" if split == "test" else f"{split}_"
            out[f"{prefix}bleu"] = detok["score"]
            out[f"{prefix}bleu_signature"] = detok["signature"]
            out[f"{prefix}bleu_tok"] = tok["score"]
            out[f"{prefix}bleu_tok_description"] = tok["description"]
        return out


def make_task(cfg, corpus, model, device):
    """The task of the config's dataset kind (data/kinds.py; each task class registers with :func:`task_for_kind`)."""
    name = data_kinds.get(cfg.dataset.kind).name
    if name not in TASKS:
        raise ConfigError(f"dataset.kind={name!r} has no task class; register one in reproduce/engine/tasks.py with "
                          f"@task_for_kind({name!r})")
    return TASKS[name](cfg, corpus, model, device)
