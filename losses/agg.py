"""AGG, adaptive gradient gating (Yu, Kim et al. 2022, "Rare Tokens Degenerate All Tokens", Sec. 4;
official code: ysw1021/AGG, fairseq criterion ``cross_entropy_agg``).

The gradient of the NLL w.r.t. an output embedding row ``w_r`` splits into three parts (Yu eq. 4):
(a) ``(p_r|i - 1) h_i`` over the rows i whose target is r; (b) ``p_r|i h_i`` over rows whose target
is not rare; (c) ``p_r|i h_i`` over rows whose target is rare (but not r). AGG scales (b) and (c)
for rare r only; the gradient w.r.t. the hidden states (and hence the rest of the network) is the
plain softmax gradient.

Token counter memory (Sec. 4.1, eq. 5). A ring of K slots x V counts of the target tokens, one slot
per *optimizer update*: ``step`` is the number of updates done before the current one (0 for the
first; every micro-batch of one update gets the same step) and writes slot ``step % K``. The slot is
cleared when a new step first writes into it, micro-batches of the same step add into it, and the
current batch is counted *before* the gates are computed (as the official code). Then

    a_k = (sum of the K slots)_k / min(step + 1, K)          (mean count per update)
    k rare  <=>  a_k < alpha,   except the special symbols (never rare)

The official code divides by ``min(itr, K)`` with fairseq's 1-based update number ``itr``; ours is
``step + 1 = itr``: the number of updates the memory holds. Yu eq. 5 writes ``a_k / K < alpha``
with the raw sum, which is the same once K updates have been seen. A token not seen in the last K
updates has a_k = 0: it is rare, with gate 0. K (``memory_updates``) defaults to the number of
optimizer updates in one epoch (Sec. 4.1), which the trainer passes to :meth:`AGG.setup`. The ring
costs 4 K V bytes on the device and in every checkpoint (about 0.55 GB for WikiText-103 at 32k
tokens per update: K ~ 3,200, V = 44,256).

Gates (eq. 7, 8, with the official code's scale):

    g1_k = min(a_k, 1) if k rare else 1   (eq. 7 writes a_k / K with the raw sum: the same number;
                                           the clamp is a no-op for alpha <= 1)
    g2_k = min(a_k / mean_{j rare} a_j, 1) if k rare else 1   (the mean includes unseen rare tokens)

and for every row the target's own entry has gate 1. Rows whose target is not rare use g1 (it gates
part (b)), rows whose target is rare use g2 (part (c) for the "very rare" tokens, those below the
rare mean). ``gate1=false`` / ``gate2=false`` replace that gate by ones (Yu Table 8, "no g1" /
"no g2": the corresponding part of the gradient is left ungated).

Loss (eq. 9, 10). With ``x_gated = g * x + (1 - g) * x.detach()`` (eq. 6: same value, gradient g):

    z0_i = h_i W~^T (+ b~)                             (W, b detached: gradient to h only)
    zl_i = gl * (h~_i W^T + b) + (1 - gl) * (h~_i W~^T + b~),   l = 1, 2   (h detached)
    L_i  = -log p(z0_i)[y_i] - 1(y_i not rare) log p(z1_i)[y_i] - 1(y_i rare) log p(z2_i)[y_i]
    loss = 1/N sum_i L_i

so ``grad_h = (p - y) W`` (the plain softmax gradient) and the gradient of row r of W is Yu App. A
eq. 23: ``(p_r|i - 1) h_i`` if y_i = r, ``g1_r p_r|i h_i`` if y_i is not rare, ``g2_r p_r|i h_i``
otherwise. An output bias (the fairseq models have none) is gated like W. The loss *value* is
2 x NLL (two terms of equal value): ``ObjectiveOutput.nll`` reports the plain NLL. Label smoothing
(``trainer.label_smoothing``) smooths every term as :meth:`Objective.token_nll` does,
``(1 - eps) NLL + eps mean_k(-log p_k)`` (the official MT loss: eps / V on every class).

``implementation``:
  * ``fused`` (default): one logits matmul and a custom autograd function (``losses/fused.py``) whose
    backward gives h the ungated and W/b the gated gradient; one (N, V) tensor is kept for backward.
  * ``literal``: the three-logit construction above, as the official code (three (N, V) logits).
Both give the same loss and gradients (tests/test_agg.py).

Grouping: dynamic (every update) by default; ``static_after_updates=S`` freezes the rare *set* to the
one of update S - 1 from update S on (Yu Table 9 "static AGG": the group fixed after one epoch);
``static_after_epochs=E`` says the same in epochs, S = round(E x the trainer's updates per epoch),
which the table uses so that nobody has to count a corpus's updates by hand. The appearance a_k,
hence the gate values, keep following the memory.

Departures from the official code (its bugs, see shared/notes/reference-implementations.md): the
memory is written only in training mode (``self.training``), never by evaluation; it is a set of
registered buffers, so it is saved in checkpoints and restored on resume; under an initialised
``torch.distributed`` the batch's counts are all-reduced (SUM) before they are added, so every rank
holds the same memory of the global batch (every rank must then call the loss equally often, as
DDP training does); translation padding never reaches the loss (the task drops padded rows), so the
official ``masked_fill`` slip has no counterpart. The official 1e-7 added to the rare mean (a guard
against 0 / 0) is replaced by an explicit g2 = 0 when every rare token is unseen (the same value).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from repdegen.core.errors import ConfigError
from repdegen.losses import Objective, ObjectiveConfig, ObjectiveOutput, as_output_layer, register_objective
from repdegen.losses.fused import chunked_softmax_loss, fused_softmax_loss
from torch import nn

IMPLEMENTATIONS = ("fused", "literal")


@dataclass
class AGGConfig(ObjectiveConfig):
    name: str = "agg"
    alpha: float = 0.03  # 0.03 for language modelling, 0.08 for translation (Yu App. B)
    gate1: bool = True  # false: Yu Table 8 "no g1"
    gate2: bool = True  # false: Yu Table 8 "no g2"
    memory_updates: int | None = None  # K; null = the optimizer updates of one epoch
    static_after_updates: int | None = None  # freeze the rare set after this many updates (Table 9)
    static_after_epochs: float | None = None  # the same in epochs of updates (resolved by setup)
    implementation: str = "fused"  # fused | literal


def agg_gates(appearance: torch.Tensor, rare: torch.Tensor, gate1: bool = True, gate2: bool = True):
    """(g1, g2), each (V,): Yu eq. 7 and 8 from the appearance ``a`` (mean count per update) and the
    rare mask. The target's own gate 1 is applied per row by the loss, not here."""
    ones = torch.ones_like(appearance)
    g1 = torch.where(rare, appearance.clamp(max=1.0), ones) if gate1 else ones
    if not gate2:
        return g1, ones
    rare_f = rare.to(appearance.dtype)
    mean_rare = (appearance * rare_f).sum() / rare_f.sum().clamp(min=1.0)
    ratio = torch.where(mean_rare > 0, appearance / mean_rare.clamp(min=torch.finfo(appearance.dtype).tiny), 0.0)
    g2 = torch.where(rare, ratio.clamp(max=1.0), ones)
    return g1, g2


