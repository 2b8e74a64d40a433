import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from reder.ctc import collapse_frames, viterbi_align
from reder.objectives.terms import ctc_loss

BLANK = 3  # vocabulary {0, 1, 2} + blank


def _collapse(path):
    out = [t for i, t in enumerate(path) if i == 0 or t != path[i - 1]]
    return [t for t in out if t != BLANK]


def _brute_force(log_probs, target):
    """All frame paths mapping to target: (log-sum, best log-prob, best paths)."""
    frames, vocab = log_probs.shape
    scores = {}
    for path in itertools.product(range(vocab), repeat=frames):
        if _collapse(list(path)) == target:
            scores[path] = sum(log_probs[t, token].item() for t, token in enumerate(path))
    if not scores:
        return -math.inf, -math.inf, []
    best = max(scores.values())
    return torch.logsumexp(torch.tensor(list(scores.values()), dtype=torch.float64), 0).item(), best, [p for p, s in scores.items() if s == best]


CASES = [  # (frames, target)
    (5, [1, 2]),
    (6, [1, 1, 2]),  # a repeated label needs a blank between
    (4, [2]),
    (3, [0, 0]),
    (4, [1, 1, 1]),  # infeasible: needs 5 frames
]


def _batch():
    frames = max(f for f, _ in CASES)
    log_probs = torch.randn(len(CASES), frames, 4, dtype=torch.float64).log_softmax(-1)
    lengths = torch.tensor([f for f, _ in CASES])
    targets = torch.zeros(len(CASES), 3, dtype=torch.long)
    for row, (_, target) in enumerate(CASES):
        targets[row, : len(target)] = torch.tensor(target)
    return log_probs, lengths, targets, torch.tensor([len(t) for _, t in CASES])


def test_viterbi_alignment_equals_brute_force():
    log_probs, lengths, targets, target_lengths = _batch()
    alignment, feasible, score = viterbi_align(log_probs, lengths, targets, target_lengths, BLANK)
    for row, (frames, target) in enumerate(CASES):
        _, best, best_paths = _brute_force(log_probs[row, :frames], target)
        if best == -math.inf:
            assert not feasible[row] and score[row] == -math.inf
            continue
        assert feasible[row]
        assert abs(score[row].item() - best) < 1e-10
        path = alignment[row, :frames].tolist()
        assert tuple(path) in best_paths
        assert (alignment[row, frames:] == 0).all()  # padding past the length


def test_ctc_equals_brute_force_and_torch():
    log_probs, lengths, targets, target_lengths = _batch()
    feasible_rows = [r for r, (f, t) in enumerate(CASES) if _brute_force(log_probs[r, :f], t)[0] > -math.inf]
    expected = torch.tensor(
        [-_brute_force(log_probs[r, : CASES[r][0]], CASES[r][1])[0] / len(CASES[r][1]) for r in feasible_rows],
        dtype=torch.float64,
    ).mean()
    rows = torch.tensor(feasible_rows)
    ours = ctc_loss(log_probs[rows], lengths[rows], targets[rows], target_lengths[rows], BLANK, smoothing=0.0)
    reference = F.ctc_loss(log_probs[rows].transpose(0, 1), targets[rows], lengths[rows], target_lengths[rows], blank=BLANK)
    assert abs(ours.item() - expected.item()) < 1e-10
    assert abs(ours.item() - reference.item()) < 1e-10


def test_label_smoothing_term():
    log_probs, lengths, targets, target_lengths = _batch()
    eps = 0.1
    plain = ctc_loss(log_probs, lengths, targets, target_lengths, BLANK, smoothing=0.0)
    smoothed = ctc_loss(log_probs, lengths, targets, target_lengths, BLANK, smoothing=eps)
    frames = [-(log_probs[r, t].mean()) for r in range(len(CASES)) for t in range(lengths[r])]
    assert abs(smoothed.item() - ((1 - eps) * plain + eps * torch.stack(frames).mean()).item()) < 1e-10
    # the infeasible row contributes zero (zero_infinity) instead of inf
    assert torch.isfinite(plain)


@pytest.mark.parametrize("keep_blank", [False, True])
def test_collapse_frames(keep_blank):
    frames = torch.tensor([[1, 1, 3, 1, 2, 2, 3, 3], [3, 3, 0, 0, 0, 9, 9, 9]])
    lengths = torch.tensor([8, 4])
    tokens, token_lengths = collapse_frames(frames, lengths, blank=3, keep_blank=keep_blank)
    rows = [tokens[r, :n].tolist() for r, n in enumerate(token_lengths.tolist())]
    assert rows == ([[1, 3, 1, 2, 3], [3, 0]] if keep_blank else [[1, 1, 2], [0]])
    assert (tokens[1, token_lengths[1]:] == 0).all()


