"""The inference trunk: the layers of reder/reversible.py's plain path, for decoding only (eval, no gradient).

Same modules, same weights, same arithmetic per position; what differs is the work around it:
  - what the attention needs besides q, k, v (the relative-distance index, the padded keys) is built once per
    call (`AttentionPlan`), not in every layer; the float bias that carries the relative positions is still
    computed per layer (it depends on that layer's queries);
  - the two halves of the state stay two contiguous tensors through the stack (no cat and chunk per layer),
    updated in place;
  - a padded batch is packed: the position-wise work (LayerNorm, the four linear layers, GELU, the residual
    updates) runs on the N real positions only, (N, D), and only the attention sees the padded (B, T) layout,
    its queries scattered in and its context gathered out. No FLOP is spent on padding outside the attention.
The output projection (`REDER.project` with `rows`) likewise computes logits at real positions only.
`REDER.layers` takes this path when the model is in eval mode, gradients are off and `REDER.fast_inference`
is set (the default); `fast_inference = False` keeps the reference path, which the tests compare this one with
token by token (tests/reder/test_inference.py). `quantized(model)`: a copy with the trunk's linear layers
dynamically quantized to int8 (CPU; an option, it changes the arithmetic).
"""
import copy
import math
import warnings
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from reder.layers import AttentionBranch, DuplexLayer, FeedForwardBranch

Op = tuple[DuplexLayer, bool]  # (layer, inverse), as in reder/reversible.py


@dataclass
class AttentionPlan:
    """Per-call constants of every layer's attention: the padded shape, the real positions' flat indices
    (None when there is no padding), the relative-distance index (B, H, T, T) and the padded keys (B, 1, 1, T)."""

    batch: int
    length: int
    rows: Optional[torch.Tensor]
    reach: int
    index: torch.Tensor
    padded_keys: Optional[torch.Tensor]

    @classmethod
    def build(cls, mask: torch.Tensor, n_heads: int, max_relative_distance: int) -> "AttentionPlan":
        batch, length = mask.shape
        reach = min(max_relative_distance, length - 1)
        positions = torch.arange(length, device=mask.device)
        distance = (positions[None, :] - positions[:, None]).clamp(-reach, reach)  # (T, T)
        index = (distance + reach).expand(batch, n_heads, length, length)
        rows = real_rows(mask)
        return cls(batch, length, rows, reach, index, ~mask[:, None, None, :] if rows is not None else None)


def real_rows(mask: torch.Tensor) -> Optional[torch.Tensor]:
    """The real positions' indices in the flattened (B·T) layout (N,), or None when nothing is padded (one host sync)."""
    return None if bool(mask.all()) else mask.reshape(-1).nonzero().squeeze(1)


def attention(branch: AttentionBranch, x: torch.Tensor, plan: AttentionPlan) -> torch.Tensor:
    """SAN(LN(x)) of packed positions x (N, D) → (N, D); RelativeSelfAttention.forward's arithmetic."""
    module = branch.attention
    heads, d_head, limit = module.n_heads, module.d_head, module.max_relative_distance
    qkv = module.qkv(F.layer_norm(x, x.shape[-1:]))  # (N, 3D)
    if plan.rows is not None:
        qkv = qkv.new_zeros(plan.batch * plan.length, qkv.shape[-1]).index_copy_(0, plan.rows, qkv)  # (B·T, 3D)
    q, k, v = qkv.view(plan.batch, plan.length, 3, heads, d_head).permute(2, 0, 3, 1, 4)  # 3×(B, H, T, dh)
    relative = q @ module.relative_keys.weight[limit - plan.reach : limit + plan.reach + 1].t()  # (B, H, T, 2·reach+1)
    bias = relative.gather(-1, plan.index).div_(math.sqrt(d_head))  # (B, H, T, T)
    if plan.padded_keys is not None:
        bias.masked_fill_(plan.padded_keys, float("-inf"))
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # (B, H, T, dh)
    context = context.transpose(1, 2).reshape(plan.batch * plan.length, heads * d_head)  # (B·T, D)
    if plan.rows is not None:
        context = context.index_select(0, plan.rows)  # (N, D)
    return module.out(context)


def feed_forward(branch: FeedForwardBranch, x: torch.Tensor) -> torch.Tensor:
    """Linear(GELU(Linear(LN(x)))) of x (N, D) → (N, D)."""
    return branch.outer(F.gelu(branch.inner(F.layer_norm(x, x.shape[-1:]))))


@torch.no_grad()
def run_inference(h: torch.Tensor, mask: torch.Tensor, ops: list[Op]) -> torch.Tensor:
    """Apply `ops` to h (B, T, 2D) with mask (B, T); returns the last state (B, T, 2D), padded positions zero."""
    if not ops:
        return h
    batch, length, width = h.shape
    first_layer = ops[0][0].attention.attention
    plan = AttentionPlan.build(mask, first_layer.n_heads, first_layer.max_relative_distance)
    flat = h.reshape(batch * length, width)
    packed = flat.index_select(0, plan.rows) if plan.rows is not None else flat  # (N, 2D)
    # Two contiguous halves of our own, updated in place: a strided half would be copied by every LayerNorm.
    first, second = packed[:, : width // 2].contiguous(), packed[:, width // 2 :].contiguous()  # (N, D) each
    for layer, inverse in ops:
        if not inverse:  # A' = A + S(B); B' = B + G(A')
            first.add_(attention(layer.attention, second, plan))
            second.add_(feed_forward(layer.feed_forward, first))
        else:  # B = B' − G(A'); A = A' − S(B)
            second.sub_(feed_forward(layer.feed_forward, first))
            first.sub_(attention(layer.attention, second, plan))
    packed = torch.cat([first, second], dim=-1)  # (N, 2D)
    if plan.rows is None:
        return packed.view(batch, length, width)
    return packed.new_zeros(batch * length, width).index_copy_(0, plan.rows, packed).view(batch, length, width)


def quantized(model: nn.Module) -> nn.Module:
    """A copy of `model` (eval) whose trunk linear layers are int8 dynamically quantized (torch.ao, CPU);
    embeddings, the tied output projection and the heads' own layers stay float32."""
    from torch.ao.quantization import quantize_dynamic

    model = copy.deepcopy(model).cpu().eval()
    with warnings.catch_warnings():  # torch.ao's deprecation notices (torchao is not a dependency)
        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.simplefilter("ignore", category=UserWarning)
        for end in model.ends.values():
            quantize_dynamic(end, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model
