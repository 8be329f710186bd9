"""Objective registry: ``build_objective(cfg.objective, vocab)``.

An objective receives the model's hidden states and the targets, forms the logits from the
model's ``output_embedding`` / ``output_bias`` itself, and returns an :class:`ObjectiveOutput`.
Adding one = one module here (found automatically) with a config dataclass extending
:class:`ObjectiveConfig` and a class registered with ``@register_objective(name, ConfigClass)``, plus
``conf/objective/<name>.yaml``. Outside this package: the module's path in ``REPDEGEN_PLUGINS`` and the
YAML's folder on Hydra's search path (``repdegen.core.registry.load_plugins``; README, "Adding an objective").

Outside the trainer (docs/library.md): ``make_objective(name, vocab_size, **options)`` (or ``AGG.create(vocab_size,
**options)``) builds a validated objective; it is called as ``objective(hidden, targets, head, step)`` with the
output layer ``head`` (an :class:`OutputLayer`, an ``nn.Linear`` such as a Hugging Face model's
``get_output_embeddings()``, or any object with ``output_embedding`` / ``output_bias``), and the loop calls
``update_penalty(head, step)`` after the backward pass and ``after_update(head, step)`` after the optimizer step.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
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


class OutputLayer:
    """The output layer an objective reads: ``logits = hidden @ weight.T + bias``. ``weight`` (V, d) is the output
    embedding (the input embedding itself in a tied model), ``bias`` (V,) or None; ``input_embedding`` is the
    matrix L that AL/REAL's target distribution and Freeze's ``mode=embedding`` read (default: ``weight``, i.e.
    a tied model; pass the input embedding of an untied model). The tensors are used as given (no copies), so
    gradients reach the caller's parameters.

    >>> import torch
    >>> from repdegen.losses import OutputLayer
    >>> head = OutputLayer(torch.randn(10, 4), torch.zeros(10))
    >>> head.logits(torch.randn(3, 4)).shape
    torch.Size([3, 10])
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 input_embedding: torch.Tensor | None = None):
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ConfigError(f"OutputLayer(weight={_describe(weight)}): the weight must be a (V, d) tensor, the output "
                              "embedding of the model (for an nn.Linear head: its .weight)")
        if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != weight.shape[:1]):
            raise ConfigError(f"OutputLayer(bias={_describe(bias)}): the bias must be None or a ({weight.size(0)},) "
                              "tensor, one entry per row of the weight")
        if input_embedding is not None and (not isinstance(input_embedding, torch.Tensor)
                                            or input_embedding.shape != weight.shape):
            raise ConfigError(f"OutputLayer(input_embedding={_describe(input_embedding)}): it must be a "
                              f"{tuple(weight.shape)} tensor like the weight, or None for a tied model")
        self.output_embedding = weight
        self.output_bias = bias
        self.input_embedding = weight if input_embedding is None else input_embedding

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(hidden, self.output_embedding, self.output_bias)


def _describe(value) -> str:
    return f"tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)


def as_output_layer(head):
    """What the objectives read the output layer from: ``head`` itself when it has ``output_embedding`` (our
    models, an :class:`OutputLayer`); an ``nn.Linear`` / ``nn.Embedding`` (any module with a 2-D ``weight``, e.g.
    a Hugging Face model's ``get_output_embeddings()``) or a (V, d) tensor as an :class:`OutputLayer` of it."""
    if hasattr(head, "output_embedding"):
        return head
    if isinstance(head, torch.Tensor):
        return OutputLayer(head)
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return OutputLayer(weight, getattr(head, "bias", None))
    raise ConfigError(f"the objective's output layer is a {type(head).__name__}, which has neither output_embedding "
                      "nor a 2-D weight; pass OutputLayer(weight, bias), the LM head module (nn.Linear, e.g. "
                      "model.get_output_embeddings()) or a model with output_embedding / output_bias")


class Objective(nn.Module):
    """Base of every objective. ``label_smoothing`` (set by ``build_objective`` from
    ``trainer.label_smoothing``) smooths the NLL term: ``(1 - eps) * NLL + eps * mean_k(-log p_k)``
    (PyTorch's ``cross_entropy(label_smoothing=eps)``: eps spread over all V classes; fairseq's
    label_smoothed_cross_entropy spreads it over the V - 1 others, a difference of eps / V).

    The call, the same for every objective: ``objective(hidden, targets, head, step, layout=None)`` with
    ``hidden`` (N, d) the states fed to the softmax, ``targets`` (N,) long, ``head`` the output layer
    (:func:`as_output_layer`), ``step`` the number of optimizer updates done before this one (every micro-batch of
    one update passes the same step) and ``layout`` the rows' sequences (:class:`TokenLayout`; unlikelihood needs
    it). It returns an :class:`ObjectiveOutput`; ``token_loss`` is what to backpropagate. Once per optimizer
    update the loop calls :meth:`update_penalty` after the backward pass(es) and before gradient clipping and
    ``optimizer.step()``, then :meth:`after_update` after the step; :meth:`setup` once before training. Each hook
    is a no-op for the objectives that need none, so a loop may call all of them for any objective. Training mode
    (``objective.train()``, the default) is what training passes use; ``objective.eval()`` for evaluation."""

    label_smoothing: float = 0.0
    # logs the trainer records at every update over the first updates (result.json "trace") and tables plot:
    # name -> (figure file, title); e.g. AGG's rare-group size. The trainer names no objective.
    traces: dict[str, tuple[str, str]] = {}

    def setup(self, updates_per_epoch: int = 1, special_ids: Sequence[int] = (), train_counts: torch.Tensor | None = None,
              model=None) -> None:
        """Called by the trainer before training (and before a checkpoint is loaded) with what a
        stateful objective may need: AGG's counter memory spans ``updates_per_epoch`` updates, special
        symbols are never rare, the freezing experiments read the training counts and the model."""

    def update_penalty(self, model, step: int = 0) -> None:
        """Called by the trainer once per optimizer update ``step``, after the backward passes of all its
        micro-batches and before clipping: a penalty on parameters (CosReg, SC) adds its gradient to
        ``param.grad`` here (``losses.add_to_grad``), so it is paid once per update, never per micro-batch."""

    def after_update(self, model=None, step: int | None = None) -> None:
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


