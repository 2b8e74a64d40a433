"""CTC decoders: batched greedy, and prefix beam search with exact rescoring of its n-best."""
import math
from collections import defaultdict

import torch
import torch.nn.functional as F

from reder.config import BOS_ID, EOS_ID, PAD_ID
from reder.ctc import collapse_frames


def strip_special(tokens: list[int], blank: int) -> list[int]:
    """A hypothesis as the user sees it: cut at the first EOS, drop pad, BOS and blank."""
    if EOS_ID in tokens:
        tokens = tokens[: tokens.index(EOS_ID)]
    return [t for t in tokens if t not in (PAD_ID, BOS_ID, blank)]


def ctc_greedy(log_probs: torch.Tensor, lengths: torch.Tensor, blank: int) -> list[list[int]]:
    """Per-frame argmax, repeats merged, blanks dropped: raw label sequences (EOS kept)."""
    tokens, token_lengths = collapse_frames(log_probs.argmax(dim=-1), lengths, blank, keep_blank=False)
    return [row[:n].tolist() for row, n in zip(tokens, token_lengths.tolist())]


def ctc_scores(log_probs: torch.Tensor, length: int, candidates: list[list[int]], blank: int) -> list[float]:
    """Length-normalised exact CTC log-likelihood, log P(y|x) / max(1, |y|), of each candidate under one
    sentence's log_probs (T, V), all candidates in one batched forward pass."""
    n = len(candidates)
    width = max(1, max(len(c) for c in candidates))
    targets = torch.zeros(n, width, dtype=torch.long)
    for row, candidate in enumerate(candidates):
        targets[row, : len(candidate)] = torch.tensor(candidate, dtype=torch.long)
    frames = log_probs[:length].float()[:, None, :].expand(length, n, log_probs.shape[-1])  # (T, N, V)
    nll = F.ctc_loss(
        frames,
        targets.to(log_probs.device),
        torch.full((n,), length, dtype=torch.long),
        torch.tensor([len(c) for c in candidates], dtype=torch.long),
        blank=blank,
        reduction="none",
        zero_infinity=False,
    )
    return [-value / max(1, len(c)) for value, c in zip(nll.tolist(), candidates)]


def _log_add(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    high, low = (a, b) if a > b else (b, a)
    return high + math.log1p(math.exp(low - high))


def _prefix_search(frame_candidates: list[list[tuple[int, float]]], blank: int, beam_size: int) -> list[tuple[int, ...]]:
    """CTC prefix beam search over the given per-frame (token, log-prob) candidates; returns the final beam."""
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
    return list(beams)


@torch.no_grad()
def ctc_nbest(
    log_probs: torch.Tensor, lengths: torch.Tensor, blank: int, beam_size: int
) -> list[list[tuple[list[int], float]]]:
    """Prefix beam search, batched over sentences: per sentence up to `beam_size` (raw labels, normalised
    score), best first (equal scores keep the search's order), without label sequences of probability 0.

    Each frame considers its top-`beam_size` tokens (with beam 1 this is exactly greedy decoding). The
    final beam plus the greedy hypothesis are rescored by the exact length-normalised CTC likelihood, so the
    best entry never scores below greedy.
    """
    k = min(beam_size, log_probs.shape[-1])
    top_log_probs, top_tokens = log_probs.float().topk(k, dim=-1)  # (B, T, k)
    greedy = ctc_greedy(log_probs, lengths, blank)
    results = []
    for index, length in enumerate(lengths.tolist()):
        frame_candidates = [
            list(zip(tokens, values))
            for tokens, values in zip(top_tokens[index, :length].tolist(), top_log_probs[index, :length].tolist())
        ]
        beam = _prefix_search(frame_candidates, blank, beam_size)
        pool = list(dict.fromkeys([*beam, tuple(greedy[index])]))  # greedy joins the n-best, duplicates merged
        candidates = [list(p) for p in pool]
        scores = ctc_scores(log_probs[index], length, candidates, blank)
        ranked = sorted(range(len(candidates)), key=lambda i: -scores[i])[:beam_size]  # stable: ties keep pool order
        ranked = [i for i in ranked if scores[i] > -math.inf] or ranked[:1]  # drop prefixes no alignment reaches
        results.append([(candidates[i], scores[i]) for i in ranked])
    return results


def ctc_beam_search(
    log_probs: torch.Tensor, lengths: torch.Tensor, blank: int, beam_size: int
) -> list[tuple[list[int], float]]:
    """The best entry of `ctc_nbest` per sentence: (raw labels, normalised score); never below greedy."""
    return [nbest[0] for nbest in ctc_nbest(log_probs, lengths, blank, beam_size)]
