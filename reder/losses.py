"""Auxiliary losses of REDER and the module a trainer wraps in DistributedDataParallel."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from reder.config import DIRECTIONS


def glance_mask(layout: torch.Tensor, candidates: torch.Tensor, predicted: torch.Tensor, ratio: float,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """GLAT's number-random glancing: per sentence, n = ⌊ratio · d + 0.5⌋ of its candidate positions, d the
    candidates where the first pass's prediction differs from the aligned target (`layout`), drawn uniformly
    without replacement. layout, predicted (B, T) ids, candidates (B, T) bool → the glanced positions (B, T)."""
    wrong = (candidates & (predicted != layout)).sum(dim=1)  # (B,)
    count = torch.floor(ratio * wrong.to(torch.float64) + 0.5).long()
    draw = torch.rand(layout.shape, generator=generator, device=layout.device if generator is None else "cpu")
    draw = draw.to(layout.device).masked_fill(~candidates, 2.0)  # non-candidates rank last
    rank = draw.argsort(dim=1).argsort(dim=1)  # (B, T): each position's place in its sentence's random order
    return candidates & (rank < count[:, None])


def forward_backward_agreement(
    forward_states: list[torch.Tensor], reverse_states: list[torch.Tensor], mask: torch.Tensor
) -> torch.Tensor:
    """Mean over states and valid positions of 1 − cos(H→, sg(H←)) on the full 2D vectors.

    forward_states[k] and reverse_states[k] are (B, T, 2D) and already lined up; mask (B, T) bool.
    """
    if len(forward_states) != len(reverse_states):
        raise ValueError(f"{len(forward_states)} forward states but {len(reverse_states)} reverse states")
    valid = mask.sum().clamp_min(1)  # no valid position: the sum is 0, so 0 (no `valid == 0` test: a sync)
    total = forward_states[0].new_zeros(())
    for forward, reverse in zip(forward_states, reverse_states):
        cosine = F.cosine_similarity(forward, reverse.detach(), dim=-1)  # (B, T)
        total = total + ((1.0 - cosine) * mask).sum()
    return total / (valid * len(forward_states))


class DuplexLoss(nn.Module):
    """`forward` = `model.loss(...)`, so DDP (which hooks `forward`) can wrap the training objective.

    `tgt2src_batch` (src, src_lengths, tgt, tgt_lengths) gives tgt2src its own pairs (sequence-level KD:
    src2tgt learns (x, teacher(x)), tgt2src learns (teacher(y), y)); both directions still go through one
    forward call, so DDP sees every parameter used in every update. `directions` default to the model's
    loss config's (a simplex model trains one; DDP then needs find_unused_parameters, pipeline/raytrain.py)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        tgt_tokens: torch.Tensor,
        tgt_lengths: torch.Tensor,
        step: int,
        directions: Optional[tuple[str, ...]] = None,
        tgt2src_batch: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = None,
    ) -> dict[str, torch.Tensor]:
        directions = self.model.loss_config.directions if directions is None else directions
        if tgt2src_batch is None:
            return self.model.loss(src_tokens, src_lengths, tgt_tokens, tgt_lengths, step, directions)
        batches = {"src2tgt": (src_tokens, src_lengths, tgt_tokens, tgt_lengths), "tgt2src": tgt2src_batch}
        parts = [self.model.loss(*batches[d], step, (d,)) for d in DIRECTIONS if d in directions]
        return {**{k: v for part in parts for k, v in part.items()}, "total": sum(part["total"] for part in parts)}
