"""CTC pieces: batched Viterbi forced alignment and frame collapsing; padding and masks of ragged batches
(shared by the model, decoding and training). The CTC loss: reder/objectives/terms.py."""
import itertools
from typing import Optional

import torch

from reder.config import PAD_ID


def pad_batch(sequences: list[list[int]], device: str | torch.device = "cpu", end: Optional[int] = None,
              pin_memory: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) token tensor and (B,) lengths, with `end` (e.g. EOS) appended to each sequence if
    given. Built at once from the flattened ids (no loop over rows); `pin_memory` builds it in pinned host memory,
    and the copy to `device` does not block the host."""
    extra = int(end is not None)
    sizes = [len(s) for s in sequences]
    lengths = torch.tensor(sizes, dtype=torch.long) + extra
    flat = torch.tensor(list(itertools.chain.from_iterable(sequences)), dtype=torch.long)
    tokens = torch.full((len(sequences), max(sizes) + extra), PAD_ID, dtype=torch.long)
    tokens.masked_scatter_(valid_mask(lengths - extra, tokens.shape[1]), flat)
    if end is not None:
        tokens.scatter_(1, (lengths - 1)[:, None], end)
    if pin_memory:
        tokens, lengths = tokens.pin_memory(), lengths.pin_memory()
    return tokens.to(device, non_blocking=True), lengths.to(device, non_blocking=True)


def valid_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """(B,) lengths → (B, T) bool, True = real position."""
    return torch.arange(max_length, device=lengths.device)[None, :] < lengths[:, None]


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
    # The scores are kept in reversed state order, padded by two −inf: window j of `scores` is then
    # (stay, from s−1, from s−2) of state s = S−1−j, a view, and one max over it gives the best and its step
    # (ties to the earlier of stay, one, two). A frame past a sample's length must stay: its emission is 0
    # and the moves are closed, so its score carries over and its backpointer is 0 (the backtrack needs no mask).
    active = valid_mask(lengths, frames)  # (B, T)
    emit = emit.flip(2).masked_fill(~active[:, :, None], 0.0)  # (B, T, S) reversed states
    moves = torch.zeros(batch, 2, states, 3, dtype=emit.dtype, device=emit.device)  # (B, active?, S, 3)
    moves[:, 1, :, 2] = torch.where(can_skip.flip(1), 0.0, float("-inf"))
    moves[:, 0, :, 1:] = float("-inf")
    moves = moves[torch.arange(batch, device=emit.device)[:, None], active.long()]  # (B, T, S, 3)
    scores = torch.full((batch, states + 2), float("-inf"), dtype=emit.dtype, device=emit.device)
    first = max(states - 2, 0)
    scores[:, first:states] = emit[:, 0, first:]  # states 1, 0: a path starts with a blank or y1
    windows = scores.unfold(1, 3, 1)  # (B, S, 3) view: scores of s, s−1, s−2
    # Time-major, so that frame t's slot is contiguous like `best`: CUDA's max refuses outputs of unequal strides.
    backpointer = torch.zeros(frames, batch, states, dtype=torch.long, device=emit.device)  # reversed states
    best = torch.empty(batch, states, dtype=emit.dtype, device=emit.device)
    for t in range(1, frames):
        torch.max(windows + moves[:, t], dim=-1, out=(best, backpointer[t]))
        torch.add(best, emit[:, t], out=scores[:, :states])
    score = scores[:, :states].flip(1)  # (B, S) in state order
    last = 2 * target_lengths.long()  # final blank; the final label sits at last − 1
    ends = torch.stack([score.gather(1, last[:, None]), score.gather(1, (last - 1)[:, None])], dim=-1)[:, 0]  # (B, 2)
    path_score, which = ends.max(dim=-1)
    state = (states - 1 - (last - which))[:, None]  # (B, 1) reversed index
    path = torch.empty(batch, frames, dtype=torch.long, device=emit.device)  # reversed state per frame
    for t in range(frames - 1, 0, -1):
        path[:, t:t + 1] = state
        state = state + backpointer[t].gather(1, state)  # a step back in state order is one forward reversed
    path[:, :1] = state
    alignment = extended.flip(1).gather(1, path).masked_fill(~active, PAD_ID)
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
