"""REDER: the reversible duplex Transformer, pure PyTorch. `reder.load(model_dir).translate(...)`: reder/api.py."""
from reder.api import Translator, load
from reder.autoregressive import Transformer
from reder.cmlm import CMLM
from reder.config import (BOS_ID, DIRECTIONS, EOS_ID, PAD_ID, UNK_ID, CmlmConfig, LossConfig, ModelConfig,
                          TransformerConfig)
from reder.model import REDER
from reder.objectives.duplex import DuplexLoss

__all__ = ["BOS_ID", "CMLM", "CmlmConfig", "DIRECTIONS", "EOS_ID", "PAD_ID", "UNK_ID", "DuplexLoss", "LossConfig", "ModelConfig", "REDER",
           "Transformer", "TransformerConfig", "Translator", "load"]
