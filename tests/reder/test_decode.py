import itertools
import math

import torch

from reder.decode import ctc_beam_search, ctc_greedy, ctc_scores, strip_special
from tests.reder.test_ctc import _brute_force

BLANK = 3


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


def test_strip_special():
    assert strip_special([2, 5, 7, 9, 3, 8], blank=9) == [5, 7]
    assert strip_special([0, 5], blank=9) == [5]
