"""REDER: the reversible duplex Transformer, pure PyTorch. `reder.load(model_dir).translate(...)`: reder/api.py."""
from reder.autoregressive import Transformer
from reder.cmlm import CMLM
from reder.config import (BOS_ID, DIRECTIONS, EOS_ID, PAD_ID, UNK_ID, CmlmConfig, LossConfig, ModelConfig,
                          TransformerConfig)
from reder.model import REDER
from reder.objectives.duplex import DuplexLoss

__all__ = ["BOS_ID", "CMLM", "CmlmConfig", "DIRECTIONS", "EOS_ID", "PAD_ID", "UNK_ID", "DuplexLoss", "LossConfig", "ModelConfig", "REDER",
           "Transformer", "TransformerConfig", "Translator", "load"]


def __getattr__(name: str):
    """`Translator` and `load` (reder/api.py), imported on first use: reder/api.py imports reder.translate, and
    a package that imports it makes `python -m reder.translate` warn that it was found in sys.modules before
    it ran as __main__ (runpy's RuntimeWarning)."""
    if name in ("Translator", "load"):
        from reder import api

        return getattr(api, name)
    raise AttributeError(f"module 'reder' has no attribute {name!r}")
