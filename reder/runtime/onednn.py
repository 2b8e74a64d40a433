"""The inference trunk: the layers of reder/reversible.py's plain path, for decoding only (eval, no gradient).

Same modules, same weights, same arithmetic per position (on a CPU with oneDNN summed in another order, below);
what differs is the work around it:
  - what the attention needs besides q, k, v (the relative-distance index, the padded keys) is built once per
    call (`AttentionPlan`), not in every layer; the float bias that carries the relative positions is still
    computed per layer (it depends on that layer's queries);
  - the two halves of the state stay two contiguous tensors through the stack (no cat and chunk per layer),
    updated in place;
  - a padded batch is packed: the position-wise work (LayerNorm, the four linear layers, GELU, the residual
    updates) runs on the N real positions only, (N, D), as one batch (large GEMMs); the attention runs in
    length groups (`length_groups`: sentences of similar length, each group padded to its own longest), its
    queries scattered in and its context gathered out. No FLOP is spent on padding outside the attention, and
    inside it only up to each group's longest sentence.
The output projection (`REDER.project` with `rows`) likewise computes logits at real positions only.
On a CPU with oneDNN (torch's x86 builds), every linear layer of this path and the output projection run as
oneDNN matmuls on weights reordered once into its blocked layout (`prepacked`, `packed`), their rows
bucketed (`bucket`: a long-lived process meets a few dozen matmul shapes, each a primitive oneDNN keeps), the
FFN's GELU fused into its first one: at batch 1 (30-odd rows) torch's default float32 GEMM (MKL) repacks each
weight on every call and reached about half the rate of the prepacked kernel on this project's AMD CPUs
(docs/results/decoding.md, "Decoding at the floor"). The reordered copy is rebuilt when its weight changes (another
tensor or an in-place update, of a weight made under inference mode too: `stamp`).
`REDER.layers` takes this path when the model is in eval mode, gradients are off and `REDER.fast_inference`
is set (the default); `fast_inference = False` keeps the reference path, which the tests compare this one with
token by token (tests/reder/test_inference.py). `quantized(model)`: a copy with the trunk's linear layers
dynamically quantized to int8 (CPU; an option, it changes the arithmetic).
"""
import copy
import math
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from reder.attention import sdpa
from reder.layers import AttentionBranch, DuplexLayer, FeedForwardBranch

Op = tuple[DuplexLayer, bool]  # (layer, inverse), as in reder/reversible.py


# An attention call's fixed cost in padded positions: on this project's CPU (d512, 4 heads, one thread) a group
# costs ~60 µs per layer plus ~4.5 µs per position it holds, real or padded, at T' = 30 to 80 (the T² part small).
GROUP_COST = 16


@dataclass
class AttentionGroup:
    """Sentences whose attention runs as one padded (b, T) batch: their span [start, end) in the packed layout,
    their real positions' indices in b·T (None when none is padded), the relative-distance index (b, H, T, T)
    and the padded keys (b, 1, 1, T), None when no key is padded."""

    start: int
    end: int
    batch: int
    length: int
    rows: Optional[torch.Tensor]
    reach: int
    index: torch.Tensor
    padded_keys: Optional[torch.Tensor]

    @classmethod
    def build(cls, span: tuple[int, int], mask: torch.Tensor, n_heads: int, max_relative_distance: int,
              pack: bool = True) -> "AttentionGroup":
        """The group of the sentences `mask` (b, T) holds; unpacked (`pack` False) every position is a row and
        the padded keys are masked whatever they are (no host sync: the static-shape path)."""
        batch, length = mask.shape
        reach = min(max_relative_distance, length - 1)
        positions = torch.arange(length, device=mask.device)
        distance = (positions[None, :] - positions[:, None]).clamp(-reach, reach)  # (T, T)
        index = (distance + reach).expand(batch, n_heads, length, length)
        rows = real_rows(mask) if pack else None
        padded = rows is not None or not pack
        return cls(*span, batch, length, rows, reach, index, ~mask[:, None, None, :] if padded else None)


