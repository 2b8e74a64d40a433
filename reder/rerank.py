"""Reranking REDER's CTC candidates: by an autoregressive teacher (the paper's "beam 20 + AT rerank"), or by
REDER itself read backwards (self-reranking: the official code's `score_reconstruction_weight`)."""
import math

import torch

from reder.autoregressive import Transformer
from reder.config import EOS_ID, PAD_ID, REVERSE
from reder.ctc import pad_batch
from reder.decode import ctc_log_likelihoods
from reder.model import REDER



@torch.no_grad()
def rerank(teacher: Transformer, src_tokens: torch.Tensor, src_lengths: torch.Tensor,
           candidates: list[list[list[int]]]) -> list[list[int]]:
    """Per sentence, the candidate (ids without EOS) with the highest teacher mean token log-prob (EOS
    appended and counted); ties go to the earlier candidate. All candidates of the batch are scored in one
    teacher pass: the source is encoded once and its memory repeated once per candidate."""
    if len(candidates) != src_tokens.shape[0]:
        raise ValueError(f"rerank: {len(candidates)} candidate lists for {src_tokens.shape[0]} sentences")
    empty = [index for index, options in enumerate(candidates) if not options]
    if empty:
        raise ValueError(f"rerank: sentences {empty} have no candidates")
    device = next(teacher.parameters()).device
    memory, src_mask = teacher.encode(src_tokens.to(device), src_lengths.to(device))  # (B, S, D), (B, S)
    counts = torch.tensor([len(options) for options in candidates], device=device)
    rows = torch.arange(len(candidates), device=device).repeat_interleave(counts)  # (C,): each candidate's sentence
    targets = [option + [EOS_ID] for options in candidates for option in options]
    tgt_lengths = torch.tensor([len(t) for t in targets], device=device)
    tgt_tokens = torch.full((len(targets), int(tgt_lengths.max())), PAD_ID, dtype=torch.long, device=device)  # (C, T)
    for row, target in enumerate(targets):
        tgt_tokens[row, : len(target)] = torch.tensor(target, dtype=torch.long)
    scores = teacher.score_encoded(memory[rows], src_mask[rows], tgt_tokens, tgt_lengths).tolist()
    best, start = [], 0
    for options in candidates:
        own = scores[start : start + len(options)]
        best.append(options[max(range(len(options)), key=own.__getitem__)])  # max keeps the first of equals
        start += len(options)
    return best


@torch.no_grad()
def reconstruction_scores(model: REDER, src_tokens: torch.Tensor, src_lengths: torch.Tensor, direction: str,
                          candidates: list[list[list[int]]]) -> list[list[float]]:
    """Per candidate ŷ (ids without EOS) of each sentence x: log P(x | ŷ) / |x| by the model's reverse
    direction (x and ŷ with EOS; the exact CTC likelihood, normalised like `ctc_scores`). All candidates of
    the batch go through one reverse pass. −inf for a candidate too long to be read back (ŷ + EOS over
    `max_input_length`) and for one whose upsampled frames cannot emit x."""
    limit, flat = model.max_input_length(), [c for options in candidates for c in options]
    rows = [row for row, options in enumerate(candidates) for _ in options]
    readable = [index for index, candidate in enumerate(flat) if len(candidate) + 1 <= limit]
    scores = [-math.inf] * len(flat)
    if readable:
        device = next(model.parameters()).device
        tokens, lengths = pad_batch([flat[i] + [EOS_ID] for i in readable], device)  # (C, T)
        output = model.outputs(tokens, lengths, REVERSE[direction])  # log-probs (C, rT, V)
        sources = [src_tokens[row, : int(src_lengths[row])].tolist() for row in range(len(candidates))]
        targets = [sources[rows[i]] for i in readable]
        positions = torch.arange(len(readable))
        for index, score in zip(readable, ctc_log_likelihoods(output.log_probs, output.lengths, positions, targets,
                                                              model.cfg.blank_id)):
            scores[index] = score
    result, start = [], 0
    for options in candidates:
        result.append(scores[start : start + len(options)])
        start += len(options)
    return result


@torch.no_grad()
def self_rerank(model: REDER, src_tokens: torch.Tensor, src_lengths: torch.Tensor, direction: str,
                nbest: list[list[tuple[list[int], float]]], weight: float) -> list[list[int]]:
    """Per sentence, the candidate of `nbest` (REDER.nbest: ids and forward score) with the highest forward
    score + weight · `reconstruction_scores`; ties and sentences where every candidate's reverse score is
    −inf keep the beam's order (its best). weight 0 is the beam's best, without the reverse pass."""
    if weight < 0:
        raise ValueError(f"self-reranking needs weight >= 0, got {weight}")
    if weight == 0:
        return [entries[0][0] for entries in nbest]
    reverse = reconstruction_scores(model, src_tokens, src_lengths, direction, [[ids for ids, _ in e] for e in nbest])
    return [pick(entries, scores, weight) for entries, scores in zip(nbest, reverse)]


def pick(entries: list[tuple[list[int], float]], reverse: list[float], weight: float) -> list[int]:
    """The ids of the entry with the highest forward + weight · reverse (the first of equals; with every
    total −inf, the first entry)."""
    totals = [forward + weight * back if weight else forward for (_, forward), back in zip(entries, reverse)]
    return entries[max(range(len(entries)), key=totals.__getitem__)][0]
