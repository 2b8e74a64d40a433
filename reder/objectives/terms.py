"""The loss terms as equations on tensors (docs/DESIGN.md, "The model"): CTC, the DAG likelihood,
forward–backward agreement, glancing's choice of positions, NMLA's bag of n-grams and the CMLM's.
reder/objectives/outputs.py calls `ctc_loss`, `dag_loss` and `ctc_ngram_loss` for the heads;
reder/objectives/duplex.py combines them into REDER's objective; reder/objectives/directional.py masks the CMLM's
targets with `uniform_mask`."""
import math
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


def expected_ngram_counts(log_probs: torch.Tensor, lengths: torch.Tensor, grams: torch.Tensor, blank: int,
                          n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Under CTC's distribution over alignments (frames independent, log_probs (B, T, V), lengths (B,)), the expected
    number of times each n-gram of `grams` (B, J, n) occurs in the collapsed output (repeats merged, blanks
    dropped), (B, J), and the expected number of n-grams of the output, (B,); n is 1 or 2. In float64.

    Unigram v: a new v starts at frame t when a_t = v and a_{t−1} ≠ v, so E = Σ_t p_t(v)(1 − p_{t−1}(v)).
    Bigram (a, b): a output's consecutive tokens are the last frame s of a's run and the first frame t of b's,
    every frame between blank: E = Σ_{s<t} p_s(a) W(s, t) p_t(b), W(s, t) = Π_{s<k<t} p_k(blank), exact for a ≠ b;
    for a = b the pairs t = s + 1 are one merged a, not a bigram, and are taken off."""
    valid = valid_mask(lengths, log_probs.shape[1])
    probs = log_probs.double().exp() * valid[..., None]  # (B, T, V), zero past each length
    not_blank = torch.ones(probs.shape[-1], dtype=probs.dtype, device=probs.device)
    not_blank[blank] = 0.0
    adjacent = probs[:, :-1] * probs[:, 1:]  # (B, T−1, V): the same token at s and s + 1
    if n == 1:
        new = probs - F.pad(adjacent, (0, 0, 1, 0))  # (B, T, V): p_t(v)(1 − p_{t−1}(v))
        expected = new.sum(dim=1).gather(1, grams[..., 0])  # (B, J)
        return expected, (new.sum(dim=1) * not_blank).sum(dim=-1)
    if n != 2:
        raise ValueError(f"n-grams of n = 1 or 2, got {n}")
    cumulative = (log_probs[..., blank].double() * valid).cumsum(dim=1)  # (B, T): Σ_{k≤t} log p_k(blank)
    before = F.pad(cumulative[:, :-1], (1, 0))  # Σ_{k≤t−1}
    later = torch.ones(log_probs.shape[1], log_probs.shape[1], dtype=torch.bool, device=log_probs.device).triu(1)
    weights = (before[:, None, :] - cumulative[:, :, None]).masked_fill(~later, -math.inf).exp()  # (B, T, T): W(s, t)
    first = probs.gather(2, grams[..., 0][:, None, :].expand(-1, probs.shape[1], -1))  # (B, T, J): p_s(a)
    second = probs.gather(2, grams[..., 1][:, None, :].expand(-1, probs.shape[1], -1))  # (B, T, J): p_t(b)
    expected = (first * (weights @ second)).sum(dim=1)  # (B, J)
    merged = (first[:, :-1] * first[:, 1:]).sum(dim=1)  # (B, J): Σ_s p_s(a) p_{s+1}(a)
    expected = expected - torch.where(grams[..., 0] == grams[..., 1], merged, 0.0)
    words = (1.0 - probs[..., blank]) * valid  # (B, T): some word piece at t
    total = torch.einsum("bs,bst,bt->b", words, weights, words) - (adjacent * not_blank).sum(dim=(1, 2))
    return expected, total


def ctc_ngram_loss(log_probs: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor, target_lengths: torch.Tensor,
                   blank: int, n: int = 2) -> torch.Tensor:
    """NMLA's bag-of-n-grams loss (Shao & Feng 2022, "Non-monotonic latent alignments for CTC-based NAT"): the
    n-gram F-measure between the output's expected n-gram counts C_θ (`expected_ngram_counts`, every alignment
    counted) and the target's C_y, one minus it:

        loss = 1 − 2 Σ_g min(C_θ(g), C_y(g)) / (T_θ + T_y),   T = the number of n-grams (T_θ expected),

    mean over the samples whose target has an n-gram (targets (B, U) with EOS, which counts as a token). The
    official code's bigram loss is this minus one (the same gradients), its unigram loss this one."""
    batch, width = targets.shape
    count = (target_lengths - n + 1).clamp(min=0)  # (B,): T_y
    span = max(width - n + 1, 1)
    grams = torch.stack([F.pad(targets, (0, n))[:, k : k + span] for k in range(n)], dim=-1)  # (B, J, n)
    present = valid_mask(count, span)  # (B, J)
    code = grams[..., 0] * log_probs.shape[-1] + (grams[..., 1] if n == 2 else 0)  # one id per n-gram
    same = (code[:, :, None] == code[:, None, :]) & present[:, :, None] & present[:, None, :]  # (B, J, J)
    reference = same.sum(dim=-1).double()  # (B, J): C_y of each position's n-gram
    first = present & ~(same & torch.ones(span, span, dtype=torch.bool, device=targets.device).tril(-1)).any(dim=-1)
    expected, total = expected_ngram_counts(log_probs, lengths, grams, blank, n)
    match = (torch.minimum(expected, reference) * first).sum(dim=-1)  # (B,)
    kept = count > 0  # a masked mean: indexing by the mask would sync for its shape
    loss = (1.0 - 2.0 * match / (total + count).clamp(min=1e-9)) * kept
    return (loss.sum() / kept.sum().clamp(min=1)).to(log_probs.dtype)
