"""Objective registry: ``build_objective(cfg.objective, vocab)``.

An objective receives the model's hidden states and the targets, forms the logits from the
model's ``output_embedding`` / ``output_bias`` itself, and returns an :class:`ObjectiveOutput`.
Adding one = one module here (found automatically) with a config dataclass extending
:class:`ObjectiveConfig` and a class registered with ``@register_objective(name, ConfigClass)``, plus
``conf/objective/<name>.yaml``. Outside this package: the module's path in ``REPDEGEN_PLUGINS`` and the
YAML's folder on Hydra's search path (``repdegen.core.registry.load_plugins``; README, "Adding an objective").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from repdegen.core.errors import ConfigError
from repdegen.core.registry import Registry, import_submodules
from torch import nn

OBJECTIVES = Registry("objective", "name")
register_objective = OBJECTIVES.register


@dataclass
class ObjectiveConfig:
    """What every objective's config has: its registered ``name`` and ``tie_weights`` (None: the model's own
    default, tied for AWD-LSTM and the Transformers, untied for the LSTMs of Inan et al.;
    ``repdegen.reproduce.settings.config.finalize``
    resolves it and writes the result to ``model.tie_weights`` too)."""

    name: str = "?"
    tie_weights: bool | None = None
    # None: the loss over all N rows at once; an int: the output layer and its softmax loss chunk_rows rows at a
    # time, the gradients formed in the forward pass (repdegen.losses.fused.chunked_softmax_loss: no N x V tensor; the same
    # values up to summation order). For the objectives whose ``supports_chunk_rows`` says so (MLE, RE, fused AGG; AL
    # and REAL with target_grad official or none: repdegen.losses.al.chunked_augmented_loss). Not part of the config hash.
    chunk_rows: int | None = None


@dataclass
class ObjectiveOutput:
    """``token_loss``: the per-token objective averaged over the tokens of the batch (the trainer
    multiplies it by the BPTT length under ``loss_reduction=sum_over_time``).
    ``nll``: the plain softmax NLL, mean over tokens, detached: what the progress bar reports."""

    token_loss: torch.Tensor
    nll: torch.Tensor
    # extra detached scalars (tensors: reading them would force a device sync on every step)
    logs: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class TokenLayout:
    """Where the N flattened rows of ``hidden``/``targets`` come from, for objectives that need the
    sequence structure (unlikelihood's "previous targets of the same sequence"): row i is position
    ``pos[i]`` of sequence ``seq[i]`` (a BPTT column of the current segment, or a translation
    target sentence); within a sequence, rows appear in increasing ``pos``. ``length``: an upper
    bound of ``pos`` + 1 known on the host (None: read from ``pos``, one device sync)."""

    seq: torch.Tensor  # (N,) long
    pos: torch.Tensor  # (N,) long
    n_seq: int
    length: int | None = None

    @staticmethod
    def time_major(T: int, B: int, device=None) -> TokenLayout:
        """Rows of a (T, B) block flattened time-major (BPTT streams): row t*B + b."""
        pos = torch.arange(T, device=device).repeat_interleave(B)
        seq = torch.arange(B, device=device).repeat(T)
        return TokenLayout(seq, pos, B, T)

    @staticmethod
    def from_mask(mask: torch.Tensor) -> TokenLayout:
        """Rows = the True entries of a (B, T) mask in row-major order (padded translation targets)."""
        seq, pos = mask.nonzero(as_tuple=True)
        return TokenLayout(seq, pos, mask.size(0), mask.size(1))


class Objective(nn.Module):
    """Base of every objective. ``label_smoothing`` (set by ``build_objective`` from
    ``trainer.label_smoothing``) smooths the NLL term: ``(1 - eps) * NLL + eps * mean_k(-log p_k)``
    (PyTorch's ``cross_entropy(label_smoothing=eps)``: eps spread over all V classes; fairseq's
    label_smoothed_cross_entropy spreads it over the V - 1 others, a difference of eps / V)."""

    label_smoothing: float = 0.0
    # logs the trainer records at every update over the first updates (result.json "trace") and tables plot:
    # name -> (figure file, title); e.g. AGG's rare-group size. The trainer names no objective.
    traces: dict[str, tuple[str, str]] = {}

    def setup(self, updates_per_epoch: int, special_ids: list[int], train_counts: torch.Tensor, model=None) -> None:
        """Called by the trainer before training (and before a checkpoint is loaded) with what a
        stateful objective may need: AGG's counter memory spans ``updates_per_epoch`` updates, special
        symbols are never rare, the freezing experiments read the training counts and the model."""

    def update_penalty(self, model, step: int) -> None:
        """Called by the trainer once per optimizer update ``step``, after the backward passes of all its
        micro-batches and before clipping: a penalty on parameters (CosReg, SC) adds its gradient to
        ``param.grad`` here (``losses.add_to_grad``), so it is paid once per update, never per micro-batch."""

    def after_update(self, model, step: int) -> None:
        """Called by the trainer after optimizer update ``step`` (the freezing experiments restore rows)."""

    def epoch_metrics(self, model) -> dict:
        """Diagnostics of the objective itself, recorded in every epoch's record beside the embedding geometry (AL's
        target entropy); none here. Called under ``no_grad`` with the weights validation reads."""
        return {}

    @staticmethod
    def supports_chunk_rows(cfg) -> bool:
        """Whether ``objective.chunk_rows`` applies to this objective with this config (a chunked kernel computes its
        whole training loss: the NLL, gated or not, or AL's)."""
        return False

    def token_nll(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the training NLL term, smoothed if configured; the plain mean NLL, detached)."""
        eps = self.label_smoothing
        if not eps:
            nll = nn.functional.cross_entropy(logits, targets)
            return nll, nll.detach()
        lprobs = torch.log_softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)
        nll = -lprobs.gather(-1, targets.unsqueeze(-1)).mean()
        smooth = -lprobs.mean(-1).mean()
        return (1.0 - eps) * nll + eps * smooth, nll.detach()


def add_to_grad(param: torch.Tensor, grad: torch.Tensor) -> None:
    """``param.grad += grad`` (creating it if absent), in the parameter's dtype."""
    grad = grad.to(param.dtype)
    if param.grad is None:
        param.grad = grad.clone()
    else:
        param.grad.add_(grad)


def validate_objective(cfg: Any, cls: type | None = None) -> None:
    """The objective's own checks (``validate_config``) and whether ``chunk_rows`` applies to it; ``cls``: its
    registered class, when the caller has looked it up already."""
    cls = cls or OBJECTIVES.entry(cfg)[0]
    def value(key):
        return cfg.get(key) if hasattr(cfg, "get") else getattr(cfg, key, None)

    chunk = value("chunk_rows")
    if chunk is not None and not cls.supports_chunk_rows(cfg):
        entries = {n: OBJECTIVES.entry(SimpleNamespace(name=n)) for n in OBJECTIVES.names()}
        able = [n for n, (c, config_cls) in entries.items() if c.supports_chunk_rows(config_cls())]
        raise ConfigError(f"objective.chunk_rows={chunk} is not supported by objective={cfg.name}"
                          + (f" with implementation={value('implementation')}" if value("implementation") else "")
                          + f"; the chunked kernels compute the (gated) NLL and AL's loss: use it with {', '.join(able)} "
                          "(AGG: implementation=fused; AL/REAL: target_grad official or none), or set objective.chunk_rows=null")
    cls.validate_config(cfg)


def build_objective(cfg: Any, vocab_size: int, label_smoothing: float = 0.0):
    objective = OBJECTIVES.entry(cfg)[0](OBJECTIVES.to_object(cfg), vocab_size)
    objective.label_smoothing = float(label_smoothing)
    return objective


def objective_names() -> list[str]:
    return OBJECTIVES.names()


import_submodules(__name__, __path__)  # every module here registers its objectives

# the objectives by name, for use outside the trainer: from repdegen.losses import AGG, CosReg
from repdegen.losses.adv_mle import AdvMLE  # noqa: E402
from repdegen.losses.agg import AGG  # noqa: E402
from repdegen.losses.al import AugmentedLoss  # noqa: E402
from repdegen.losses.cosreg import CosReg  # noqa: E402
from repdegen.losses.freeze import Freeze  # noqa: E402
from repdegen.losses.mle import MLE  # noqa: E402
from repdegen.losses.sc import SpectrumControl  # noqa: E402
from repdegen.losses.ul import Unlikelihood  # noqa: E402

__all__ = ["AGG", "MLE", "AdvMLE", "AugmentedLoss", "CosReg", "Freeze", "Objective", "ObjectiveConfig", "ObjectiveOutput",
           "SpectrumControl", "Unlikelihood", "build_objective", "objective_names", "register_objective"]
