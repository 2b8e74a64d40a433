"""Model and loss configuration: frozen dataclasses, saved inside every checkpoint.

`Config.from_dict(values)` and `config.to_dict()` are the one loader of reder/configio.py (unknown keys and
wrong types are errors), which pipeline/config.py uses for the whole pipeline config too.
"""
from dataclasses import dataclass
from typing import Any

from reder.configio import round_trip

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
DIRECTIONS = ("src2tgt", "tgt2src")
HEADS = ("ctc", "dag")


def _blank_id(config: Any) -> int:
    """The CTC blank: the last id of the joint vocabulary, never a real piece, so never generated (with
    head="dag" the same id is the skip token of FBA's laid-out target)."""
    return config.vocab_size - 1


@round_trip
@dataclass(frozen=True)
class ModelConfig:
    """Shape and regularisation of the reversible duplex Transformer (docs/DESIGN.md, "The model")."""

    vocab_size: int = 8000  # includes the CTC blank, which is the last id
    d_model: int = 512  # width of one half of the residual stream; the stream is 2 * d_model
    n_heads: int = 8
    ffn_dim: int = 2048
    layers_per_end: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    upsample_ratio: int = 2
    max_relative_distance: int = 16
    max_positions: int = 1024  # positions of the upsampled input sequence
    share_ends: bool = False  # tie the two ends' layers (embeddings and positions are always shared/own)
    label_smoothing: float = 0.1
    memory_efficient: bool = True  # rebuild activations in backward instead of storing them
    head: str = "ctc"  # output head at both ends: "ctc" or "dag" (docs/DESIGN.md, "Output heads")
    graph_upsample_ratio: float = 8.0  # λ (head="dag"): a graph has int(λ·(|x|+2)) vertices, |x| without BOS/EOS
    link_heads: int = 4  # heads of the DAG link scorer (head="dag")
    blank_id = property(_blank_id)

    def __post_init__(self) -> None:
        checks = {
            **_transformer_checks(self),
            "ffn_dim must be >= 1": self.ffn_dim >= 1,
            "layers_per_end must be >= 1": self.layers_per_end >= 1,
            "upsample_ratio must be an int >= 1": isinstance(self.upsample_ratio, int) and self.upsample_ratio >= 1,
            "max_relative_distance must be >= 1": self.max_relative_distance >= 1,
            f"head must be one of {HEADS}": self.head in HEADS,
            "graph_upsample_ratio must be a number >= 1": isinstance(self.graph_upsample_ratio, (int, float))
            and not isinstance(self.graph_upsample_ratio, bool) and self.graph_upsample_ratio >= 1,
            "link_heads must be >= 1 and divide d_model": isinstance(self.link_heads, int) and self.link_heads >= 1
            and self.d_model % self.link_heads == 0,
        }
        _validate(self, checks)
        # Checked after the ratios: an input of EOS alone must fit once upsampled (CTC: r positions; DAG: a
        # graph of int(λ·2) vertices, BOS and EOS).
        shortest = self.upsample_ratio if self.head == "ctc" else int(self.graph_upsample_ratio * 2)
        _validate(self, {f"max_positions must be >= {max(2, shortest)} (an input of EOS alone, upsampled by the "
                         f"{self.head} head)": self.max_positions >= max(2, shortest)})


@round_trip
@dataclass(frozen=True)
class TransformerConfig:
    """The autoregressive Transformer (teacher for distillation and AR baseline; reder/autoregressive.py)."""

    vocab_size: int = 8000  # the joint SentencePiece vocabulary, CTC blank (never generated) included as the last id
    d_model: int = 512
    n_heads: int = 8
    ffn_dim: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    label_smoothing: float = 0.1
    max_positions: int = 1024  # longest source (with EOS) and longest output (with EOS)
    blank_id = property(_blank_id)

    def __post_init__(self) -> None:
        checks = {
            **_transformer_checks(self),
            "d_model must be even (sinusoidal positions)": self.d_model % 2 == 0,
            "ffn_dim must be >= 1": self.ffn_dim >= 1,
            "encoder_layers and decoder_layers must be >= 1": self.encoder_layers >= 1 and self.decoder_layers >= 1,
            "max_positions must be >= 2": self.max_positions >= 2,
        }
        _validate(self, checks)


@round_trip
@dataclass(frozen=True)
class LossConfig:
    """Weights of the auxiliary losses and the step at which they switch on (stage two)."""

    lambda_fba: float = 0.1
    lambda_cc: float = 0.1
    aux_start_step: int = 0

    def __post_init__(self) -> None:
        if self.lambda_fba < 0 or self.lambda_cc < 0 or self.aux_start_step < 0:
            raise ValueError(f"LossConfig: weights and aux_start_step must be >= 0 (got {self})")


def _transformer_checks(config: Any) -> dict[str, bool]:
    """The checks REDER's and the AR Transformer's configs share: vocabulary, attention heads, regularisation."""
    return {
        "vocab_size must be > 4 (pad, unk, bos, eos, blank)": config.vocab_size > 4,
        "d_model must be >= 1": config.d_model >= 1,
        "d_model must be divisible by n_heads": config.n_heads >= 1 and config.d_model % config.n_heads == 0,
        "dropout must be in [0, 1)": 0.0 <= config.dropout < 1.0,
        "attention_dropout must be in [0, 1)": 0.0 <= config.attention_dropout < 1.0,
        "label_smoothing must be in [0, 1)": 0.0 <= config.label_smoothing < 1.0,
    }


def _validate(config: Any, checks: dict[str, bool]) -> None:
    """Raise ValueError naming the first failed check."""
    for message, ok in checks.items():
        if not ok:
            raise ValueError(f"{type(config).__name__}: {message} (got {config})")
