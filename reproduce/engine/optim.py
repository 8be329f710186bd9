"""Optimizers and learning-rate schedules of the trainer (``optim`` config).

Schedules: epochs ``1..decay_after_epoch`` at ``lr``, then ``lr * lr_decay**(e - k)``; or fairseq's
``inverse_sqrt`` for Adam (linear warm-up, then ``lr * sqrt(warmup / update)``).
NT-ASGD (Merity et al. 2018, as awd-lstm-lm/main.py): SGD until the validation loss is worse than the best of all
but the last ``nonmono`` evaluations (:func:`nonmonotone_trigger`), then ``torch.optim.ASGD(t0=0, lambd=0)``; from
then on validation (and the saved best model) uses the averaged weights (:func:`averaged_weights`).
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
from repdegen.core.errors import ConfigError


def make_optimizer(name: str, params: list, o, device: torch.device):
    """``sgd`` (with momentum / weight decay), ``adam`` (AdamW when ``decoupled_weight_decay``; fused on GPUs) or
    ``asgd`` (NT-ASGD's averaging phase and AWD-LSTM's finetune)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    if name == "adam":
        opt_cls = torch.optim.AdamW if o.decoupled_weight_decay else torch.optim.Adam
        fused = device.type == "cuda"  # one kernel for the whole update on GPUs
        return opt_cls(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, fused=fused)
    if name == "asgd":
        return torch.optim.ASGD(params, lr=o.lr, t0=0, lambd=0.0, weight_decay=o.weight_decay)
    raise ValueError(name)


def lr_for_epoch(o, epoch: int, constant: bool = False) -> float:
    """The per-epoch step decay (``constant``: finetune and ASGD keep ``lr``)."""
    if constant:
        return o.lr
    return o.lr * o.lr_decay ** max(epoch - o.decay_after_epoch, 0)


def lr_for_update(o, update: int) -> float:
    """fairseq's inverse_sqrt: linear warm-up from warmup_init_lr over warmup_updates, then
    lr * sqrt(warmup_updates / update); ``update`` = optimizer updates done so far."""
    if update < o.warmup_updates:
        return o.warmup_init_lr + update * (o.lr - o.warmup_init_lr) / o.warmup_updates
    return o.lr * math.sqrt(o.warmup_updates / max(update, 1))


def nonmonotone_trigger(history: list[float], value: float, nonmono: int) -> bool:
    """Merity et al. (2018)'s rule: ``value`` is worse than the best of all but the last ``nonmono``
    earlier validation losses (``history``)."""
    return len(history) > nonmono and value > min(history[: len(history) - nonmono])


@contextlib.contextmanager
def averaged_weights(params, optimizer):
    """Swap ASGD's running averages into the parameters for the duration of the block."""
    if not isinstance(optimizer, torch.optim.ASGD):
        yield
        return
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            ax = optimizer.state.get(p, {}).get("ax")
            if ax is not None:
                p.copy_(ax)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


@functools.cache
def cpu_runs_bf16_lstm() -> bool:
    """Whether this CPU's oneDNN has a bf16 LSTM kernel (AVX512-BF16 or AMX; an AMD EPYC without them has none, and a
    bf16 LSTM forward there fails inside oneDNN): a tiny forward under autocast, tried once."""
    lstm = torch.nn.LSTM(4, 4)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
            lstm(torch.zeros(2, 1, 4))
    except RuntimeError:
        return False
    return True


def check_bf16(precision: str, device: torch.device, model: torch.nn.Module) -> None:
    """A ConfigError, before anything trains, for ``trainer.precision=bf16`` on a CPU that cannot run the model's LSTMs
    in bf16 (instead of oneDNN's "could not create a primitive descriptor" at the first update)."""
    if device.type == "cpu" and use_bf16(precision, device) and getattr(model, "uses_lstm_kernel", False) \
            and not cpu_runs_bf16_lstm():
        import platform

        raise ConfigError(f"trainer.precision={precision}: this CPU ({platform.processor() or platform.machine()}) has no "
                          f"bf16 LSTM kernel in oneDNN (it needs AVX512-BF16 or AMX), and the model has LSTM layers; "
                          f"expected fp32 here: set trainer.precision=fp32 (paper runs are fp32 anyway)")


def use_bf16(precision: str, device: torch.device) -> bool:
    if precision == "auto":
        return device.type == "cuda" and torch.cuda.is_bf16_supported()
    return precision == "bf16"
