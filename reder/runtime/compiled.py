"""Compiled decoding: the inference trunk under torch.compile, an option.

On a GPU a small batch's decode is ~25 kernel launches per layer, and their launch cost, not their arithmetic,
sets its time. CUDA graphs replay a recorded sequence of kernels in one launch, but only at the shapes recorded.
On CUDA `StaticTrunk` pads a batch (B, T, 2D) up to the next bucket of `batch_buckets(B)` × LENGTHS (the extra
sentences one real position each, the extra positions masked out as keys), runs reder/runtime/onednn.py's trunk
unpacked (`run_inference(..., pack=False)`: no host sync, no data-dependent shape) under `torch.compile` mode
"reduce-overhead" (CUDA graphs), and slices the real batch back, its padded positions zero as the eager trunk leaves
them: one graph per bucket and direction, compiled at its first call.

On a CPU there are no launches to save; what costs is the Python and the small ops between the GEMMs. There a batch
without padding (every batch of one sentence) runs the same unpacked trunk through inductor with its weights
frozen into the graph (`torch._inductor.config.freezing`): each linear layer a oneDNN matmul on a weight packed at
compile time, the FFN's GELU and some residual updates fused into their matmuls, LayerNorm and the attention's bias
in generated C++. Its batch and length dimensions are dynamic: one graph per direction (two where a short input
clips the relative distances' reach), compiled at its first call (seconds to a minute). A padded batch runs
the eager packed trunk instead, which computes no padded position outside the attention (docs/results/decoding.md,
"Decoding at the floor": bucketed static shapes pad and halved the CPU's batch-64 throughput). The frozen weights
are those of the first call: a later change to them (training, `load_state_dict`) raises instead of decoding
with stale ones.

Padding changes no real position's arithmetic: a padded key is masked out of every real query's softmax, and every
other op is per position; the tests compare tokens with the eager path (tests/reder/test_static.py). Options:
`reder.load(dir, compile=True)`, `--compile` of `reder.translate`.
"""
import types
from typing import Callable, Optional

import torch
from torch import nn

from reder.runtime.onednn import Op, run_inference, stamp

LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # upsampled positions T': ≤ 1.5× apart
MAX_BATCH_BUCKET = 1024  # batch buckets: the powers of two up to this, then multiples of it
RECOMPILE_LIMIT = 256  # graphs per compiled function: buckets × 2 directions (torch's default, 8, is too few)
# A CPU trunk compiled for one direction's ops: the compiled function, the parameters frozen into it, their stamps
Frozen = tuple[Callable[..., torch.Tensor], list[nn.Parameter], list[tuple[int, int]]]


