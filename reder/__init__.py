"""REDER: the reversible duplex Transformer, pure PyTorch."""
from reder.config import BOS_ID, DIRECTIONS, EOS_ID, PAD_ID, UNK_ID, LossConfig, ModelConfig

__all__ = ["BOS_ID", "DIRECTIONS", "EOS_ID", "PAD_ID", "UNK_ID", "LossConfig", "ModelConfig"]
