"""The DAG's log-likelihood DP in PyTorch, with its hand-written backward (`DagLikelihood`), and what the
Triton kernels (reder/dag_triton.py) share with it (`save_likelihood`). Layout as in reder/dag.py."""
import torch
from torch.autograd.function import once_differentiable

NEG_INF = float("-inf")


def _alpha(log_edges: torch.Tensor, emissions: torch.Tensor) -> torch.Tensor:
    """α (B, M, L): α_0 = start at vertex 0; α_i[j] = logsumexp_k(α_{i−1}[k] + log E_kj) + log P(y_i|v_j).

    Here and in `_beta` no gradient flows (they run inside `DagLikelihood`), so the fused `torch.logsumexp`
    is safe: its *values* on all-(−inf) slices are −inf; only its gradients there are NaN. ~3× faster."""
    alpha = emissions.new_full(emissions.shape, NEG_INF)
    alpha[:, 0, 0] = emissions[:, 0, 0]
    for i in range(1, emissions.shape[1]):
        alpha[:, i] = torch.logsumexp(alpha[:, i - 1, :, None] + log_edges, dim=1) + emissions[:, i]
    return alpha


def _beta(log_edges: torch.Tensor, emissions: torch.Tensor, graph_lengths: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """β (B, M, L): log-probability of finishing Y from vertex j after emitting y_i there (0 at the end)."""
    batch, steps, _ = emissions.shape
    beta = emissions.new_full(emissions.shape, NEG_INF)
    beta[torch.arange(batch), target_lengths - 1, graph_lengths - 1] = 0.0
    for i in range(steps - 2, -1, -1):
        following = torch.logsumexp(log_edges + (emissions[:, i + 1] + beta[:, i + 1])[:, None, :], dim=2)  # (B, L)
        beta[:, i] = torch.where((i < target_lengths - 1)[:, None], following, beta[:, i])
    return beta


def save_likelihood(ctx, log_edges: torch.Tensor, emissions: torch.Tensor, alpha: torch.Tensor, graph_lengths: torch.Tensor,
                    target_lengths: torch.Tensor) -> torch.Tensor:
    """log P (B,) = α_{M_b−1}[L_b − 1], saving for backward what the DPs' backward passes read: log E, the
    emissions, α, log P and the lengths."""
    log_likelihood = alpha[torch.arange(alpha.shape[0], device=alpha.device), target_lengths - 1, graph_lengths - 1]
    ctx.save_for_backward(log_edges, emissions, alpha, log_likelihood, graph_lengths, target_lengths)
    return log_likelihood


class DagLikelihood(torch.autograd.Function):
    """log P(Y|X) with a hand-written backward: keeps only log E, the emissions, α and log P; β is built in
    backward. dZ/d emit_ij = exp(α_i[j] + β_i[j] − Z); dZ/d log E_kj = Σ_i exp(α_{i−1}[k] + log E_kj +
    emit_ij + β_i[j] − Z). Memory O(B·L² + B·M·L) instead of autograd's ~2·M tensors of B·L²."""

    @staticmethod
    def forward(ctx, log_edges, emissions, graph_lengths, target_lengths):
        return save_likelihood(ctx, log_edges, emissions, _alpha(log_edges, emissions), graph_lengths, target_lengths)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        log_edges, emissions, alpha, log_likelihood, graph_lengths, target_lengths = ctx.saved_tensors
        beta = _beta(log_edges, emissions, graph_lengths, target_lengths)
        feasible = torch.isfinite(log_likelihood)
        feasible = torch.isfinite(log_likelihood)[:, None, None]  # (B, 1, 1); infeasible samples get zero gradients
        z = torch.where(feasible, log_likelihood[:, None, None], 0.0)
        grad_emissions = (alpha + beta - z).exp()  # (B, M, L): posterior of vertex j emitting y_i
        before, after = alpha - z, emissions + beta  # (B, M, L): the vectors each edge term adds to log E
        grad_edges, term = torch.zeros_like(log_edges), torch.empty_like(log_edges)
        for i in range(1, emissions.shape[1]):  # one (B, L, L) buffer, reused: memory stays O(B·L²)
            torch.add(log_edges, before[:, i - 1, :, None], out=term)
            grad_edges += term.add_(after[:, i, None, :]).exp_()
        scale = grad[:, None, None]
        return torch.where(feasible, grad_edges * scale, 0.0), torch.where(feasible, grad_emissions * scale, 0.0), None, None
