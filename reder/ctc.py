"""CTC pieces: the label-smoothed loss, batched Viterbi forced alignment, and frame collapsing; padding and
masks of ragged batches (shared by the model, decoding and training)."""
import torch
import torch.nn.functional as F

from reder.config import PAD_ID


def pad_batch(sequences: list[list[int]], device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) token tensor and (B,) lengths."""
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    tokens = torch.full((len(sequences), int(lengths.max())), PAD_ID, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        tokens[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
    return tokens.to(device), lengths.to(device)


def valid_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """(B,) lengths → (B, T) bool, True = real position."""
    return torch.arange(max_length, device=lengths.device)[None, :] < lengths[:, None]


def smoothed_ctc_loss(
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    targets: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    smoothing: float,
) -> torch.Tensor:
    """(1−ε)·CTC + ε·mean over valid frames of (−mean_v log p_v).

    CTC is `F.ctc_loss` with reduction "mean" (each sample's negative log-likelihood divided by its target
    length, then averaged over the batch) and `zero_infinity=True`; log_probs (B, T, V) float32.
    """
    nll = F.ctc_loss(
        log_probs.transpose(0, 1), targets, lengths, target_lengths, blank=blank, reduction="mean", zero_infinity=True
    )
    if smoothing == 0:
        return nll
    uniform = -log_probs.mean(dim=-1)[valid_mask(lengths, log_probs.shape[1])].mean()
    return (1 - smoothing) * nll + smoothing * uniform


def _extended_labels(targets: torch.Tensor, blank: int) -> torch.Tensor:
    """(B, U) → (B, 2U+1): blank, y1, blank, y2, …, yU, blank."""
    batch, length = targets.shape
    extended = torch.full((batch, 2 * length + 1), blank, dtype=torch.long, device=targets.device)
    extended[:, 1::2] = targets
    return extended


@torch.no_grad()
def viterbi_align(
    log_probs: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor, target_lengths: torch.Tensor, blank: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best CTC path of each target under log_probs (B, T, V).

    Returns the frame labels (B, T) (blanks included, PAD past each length), whether a path exists (B,),
    and the path's log-probability (B,) (−inf where none exists).
    """
    batch, frames, _ = log_probs.shape
    extended = _extended_labels(targets.long(), blank)  # (B, S)
    states = extended.shape[1]
    emit = log_probs.gather(2, extended[:, None, :].expand(batch, frames, states))  # (B, T, S)
    can_skip = torch.zeros_like(extended, dtype=torch.bool)
    can_skip[:, 2:] = (extended[:, 2:] != blank) & (extended[:, 2:] != extended[:, :-2])
    neg_inf = torch.tensor(float("-inf"), dtype=emit.dtype, device=emit.device)
    score = torch.full((batch, states), float("-inf"), dtype=emit.dtype, device=emit.device)
    score[:, :2] = emit[:, 0, :2]
    backpointer = torch.zeros(batch, frames, states, dtype=torch.uint8, device=emit.device)
    for t in range(1, frames):
        from_one = F.pad(score[:, :-1], (1, 0), value=float("-inf"))
        from_two = torch.where(can_skip, F.pad(score[:, :-2], (2, 0), value=float("-inf")), neg_inf)
        best, step = torch.stack([score, from_one, from_two], dim=-1).max(dim=-1)  # (B, S)
        active = (t < lengths)[:, None]
        score = torch.where(active, best + emit[:, t], score)
        backpointer[:, t] = step.to(torch.uint8)
    last = 2 * target_lengths.long()  # final blank; the final label sits at last − 1
    ends = torch.stack([score.gather(1, last[:, None]), score.gather(1, (last - 1)[:, None])], dim=-1)[:, 0]  # (B, 2)
    path_score, which = ends.max(dim=-1)
    state = last - which
    alignment = torch.full((batch, frames), PAD_ID, dtype=torch.long, device=emit.device)
    for t in range(frames - 1, -1, -1):
        active = t < lengths
        alignment[:, t] = torch.where(active, extended.gather(1, state[:, None])[:, 0], alignment[:, t])
        step = backpointer[:, t].gather(1, state[:, None])[:, 0].long()
        state = torch.where(active & (t > 0), state - step, state)
    return alignment, torch.isfinite(path_score), path_score


def collapse_frames(frames: torch.Tensor, lengths: torch.Tensor, blank: int, keep_blank: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge repeated frame labels (and drop blanks unless keep_blank): (B, T) → padded (B, T'), lengths (B,)."""
    valid = valid_mask(lengths, frames.shape[1])
    keep = valid.clone()
    keep[:, 1:] &= frames[:, 1:] != frames[:, :-1]
    if not keep_blank:
        keep &= frames != blank
    new_lengths = keep.sum(dim=1)
    position = torch.where(keep, keep.long().cumsum(dim=1) - 1, frames.shape[1])  # dropped frames go to a spill column
    out = torch.full((frames.shape[0], frames.shape[1] + 1), PAD_ID, dtype=frames.dtype, device=frames.device)
    out.scatter_(1, position, frames)
    width = max(int(new_lengths.max()), 1) if frames.shape[0] else 1
    return out[:, :width], new_lengths
