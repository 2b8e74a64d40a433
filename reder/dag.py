"""DA-Transformer output head (Huang et al., ICML 2022): links, the DP, Viterbi alignment, the greedy, lookahead
and Viterbi searches (the loss: reder/objectives/terms.py; the beam search over strings: reder/dag_beam.py; the
decoders that run them: reder/decoding/dag.py).

A batch of graphs: vertex b, j for j < L_b (graph_lengths); vertex 0 starts every path and L_b − 1 ends it.
`log_edges` (B, L, L) holds log E_kj, −inf unless k < j < L_b. The target is Y = [BOS, y…, EOS] (M_b
tokens, target_lengths) and `emissions` (B, M, L) holds log P(Y_i | v_j). Everything is batched and
padding-aware; all-(−inf) rows and columns are normal, so logsumexp here is always the masked one.
"""
import importlib
import importlib.util
import math

import torch
import torch.nn.functional as F
from torch import nn

from reder.config import DAG_DPS
from reder.dag_likelihood import NEG_INF, DagLikelihood


def masked_logsumexp(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """logsumexp with −inf entries absent: an all-(−inf) slice gives −inf with zero gradients, where
    `torch.logsumexp` gives NaN gradients that spread to valid entries."""
    peak = x.detach().amax(dim=dim, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    total = (x - peak).exp().sum(dim=dim, keepdim=True)
    empty = total == 0
    out = torch.where(empty, NEG_INF, total.masked_fill(empty, 1.0).log() + peak)
    return out if keepdim else out.squeeze(dim)


def masked_log_softmax(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """log_softmax over the entries where mask is True; −inf (zero gradient) elsewhere."""
    x = x.masked_fill(~mask, NEG_INF)
    return torch.where(mask, x - masked_logsumexp(x, dim, keepdim=True), NEG_INF)


def edge_mask(graph_lengths: torch.Tensor, length: int) -> torch.Tensor:
    """(B, L, L) bool: True where k < j < L_b, the edges of each graph (the last vertex has none out)."""
    index = torch.arange(length, device=graph_lengths.device)
    return (index[:, None] < index[None, :])[None] & (index < graph_lengths[:, None])[:, None, :]


class DagLinks(nn.Module):
    """log E_ij = logsumexp_h(log g_ih + log_softmax_{j>i}(q_i^h·k_j^h/√d_h)), on u_j = [v_j; p_j] with its
    own learned link positions p; computed in float32 (or wider) even under autocast."""

    def __init__(self, d_model: int, n_heads: int, max_positions: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.positions = nn.Embedding(max_positions, d_model)
        self.query = nn.Linear(2 * d_model, d_model)
        self.key = nn.Linear(2 * d_model, d_model)
        self.gate = nn.Linear(2 * d_model, n_heads)

    def forward(self, states: torch.Tensor, graph_lengths: torch.Tensor) -> torch.Tensor:
        """Vertex states (B, L, D) → log E (B, L, L)."""
        batch, length, width = states.shape
        dtype = torch.promote_types(self.query.weight.dtype, torch.float32)
        with torch.autocast(states.device.type, enabled=False):
            positions = self.positions.weight[:length].expand(batch, length, width)
            u = torch.cat([states, positions], dim=-1).to(dtype)  # (B, L, 2D)
            q = self.query(u).view(batch, length, self.n_heads, -1).transpose(1, 2)  # (B, H, L, d_h)
            k = self.key(u).view(batch, length, self.n_heads, -1).transpose(1, 2)  # (B, H, L, d_h)
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, L, L)
            links = masked_log_softmax(scores, edge_mask(graph_lengths, length)[:, None], dim=-1)
            log_gate = F.log_softmax(self.gate(u), dim=-1).transpose(1, 2)  # (B, H, L)
            return masked_logsumexp(links + log_gate[..., None], dim=1)  # (B, L, L)


def target_emissions(log_probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log_probs (B, L, V), targets (B, M) → emissions (B, M, L): log P(Y_i | v_j)."""
    batch, length, _ = log_probs.shape
    return log_probs.gather(2, targets[:, None, :].expand(batch, length, targets.shape[1])).transpose(1, 2)


def triton_installed() -> bool:
    """Whether the optional Triton extra is importable here."""
    return importlib.util.find_spec("triton") is not None


def resolve_dp(dp: str, device: torch.device) -> str:
    """The DP `model.dag_dp` resolves to for tensors on `device`: torch or triton (auto: triton on CUDA when
    installed). Checked where the loss runs, not when the config loads, so that a model trained with
    dag_dp=triton still loads and decodes where Triton is absent."""
    if dp not in DAG_DPS:
        raise ValueError(f"model.dag_dp must be one of {list(DAG_DPS)}, got {dp!r}")
    if dp == "auto":
        return "triton" if device.type == "cuda" and triton_installed() else "torch"
    if dp == "triton" and not triton_installed():
        raise RuntimeError("model.dag_dp=triton but Triton is not installed: pip install -e '.[triton]', "
                           "or set model.dag_dp=torch (or auto)")
    return dp


def dag_log_likelihood(
    log_edges: torch.Tensor, emissions: torch.Tensor, graph_lengths: torch.Tensor, target_lengths: torch.Tensor,
    hand_written: bool = True, dp: str = "torch"
) -> torch.Tensor:
    """log P(Y|X) (B,) summed over all paths 0 = a_1 < … < a_M = L_b − 1; −inf where L_b < M_b.

    hand_written=False runs the same DP through plain autograd (the test and benchmark reference); with
    hand_written, `dp` (`resolve_dp`) picks `DagLikelihood` or the Triton kernels (reder/dag_triton.py)."""
    graph_lengths, target_lengths = graph_lengths.long(), target_lengths.long()
    if hand_written and resolve_dp(dp, emissions.device) == "triton":
        kernels = importlib.import_module("reder.dag_triton")  # imports triton: only here
        return kernels.triton_dag_log_likelihood(log_edges, emissions, graph_lengths, target_lengths)
    if hand_written:
        return DagLikelihood.apply(log_edges, emissions, graph_lengths, target_lengths)
    alphas = [F.pad(emissions[:, 0, :1], (0, emissions.shape[2] - 1), value=NEG_INF)]
    for i in range(1, emissions.shape[1]):
        alphas.append(masked_logsumexp(alphas[-1][:, :, None] + log_edges, dim=1) + emissions[:, i])
    alpha = torch.stack(alphas, dim=1)  # (B, M, L)
    return alpha[torch.arange(alpha.shape[0], device=alpha.device), target_lengths - 1, graph_lengths - 1]


@torch.no_grad()
def viterbi_align(
    log_edges: torch.Tensor, emissions: torch.Tensor, graph_lengths: torch.Tensor, target_lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best path of each target: its vertices (B, M) (−1 past M_b), whether one exists (B,), its score (B,)."""
    batch, steps, length = emissions.shape
    rows = torch.arange(batch, device=emissions.device)
    graph_lengths, target_lengths = graph_lengths.long(), target_lengths.long()
    delta = F.pad(emissions[:, 0, :1], (0, length - 1), value=NEG_INF)  # (B, L)
    backpointers = torch.zeros(batch, steps, length, dtype=torch.long, device=emissions.device)
    for i in range(1, steps):
        best, backpointers[:, i] = (delta[:, :, None] + log_edges).max(dim=1)  # (B, L)
        delta = torch.where((i < target_lengths)[:, None], best + emissions[:, i], delta)
    score = delta[rows, graph_lengths - 1]
    path = torch.full((batch, steps), -1, dtype=torch.long, device=emissions.device)
    vertex = graph_lengths - 1
    for i in range(steps - 1, -1, -1):
        active = i < target_lengths
        path[:, i] = torch.where(active, vertex, -1)
        vertex = torch.where(active, backpointers[rows, i, vertex], vertex)
    feasible = torch.isfinite(score)
    return torch.where(feasible[:, None], path, -1), feasible, score


def limit_transitions(log_edges: torch.Tensor, max_transition: int) -> torch.Tensor:
    """log E without the edges that jump more than `max_transition` vertices ahead (−inf; 0 = no limit), for
    decoding (DA-Transformer's max_transition_length). Every vertex keeps the edge to its successor."""
    if max_transition <= 0 or max_transition >= log_edges.shape[-1]:
        return log_edges
    index = torch.arange(log_edges.shape[-1], device=log_edges.device)
    return log_edges.masked_fill((index[None, :] - index[:, None] > max_transition)[None], NEG_INF)


def _repeats(tokens: list[int], longest: int) -> bool:
    """Whether `tokens` ends in an n-gram repeated right before it, for some 2 ≤ n ≤ longest."""
    return any(tokens[-n:] == tokens[-2 * n : -n] for n in range(2, longest + 1) if len(tokens) >= 2 * n)


@torch.no_grad()
def dag_greedy(log_edges: torch.Tensor, log_probs: torch.Tensor, graph_lengths: torch.Tensor, lookahead: float = 0.0,
               max_transition: int = 0, no_repeat_ngram: int = 0) -> list[list[int]]:
    """Greedy (lookahead=0) or lookahead decoding: from vertex 0 step to argmax_j log E(a, j) + β·max_y
    log P(y|v_j) until the last vertex, emit each vertex's argmax token, merge repeats (raw ids, BOS/EOS kept).
    `max_transition` bounds the jumps (`limit_transitions`); with `no_repeat_ngram` N ≥ 2 a step whose token
    would end the output in a consecutively repeated n-gram (2 ≤ n ≤ N, "a b a b") takes the next best
    vertex instead (the best one when every vertex would)."""
    log_edges = limit_transitions(log_edges, max_transition)
    best, tokens = log_probs.max(dim=-1)  # (B, L)
    scores = log_edges + lookahead * best[:, None, :]  # (B, L, L): next-vertex scores from each vertex
    following = scores.argmax(dim=-1).tolist()  # (B, L): the best next vertex from each vertex
    ranked = scores.argsort(dim=-1, descending=True).tolist() if no_repeat_ngram >= 2 else None
    allowed = (scores > NEG_INF).tolist() if ranked is not None else None
    hypotheses = []
    for b, (row_next, row_tokens, length) in enumerate(zip(following, tokens.tolist(), graph_lengths.tolist())):
        vertex, out = 0, [row_tokens[0]]
        while vertex < length - 1:
            choice = max(row_next[vertex], vertex + 1)  # always forward, even on a degenerate (NaN) row
            if ranked is not None:
                for j in ranked[b][vertex]:
                    if vertex < j < length and allowed[b][vertex][j]:
                        token = row_tokens[j]
                        if token == out[-1] or not _repeats(out + [token], no_repeat_ngram):
                            choice = j
                            break
            vertex = choice
            if row_tokens[vertex] != out[-1]:
                out.append(row_tokens[vertex])
        hypotheses.append(out)
    return hypotheses


@torch.no_grad()
def dag_viterbi(log_edges: torch.Tensor, log_probs: torch.Tensor, graph_lengths: torch.Tensor, length_penalty: float = 1.0,
                max_transition: int = 0) -> list[list[int]]:
    """Viterbi decoding (Shao et al. 2022): for every path length m the best path from vertex 0 to L_b − 1
    scored Σ log E + Σ max_y log P(y|v); pick m by score / m^length_penalty; emit argmax tokens (no merging).
    `max_transition` bounds the jumps (`limit_transitions`)."""
    log_edges = limit_transitions(log_edges, max_transition)
    best, tokens = log_probs.max(dim=-1)  # (B, L)
    batch, length = best.shape
    rows, ends = torch.arange(batch, device=best.device), graph_lengths.long() - 1
    delta = F.pad(best[:, :1], (0, length - 1), value=NEG_INF)  # (B, L): best paths of m vertices ending at j
    finals, backpointers = [delta[rows, ends]], []
    for k in range(1, length):
        # Edges only go forward: a path of k + 1 vertices from vertex 0 ends at k or later, and the vertex
        # before its end is at k − 1 or later, so only that corner of the (L, L) step is computed (L³/3 in all).
        score, pointer = (delta[:, k - 1:, None] + log_edges[:, k - 1:, k:]).max(dim=1)  # (B, L − k)
        delta = F.pad(score + best[:, k:], (k, 0), value=NEG_INF)
        finals.append(delta[rows, ends])
        backpointers.append(F.pad(pointer + (k - 1), (k, 0)))
    vertices = torch.arange(1, length + 1, dtype=best.dtype, device=best.device)
    chosen = (torch.stack(finals, dim=1) / vertices**length_penalty).argmax(dim=1)  # (B,): m − 1
    hypotheses = []
    for b, (m, end) in enumerate(zip(chosen.tolist(), ends.tolist())):
        path = [end]
        for step in range(m - 1, -1, -1):
            path.append(int(backpointers[step][b, path[-1]]))
        hypotheses.append([int(tokens[b, v]) for v in reversed(path)])
    return hypotheses


def graph_lengths_for(input_lengths: torch.Tensor, ratio: float) -> torch.Tensor:
    """Vertices of each graph, int(λ·S_b), for inputs of S_b tokens counting BOS and EOS (float64 arithmetic,
    the same rounding as Python's int(ratio * length))."""
    return (input_lengths.double() * ratio).floor().long()