@torch.no_grad()
def _frame_by_frame_viterbi(log_probs, lengths, targets, target_lengths, blank):
    """viterbi_align as it once was (a masked update and a masked backtrack step per frame): the
    reference for ties, which decide the layout glancing and FBA train on."""
    batch, frames, _ = log_probs.shape
    extended = torch.full((batch, 2 * targets.shape[1] + 1), blank, dtype=torch.long)
    extended[:, 1::2] = targets
    states = extended.shape[1]
    emit = log_probs.gather(2, extended[:, None, :].expand(batch, frames, states))
    can_skip = torch.zeros_like(extended, dtype=torch.bool)
    can_skip[:, 2:] = (extended[:, 2:] != blank) & (extended[:, 2:] != extended[:, :-2])
    score = torch.full((batch, states), -math.inf, dtype=emit.dtype)
    score[:, :2] = emit[:, 0, :2]
    backpointer = torch.zeros(batch, frames, states, dtype=torch.uint8)
    for t in range(1, frames):
        from_one = F.pad(score[:, :-1], (1, 0), value=-math.inf)
        from_two = torch.where(can_skip, F.pad(score[:, :-2], (2, 0), value=-math.inf), torch.tensor(-math.inf, dtype=emit.dtype))
        best, step = torch.stack([score, from_one, from_two], dim=-1).max(dim=-1)
        score = torch.where((t < lengths)[:, None], best + emit[:, t], score)
        backpointer[:, t] = step.to(torch.uint8)
    last = 2 * target_lengths.long()
    path_score, which = torch.stack([score.gather(1, last[:, None]), score.gather(1, (last - 1)[:, None])], -1)[:, 0].max(-1)
    state = last - which
    alignment = torch.full((batch, frames), 0, dtype=torch.long)
    for t in range(frames - 1, -1, -1):
        active = t < lengths
        alignment[:, t] = torch.where(active, extended.gather(1, state[:, None])[:, 0], alignment[:, t])
        step = backpointer[:, t].gather(1, state[:, None])[:, 0].long()
        state = torch.where(active & (t > 0), state - step, state)
    return alignment, torch.isfinite(path_score), path_score


@pytest.mark.parametrize("seed", range(4))
def test_viterbi_alignment_breaks_ties_as_the_frame_by_frame_loop(seed):
    """Log-probs from three values (most paths tie), repeated labels, frames from a label count to twice it,
    infeasible rows, a one-frame row and a one-label target: the same alignment, feasibility and score."""
    generator = torch.Generator().manual_seed(seed)
    batch, vocab = 12, 4
    target_lengths = torch.randint(1, 5, (batch,), generator=generator)
    target_lengths[0] = 1
    targets = torch.randint(0, 3, (batch, int(target_lengths.max())), generator=generator)
    targets[1, :2] = 1  # a repeat: needs a blank between
    lengths = (target_lengths + torch.randint(-1, 5, (batch,), generator=generator)).clamp_min(1)
    lengths[0] = 1
    choice = torch.randint(0, 3, (batch, int(lengths.max()), vocab), generator=generator)
    log_probs = torch.tensor([-0.5, -1.0, -2.0], dtype=torch.float64)[choice]
    ours = viterbi_align(log_probs, lengths, targets, target_lengths, BLANK)
    reference = _frame_by_frame_viterbi(log_probs, lengths, targets, target_lengths, BLANK)
    assert not reference[1].all() and reference[1].any()  # both kinds of rows
    assert ours[0].tolist() == reference[0].tolist()
    assert ours[1].tolist() == reference[1].tolist()
    torch.testing.assert_close(ours[2], reference[2], rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_viterbi_alignment_on_cuda_equals_the_cpu(dtype):
    """CUDA's max with `out=` refuses a values and an indices tensor of unequal strides (the bf16 train stage failed
    on it once stage two switched on: `reduce_op(): expected both outputs to have same strides`); the alignment,
    feasibility and score on the GPU are the CPU's."""
    generator = torch.Generator().manual_seed(0)
    batch, vocab = 12, 4
    target_lengths = torch.randint(1, 6, (batch,), generator=generator)
    targets = torch.randint(0, 3, (batch, int(target_lengths.max())), generator=generator)
    lengths = (2 * target_lengths + torch.randint(-2, 4, (batch,), generator=generator)).clamp_min(1)
    log_probs = torch.randn(batch, int(lengths.max()), vocab, generator=generator, dtype=dtype).log_softmax(-1)
    expected = viterbi_align(log_probs, lengths, targets, target_lengths, BLANK)
    on_cuda = viterbi_align(log_probs.cuda(), lengths.cuda(), targets.cuda(), target_lengths.cuda(), BLANK)
    assert expected[1].any()
    assert on_cuda[0].tolist() == expected[0].tolist()
    assert on_cuda[1].tolist() == expected[1].tolist()
    torch.testing.assert_close(on_cuda[2].cpu(), expected[2])
