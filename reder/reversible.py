"""Run a stack of reversible duplex layers, and backprop through it without storing activations.

With `memory_efficient`, each step is a `_ReversibleStep` and only the top one keeps its output. In
backward the steps run from the top, each rebuilding each layer's input from its output (F⁻¹ for a regular step, F for an inverse step) while it
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


class _Tape:
    """Hands each step, in backward, the output state that the step above it has just rebuilt."""

    def __init__(self) -> None:
        self.state: Optional[torch.Tensor] = None


class _ReversibleStep(torch.autograd.Function):
    """One trunk step that saves no activations. Only the top step keeps its output; every other step gets
    its output from the tape, rebuilt by the step above. The layer's parameters are explicit inputs, so
    each step returns its parameter gradients through the engine as soon as it is done: gradients
    accumulate layer by layer (DDP sees each one ready once) and only one layer's are in flight."""

    @staticmethod
    def forward(ctx, h, mask, layer, inverse, rng, tape, is_top, rng_sink, *params):
        out, used = layer.step(h, mask, inverse, rng)
        rng_sink.append(used)
        ctx.layer, ctx.inverse, ctx.rng, ctx.tape, ctx.is_top, ctx.params = layer, inverse, used, tape, is_top, params
        ctx.autocast = (h.device.type, torch.is_autocast_enabled(h.device.type), torch.get_autocast_dtype(h.device.type))
        ctx.save_for_backward(mask, out) if is_top else ctx.save_for_backward(mask)
        return out

    @staticmethod
    def backward(ctx, grad):
        mask, *top = ctx.saved_tensors
        out = top[0] if ctx.is_top else ctx.tape.state
        if out is None:
            raise RuntimeError("reversible trunk: backward ran twice or out of order through the same graph")
        device_type, autocast_on, autocast_dtype = ctx.autocast
        param_grads: dict = {}
        with torch.autocast(device_type, autocast_dtype) if autocast_on else contextlib.nullcontext():
            ctx.tape.state, grad = _step_back(ctx.layer, ctx.inverse, out.detach(), grad, mask, ctx.rng, param_grads)
        return (grad, None, None, None, None, None, None, None, *[param_grads.get(p) for p in ctx.params])


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
    needs_grad = torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for layer, _ in ops for p in layer.parameters()))
    if not (memory_efficient and needs_grad):
        states, recorded = _run_plain(h, mask, ops, rngs)
        return (states if keep_all else states[-1:]), recorded
    tape, sink, states = _Tape(), [], []
    for index, (layer, inverse) in enumerate(ops):
        params = [p for p in layer.parameters() if p.requires_grad]
        rng = rngs[index] if rngs is not None else None
        h = _ReversibleStep.apply(h, mask, layer, inverse, rng, tape, index == len(ops) - 1, sink, *params)
        if keep_all or index == len(ops) - 1:
            states.append(h)
    return states, sink
