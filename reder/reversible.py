"""Run a stack of reversible duplex layers, and backprop through it without storing activations.

`_ReversibleTrunk` keeps only the trunk's last state. In backward it walks the layers from the top,
rebuilding each layer's input from its output (F⁻¹ for a regular step, F for an inverse step) while it
back-propagates through the recomputed branches, replaying each branch's recorded RNG state so the
dropout masks are the ones the forward pass used (RevNet, Gomez et al. 2017). `run_trunk(...,
memory_efficient=False)` is the plain-autograd twin through the same blocks, kept as the test reference.
"""
import contextlib
from typing import Optional

import torch

from reder.layers import DuplexLayer, LayerRng

Op = tuple[DuplexLayer, bool]  # (layer, inverse)


def invert_ops(ops: list[Op]) -> list[Op]:
    """The op list of the inverse map: reversed order, each step flipped between F and F⁻¹."""
    return [(layer, not inverse) for layer, inverse in reversed(ops)]


def _run_plain(
    h: torch.Tensor, mask: torch.Tensor, ops: list[Op], rngs: Optional[list[LayerRng]]
) -> tuple[list[torch.Tensor], list[LayerRng]]:
    states, recorded = [], []
    for index, (layer, inverse) in enumerate(ops):
        h, rng = layer.step(h, mask, inverse, rngs[index] if rngs is not None else None)
        states.append(h)
        recorded.append(rng)
    return states, recorded


def _vjp(
    layer: DuplexLayer,
    branch: torch.nn.Module,
    x: torch.Tensor,
    mask: torch.Tensor,
    rng,
    grad_output: torch.Tensor,
    param_grads: dict,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recompute branch(x) with its recorded RNG; return (branch(x), grad wrt x) and add parameter grads."""
    params = [p for p in branch.parameters() if p.requires_grad]
    with torch.enable_grad():
        x = x.detach().requires_grad_()
        update, _ = layer.run_branch(branch, x, mask, rng, record=False)
        grads = torch.autograd.grad(update, [x, *params], grad_output, allow_unused=True)
    for param, grad in zip(params, grads[1:]):
        if grad is not None:
            param_grads[param] = param_grads[param] + grad if param in param_grads else grad
    return update.detach(), grads[0]


def _step_back(
    layer: DuplexLayer, inverse: bool, out: torch.Tensor, grad: torch.Tensor, mask: torch.Tensor, rng: LayerRng, param_grads: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """Given a step's output and the gradient there, return its input and the gradient at the input."""
    rng_attention, rng_feed_forward = rng
    first, second = out.chunk(2, dim=-1)  # (B, T, D) each
    grad_first, grad_second = grad.chunk(2, dim=-1)
    if not inverse:  # out = (A + S(B), B + G(A'))
        update, dx = _vjp(layer, layer.feed_forward, first, mask, rng_feed_forward, grad_second, param_grads)
        second, grad_first = second - update, grad_first + dx
        update, dx = _vjp(layer, layer.attention, second, mask, rng_attention, grad_first, param_grads)
        first, grad_second = first - update, grad_second + dx
    else:  # out = (A' − S(B), B' − G(A'))
        update, dx = _vjp(layer, layer.attention, second, mask, rng_attention, -grad_first, param_grads)
        first, grad_second = first + update, grad_second + dx
        update, dx = _vjp(layer, layer.feed_forward, first, mask, rng_feed_forward, -grad_second, param_grads)
        second, grad_first = second + update, grad_first + dx
    return torch.cat([first, second], dim=-1), torch.cat([grad_first, grad_second], dim=-1)


class _ReversibleTrunk(torch.autograd.Function):
    """Autograd function over the whole trunk; parameters are explicit inputs so their gradients are
    returned once through the engine (no nested backward, so DDP sees each gradient ready once)."""

    @staticmethod
    def forward(ctx, h, mask, ops, rngs, keep_all, rng_sink, *params):
        states, recorded = _run_plain(h, mask, ops, rngs)
        rng_sink.extend(recorded)
        ctx.ops, ctx.rngs, ctx.keep_all = ops, recorded, keep_all
        ctx.params = params
        ctx.autocast = (h.device.type, torch.is_autocast_enabled(h.device.type), torch.get_autocast_dtype(h.device.type))
        ctx.save_for_backward(states[-1], mask)
        return tuple(states) if keep_all else states[-1]

    @staticmethod
    def backward(ctx, *grads):
        out, mask = ctx.saved_tensors
        h, grad = out.detach(), grads[-1]
        param_grads: dict = {}
        device_type, autocast_on, autocast_dtype = ctx.autocast
        autocast = torch.autocast(device_type, autocast_dtype) if autocast_on else contextlib.nullcontext()
        with autocast:
            for index in reversed(range(len(ctx.ops))):
                layer, inverse = ctx.ops[index]
                h, grad = _step_back(layer, inverse, h, grad, mask, ctx.rngs[index], param_grads)
                if ctx.keep_all and index > 0:
                    grad = grad + grads[index - 1]  # the loss also reads the state after step index-1
        return (grad, None, None, None, None, None, *[param_grads.get(p) for p in ctx.params])


def run_trunk(
    h: torch.Tensor,
    mask: torch.Tensor,
    ops: list[Op],
    memory_efficient: bool,
    keep_all: bool = False,
    rngs: Optional[list[LayerRng]] = None,
) -> tuple[list[torch.Tensor], list[LayerRng]]:
    """Apply `ops` to h (B, T, 2D). Returns the states after every step (keep_all) or just the last, and
    the RNG states the steps used (recorded, or `rngs` replayed) so a later pass can reuse the masks."""
    params = list(dict.fromkeys(p for layer, _ in ops for p in layer.parameters() if p.requires_grad))
    needs_grad = torch.is_grad_enabled() and (h.requires_grad or bool(params))
    if memory_efficient and needs_grad:
        sink: list[LayerRng] = []
        out = _ReversibleTrunk.apply(h, mask, ops, rngs, keep_all, sink, *params)
        return (list(out) if keep_all else [out]), sink
    states, recorded = _run_plain(h, mask, ops, rngs)
    return (states if keep_all else states[-1:]), recorded
