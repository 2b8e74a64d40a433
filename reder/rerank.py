"""Teacher reranking of REDER's candidates (the paper's "beam 20 + AT rerank")."""
import torch

from reder.autoregressive import Transformer
from reder.config import EOS_ID, PAD_ID


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
