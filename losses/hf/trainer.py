"""``DegenerationTrainer``: a ``transformers.Trainer`` whose loss is a repdegen objective (docs/hf.md).

Per micro-batch, :meth:`DegenerationTrainer.compute_loss` runs the causal LM with ``output_hidden_states=True`` and
hands the objective what it reads in repdegen's own trainer: the last hidden states (the LM head's input, after the
final norm: checked once against the model's own logits), the targets shifted by one (positions labelled -100,
padding, dropped), the LM head as an :class:`repdegen.losses.OutputLayer` and ``step``, the optimizer updates done
before this one (``state.global_step``: every micro-batch of an update passes the same step, which is what AGG's
token counter memory keys its slots on). The objective's hooks run where repdegen's trainer runs them:

* ``setup(updates_per_epoch, special_ids, train_counts, model)`` at ``on_train_begin``, before the objective's state
  is restored from a checkpoint;
* ``update_penalty(head, step)`` (CosReg, SC) once per optimizer update, after the backward pass of its last
  micro-batch and before gradient clipping and ``optimizer.step()`` (:meth:`DegenerationTrainer.training_step`);
* ``after_update(head, step)`` once per optimizer update, after ``optimizer.step()`` (``on_step_end``).

The objective's state (AGG's memory: its buffers) is saved as ``OBJECTIVE_STATE`` in each ``checkpoint-<step>/``
folder the Trainer writes and loaded from it by ``train(resume_from_checkpoint=...)``.
"""

from __future__ import annotations

import inspect
import math
import os
import warnings
from collections.abc import Sequence, Sized

import torch
from repdegen.core.errors import ConfigError
from repdegen.core.files import atomic_torch_save
from repdegen.losses import Objective, OutputLayer, TokenLayout, make_objective
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

# the objective's state_dict in a checkpoint folder of the Trainer, beside its model and optimizer files
OBJECTIVE_STATE = "repdegen_objective.pt"
IGNORE_INDEX = -100  # the label of positions that are not trained on (padding), as in transformers


def output_layer(model) -> tuple[OutputLayer, bool]:
    """(the LM head of a ``PreTrainedModel`` as the objectives read it, whether its weight is the input embedding).

    The head's weight is used as is (gradients reach the model); ``input_embedding`` is the model's input embedding,
    which AL/REAL and Freeze read."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ConfigError(f"{type(model).__name__}.get_output_embeddings() is {type(head).__name__}, not a linear LM head "
                          "with a (V, d) weight; DegenerationTrainer trains causal LMs whose logits are hidden @ W.T (+ b)")
    inp = getattr(embed, "weight", None)
    tied = inp is weight or (isinstance(inp, torch.Tensor) and inp.shape == weight.shape
                             and inp.data_ptr() == weight.data_ptr())
    inp = inp if isinstance(inp, torch.Tensor) and inp.shape == weight.shape else None
    return OutputLayer(weight, getattr(head, "bias", None), weight if tied else inp), tied


@torch.no_grad()
def token_counts(dataset, vocab_size: int) -> torch.Tensor:
    """(V,) int64: how often each token id is a training position of ``dataset`` (a sized dataset of examples with
    ``input_ids``, and optionally ``labels`` (-100: not trained on) or ``attention_mask``): the corpus counts that
    Freeze and AL read in ``setup`` and that frequency groups (``repdegen.analysis.groups.frequency_groups``) need."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for example in dataset:
        ids = torch.as_tensor(example["labels"] if example.get("labels") is not None else example["input_ids"])
        ids = ids.reshape(-1).long()
        mask = ids != IGNORE_INDEX
        if example.get("labels") is None and example.get("attention_mask") is not None:
            mask &= torch.as_tensor(example["attention_mask"]).reshape(-1).bool()
        ids = ids[mask]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise ConfigError(f"token_counts: a token id in [{int(ids.min())}, {int(ids.max())}] is outside the model's "
                              f"vocabulary of {vocab_size}; the dataset was tokenized with another tokenizer")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def with_labels(inputs) -> dict:
    """A copy of the batch with ``labels``: its own, or the inputs with the padding (``attention_mask`` 0) at -100."""
    inputs = dict(inputs)
    if inputs.get("labels") is None:
        labels = inputs["input_ids"]
        if inputs.get("attention_mask") is not None:
            labels = labels.masked_fill(inputs["attention_mask"] == 0, IGNORE_INDEX)
        inputs["labels"] = labels
    return inputs


def _objective(objective, vocab_size: int, options: dict | None, label_smoothing: float) -> Objective:
    if isinstance(objective, Objective):
        if options:
            raise ConfigError("DegenerationTrainer(objective=<an Objective>, objective_options=...): the options configure "
                              "an objective built by name; pass objective='agg' with objective_options, or the built one alone")
        return objective
    if not isinstance(objective, str):
        raise ConfigError(f"DegenerationTrainer(objective={objective!r}): pass an objective's name (repdegen.losses."
                          "objective_names(): mle, agg, cosreg, ul, ul_agg, ...) or an Objective built by make_objective")
    return make_objective(objective, vocab_size, label_smoothing=label_smoothing, **(options or {}))