def _accepts(hint, value) -> bool:
    """Whether ``value`` fits the config field annotation ``hint`` (the annotations our configs use; others pass)."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_accepts(arg, value) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, (list, tuple)) and all(_accepts(item, v) for v in value)
    return True


def _coerce(hint, value):
    """An int given for a float field as a float, a tuple given for a list field as a list (as a YAML config would)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (types.UnionType, typing.Union) else (hint,)
    if isinstance(value, int) and not isinstance(value, bool) and float in args and int not in args:
        return float(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def make_objective(name: str, vocab_size: int, *, label_smoothing: float = 0.0, **options) -> Objective:
    """The objective ``name`` (one of :func:`objective_names`) over a vocabulary of ``vocab_size`` tokens, its config
    dataclass built from ``options`` (its fields, e.g. ``alpha=0.03`` for AGG; omitted fields keep the schema's
    defaults, the values ``conf/objective/<name>.yaml`` starts from) and checked as the trainer checks it. A bad name,
    key or value raises :class:`~repdegen.core.errors.ConfigError` naming it and the fix.

    >>> from repdegen.losses import make_objective
    >>> agg = make_objective("agg", vocab_size=100, alpha=0.03, memory_updates=50)
    >>> type(agg).__name__, agg.cfg.alpha, agg.memory_updates
    ('AGG', 0.03, 50)
    >>> make_objective("agg", vocab_size=100, alfa=0.03)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    repdegen.core.errors.ConfigError: make_objective('agg'): unknown option alfa=0.03 (did you mean alpha?); ...
    """
    if name not in OBJECTIVES.names():
        close = difflib.get_close_matches(str(name), OBJECTIVES.names(), n=1)
        raise ConfigError(f"make_objective({name!r}): no such objective" + (f" (did you mean {close[0]!r}?)" if close else "")
                          + f"; the objectives are {', '.join(OBJECTIVES.names())}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ConfigError(f"make_objective({name!r}, vocab_size={vocab_size!r}): vocab_size must be a positive int, the "
                          "number of rows of the output embedding")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) or not 0 <= label_smoothing < 1:
        raise ConfigError(f"make_objective({name!r}, label_smoothing={label_smoothing!r}): label_smoothing must be a "
                          "number in [0, 1) (0: plain NLL)")
    cls, config_cls = OBJECTIVES.entry(SimpleNamespace(name=name))
    hints = typing.get_type_hints(config_cls)
    keys = [f.name for f in fields(config_cls) if f.name != "name"]
    values = {}
    for key, value in options.items():
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            raise ConfigError(f"make_objective({name!r}): unknown option {key}={value!r}"
                              + (f" (did you mean {close[0]}?)" if close else "")
                              + f"; {config_cls.__name__}'s options are {', '.join(keys)}")
        hint = hints.get(key, Any)
        if not _accepts(hint, value):
            expected = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
            raise ConfigError(f"make_objective({name!r}): {key}={value!r} is a {type(value).__name__}, expected "
                              f"{expected} ({config_cls.__name__}.{key}); pass a value of that type")
        values[key] = _coerce(hint, value)
    cfg = config_cls(**values)
    validate_objective(cfg, cls)
    objective = cls(cfg, vocab_size)
    objective.label_smoothing = float(label_smoothing)
    return objective


def _create(cls, vocab_size: int, *, label_smoothing: float = 0.0, **options):
    names = [n for n in OBJECTIVES.names() if OBJECTIVES.entry(SimpleNamespace(name=n))[0] is cls]
    if not names:
        raise ConfigError(f"{cls.__name__}.create: {cls.__name__} is not a registered objective; register it with "
                          "@register_objective(name, ConfigClass), or construct it as cls(config, vocab_size)")
    return make_objective(names[0], vocab_size, label_smoothing=label_smoothing, **options)


# ``AGG.create(vocab_size=V, alpha=0.03)``: make_objective under the class's registered name
Objective.create = classmethod(_create)


import_submodules(__name__, __path__)  # every module here registers its objectives

# the objectives by name, for use outside the trainer: from repdegen.losses import AGG, CosReg
from repdegen.losses.adv_mle import AdvMLE  # noqa: E402
from repdegen.losses.agg import AGG  # noqa: E402
from repdegen.losses.al import REAL, AugmentedLoss  # noqa: E402
from repdegen.losses.cosreg import CosReg  # noqa: E402
from repdegen.losses.freeze import Freeze  # noqa: E402
from repdegen.losses.mle import MLE, RE  # noqa: E402
from repdegen.losses.sc import SpectrumControl  # noqa: E402
from repdegen.losses.ul import Unlikelihood  # noqa: E402
from repdegen.losses.ul_agg import ULAGG, ULAGGGated  # noqa: E402

__all__ = ["AGG", "MLE", "RE", "REAL", "ULAGG", "AdvMLE", "AugmentedLoss", "CosReg", "Freeze", "Objective",
           "ObjectiveConfig", "ObjectiveOutput", "OutputLayer", "SpectrumControl", "TokenLayout", "ULAGGGated",
           "Unlikelihood", "as_output_layer", "build_objective", "make_objective", "objective_names",
           "register_objective"]