@dataclass
class AttentionPlan:
    """Per-call constants of every layer's attention: the padded shape, the real positions' flat indices (N,)
    (None when there is no padding), the attention groups, and `order`, the packed positions in the groups'
    order (None when the groups are in the batch's order already: `translate_ids` sorts by length)."""

    batch: int
    length: int
    rows: Optional[torch.Tensor]
    groups: list[AttentionGroup]
    order: Optional[torch.Tensor]

    @classmethod
    def build(cls, mask: torch.Tensor, n_heads: int, max_relative_distance: int, pack: bool = True) -> "AttentionPlan":
        """Packed (the default): the sentences of a ragged batch attend in length groups (`length_groups`), each
        padded to its own longest; `mask` must be a prefix mask (real positions first, the DESIGN convention)."""
        batch, length = mask.shape
        rows = real_rows(mask) if pack else None
        if rows is None:  # nothing padded, or unpacked: one group of the whole batch
            return cls(batch, length, None, [AttentionGroup.build((0, batch * length), mask, n_heads,
                                                                  max_relative_distance, pack)], None)
        lengths = mask.sum(1).tolist()
        by_length = sorted(range(batch), key=lambda i: lengths[i])
        offsets = [0]
        for size in lengths:
            offsets.append(offsets[-1] + size)
        groups, start = [], 0
        for members in length_groups([lengths[i] for i in by_length]):
            chosen = by_length[members[0] : members[-1] + 1]
            end = start + sum(lengths[i] for i in chosen)
            longest = lengths[chosen[-1]]
            groups.append(AttentionGroup.build((start, end), mask[chosen, :longest], n_heads, max_relative_distance))
            start = end
        order = None
        if by_length != list(range(batch)):
            order = torch.cat([torch.arange(offsets[i], offsets[i + 1], device=mask.device) for i in by_length])
        return cls(batch, length, rows, groups, order)


def length_groups(lengths: list[int], cost: Optional[int] = None) -> list[range]:
    """Split ascending `lengths` into runs that minimise the positions the attention computes (each run padded to
    its longest: b·T) plus `cost` per run (default GROUP_COST): an exact dynamic programme over the distinct
    lengths. Each run's indices into `lengths`."""
    cost = GROUP_COST if cost is None else cost
    distinct = sorted(set(lengths))
    before = [0]  # sentences shorter than each distinct length
    for value in distinct:
        before.append(before[-1] + lengths.count(value))
    best, cut = [0] * (len(distinct) + 1), [0] * (len(distinct) + 1)
    for j in range(1, len(distinct) + 1):
        best[j], cut[j] = min((best[i] + (before[j] - before[i]) * distinct[j - 1] + cost, i) for i in range(j))
    bounds, j = [], len(distinct)
    while j:
        bounds.append(range(before[cut[j]], before[j]))
        j = cut[j]
    return bounds[::-1]


ONEDNN = torch.backends.mkldnn.is_available()  # False: torch's default GEMM everywhere (the bench's comparison)
_packed: dict[int, tuple[weakref.ref, tuple[int, int], torch.Tensor]] = {}


def stamp(tensor: torch.Tensor) -> tuple[int, int]:
    """What changes when a tensor's values do: its storage address and version counter. An inference tensor (made
    under inference mode) has no version counter, and an in-place update of it (under inference mode) moves nothing
    else: for it, the XOR of its bits stands in (one read of the tensor, as 64-bit words where it packs into them;
    blind only to a change that leaves that XOR as it was: values moved about, two rows swapped)."""
    if not tensor.is_inference():
        return tensor.data_ptr(), tensor._version
    flat = tensor.detach().reshape(-1)
    words = flat.view(torch.int64) if flat.element_size() == 4 and flat.numel() % 2 == 0 else flat  # no upcast
    return tensor.data_ptr(), torch.hash_tensor(words).item()