class DegenerationTrainer(Trainer):
    """A ``transformers.Trainer`` that trains a causal LM under a repdegen objective.

    ``objective``: a name of ``repdegen.losses.objective_names()`` (built by ``make_objective`` with
    ``objective_options`` and ``label_smoothing``) or an :class:`~repdegen.losses.Objective`. ``train_counts``: the
    (V,) training count of each token (default: counted from ``train_dataset`` when it is sized; kept as
    ``self.train_counts``). ``special_ids``: tokens AGG never counts as rare (default: the ``processing_class``'s
    ``all_special_ids``). ``allow_untied``: train a model whose LM head is not its input embedding; the objectives then
    act on the LM head alone (the papers' mechanism is about tied embeddings; RE and REAL refuse an untied model).
    Everything else goes to ``transformers.Trainer``; ``args.max_grad_norm`` clips after ``update_penalty``."""

    def __init__(self, model=None, args=None, *, objective: str | Objective = "mle", objective_options: dict | None = None,
                 label_smoothing: float = 0.0, train_counts: torch.Tensor | None = None,
                 special_ids: Sequence[int] | None = None, allow_untied: bool = False, **kwargs):
        if model is None or kwargs.get("model_init") is not None:
            raise ConfigError("DegenerationTrainer needs the model itself (model=...); model_init is not supported")
        super().__init__(model=model, args=args, **kwargs)
        head, tied = output_layer(self.model)
        vocab = head.output_embedding.size(0)
        self.objective = _objective(objective, vocab, objective_options, label_smoothing)
        name = getattr(self.objective.cfg, "name", type(self.objective).__name__)
        if not tied:
            if getattr(self.objective.cfg, "tie_weights", None) is True:
                raise ConfigError(f"objective={name} needs tied input and output embeddings, and "
                                  f"{type(model).__name__}'s LM head is not its input embedding; load the model with "
                                  "tie_word_embeddings=True, or use another objective")
            if not allow_untied:
                raise ConfigError(f"{type(model).__name__}'s LM head is not its input embedding (untied), and repdegen's "
                                  "objectives assume tied input and output embeddings (the degeneration they counter is of "
                                  "the tied matrix); load the model with tie_word_embeddings=True, or pass "
                                  "allow_untied=True to apply the objective to the LM head alone")
        self.objective.to(self.args.device)
        self.train_counts = train_counts
        self.special_ids = special_ids
        self.tied = tied
        # the objective returns the mean over the micro-batch's tokens: the Trainer divides it by the accumulation steps
        # (and does not pass num_items_in_batch to the model, which computes no loss here)
        self.model_accepts_loss_kwargs = False
        if hasattr(self, "loss_is_scaled_for_ga"):
            self.loss_is_scaled_for_ga = False
        forward = inspect.signature(self.accelerator.unwrap_model(self.model).forward).parameters
        # training needs no logits: ask for the last position's only, where the model allows it (and check with it)
        self._keep_arg = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in forward), None)
        self._checked = False
        self._resume_dir: str | None = None
        self._log_sums: dict[str, torch.Tensor] = {}
        self._log_n = 0
        self.add_callback(DegenerationCallback(self))

    # -- the loss -----------------------------------------------------------------------------------
    def head(self, model=None) -> OutputLayer:
        """The output layer of ``model`` (default: the trained one) as the objectives read it."""
        return output_layer(self.accelerator.unwrap_model(model if model is not None else self.model))[0]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The objective's loss of the micro-batch in training; in evaluation the plain NLL (so ``eval_loss`` is
        comparable between objectives: AGG's training loss is 2 x NLL in value)."""
        inputs = with_labels(inputs)
        labels = inputs.pop("labels")
        kwargs = {"output_hidden_states": True, "return_dict": True}
        if self._keep_arg and model.training:
            kwargs[self._keep_arg] = 1
        outputs = model(**inputs, **kwargs)
        hidden = outputs.hidden_states[-1]
        head = self.head(model)
        if not self._checked:
            self._check_head_input(outputs, hidden, head)
        targets = labels[:, 1:]
        keep = targets != IGNORE_INDEX
        rows, targets = hidden[:, :-1][keep], targets[keep]
        self.objective.train(model.training)
        if targets.numel() == 0:  # a micro-batch of padding only
            loss = hidden.sum() * 0.0
            return (loss, outputs) if return_outputs else loss
        out = self.objective(rows, targets, head, self.state.global_step, TokenLayout.from_mask(keep))
        if model.training:
            self._accumulate_logs(out)
            loss = out.token_loss
        else:
            loss = out.nll
        return (loss, outputs) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        # batches without labels (a dataset of input_ids) are scored too: a causal LM's labels are its inputs
        return super().prediction_step(model, with_labels(inputs), prediction_loss_only, ignore_keys=ignore_keys)

    @torch.no_grad()
    def _check_head_input(self, outputs, hidden, head) -> None:
        """Once: the model's own logits at the last position equal ``head.logits`` of ``hidden_states[-1]`` there, i.e.
        the last hidden state is what the LM head reads (after the final norm; no logit scaling or soft-capping)."""
        logits = getattr(outputs, "logits", None)
        if logits is None:
            return
        ours = head.logits(hidden[:, -1]).float()
        theirs = logits[:, -1].float()
        if not torch.allclose(ours, theirs, rtol=1e-3, atol=1e-3 * (1.0 + float(theirs.abs().max()))):
            raise ConfigError(f"{type(self.accelerator.unwrap_model(self.model)).__name__}: the LM head applied to "
                              "hidden_states[-1] does not give the model's logits (max difference "
                              f"{float((ours - theirs).abs().max()):.3g}): the model transforms its last hidden state "
                              "after it returns it (a norm, a logit scale or soft-cap), which the objectives would miss")
        self._checked = True

    def training_step(self, model, inputs, *args, **kwargs):
        loss = super().training_step(model, inputs, *args, **kwargs)
        if self.accelerator.sync_gradients:  # the last micro-batch of the update: its gradient is complete
            self.objective.update_penalty(self.head(model), self.state.global_step)
        return loss

    # -- logs -----------------------------------------------------------------------------------------
    def _accumulate_logs(self, out) -> None:
        values = {"nll": out.nll, **{k: v for k, v in out.logs.items() if isinstance(v, torch.Tensor) and v.numel() == 1}}
        for key, value in values.items():
            value = value.detach().double().reshape(())
            self._log_sums[key] = self._log_sums[key] + value if key in self._log_sums else value
        self._log_n += 1

    def log(self, logs: dict, *args, **kwargs) -> None:
        """The Trainer's training logs plus ``nll`` (the plain NLL, mean over the micro-batches since the last log;
        ``loss`` is the objective's) and the objective's own scalars (AGG: ``rare_count``, ``rare_target_frac``;
        CosReg: ``cosreg``; UL: ``ul_loss``), averaged the same way."""
        if "loss" in logs and self._log_n:
            for key, total in self._log_sums.items():
                logs.setdefault(key, round(float(total) / self._log_n, 6))
            self._log_sums, self._log_n = {}, 0
        super().log(logs, *args, **kwargs)

    # -- the objective's state --------------------------------------------------------------------------
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        path = resume_from_checkpoint
        if path is True:
            path = get_last_checkpoint(self.args.output_dir)
        self._resume_dir = path if isinstance(path, str) else None
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def setup_objective(self, train_dataloader=None) -> None:
        """``objective.setup`` with the run's updates per epoch, special tokens and training counts."""
        ga = max(1, self.args.gradient_accumulation_steps)
        if isinstance(train_dataloader, Sized) and len(train_dataloader):
            updates = math.ceil(len(train_dataloader) / ga)
        else:
            updates = max(1, self.state.max_steps)
        head = self.head()
        vocab = head.output_embedding.size(0)
        if self.train_counts is None and isinstance(self.train_dataset, Sized):
            self.train_counts = token_counts(self.train_dataset, vocab)
        if self.special_ids is None:
            self.special_ids = list(getattr(self.processing_class, "all_special_ids", None) or [])
        counts = self.train_counts if self.train_counts is not None else torch.zeros(vocab, dtype=torch.int64)
        self.objective.setup(updates_per_epoch=updates, special_ids=list(self.special_ids), train_counts=counts,
                             model=head)

    def load_objective_state(self, checkpoint_dir: str) -> bool:
        """Restore the objective's state from ``checkpoint_dir``; False (with a warning) when it holds none."""
        path = os.path.join(checkpoint_dir, OBJECTIVE_STATE)
        if not os.path.isfile(path):
            warnings.warn(f"{checkpoint_dir} has no {OBJECTIVE_STATE}: the objective's state (AGG's token memory) starts "
                          "afresh; it was written by a Trainer that is not a DegenerationTrainer", stacklevel=2)
            return False
        saved = torch.load(path, map_location=self.args.device, weights_only=True)
        self.objective.load_state_dict(saved["state_dict"])
        return True

    def save_objective_state(self, checkpoint_dir: str) -> None:
        name = getattr(self.objective.cfg, "name", type(self.objective).__name__)
        state = {k: v.detach().cpu() for k, v in self.objective.state_dict().items()}
        atomic_torch_save(os.path.join(checkpoint_dir, OBJECTIVE_STATE), {"objective": name, "state_dict": state})


class DegenerationCallback(TrainerCallback):
    """The objective's per-run and per-update hooks (added by :class:`DegenerationTrainer` itself)."""

    def __init__(self, trainer: DegenerationTrainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        t = self.trainer
        t.setup_objective(train_dataloader)
        if t._resume_dir:
            t.load_objective_state(t._resume_dir)

    def on_step_end(self, args, state, control, **kwargs):
        # global_step already counts this update; the hooks name it by the updates done before it, as forward did
        self.trainer.objective.after_update(self.trainer.head(), state.global_step - 1)

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if state.is_world_process_zero and os.path.isdir(folder):
            self.trainer.save_objective_state(folder)
