"""Freezing experiments of Yu et al. (2022), Sec. 3 (Table 1, Figure 2; Table 2).

The rare group is the rarest ``rare_fraction`` (20%) of the vocabulary by training frequency (Sec.
3.1: 30/50/20% frequent/medium/rare; ``repdegen.analysis.groups.frequency_groups``), special symbols excluded;
with ``group_cutoffs`` (by default the run's ``trainer.analysis.group_cutoffs``: the official evaluation's index
cut-offs 13,000 / 36,000 at scale paper) it is the ids at or after the second cut-off, so the frozen set is the
rare group the run is scored on. It is fixed for the whole run (it comes from the corpus, not from AGG's memory).

``mode=embedding`` (Table 1, Figure 2: "freezing the rare group token embeddings in their initial
states"): while ``step < until_step`` (``null``: all training), the gradient of the rare rows of the
embedding matrix (tied: input and output use alike; untied: both matrices) is zeroed by a gradient
hook, and after every optimizer update the rows are put back to their initial values (so decoupled
weight decay cannot move them either). The initial rows are a buffer, saved in checkpoints.

``mode=parts`` (Table 2): the parts of Yu eq. 4 named in ``parts`` are detached for the rare rows of
the *output* embedding: (b) ``p_r|i h_i`` over rows i whose target is not rare, (c) the same over
rows whose target is rare (other than r); part (a), the pull toward the target's own hidden states,
always trains. This is AGG's gated gradient (losses/agg.py, the fused function) with constant gates:
g1 = 0 on rare tokens when (b) is frozen, g2 = 0 when (c) is, 1 otherwise; the hidden states get the
plain softmax gradient. After ``until_step`` the objective is plain MLE.

The reported ``nll`` is the plain NLL; the ``token_loss`` value of ``mode=parts`` is 2 x NLL (AGG's
two-term form), its gradient is the MLE gradient with the frozen parts removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from repdegen.core.errors import ConfigError
from repdegen.losses import Objective, ObjectiveConfig, ObjectiveOutput, as_output_layer, register_objective
from repdegen.losses.fused import fused_softmax_loss

MODES = ("embedding", "parts")
PARTS = ("b", "c")


@dataclass
class FreezeConfig(ObjectiveConfig):
    name: str = "freeze"
    mode: str = "embedding"
    parts: list[str] = field(default_factory=lambda: ["b", "c"])
    # freeze during optimizer updates 0 .. until_step - 1 (null: the whole run)
    until_step: int | None = None
    rare_fraction: float = 0.2
    # the groups by dictionary index (frequent < c1 <= medium < c2 <= rare), as the evaluation scores them; null: by
    # rare_fraction. conf/objective/freeze.yaml sets it to the run's own trainer.analysis.group_cutoffs
    group_cutoffs: list[int] | None = None


@register_objective("freeze", FreezeConfig)
class Freeze(Objective):
    """The freezing experiments (the module docstring). :meth:`setup` needs ``train_counts`` (V,) (the rare group is
    the rarest ``rare_fraction`` by count; ``special_ids`` are never rare) and, for ``mode=embedding``, ``model`` (the
    output layer; ``OutputLayer(W, b, input_embedding=E)`` for an untied model: both matrices freeze), and
    :meth:`after_update` restores the frozen rows after every optimizer step.

    >>> import torch
    >>> from repdegen.losses import Freeze, OutputLayer
    >>> freeze = Freeze.create(vocab_size=10, rare_fraction=0.2)
    >>> W = torch.nn.Parameter(torch.randn(10, 4))
    >>> head, opt = OutputLayer(W), torch.optim.SGD([W], lr=0.1, weight_decay=0.1)
    >>> freeze.setup(train_counts=torch.arange(10, 0, -1), model=head)  # ids 8 and 9: the rarest 20 %
    >>> before = W.detach().clone()
    >>> freeze(torch.randn(6, 4), torch.randint(10, (6,)), head, step=0).token_loss.backward()
    >>> opt.step()
    >>> freeze.after_update(head, step=0)
    >>> bool(torch.equal(W[8:], before[8:])), bool((W[:8] != before[:8]).any())  # rare rows kept, the rest moved
    (True, True)
    """

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.register_buffer("rare", torch.zeros(vocab_size, dtype=torch.bool))
        self.register_buffer("init_rows", torch.zeros(0))
        self._active = False
        self._hooked = False

    @staticmethod
    def validate_config(cfg) -> None:
        if cfg.mode not in MODES:
            raise ConfigError(
                f"objective.mode={cfg.mode!r} is not one of {', '.join(MODES)} (embedding: Yu Table 1; parts: Table 2)"
            )
        bad = [p for p in cfg.parts if p not in PARTS]
        if bad or (cfg.mode == "parts" and not cfg.parts):
            raise ConfigError(f"objective.parts={list(cfg.parts)} must name parts of Yu eq. 4 among {PARTS}, e.g. [b] or [b, c]")
        if not 0.0 < cfg.rare_fraction < 1.0:
            raise ConfigError(f"objective.rare_fraction={cfg.rare_fraction} must be in (0, 1) (the paper's rare group is 0.2)")
        if cfg.until_step is not None and cfg.until_step < 0:
            raise ConfigError(f"objective.until_step={cfg.until_step} must be >= 0, or null to freeze for the whole run")

    def setup(self, updates_per_epoch: int = 1, special_ids=(), train_counts: torch.Tensor | None = None,
              model=None) -> None:
        from repdegen.analysis.groups import frequency_groups

        if train_counts is None:
            raise ConfigError("Freeze.setup(train_counts=None): the rare group comes from the training counts; pass "
                              "train_counts, a (V,) tensor of each token's count in the training data")

        rest = (1.0 - self.cfg.rare_fraction) / 2
        cutoffs = self.cfg.group_cutoffs
        n_specials = next(k for k in range(len(special_ids) + 1) if k not in set(special_ids))  # the leading specials
        groups = frequency_groups(train_counts, fractions=(rest, rest, self.cfg.rare_fraction),
                                  cutoffs=list(cutoffs) if cutoffs else None, n_specials=n_specials if cutoffs else None)
        rare = torch.zeros(self.vocab_size, dtype=torch.bool)
        rare[groups["rare"]] = True
        if special_ids:
            rare[torch.as_tensor(list(special_ids), dtype=torch.long)] = False
        self.rare.copy_(rare.to(self.rare.device))
        if self.cfg.mode == "embedding" and model is not None:
            model = as_output_layer(model)
            with torch.no_grad():
                self.init_rows = torch.stack([w[self.rare].detach().clone() for w in self._matrices(model)])
            self._hook(model)

    # -- mode=embedding ------------------------------------------------------------------------------
    @staticmethod
    def _matrices(model) -> list[torch.Tensor]:
        mats = [model.input_embedding]
        if model.output_embedding is not model.input_embedding:
            mats.append(model.output_embedding)
        return mats

    def _hook(self, model) -> None:
        if self._hooked:
            return
        for w in self._matrices(model):
            w.register_hook(lambda g: g.masked_fill(self.rare.unsqueeze(1), 0.0) if self._active else g)
        self._hooked = True

    def frozen(self, step: int) -> bool:
        return self.cfg.until_step is None or step < self.cfg.until_step

    @torch.no_grad()
    def after_update(self, model=None, step: int | None = None) -> None:
        """Called by the trainer after optimizer update ``step``: restore the frozen rows."""
        if self.cfg.mode == "embedding" and self._active and self.init_rows.numel():
            for w, rows in zip(self._matrices(as_output_layer(model)), self.init_rows):
                w[self.rare] = rows.to(w.dtype)

    # -- loss ----------------------------------------------------------------------------------------
    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, model, step: int = 0, layout=None) -> ObjectiveOutput:
        model = as_output_layer(model)
        self._active = self.training and self.frozen(step)
        if self.cfg.mode == "embedding" or not self._active:
            loss, nll = self.token_nll(model.logits(hidden), targets)
            return ObjectiveOutput(token_loss=loss, nll=nll)
        dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        ones = torch.ones(self.vocab_size, dtype=dtype, device=hidden.device)
        zero_rare = (~self.rare).to(dtype)
        g1 = zero_rare if "b" in self.cfg.parts else ones
        g2 = zero_rare if "c" in self.cfg.parts else ones
        loss, nll, _ = fused_softmax_loss(hidden, model.output_embedding, model.output_bias, targets,
                                          self.label_smoothing, gates=(g1, g2, self.rare[targets]))
        return ObjectiveOutput(token_loss=loss, nll=nll.detach())
