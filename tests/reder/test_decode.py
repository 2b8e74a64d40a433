"""CTC decoding: greedy, the batched tensor prefix beam search against the per-sentence Python reference it
replaced, exact rescoring, and the per-frame cutoffs."""
import itertools
import math
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F

from reder.config import CUTOFF_PROB, CUTOFF_TOP_N
from reder.decode import (ctc_beam_search, ctc_greedy, ctc_log_likelihoods, ctc_nbest, ctc_scores, frame_candidates,
                          prefix_beam_search, strip_special)
from tests.reder.test_ctc import _brute_force

BLANK = 3


def _log_add(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    high, low = (a, b) if a > b else (b, a)
    return high + math.log1p(math.exp(low - high))


def reference_prefix_search(frame_candidates: list[list[tuple[int, float]]], blank: int, beam_size: int) -> list[tuple[int, ...]]:
    """The per-sentence Python prefix beam search that `prefix_beam_search` replaced (the test reference):
    per frame its (token, log-prob) candidates; returns the final beam, best first."""
    beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, -math.inf)}  # prefix → (log p_blank, log p_label)
    for candidates in frame_candidates:
        grown: dict[tuple[int, ...], list[float]] = defaultdict(lambda: [-math.inf, -math.inf])
        for prefix, (p_blank, p_label) in beams.items():
            total = _log_add(p_blank, p_label)
            last = prefix[-1] if prefix else None
            for token, log_prob in candidates:
                if token == blank:
                    grown[prefix][0] = _log_add(grown[prefix][0], total + log_prob)
                elif token == last:
                    grown[prefix][1] = _log_add(grown[prefix][1], p_label + log_prob)  # repeat merges
                    extended = grown[prefix + (token,)]
                    extended[1] = _log_add(extended[1], p_blank + log_prob)  # a blank separated them
                else:
                    extended = grown[prefix + (token,)]
                    extended[1] = _log_add(extended[1], total + log_prob)
        ranked = sorted(grown.items(), key=lambda item: _log_add(*item[1]), reverse=True)[:beam_size]
        beams = {prefix: (p_blank, p_label) for prefix, (p_blank, p_label) in ranked}
    return [prefix for prefix, scores in beams.items() if _log_add(*scores) > -math.inf]


def _reference_beams(log_probs, lengths, blank, beam_size, cutoff_top_n, cutoff_prob):
    tokens, values = frame_candidates(log_probs, cutoff_top_n, cutoff_prob)
    beams = []
    for row, length in enumerate(lengths.tolist()):
        frames = [[(t, v) for t, v in zip(ts, vs) if v > -math.inf]
                  for ts, vs in zip(tokens[row, :length].tolist(), values[row, :length].tolist())]
        beams.append([list(p) for p in reference_prefix_search(frames, blank, beam_size)])
    return beams


@pytest.mark.parametrize("beam_size, cutoff_top_n, cutoff_prob", [(4, 4, 1.0), (8, 5, 1.0), (6, 40, 0.9), (20, 20, 1.0)])
def test_tensor_prefix_search_equals_the_python_reference(beam_size, cutoff_top_n, cutoff_prob):
    log_probs = (torch.randn(24, 14, 7) * 2).log_softmax(-1)
    lengths = torch.randint(1, 15, (24,))
    lengths[0] = 14
    tokens, values = frame_candidates(log_probs, cutoff_top_n, cutoff_prob)
    ours = prefix_beam_search(tokens, values, lengths, blank=6, beam_size=beam_size)
    assert ours == _reference_beams(log_probs, lengths, 6, beam_size, cutoff_top_n, cutoff_prob)
    assert max(len(beam) for beam in ours) == beam_size


def test_frame_candidates_cut_at_top_n_and_at_the_cumulative_probability():
    log_probs = torch.tensor([[[0.5, 0.3, 0.15, 0.05]]]).log()
    tokens, values = frame_candidates(log_probs, cutoff_top_n=3)
    assert tokens.tolist() == [[[0, 1, 2]]] and torch.isfinite(values).all()
    _, values = frame_candidates(log_probs, cutoff_top_n=4, cutoff_prob=0.8)
    assert torch.isfinite(values).tolist() == [[[True, True, False, False]]]  # 0.5 + 0.3 reaches 0.8
    _, values = frame_candidates(log_probs, cutoff_top_n=4, cutoff_prob=0.1)
    assert torch.isfinite(values).tolist() == [[[True, False, False, False]]]  # the most likely always stays
    assert (CUTOFF_TOP_N, CUTOFF_PROB) == (40, 1.0)
    with pytest.raises(ValueError, match="cutoff"):
        frame_candidates(log_probs, cutoff_top_n=0)


