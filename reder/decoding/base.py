"""What every decoder is: a small frozen dataclass, registered by `name` for one `family` of models, whose fields
are its options (checked when it is built), and which turns a padded batch into one hypothesis per sentence.

A decoder's family says which models it decodes: `ctc` and `dag` (a REDER with that head), `transformer` (the
autoregressive teacher), `cmlm`, and `ct2` (a teacher converted to CTranslate2, `Ct2Model`). The same name may
mean one method in each family (`greedy`, `beam`); reder/decoding/__init__.py holds the registry.
"""
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Iterator, Optional

import torch

from reder.autoregressive import Transformer
from reder.cmlm import CMLM
from reder.ctc import pad_batch
from reder.model import REDER


@dataclass(frozen=True)
class Ct2Model:
    """A teacher converted to CTranslate2 (reder/ct2.py): its translator and the converted directory."""

    translator: Any
    directory: Path
    max_positions: int

    def max_input_length(self) -> int:
        return self.max_positions


Model = REDER | Transformer | CMLM | Ct2Model


def family_of(model: Model) -> str:
    """The decoder family of a model: its head's name for a REDER, else its kind."""
    if isinstance(model, REDER):
        return model.cfg.head
    if isinstance(model, CMLM):  # before Transformer: both are encoder–decoders
        return "cmlm"
    if isinstance(model, Transformer):
        return "transformer"
    if isinstance(model, Ct2Model):
        return "ct2"
    raise TypeError(f"no decoder decodes a {type(model).__name__}")


def length_batches(sequences: list[list[int]], batch_size: int,
                   device: torch.device) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """`sequences` in length-sorted batches of `batch_size`: each batch's indices into `sequences`, its padded
    tokens (B, T) and lengths (B,) on `device` (what every decoding loop of this package walks)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        yield (chunk, *pad_batch([sequences[i] for i in chunk], device))


@dataclass(frozen=True)
class Decoder(ABC):
    """One decoding method with its options (the dataclass fields). Subclasses set `name` and `family`, check
    their options in `__post_init__` (ValueError naming the option), and fill in `decode`."""

    name: ClassVar[str]
    family: ClassVar[str]

    @abstractmethod
    def decode(self, model: Model, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> list[list[int]]:
        """A padded batch (B, T) of ids ending in EOS → one hypothesis per sentence (ids without specials)."""

    def decode_sequences(self, model: Model, sequences: list[list[int]], direction: str,
                         batch_size: int) -> list[list[int]]:
        """`decode` over length-sorted batches of `sequences` (each ending in EOS); outputs in input order."""
        outputs: list[list[int]] = [[] for _ in sequences]
        for chunk, tokens, lengths in length_batches(sequences, batch_size, next(model.parameters()).device):
            for index, hypothesis in zip(chunk, self.decode(model, tokens, lengths, direction)):
                outputs[index] = hypothesis
        return outputs

    def limits(self) -> list[tuple[int, str]]:
        """The input lengths (pieces with EOS) that models this decoder brings along read (a reranking teacher),
        each with what it is."""
        return []

    def options(self) -> dict[str, Any]:
        """The options as given (a model they hold is named by its class)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def check(decoder: Decoder, **conditions: str) -> None:
    """Raise ValueError for the first option that breaks its condition (">= 1", ">= 0", "in (0, 1]")."""
    for key, condition in conditions.items():
        value = getattr(decoder, key)
        ok = {">= 1": lambda v: v >= 1, ">= 0": lambda v: v >= 0, "in (0, 1]": lambda v: 0 < v <= 1}[condition]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise ValueError(f"decoder {decoder.name!r}: {key} must be {condition}, got {value!r}")


def optional_model(decoder: Decoder, key: str, kind: type, what: str) -> Optional[Any]:
    """The model option `key` when set, checked to be a `kind`."""
    value = getattr(decoder, key)
    if value is not None and not isinstance(value, kind):
        raise ValueError(f"decoder {decoder.name!r}: {key} must be {what}, got a {type(value).__name__}")
    return value