def packed(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (out, in) reordered for oneDNN's matmul, built on first use and again when the weight has changed
    since (another storage, or an in-place update: its `stamp`)."""
    key, current = id(weight), stamp(weight)
    entry = _packed.get(key)
    if entry is None or entry[0]() is not weight or entry[1] != current:
        reordered = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        _packed[key] = (weakref.ref(weight, lambda _, key=key: _packed.pop(key, None)), current, reordered)
        return reordered
    return entry[2]


def onednn(x: torch.Tensor) -> bool:
    """Whether `x`'s matmuls take the prepacked oneDNN kernel: float32 on the CPU, no gradient, not traced."""
    return (ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling())


def bucket(rows: int) -> int:
    """`rows` rounded up to one of eight sizes per octave (at most 1/8 more; up to 16 rows, itself). oneDNN builds a
    primitive for every matmul shape it meets and keeps up to 1,024 of them (its cache and torch's ideep cache, a few
    hundred KB each): a server meets a new row count with nearly every batch, and its memory grew for tens of
    minutes until the caches were full (~300 MB of primitives). With the rows bucketed it meets a few dozen."""
    if rows <= 16:
        return rows
    step = 1 << (rows.bit_length() - 4)
    return -(-rows // step) * step


def bucketed(matmul: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """matmul(x) of rows x (N, in) run on `bucket`(N) rows, the extra ones zero, and cut back to N (a row's output
    depends on that row alone)."""
    rows = x.shape[0]
    size = bucket(rows)
    if size == rows:
        return matmul(x)
    return matmul(torch.cat([x, x.new_zeros(size - rows, x.shape[1])]))[:rows]


def prepacked(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
              gelu: bool = False) -> torch.Tensor:
    """x @ weight.t() + bias of rows x (N, in), then GELU with `gelu` (fused, erf as F.gelu's default): oneDNN's
    matmul on the weight reordered once (`packed`), its rows bucketed."""
    reordered, attr, algorithm = packed(weight), "gelu" if gelu else "none", "none" if gelu else ""
    return bucketed(lambda rows: torch.ops.mkldnn._linear_pointwise(rows, reordered, bias, attr, [], algorithm), x)


def linear(module: nn.Module, x: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """module(x), then GELU with `gelu`: `prepacked` where `onednn(x)`, else the module itself (any other device or
    dtype, an int8 layer)."""
    if type(module) is nn.Linear and onednn(x) and x.dim() == 2:
        return prepacked(x, module.weight, module.bias, gelu)
    return F.gelu(module(x)) if gelu else module(x)


def tied_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.t() (the tied output projection, no bias): `prepacked` where `onednn(x)`."""
    if onednn(x) and x.dim() == 2:
        return prepacked(x, weight)
    return x @ weight.t()


def real_rows(mask: torch.Tensor) -> Optional[torch.Tensor]:
    """The real positions' indices in the flattened (B·T) layout (N,), or None when nothing is padded (one host sync)."""
    return None if bool(mask.all()) else mask.reshape(-1).nonzero().squeeze(1)


def attention(branch: AttentionBranch, x: torch.Tensor, plan: AttentionPlan) -> torch.Tensor:
    """SAN(LN(x)) of packed positions x (N, D) → (N, D); RelativeSelfAttention.forward's arithmetic, group by group."""
    module = branch.attention
    qkv = linear(module.qkv, F.layer_norm(x, x.shape[-1:]))  # (N, 3D)
    if plan.order is not None:
        qkv = qkv.index_select(0, plan.order)  # the groups' order
    contexts = [attend(module, qkv[group.start : group.end], group) for group in plan.groups]
    context = contexts[0] if len(contexts) == 1 else torch.cat(contexts)  # (N, D)
    if plan.order is not None:
        context = torch.empty_like(context).index_copy_(0, plan.order, context)  # back to the batch's order
    return linear(module.out, context)


def attend(module: nn.Module, qkv: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
    """The attention context (n, D) of one group's packed q, k, v (n, 3D), computed in its padded (b, T) layout."""
    heads, d_head, limit = module.n_heads, module.d_head, module.max_relative_distance
    if group.rows is not None:
        qkv = qkv.new_zeros(group.batch * group.length, qkv.shape[-1]).index_copy_(0, group.rows, qkv)  # (b·T, 3D)
    q, k, v = qkv.view(group.batch, group.length, 3, heads, d_head).permute(2, 0, 3, 1, 4)  # 3×(b, H, T, dh)
    relative = q @ module.relative_keys.weight[limit - group.reach : limit + group.reach + 1].t()  # (b, H, T, 2·reach+1)
    bias = relative.gather(-1, group.index).div_(math.sqrt(d_head))  # (b, H, T, T)
    if group.padded_keys is not None:
        bias.masked_fill_(group.padded_keys, float("-inf"))
    context = sdpa(q, k, v, attn_mask=bias)  # (b, H, T, dh)
    context = context.transpose(1, 2).reshape(group.batch * group.length, heads * d_head)  # (b·T, D)
    return context.index_select(0, group.rows) if group.rows is not None else context


def feed_forward(branch: FeedForwardBranch, x: torch.Tensor) -> torch.Tensor:
    """Linear(GELU(Linear(LN(x)))) of x (N, D) → (N, D)."""
    return linear(branch.outer, linear(branch.inner, F.layer_norm(x, x.shape[-1:]), gelu=True))


@torch.no_grad()
def run_inference(h: torch.Tensor, mask: torch.Tensor, ops: list[Op], pack: bool = True) -> torch.Tensor:
    """Apply `ops` to h (B, T, 2D) with mask (B, T); returns the last state (B, T, 2D), padded positions zero.
    `pack` False: every position computed, the attention one padded batch, no host sync (reder/runtime/compiled.py's path
    under torch.compile); padded positions then hold what they compute, not zero."""
    if not ops:
        return h
    batch, length, width = h.shape
    first_layer = ops[0][0].attention.attention
    plan = AttentionPlan.build(mask, first_layer.n_heads, first_layer.max_relative_distance, pack)
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