@register_objective("agg", AGGConfig)
class AGG(Objective):
    """Adaptive gradient gating (the module docstring). Options (:class:`AGGConfig`): ``alpha`` (a token is rare
    when its mean count per update in the memory is below it), ``memory_updates`` K (None: one epoch of updates,
    given to :meth:`setup`), ``gate1``/``gate2``, ``static_after_updates``/``static_after_epochs``,
    ``implementation``.

    Hooks: :meth:`setup` once before training, ``setup(updates_per_epoch, special_ids)`` (K when
    ``memory_updates`` is None; the special ids are never rare; no training counts: the groups come from the
    memory alone). In training mode each call first adds its targets to the memory slot of ``step``, then
    gates; pass ``step`` (the updates done before this one, the same for every micro-batch of an update), or
    omit it and call :meth:`after_update` after every optimizer step, which advances the objective's own count.
    The memory saves and loads with ``state_dict()`` / ``load_state_dict()`` (into a module built with the same
    options). ``token_loss``'s value is 2 x NLL (two terms of equal value), its gradient the gated one; ``nll``
    is the plain NLL; ``logs["rare_count"]`` the rare group's size.

    >>> import torch
    >>> from repdegen.losses import AGG, OutputLayer
    >>> agg = AGG.create(vocab_size=10, alpha=0.5, memory_updates=4)
    >>> agg.setup(special_ids=[0])
    >>> head = OutputLayer(torch.randn(10, 4, requires_grad=True))
    >>> for step in range(3):
    ...     out = agg(torch.randn(8, 4), torch.randint(0, 5, (8,)), head, step)
    ...     out.token_loss.backward()
    ...     agg.after_update(head, step)
    >>> int(out.logs["rare_count"]) >= 5  # ids 5-9 never appear in the memory: rare
    True

    Buffers (saved in ``state_dict``): ``counts`` (K, V) int32 ring of per-update target counts,
    ``total`` (V,) int64 their sum, ``slot_step`` (K,) int64 the step that last wrote each slot (-1:
    never), ``special`` (V,) bool never-rare symbols, ``static_rare`` (V,) bool the frozen rare set."""

    # the trainer records the rare group's size per update; tables plot it (Yu et al. Fig. 4, Table 9)
    traces = {"rare_count": ("rare_group_size.png", "AGG rare group size")}

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        k = cfg.memory_updates or 1
        self._needs_setup = cfg.memory_updates is None or getattr(cfg, "static_after_epochs", None) is not None
        # update from which the rare set stays fixed (static AGG); setup() resolves static_after_epochs
        self.static_after: int | None = cfg.static_after_updates
        self.register_buffer("counts", torch.zeros(k, vocab_size, dtype=torch.int32))
        self.register_buffer("total", torch.zeros(vocab_size, dtype=torch.int64))
        self.register_buffer("slot_step", torch.full((k,), -1, dtype=torch.int64))
        self.register_buffer("special", torch.zeros(vocab_size, dtype=torch.bool))
        self.register_buffer("static_rare", torch.zeros(vocab_size, dtype=torch.bool))
        self._last_step: int | None = None  # host copy of the newest step in memory (no device syncs)
        # the step a call without ``step`` uses: advanced by after_update; None: the memory's newest step + 1
        self._updates: int | None = None

    @staticmethod
    def validate_config(cfg) -> None:
        if not cfg.alpha > 0:
            raise ConfigError(f"objective.alpha={cfg.alpha} must be > 0 (Yu et al. use 0.03 for LM, 0.08 for MT)")
        if cfg.implementation not in IMPLEMENTATIONS:
            raise ConfigError(
                f"objective.implementation={cfg.implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}; "
                "use fused (one logits matmul) or literal (the official three-logit form)"
            )
        if cfg.memory_updates is not None and cfg.memory_updates < 1:
            raise ConfigError(
                f"objective.memory_updates={cfg.memory_updates} must be a positive number of optimizer updates, "
                "or null for one epoch of updates"
            )
        if cfg.static_after_updates is not None and cfg.static_after_epochs is not None:
            raise ConfigError(
                f"objective.static_after_updates={cfg.static_after_updates} and objective.static_after_epochs="
                f"{cfg.static_after_epochs} both say when the rare set freezes; set one of them (the other null)"
            )
        if cfg.static_after_epochs is not None and cfg.static_after_epochs <= 0:
            raise ConfigError(f"objective.static_after_epochs={cfg.static_after_epochs} must be > 0 (epochs of updates), "
                              "or null for dynamic grouping")
        if cfg.static_after_updates is not None and cfg.static_after_updates < 1:
            raise ConfigError(
                f"objective.static_after_updates={cfg.static_after_updates} must be >= 1 (the rare set is frozen "
                "after that many updates), or null for dynamic grouping"
            )

    # -- memory -------------------------------------------------------------------------------------
    @property
    def memory_updates(self) -> int:
        return self.counts.size(0)

    def setup(self, updates_per_epoch: int | None = None, special_ids=(), train_counts: torch.Tensor | None = None,
              model=None) -> None:
        """K = ``memory_updates`` or ``updates_per_epoch``; the special symbols are never rare. The
        corpus counts (``train_counts``) are not used: the grouping comes from the memory alone. The
        memory is kept when K is unchanged (setup before loading a checkpoint, or called twice)."""
        if updates_per_epoch is None and (self.cfg.memory_updates is None or self.cfg.static_after_epochs is not None):
            what = "memory_updates=None (K = one epoch)" if self.cfg.memory_updates is None else (
                f"static_after_epochs={self.cfg.static_after_epochs}")
            raise ConfigError(f"AGG.setup(updates_per_epoch=None) with {what}: pass updates_per_epoch, the number of "
                              "optimizer updates in one epoch, or set memory_updates (and static_after_updates)")
        k = self.cfg.memory_updates or max(1, int(updates_per_epoch))
        if self.cfg.static_after_epochs is not None:
            self.static_after = max(1, round(self.cfg.static_after_epochs * int(updates_per_epoch)))
        if k != self.memory_updates:
            self._resize(k)
        self.special.zero_()
        if special_ids:
            self.special[torch.as_tensor(list(special_ids), dtype=torch.long, device=self.special.device)] = True
        self._needs_setup = False

    def _resize(self, k: int) -> None:
        device = self.counts.device
        self.counts = torch.zeros(k, self.vocab_size, dtype=torch.int32, device=device)
        self.slot_step = torch.full((k,), -1, dtype=torch.int64, device=device)
        self.total.zero_()
        self._last_step = None
        self._updates = None

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        saved = state_dict.get(prefix + "counts")
        if saved is not None and saved.size(0) != self.memory_updates:
            self._resize(saved.size(0))  # the checkpoint's K wins
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        # K and the specials come with the state; static_after_epochs still needs setup's updates per epoch
        self._needs_setup = self._needs_setup and self.cfg.static_after_epochs is not None
        self._last_step = None
        self._updates = None

    def record(self, targets: torch.Tensor, step: int) -> None:
        """Add the batch's target counts into slot ``step % K`` (cleared first if an older step wrote
        it). Device ops only; the host keeps the newest step to notice a jump in ``step``."""
        k = self.memory_updates
        if self._last_step is None:
            self._last_step = int(self.slot_step.max())  # one sync, after construction or loading
        if step not in (self._last_step, self._last_step + 1):
            # not the trainer's 0/+1 progression (a jump or a restart): keep only updates step-K+1..step
            stale = (self.slot_step <= step - k) | (self.slot_step > step)
            self.counts[stale] = 0
            self.slot_step[stale] = -1
            self.total.copy_(self.counts.sum(0, dtype=torch.int64))
        batch = torch.bincount(targets.reshape(-1), minlength=self.vocab_size)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(batch, op=dist.ReduceOp.SUM)  # every rank: the counts of the global batch
        slot = step % k
        old = self.counts[slot].long()
        same_step = self.slot_step[slot] == step
        new = torch.where(same_step, old, torch.zeros_like(old)) + batch
        self.total += new - old
        self.counts[slot] = new.to(torch.int32)
        self.slot_step[slot] = step
        self._last_step = step

    def appearance(self, step: int) -> torch.Tensor:
        """a (V,) float64: the memory's counts per update, ``sum of slots / min(step + 1, K)``."""
        return self.total.double() / min(step + 1, self.memory_updates)

    def groups(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(appearance a, rare mask) at ``step``; in training, also remembers the set for static AGG."""
        a = self.appearance(step)
        s = self.static_after
        if s is not None and step >= s:
            return a, self.static_rare.clone()
        rare = (a < self.cfg.alpha) & ~self.special
        if s is not None and self.training:
            self.static_rare.copy_(rare)
        return a, rare

    def current_step(self, step: int | None = None) -> int:
        """``step`` when given; else the objective's own count of updates: one more than the step of the last
        :meth:`after_update`, or, before any, one more than the newest step in the memory (0 for a fresh one)."""
        if step is not None:
            return step
        if self._updates is None:
            self._updates = int(self.slot_step.max()) + 1
        return self._updates

    def after_update(self, model=None, step: int | None = None) -> None:
        """After optimizer update ``step`` (default: the current step): the next call without ``step`` is the
        next update's. The memory itself is written by the forward passes of training mode."""
        self._updates = self.current_step(step) + 1

    # -- loss ---------------------------------------------------------------------------------------
    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, model, step: int | None = None,
                layout=None) -> ObjectiveOutput:
        model = as_output_layer(model)
        step = self.current_step(step)
        g1, g2, rare_rows, logs = self.gates(targets, step, hidden.dtype)
        loss, nll, extra = self.gated_loss(hidden, targets, model, g1, g2, rare_rows, layout)
        return ObjectiveOutput(token_loss=loss, nll=nll.detach(), logs={**logs, **extra})

    def gates(self, targets: torch.Tensor, step: int, dtype: torch.dtype):
        """(g1, g2, rare_rows, logs): record the batch (training), group, and gate (Yu eq. 5-8)."""
        if self.training:
            if self._needs_setup:
                raise RuntimeError("AGG.setup(updates_per_epoch, special_ids, ...) must run before training (K = one epoch)")
            self.record(targets, step)
        a, rare = self.groups(step)
        g1, g2 = agg_gates(a, rare, self.cfg.gate1, self.cfg.gate2)
        rare_rows = rare[targets]
        dtype = torch.float64 if dtype == torch.float64 else torch.float32
        logs = {"rare_count": rare.sum().detach(), "rare_target_frac": rare_rows.float().mean().detach()}
        return g1.to(dtype), g2.to(dtype), rare_rows, logs

    def gated_loss(self, hidden, targets, model, g1, g2, rare_rows, layout):
        """(loss, nll, extra logs) of the gated objective: AGG's; UL+AGG adds its UL term."""
        loss_fn = self.fused_loss if self.cfg.implementation == "fused" else self.literal_loss
        loss, nll = loss_fn(hidden, model.output_embedding, model.output_bias, targets, g1, g2, rare_rows)
        return loss, nll, {}

    @staticmethod
    def supports_chunk_rows(cfg) -> bool:
        return cfg.implementation == "fused"

    def fused_loss(self, h, W, b, targets, g1, g2, rare_rows):
        if self.cfg.chunk_rows is not None and self.training:
            return chunked_softmax_loss(h, W, b, targets, self.label_smoothing, gates=(g1, g2, rare_rows),
                                        chunk_rows=self.cfg.chunk_rows)
        loss, nll, _ = fused_softmax_loss(h, W, b, targets, self.label_smoothing, gates=(g1, g2, rare_rows))
        return loss, nll

    def literal_loss(self, h, W, b, targets, g1, g2, rare_rows):
        """The official three-logit form (one device sync for the row split)."""
        n = targets.numel()
        b_det = b.detach() if b is not None else None
        loss, nll = self.token_nll(nn.functional.linear(h, W.detach(), b_det), targets)  # z0: gradient to h only
        h_det = h.detach()
        for gate, rows in ((g1, ~rare_rows), (g2, rare_rows)):
            idx = rows.nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            t = targets[idx]
            z = nn.functional.linear(h_det[idx], W, b).to(gate.dtype)  # gates stay float32 under autocast
            g = gate.expand(idx.numel(), -1).clone()
            g[torch.arange(idx.numel(), device=g.device), t] = 1.0  # the target's own logit: gate 1
            z_gated = g * z + (1.0 - g) * z.detach()
            term, _ = self.token_nll(z_gated, t)
            loss = loss + term * (idx.numel() / n)  # sum over these rows / all N tokens
        return loss, nll
