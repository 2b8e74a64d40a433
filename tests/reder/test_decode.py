import itertools
import math

import torch

from reder.decode import ctc_beam_search, ctc_greedy, ctc_nbest, ctc_scores, strip_special
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
