"""The CMLM's decoder (reder/cmlm.py): `mask_predict` with `iterations` T and `length_beam` candidate lengths
decoded in parallel, the best mean token log-probability winning. (Refining another decoder's output with a
CMLM is no decoder of its own: `translate_ids(..., refiner=cmlm, refine_steps=K)` after any.)"""
from dataclasses import dataclass

import torch

from reder.cmlm import CMLM
from reder.decoding.base import Decoder, check


@dataclass(frozen=True)
class MaskPredict(Decoder):
    name = "mask_predict"
    family = "cmlm"
    iterations: int = 10
    length_beam: int = 5

    def __post_init__(self) -> None:
        check(self, iterations=">= 1", length_beam=">= 1")

    def decode(self, model: CMLM, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> list[list[int]]:
        return [hypothesis for hypothesis, _ in model.mask_predict(tokens, lengths, self.iterations, self.length_beam)]