def bucket(size: int, sizes: tuple[int, ...]) -> int:
    """The smallest of `sizes` that holds `size`; beyond the largest, `size` rounded up to a multiple of it."""
    for candidate in sizes:
        if candidate >= size:
            return candidate
    return -(-size // sizes[-1]) * sizes[-1]


def batch_buckets() -> tuple[int, ...]:
    """1, 2, 4, …, MAX_BATCH_BUCKET."""
    return tuple(2**k for k in range(MAX_BATCH_BUCKET.bit_length()))


def pad_to_bucket(h: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h (B, T, 2D) and its mask (B, T) zero-padded to the bucket's (B', T'); each added sentence has one real
    position (a sentence with none would attend to nothing: a softmax over −inf only)."""
    batch, length, width = h.shape
    padded_batch, padded_length = bucket(batch, batch_buckets()), bucket(length, LENGTHS)
    padded = h.new_zeros(padded_batch, padded_length, width)
    padded[:batch, :length] = h
    padded_mask = mask.new_zeros(padded_batch, padded_length)
    padded_mask[:batch, :length] = mask
    padded_mask[batch:, 0] = True
    return padded, padded_mask


def stamps(parameters: list[nn.Parameter]) -> list[tuple[int, int]]:
    """Each parameter's `reder.runtime.onednn.stamp`: what changes when a weight does."""
    return [stamp(p) for p in parameters]


def own_code(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`function` on a copy of its code object: torch.compile keeps compiled graphs per code object, guarded by the
    parameters' identity, not their values, so a trunk compiled again after its weights changed would otherwise
    find the graph frozen with the old ones."""
    return types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__,
                              function.__defaults__, function.__closure__)


class StaticTrunk:
    """`REDER.layers`' inference trunk under torch.compile (see the module doc): at bucketed static shapes on CUDA,
    with frozen weights and dynamic shapes for unpadded batches on a CPU. `backend`: torch.compile's
    ("inductor"), or None: the same shapes and dispatch run eagerly, not compiled (for tests). `buckets`: whether to
    pad to the buckets (default: on any device but a CPU; True on a CPU runs the CUDA path's shapes, for tests)."""

    def __init__(self, device: torch.device, backend: Optional[str] = "inductor",
                 buckets: Optional[bool] = None) -> None:
        self.backend, self.buckets = backend, device.type != "cpu" if buckets is None else buckets
        self.run: Callable[..., torch.Tensor] = run_inference
        if backend is not None:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        if backend is not None and self.buckets:
            mode = "reduce-overhead" if device.type == "cuda" and backend == "inductor" else None
            self.run = torch.compile(run_inference, mode=mode, backend=backend, dynamic=False)
        self.frozen: dict[tuple[tuple[int, bool], ...], Frozen] = {}  # CPU: by the ops' (id(layer), inverse)

    def __call__(self, h: torch.Tensor, mask: torch.Tensor, ops: list[Op]) -> torch.Tensor:
        """run_inference(h, mask, ops) (B, T, 2D), padded positions zero: compiled at the bucket's shape (CUDA), or
        compiled as it is when nothing is padded and eagerly packed otherwise (CPU)."""
        if not self.buckets:
            return self.unpadded(h, mask, ops) if bool(mask.all()) else run_inference(h, mask, ops)
        batch, length, _ = h.shape
        padded, padded_mask = pad_to_bucket(h, mask)
        out = self.run(padded, padded_mask, ops, False)[:batch, :length]  # (B, T, 2D)
        # masked_fill makes a new tensor: a CUDA graph's output buffer is overwritten by its next replay
        return out.masked_fill(~mask[..., None], 0.0)

    def unpadded(self, h: torch.Tensor, mask: torch.Tensor, ops: list[Op]) -> torch.Tensor:
        """The trunk of a batch without padding, compiled with the weights frozen in at the first call for these
        `ops`, batch and length dynamic (a closure over `ops`: torch.compile guards on it more cheaply than on an
        argument, ~0.5 ms a call on the project's CPU)."""
        if self.backend is None:
            return run_inference(h, mask, ops, False)
        key = tuple((id(layer), inverse) for layer, inverse in ops)
        if key not in self.frozen:
            parameters = [p for layer, _ in ops for p in layer.parameters()]
            trunk = own_code(lambda h, mask: run_inference(h, mask, ops, False))
            self.frozen[key] = (torch.compile(trunk, backend=self.backend, dynamic=False), parameters, stamps(parameters))
        trunk, parameters, compiled_with = self.frozen[key]
        if stamps(parameters) != compiled_with:
            raise RuntimeError("the model's weights changed after its trunk was compiled with them frozen in: "
                               "compile it again (reder.runtime.compiled.compiled) or decode eagerly (model.static_trunk = None)")
        for dim in (0, 1):
            torch._dynamo.maybe_mark_dynamic(h, dim)
            torch._dynamo.maybe_mark_dynamic(mask, dim)
        # Set for the call, not through torch.compile's options: torch.compile reads it when it traces (the first
        # call, and any recompile), and inductor.config.patch costs ~1 ms a call.
        config, freezing = torch._inductor.config, torch._inductor.config.freezing
        config.freezing = True
        try:
            return trunk(h, mask)
        finally:
            config.freezing = freezing


def compiled(model: nn.Module, backend: Optional[str] = "inductor", buckets: Optional[bool] = None) -> nn.Module:
    """`model` (a REDER) with its inference trunk run by a StaticTrunk on the model's device (in place; returned)."""
    model.static_trunk = StaticTrunk(next(model.parameters()).device, backend, buckets)
    return model
