"""The teacher's `greedy` and `beam` through CTranslate2 (reder/ct2.py; an optional extra, imported only here
when a decoder runs): `mirror` (the default) reproduces our search's outputs (`reder.ct2.translate_ids`),
otherwise CTranslate2 runs as one runs it (`translate_plain`). Options as reder/decoding/autoregressive.py's."""
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from reder.decoding.base import Ct2Model, Decoder, check


def ct2_model(ct2_dir: Path, device: str = "cpu", threads: int = 1) -> Ct2Model:
    """A converted teacher (`reder.ct2.convert`) loaded for the ct2 decoders."""
    from reder.ct2 import load_translator

    max_positions = json.loads((Path(ct2_dir) / "reder.json").read_text(encoding="utf-8"))["max_positions"]
    return Ct2Model(load_translator(Path(ct2_dir), device, threads), Path(ct2_dir), max_positions)


@dataclass(frozen=True)
class Ct2Greedy(Decoder):
    name = "greedy"
    family = "ct2"
    max_len_a: float = 1.2
    max_len_b: int = 10
    mirror: bool = True
    beam_size = 1
    length_penalty = 1.0

    def __post_init__(self) -> None:
        check(self, beam_size=">= 1", length_penalty=">= 0", max_len_a=">= 0", max_len_b=">= 0")

    def decode(self, model: Ct2Model, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> list[list[int]]:
        return self.decode_sequences(model, [row[:n] for row, n in zip(tokens.tolist(), lengths.tolist())], direction,
                                     len(lengths))

    def decode_sequences(self, model: Ct2Model, sequences: list[list[int]], direction: str,
                         batch_size: int) -> list[list[int]]:
        from reder.ct2 import translate_ids, translate_plain

        search = translate_ids if self.mirror else translate_plain
        return search(model.translator, model.directory, sequences, self.beam_size, self.length_penalty,
                      self.max_len_a, self.max_len_b, batch_size=batch_size)


@dataclass(frozen=True)
class Ct2Beam(Ct2Greedy):
    name = "beam"
    beam_size: int = 4
    length_penalty: float = 1.0
