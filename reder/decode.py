"""CTC decoders: batched greedy, and a batched tensor prefix beam search with exact rescoring of its n-best."""
import math

import torch
import torch.nn.functional as F

from reder.config import BOS_ID, CUTOFF_PROB, CUTOFF_TOP_N, EOS_ID, PAD_ID
from reder.ctc import collapse_frames

HASH_BASES = (1_000_003, 998_244_353)  # two polynomial hashes of a prefix, each mod HASH_MODULUS
HASH_MODULUS = 2_147_483_647  # 2^31 − 1: a hash times a base stays inside int64


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
    sentence's log_probs (T, V)."""
    rows = torch.zeros(len(candidates), dtype=torch.long)
    return ctc_log_likelihoods(log_probs[None], torch.tensor([length]), rows, candidates, blank)


def ctc_log_likelihoods(log_probs: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor,
                        targets: list[list[int]], blank: int) -> list[float]:
    """log P(targets[n] | frames of sentence rows[n]) / max(1, |targets[n]|) under log_probs (B, T, V), all
    in one F.ctc_loss (−inf where no alignment exists).

    Only the blank and each target's own labels are gathered, (N, T, 1 + U) instead of (N, T, V): label j
    gets column 1 + the index where its run of equal labels starts, so equal neighbours still need a blank
    between them, and the likelihood is exactly the full-vocabulary one."""
    count, frames = len(targets), log_probs.shape[1]
    width = max(1, max((len(t) for t in targets), default=1))
    labels = torch.zeros(count, width, dtype=torch.long)
    for row, target in enumerate(targets):
        labels[row, : len(target)] = torch.tensor(target, dtype=torch.long)
    device = log_probs.device
    labels, rows = labels.to(device), rows.to(device)
    position = torch.arange(width, device=device)
    starts = torch.ones_like(labels, dtype=torch.bool)
    starts[:, 1:] = labels[:, 1:] != labels[:, :-1]
    columns = torch.where(starts, position, 0).cummax(dim=1).values + 1  # (N, U)
    time = torch.arange(frames, device=device)
    emit = log_probs[rows[:, None, None], time[None, :, None], labels[:, None, :]]  # (N, T, U)
    emit = torch.cat([log_probs[rows, :, blank][:, :, None], emit], dim=-1).float()  # (N, T, 1 + U)
    nll = F.ctc_loss(emit.transpose(0, 1), columns, lengths.to(device)[rows],
                     torch.tensor([len(t) for t in targets], dtype=torch.long, device=device),
                     blank=0, reduction="none", zero_infinity=False)
    return [-value / max(1, len(t)) for value, t in zip(nll.tolist(), targets)]


def frame_candidates(log_probs: torch.Tensor, cutoff_top_n: int = CUTOFF_TOP_N,
                     cutoff_prob: float = CUTOFF_PROB) -> tuple[torch.Tensor, torch.Tensor]:
    """Each frame's tokens for the beam, most likely first: tokens (B, T, N) and log-probs (B, T, N); N =
    min(cutoff_top_n, V), and of these only the shortest head whose probabilities sum to cutoff_prob (the
    one that crosses it included; the most likely token always) — the others get log-prob −inf."""
    if cutoff_top_n < 1 or not 0 < cutoff_prob <= 1:
        raise ValueError(f"need cutoff_top_n >= 1 and 0 < cutoff_prob <= 1, got {cutoff_top_n} and {cutoff_prob}")
    values, tokens = log_probs.float().topk(min(cutoff_top_n, log_probs.shape[-1]), dim=-1)  # (B, T, N)
    if cutoff_prob < 1:
        probs = values.exp()
        values = values.masked_fill(probs.cumsum(dim=-1) - probs >= cutoff_prob, -math.inf)
    return tokens, values


