"""repdegen's objectives in a Hugging Face ``transformers.Trainer`` (docs/hf.md).

``from repdegen.hf import DegenerationTrainer`` trains any causal LM with tied embeddings under MLE, AGG, CosReg, UL,
UL+AGG, ... (``repdegen.losses.objective_names()``). Needs the ``hf`` extra: ``pip install "repdegen[hf]"``.

The names are loaded on first use, so importing this package costs nothing and does not import ``transformers``: the
objectives' registry (``repdegen.losses``, whose folder holds this one) imports every module beside it.
"""

from __future__ import annotations

import importlib

__all__ = ["OBJECTIVE_STATE", "DegenerationCallback", "DegenerationTrainer", "output_layer", "token_counts"]

INSTALL_HINT = 'pip install "repdegen[hf]" (transformers, accelerate, safetensors, tokenizers)'


def _load():
    from repdegen.core.errors import ConfigError

    for dist in ("transformers", "accelerate"):
        try:
            importlib.import_module(dist)
        except ImportError as err:
            raise ConfigError(f"repdegen.hf trains with the Hugging Face Trainer, which needs {dist} ({err}); "
                              f"install the hf extra: {INSTALL_HINT}") from err
    return importlib.import_module(__name__ + ".trainer")


def __getattr__(name: str):
    if name in __all__:
        return getattr(_load(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
