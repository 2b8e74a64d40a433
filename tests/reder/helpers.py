"""Tiny models and batches shared by the reder tests, and the 64 real Multi30k pairs the learning tests memorise."""
import time
from typing import Callable, Optional

import sacrebleu
import torch

from reder import EOS_ID, DuplexLoss, LossConfig, ModelConfig, REDER
from reder.ctc import pad_batch
from reder.dag import dag_log_likelihood, edge_mask, graph_lengths_for, masked_log_softmax, target_emissions
from reder.decoding.run import decode
from tests.conftest import SHARED_DATA

MULTI30K = SHARED_DATA / "multi30k"
N_PAIRS = 64


class WordPairs:
    """The first N_PAIRS Multi30k train pairs with a word vocabulary over both sides (ids from 4: 0-3 are
    pad, unk, bos, eos; `vocab_size` leaves the last id free for the CTC blank / DAG skip token)."""

    def __init__(self) -> None:
        self.english = (MULTI30K / "train.en").read_text(encoding="utf-8").splitlines()[:N_PAIRS]
        self.german = (MULTI30K / "train.de").read_text(encoding="utf-8").splitlines()[:N_PAIRS]
        words = sorted({w for line in self.english + self.german for w in line.split()})
        self.vocab = {w: i + 4 for i, w in enumerate(words)}
        self.inverse = {i: w for w, i in self.vocab.items()}
        self.vocab_size = len(self.vocab) + 5

    def encode(self, lines: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Word ids with EOS, right-padded (B, T), and lengths (B,)."""
        return pad_batch([[self.vocab[w] for w in line.split()] + [EOS_ID] for line in lines])

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.inverse.get(t, "<unk>") for t in ids)


def memorise(model: REDER, loss_config: LossConfig, data: WordPairs, every: int, score_from: int, limit_s: float,
             max_steps: int = 10**9) -> tuple[dict[str, torch.Tensor], Callable[[str, str], float]]:
    """Train `model` under `DuplexLoss(model, loss_config)` on all of `data` in one batch (Adam, clipping) until
    both directions' greedy BLEU exceeds 90 — scored every `every` steps from step `score_from` — or `limit_s` /
    `max_steps` run out. Returns the last step's loss terms and bleu(direction, decoder) on the memorised pairs."""
    objective = DuplexLoss(model, loss_config)
    src, src_lengths = data.encode(data.english)
    tgt, tgt_lengths = data.encode(data.german)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98))

    def bleu(direction: str, decoder: str = "greedy") -> float:
        model.eval()
        tokens, lengths, references = (src, src_lengths, data.german) if direction == "src2tgt" else (tgt, tgt_lengths, data.english)
        hypotheses = [data.decode(h) for h in decode(model, tokens, lengths, direction, decoder)]
        model.train()
        return sacrebleu.corpus_bleu(hypotheses, [references]).score

    start, step = time.monotonic(), 0
    while step < max_steps and time.monotonic() - start < limit_s:
        terms = objective(src, src_lengths, tgt, tgt_lengths, step)
        optimizer.zero_grad()
        terms["total"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % every == 0 and step >= score_from:
            scores = {d: bleu(d) for d in ("src2tgt", "tgt2src")}
            print(step, f"{time.monotonic() - start:.0f}s", {k: round(v.item(), 3) for k, v in terms.items()}, scores)
            if min(scores.values()) > 90:
                break
    return terms, bleu


def tiny_config(**overrides) -> ModelConfig:
    values = dict(vocab_size=12, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=2, dropout=0.1,
                  attention_dropout=0.1, upsample_ratio=2, max_relative_distance=3, max_positions=64)
    values.update(overrides)
    return ModelConfig(**values)


def tiny_model(**overrides) -> REDER:
    return REDER(tiny_config(**overrides))


def decoding_model(head: str = "ctc", **overrides) -> REDER:
    """A tiny REDER in eval mode (vocabulary 20, d 16, 2 heads, 2 layers per end) with a random, non-identity
    ActNorm (its inverse is in the decoding path too): for comparing decoding paths."""
    extra = {"head": head, "graph_upsample_ratio": 2.0} if head == "dag" else {}
    model = tiny_model(vocab_size=20, d_model=16, n_heads=2, ffn_dim=24, layers_per_end=2, **{**extra, **overrides})
    for norm in model.actnorm.values():
        norm.log_scale.data.normal_(0, 0.3)
        norm.bias.data.normal_(0, 0.3)
        norm.initialized.fill_(True)
    return model.eval()


def random_batch(lengths: list[int], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded token batch (B, T): real tokens in [4, blank), EOS last, PAD after."""
    tokens = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        tokens[row, : length - 1] = torch.randint(4, vocab_size - 1, (length - 1,))
        tokens[row, length - 1] = EOS_ID
    return tokens, torch.tensor(lengths)


def padding_mask(lengths: list[int]) -> torch.Tensor:
    return torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]


def random_dag_batch(ratio: float, seed: int, dtype: torch.dtype = torch.float32, batch: int = 5, longest: int = 8,
                     longest_target: int = 10, slack: Optional[int] = None, vocab: int = 9,
                     device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """Random ragged graphs of int(λ·S_b) vertices (S_b from 2 to `longest`) with random links and emissions,
    targets of 2 to `longest_target` tokens that fit (with `slack`: of L_b − 0…slack tokens, whose paths skip
    at most `slack` vertices), and one more sample whose target is a token longer than its graph (no path):
    log E (B, L, L), log-probs (B, L, V), targets (B, M), graph and target lengths (B,)."""
    generator = torch.Generator().manual_seed(seed)
    sources = torch.cat([torch.randint(2, longest + 1, (batch,), generator=generator), torch.tensor([2])])
    graph_lengths = graph_lengths_for(sources, ratio)  # (B,)
    if slack is None:
        fitting = [torch.randint(2, int(min(length, longest_target)) + 1, (), generator=generator)
                   for length in graph_lengths[:-1]]
    else:
        fitting = [(length - torch.randint(0, slack + 1, (), generator=generator)).clamp(min=2) for length in graph_lengths[:-1]]
    target_lengths = torch.stack(fitting + [graph_lengths[-1] + 1])
    length, steps = int(graph_lengths.max()), int(target_lengths.max())
    scores = 2 * torch.randn(batch + 1, length, length, generator=generator, dtype=dtype)
    log_edges = masked_log_softmax(scores, edge_mask(graph_lengths, length), dim=-1)
    log_probs = (2 * torch.randn(batch + 1, length, vocab, generator=generator, dtype=dtype)).log_softmax(-1)
    targets = torch.randint(0, vocab, (batch + 1, steps), generator=generator)
    moved = (t.to(device) for t in (log_edges, log_probs, targets, graph_lengths, target_lengths))
    return tuple(moved)


def _likelihood_and_gradients(function, log_edges, emissions, graph_lengths, target_lengths, weights):
    """log P(Y|X) (B,) and the gradients of Σ_b w_b log P_b over the feasible samples."""
    edges, emits = log_edges.detach().requires_grad_(), emissions.detach().requires_grad_()
    value = function(edges, emits, graph_lengths, target_lengths)
    torch.where(torch.isfinite(value), value * weights, 0.0).sum().backward()
    return value.detach(), edges.grad, emits.grad


def dp_differences(function: Callable, ratio: float, seed: int, dtype: torch.dtype, **sizes) -> list[float]:
    """A DAG DP `function` (dag_log_likelihood's arguments) against the PyTorch DP on a `random_dag_batch`: the
    largest difference of the values, the edge gradients and the emission gradients, each over the magnitude of
    what it is compared with; asserts the infeasible sample's −inf and zero gradients."""
    log_edges, log_probs, targets, graph_lengths, target_lengths = random_dag_batch(ratio, seed, dtype, **sizes)
    device = log_edges.device
    emissions = target_emissions(log_probs, targets)
    weights = torch.rand(len(graph_lengths), dtype=dtype, device=device)
    expected = _likelihood_and_gradients(dag_log_likelihood, log_edges, emissions, graph_lengths, target_lengths, weights)
    got = _likelihood_and_gradients(function, log_edges, emissions, graph_lengths, target_lengths, weights)
    feasible = torch.isfinite(expected[0])
    assert feasible[:-1].all() and not feasible[-1]
    assert got[0][-1] == float("-inf") and got[1][-1].abs().max() == 0 and got[2][-1].abs().max() == 0
    assert all(torch.isfinite(tensor).all() for tensor in got[1:])
    return [float((a[feasible] - b[feasible]).abs().max() / b[feasible].abs().max().clamp(min=1))
            for a, b in zip(got, expected)]