def test_batched_log_likelihoods_equal_full_vocabulary_ctc_loss():
    log_probs = torch.randn(3, 9, 6).log_softmax(-1)
    lengths = torch.tensor([9, 6, 4])
    rows = torch.tensor([0, 0, 1, 2, 2, 1])
    targets = [[1, 1, 2], [], [4, 4, 4], [0, 2, 0, 1, 3], [2], [1, 2, 1, 2]]
    ours = ctc_log_likelihoods(log_probs, lengths, rows, targets, blank=5)
    for row, target, score in zip(rows.tolist(), targets, ours):
        nll = F.ctc_loss(log_probs[row, : lengths[row]][:, None], torch.tensor([target + [0]]), lengths[row : row + 1],
                         torch.tensor([len(target)]), blank=5, reduction="sum")
        assert score == pytest.approx(-nll.item() / max(1, len(target)), abs=1e-5) or score == -nll.item() == -math.inf
    assert ours[3] == -math.inf  # 5 labels cannot come out of 4 frames


def _peaky(batch, frames, vocab):
    return (torch.randn(batch, frames, vocab) * 3).log_softmax(-1)


def test_beam_one_equals_greedy():
    log_probs = _peaky(16, 12, 6)
    lengths = torch.randint(1, 13, (16,))
    greedy = ctc_greedy(log_probs, lengths, blank=5)
    beam = [labels for labels, _ in ctc_beam_search(log_probs, lengths, blank=5, beam_size=1)]
    assert beam == greedy


def test_larger_beam_never_scores_worse_than_greedy():
    log_probs = torch.randn(24, 10, 5).log_softmax(-1)  # flat distributions: greedy is often not the best
    lengths = torch.full((24,), 10)
    greedy = ctc_greedy(log_probs, lengths, blank=4)
    results = ctc_beam_search(log_probs, lengths, blank=4, beam_size=8)
    improved = 0
    for row, (labels, score) in enumerate(results):
        greedy_score = ctc_scores(log_probs[row], 10, [greedy[row]], blank=4)[0]
        assert score >= greedy_score - 1e-6
        assert abs(ctc_scores(log_probs[row], 10, [labels], blank=4)[0] - score) < 1e-6
        improved += score > greedy_score + 1e-6
    assert improved > 0  # the search does find better hypotheses than greedy on these inputs


def test_unpruned_beam_finds_the_exact_best_label_sequence():
    log_probs = torch.randn(3, 4, 4, dtype=torch.float64).log_softmax(-1)
    lengths = torch.tensor([4, 4, 3])
    results = ctc_beam_search(log_probs, lengths, blank=BLANK, beam_size=500)
    for row, (labels, score) in enumerate(results):
        frames = lengths[row].item()
        best = -math.inf
        for size in range(frames + 1):
            for target in itertools.product(range(3), repeat=size):
                log_likelihood = _brute_force(log_probs[row, :frames], list(target))[0]
                best = max(best, log_likelihood / max(1, size))
        assert abs(score - best) < 1e-6


def test_nbest_is_best_first_exactly_scored_and_led_by_the_beam_search_result():
    log_probs = torch.randn(12, 9, 6).log_softmax(-1)
    lengths = torch.randint(1, 10, (12,))
    nbest = ctc_nbest(log_probs, lengths, blank=5, beam_size=4)
    best = ctc_beam_search(log_probs, lengths, blank=5, beam_size=4)
    greedy = ctc_greedy(log_probs, lengths, blank=5)
    for row, entries in enumerate(nbest):
        labels = [list(e[0]) for e in entries]
        scores = [e[1] for e in entries]
        assert entries[0] == best[row]
        assert 1 <= len(entries) <= 4 and len({tuple(x) for x in labels}) == len(labels)
        assert scores == sorted(scores, reverse=True)
        exact = ctc_scores(log_probs[row], lengths[row].item(), labels, blank=5)
        assert all(abs(s - e) < 1e-6 for s, e in zip(scores, exact))
        greedy_score = ctc_scores(log_probs[row], lengths[row].item(), [greedy[row]], blank=5)[0]
        assert greedy[row] in labels or scores[-1] >= greedy_score - 1e-6  # greedy joined the pool
    assert max(len(entries) for entries in nbest) == 4


def test_unpruned_nbest_is_the_exact_top_n():
    log_probs = torch.randn(2, 4, 4, dtype=torch.float64).log_softmax(-1)
    lengths = torch.tensor([4, 3])
    nbest = ctc_nbest(log_probs, lengths, blank=BLANK, beam_size=500)  # 3 labels, <= 4 frames: nothing is pruned
    for row, entries in enumerate(nbest):
        frames = lengths[row].item()
        every = []
        for size in range(frames + 1):
            for target in itertools.product(range(3), repeat=size):
                log_likelihood = _brute_force(log_probs[row, :frames], list(target))[0]
                if log_likelihood > -math.inf:
                    every.append(log_likelihood / max(1, size))
        every.sort(reverse=True)
        assert len(entries) == len(every)
        assert all(abs(s - e) < 1e-6 for (_, s), e in zip(entries, every))


def test_strip_special():
    assert strip_special([2, 5, 7, 9, 3, 8], blank=9) == [5, 7]
    assert strip_special([0, 5], blank=9) == [5]