def prefix_beam_search(tokens: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, blank: int,
                       beam_size: int) -> list[list[list[int]]]:
    """CTC prefix beam search of all sentences at once over the frames' candidates (`frame_candidates`):
    per sentence its final beam (label sequences, most probable first, only those of probability > 0).

    Each slot of the (B, K) beam holds a prefix's log p(ends in blank) and log p(ends in a label); a frame
    makes K "stay" entries (blank, or the last label repeated) and K·N extensions; an extension equal to a
    kept prefix (kept prefix j = kept prefix k + j's last label, prefixes compared by two 31-bit polynomial
    hashes) is log-sum-exp merged into it, the top K survive.
    Prefixes are rebuilt at the end from per-frame back-pointers."""
    batch, frames, width = tokens.shape
    device, slots, neg_inf = tokens.device, beam_size, -math.inf
    p_blank = torch.full((batch, slots), neg_inf, dtype=torch.float64, device=device)
    p_blank[:, 0] = 0.0  # slot 0: the empty prefix
    p_label = torch.full_like(p_blank, neg_inf)
    last = torch.full((batch, slots), -1, dtype=torch.long, device=device)
    hashes = torch.zeros(batch, slots, 2, dtype=torch.long, device=device)  # two hashes of each prefix
    parent_key = torch.full((batch, slots), -1, dtype=torch.long, device=device)  # key of the prefix minus its last label
    bases = torch.tensor(HASH_BASES, device=device)
    keep = torch.arange(slots, device=device).expand(batch, slots)
    parents, appended = [], []
    for t in range(int(lengths.max()) if batch else 0):
        token, log_prob = tokens[:, t], values[:, t].double()  # (B, N)
        is_blank = token == blank
        total = torch.logaddexp(p_blank, p_label)  # (B, K)
        same = last[:, :, None] == token[:, None, :]  # (B, K, N)
        last_log_prob = torch.where(same, log_prob[:, None, :], neg_inf).amax(dim=-1)  # (B, K)
        stay_blank = total + torch.where(is_blank, log_prob, neg_inf).amax(dim=-1)[:, None]
        stay_label = p_label + last_log_prob  # repeats merge
        grow = torch.where(same, p_blank[:, :, None], total[:, :, None]) + log_prob[:, None, :]  # (B, K, N)
        grow = grow.masked_fill(is_blank[:, None, :], neg_inf)
        # kept prefix j = kept prefix k + last_j: that extension of k merges into j
        key = hashes[..., 0] * (HASH_MODULUS + 1) + hashes[..., 1]  # (B, K)
        alive = torch.isfinite(total)
        match = (parent_key[:, :, None] == key[:, None, :]) & alive[:, :, None] & alive[:, None, :]  # (B, Kj, Kk)
        extension = torch.where(last[:, :, None] == last[:, None, :], p_blank[:, None, :], total[:, None, :])
        stay_label = torch.logaddexp(stay_label, torch.where(match, extension + last_log_prob[:, :, None], neg_inf).amax(dim=-1))
        grow = grow.masked_fill(torch.bmm(match.transpose(1, 2).float(), same.float()) > 0, neg_inf)
        entry_blank = torch.cat([stay_blank, torch.full_like(grow.flatten(1), neg_inf)], dim=1)  # (B, K + K·N)
        entry_label = torch.cat([stay_label, grow.flatten(1)], dim=1)
        _, index = torch.logaddexp(entry_blank, entry_label).topk(slots, dim=1)  # (B, K)
        offset = (index - slots).clamp(min=0)
        active = (t < lengths.to(device))[:, None]
        grown = (index >= slots) & active
        parent = torch.where(active, torch.where(grown, offset // width, index), keep)
        label = torch.where(grown, token.gather(1, offset % width), -1)
        parent_hashes = hashes.gather(1, parent[..., None].expand(-1, -1, 2))
        hashes = torch.where(grown[..., None], (parent_hashes * bases + label[..., None] + 1) % HASH_MODULUS, parent_hashes)
        parent_key = torch.where(grown, key.gather(1, parent), parent_key.gather(1, parent))
        last = torch.where(grown, label, last.gather(1, parent))
        p_blank = torch.where(active, entry_blank.gather(1, index), p_blank)
        p_label = torch.where(active, entry_label.gather(1, index), p_label)
        parents.append(parent)
        appended.append(label)
    alive = torch.isfinite(torch.logaddexp(p_blank, p_label)).tolist()
    slot, labels = keep, []
    for parent, label in zip(reversed(parents), reversed(appended)):
        labels.append(label.gather(1, slot))
        slot = parent.gather(1, slot)
    table = torch.stack(labels[::-1], dim=-1).tolist() if labels else [[[] for _ in range(slots)] for _ in range(batch)]
    return [[[x for x in row if x >= 0] for row, live in zip(rows, alive[b]) if live] for b, rows in enumerate(table)]


@torch.no_grad()
def ctc_nbest(log_probs: torch.Tensor, lengths: torch.Tensor, blank: int, beam_size: int,
              cutoff_top_n: int = CUTOFF_TOP_N, cutoff_prob: float = CUTOFF_PROB) -> list[list[tuple[list[int], float]]]:
    """Prefix beam search, batched over sentences: per sentence up to `beam_size` (raw labels, normalised
    score), best first (equal scores keep the search's order), without label sequences of probability 0.

    Each frame offers the beam its `frame_candidates` (cutoff_top_n, cutoff_prob); beam 1 is greedy
    decoding. The final beam plus the greedy hypothesis are rescored by the exact length-normalised CTC
    likelihood (all sentences in one pass), so the best entry never scores below greedy.
    """
    greedy = ctc_greedy(log_probs, lengths, blank)
    if beam_size == 1:
        beams = [[] for _ in greedy]
    else:
        beams = prefix_beam_search(*frame_candidates(log_probs, cutoff_top_n, cutoff_prob), lengths, blank, beam_size)
    pools = [list(map(list, dict.fromkeys([*map(tuple, beam), tuple(g)]))) for beam, g in zip(beams, greedy)]
    rows = torch.tensor([row for row, pool in enumerate(pools) for _ in pool], dtype=torch.long)
    flat = [candidate for pool in pools for candidate in pool]
    scores = ctc_log_likelihoods(log_probs, lengths, rows, flat, blank) if flat else []
    results, start = [], 0
    for pool in pools:
        own = scores[start : start + len(pool)]
        start += len(pool)
        ranked = sorted(range(len(pool)), key=lambda i: -own[i])[:beam_size]  # stable: ties keep pool order
        ranked = [i for i in ranked if own[i] > -math.inf] or ranked[:1]  # drop prefixes no alignment reaches
        results.append([(pool[i], own[i]) for i in ranked])
    return results


def ctc_beam_search(log_probs: torch.Tensor, lengths: torch.Tensor, blank: int, beam_size: int,
                    cutoff_top_n: int = CUTOFF_TOP_N, cutoff_prob: float = CUTOFF_PROB) -> list[tuple[list[int], float]]:
    """The best entry of `ctc_nbest` per sentence: (raw labels, normalised score); never below greedy."""
    return [nbest[0] for nbest in ctc_nbest(log_probs, lengths, blank, beam_size, cutoff_top_n, cutoff_prob)]
