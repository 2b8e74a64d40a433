"""REDER: the reversible duplex Transformer, pure PyTorch. `reder.load(model_dir).translate(...)`: reder/api.py.

The configuration names load with the package; the models, the loss and the API on first use (PEP 562's module
`__getattr__`), so that the torch-free modules (reder.config, reder.feasibility) load without torch: the tokenize
stage's Ray Data actors read their feasibility rule from here, and torch would be ~150 MB more in each of them."""
from typing import Any

from reder.config import (BOS_ID, DIRECTIONS, EOS_ID, PAD_ID, UNK_ID, CmlmConfig, LossConfig, ModelConfig,
                          TransformerConfig)

__all__ = ["BOS_ID", "CMLM", "CmlmConfig", "DIRECTIONS", "EOS_ID", "PAD_ID", "UNK_ID", "DuplexLoss", "LossConfig", "ModelConfig", "REDER",
           "Transformer", "TransformerConfig", "Translator", "load"]


def __getattr__(name: str) -> Any:
    """The package's torch names, imported when first asked for (then module attributes like the others)."""
    if name in ("Translator", "load"):
        from reder.api import Translator, load
    elif name == "Transformer":
        from reder.autoregressive import Transformer
    elif name == "CMLM":
        from reder.cmlm import CMLM
    elif name == "REDER":
        from reder.model import REDER
    elif name == "DuplexLoss":
        from reder.objectives.duplex import DuplexLoss
    else:
        raise AttributeError(f"module 'reder' has no attribute {name!r}")
    value = locals()[name]
    globals()[name] = value
    return value
