"""The loss terms as equations on tensors (docs/DESIGN.md, "The model"): CTC, the DAG likelihood,
forward–backward agreement, glancing's choice of positions and the CMLM's. The heads call `ctc_loss` and
`dag_loss`; reder/objectives/duplex.py combines them into REDER's objective; reder/objectives/directional.py
masks the CMLM's targets with `uniform_mask`."""
from typing import Optional

import torch
import torch.nn.functional as F

from reder.ctc import valid_mask
from reder.dag import dag_log_likelihood, target_emissions


def ctc_loss(
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    targets: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    smoothing: float,
) -> torch.Tensor:
    """Label-smoothed CTC: (1−ε)·CTC + ε·mean over valid frames of (−mean_v log p_v).

    CTC = mean over samples of −log Σ_{a ∈ B⁻¹(y)} Π_t p(a_t | x) / |y|, B collapsing repeats and dropping
    blanks: `F.ctc_loss` with reduction "mean" and `zero_infinity=True`; log_probs (B, T, V) float32.
    """
    nll = F.ctc_loss(
        log_probs.transpose(0, 1), targets, lengths, target_lengths, blank=blank, reduction="mean", zero_infinity=True
    )
    if smoothing == 0:
        return nll
    valid = valid_mask(lengths, log_probs.shape[1])  # a masked mean: indexing by the mask would sync for its shape
    uniform = -(log_probs.mean(dim=-1) * valid).sum() / valid.sum()
    return (1 - smoothing) * nll + smoothing * uniform


def dag_loss(
    log_edges: torch.Tensor, log_probs: torch.Tensor, graph_lengths: torch.Tensor, targets: torch.Tensor, target_lengths: torch.Tensor,
    dp: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """DA-Transformer's loss: mean over samples of −log P(Y|X)/|Y|, with
    P(Y|X) = Σ over paths 0 = a_1 < … < a_M = L − 1 of Π_i E_{a_{i−1} a_i} · Π_i P(y_i | v_{a_i}),
    and how many samples were dropped because their graph has fewer vertices than Y has tokens (they have no
    path; they are left out, not given a zero loss). `dp`: `model.dag_dp` (reder.dag.resolve_dp)."""
    feasible = graph_lengths >= target_lengths
    dropped = (~feasible).sum()
    if not bool(feasible.any()):  # keep the graph connected (DDP) without a NaN from 0·(−inf)
        return log_probs.sum() * 0.0 + log_edges.masked_fill(~torch.isfinite(log_edges), 0.0).sum() * 0.0, dropped
    keep = feasible.nonzero()[:, 0]
    emissions = target_emissions(log_probs[keep], targets[keep, : int(target_lengths[keep].max())])  # (B', M, L)
    log_likelihood = dag_log_likelihood(log_edges[keep], emissions, graph_lengths[keep], target_lengths[keep], dp=dp)
    return (-log_likelihood / target_lengths[keep]).mean(), dropped


def forward_backward_agreement(
    forward_states: list[torch.Tensor], reverse_states: list[torch.Tensor], mask: torch.Tensor
) -> torch.Tensor:
    """FBA: mean over states k and valid positions t of 1 − cos(H→_k,t, sg(H←_k,t)) on the full 2D vectors.

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


def uniform_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """CMLM's training mask (B, width), True = masked: per row n ~ U{1..length} positions, chosen uniformly
    without replacement among its first `length` (none for an empty row)."""
    valid = valid_mask(lengths, width)
    draws = torch.rand(lengths.shape[0], width, device=lengths.device).masked_fill(~valid, 2.0)
    ranks = draws.argsort(dim=1).argsort(dim=1)  # (B, width): a random order of the real positions first
    counts = (torch.rand(lengths.shape[0], device=lengths.device) * lengths).long() + 1  # uniform in 1..length
    counts = torch.minimum(counts, lengths)
    return ranks < counts[:, None]
