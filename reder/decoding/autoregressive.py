"""The autoregressive teacher's decoders (reder/autoregressive.py): `greedy` and `beam` (fairseq's beam search
with a greedy row beside the beams, so it never scores below greedy); hypotheses of at most
int(`max_len_a`·|x| + `max_len_b`) tokens with EOS, scored sum log-prob / len^`length_penalty` in the beam.
The same searches through CTranslate2: reder/decoding/ct2.py."""
from dataclasses import dataclass

import torch

from reder.autoregressive import Transformer
from reder.decoding.base import Decoder, check


@dataclass(frozen=True)
class TeacherGreedy(Decoder):
    name = "greedy"
    family = "transformer"
    max_len_a: float = 1.2
    max_len_b: int = 10

    def __post_init__(self) -> None:
        check(self, max_len_a=">= 0", max_len_b=">= 0")

    def decode(self, model: Transformer, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> list[list[int]]:
        return model.greedy(tokens, lengths, self.max_len_a, self.max_len_b)


@dataclass(frozen=True)
class TeacherBeam(Decoder):
    name = "beam"
    family = "transformer"
    beam_size: int = 4
    length_penalty: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10

    def __post_init__(self) -> None:
        check(self, beam_size=">= 1", length_penalty=">= 0", max_len_a=">= 0", max_len_b=">= 0")

    def decode(self, model: Transformer, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> list[list[int]]:
        if self.beam_size == 1:  # beam 1 is greedy
            return model.greedy(tokens, lengths, self.max_len_a, self.max_len_b)
        return [h for h, _ in model.beam_search(tokens, lengths, self.beam_size, self.length_penalty, self.max_len_a,
                                                self.max_len_b)]
