"""Multi-head self-attention with relative position representations on the keys (Shaw et al., 2018)."""
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

# The fused attention kernels that need no per-shape set-up. PyTorch may pick cuDNN's for a masked attention on
# a CUDA card, and cuDNN builds an execution plan for every new shape: with batches of many lengths (and a
# decoder's growing length) that is seconds per shape until every shape has been seen once.
PLANLESS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """F.scaled_dot_product_attention(q, k, v, **kwargs), on a CUDA device without cuDNN's kernel (`PLANLESS`);
    on a CPU unchanged (and without the context manager's cost)."""
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    with sdpa_kernel(PLANLESS):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


class RelativeSelfAttention(nn.Module):
    """score_ij = (q_i·k_j + q_i·r_clip(j−i)) / √d_head; one r table per layer, shared by the heads; no causal mask."""

    def __init__(self, d_model: int, n_heads: int, max_relative_distance: int, attention_dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.max_relative_distance = max_relative_distance
        self.attention_dropout = attention_dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.relative_keys = nn.Embedding(2 * max_relative_distance + 1, self.d_head)
        nn.init.normal_(self.relative_keys.weight, std=self.d_head**-0.5)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, T, D), mask (B, T) bool with True = real token; returns (B, T, D)."""
        batch, length, d_model = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)  # 3×(B, H, T, dh)
        # Only distances up to T−1 occur: score against those rows of the table alone, so a large (unclipped)
        # K costs no more than T−1 (the official code's K=1024 would otherwise score 2049 rows per query).
        reach, limit = min(self.max_relative_distance, length - 1), self.max_relative_distance
        positions = torch.arange(length, device=x.device)
        distance = (positions[None, :] - positions[:, None]).clamp(-reach, reach)  # (T, T)
        relative = q @ self.relative_keys.weight[limit - reach : limit + reach + 1].t()  # (B, H, T, 2·reach+1)
        index = (distance + reach).expand(batch, self.n_heads, length, length)
        bias = relative.gather(-1, index) / math.sqrt(self.d_head)  # (B, H, T, T): q_i·r_clip(j−i)/√dh
        bias = bias.masked_fill(~mask[:, None, None, :], float("-inf"))  # padded keys
        dropout = self.attention_dropout if self.training else 0.0
        context = sdpa(q, k, v, attn_mask=bias, dropout_p=dropout)  # (B, H, T, dh)
        return self.out(context.transpose(1, 2).reshape(batch, length, d_model))
