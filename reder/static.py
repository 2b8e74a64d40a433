"""Static-shape decoding (issue 58, item 4): the inference trunk at a few fixed shapes, under torch.compile.

On a GPU a small batch's decode is ~25 kernel launches per layer, and their launch cost, not their arithmetic,
sets its time. CUDA graphs replay a recorded sequence of kernels in one launch, but only at the shapes recorded.
`StaticTrunk` pads a batch (B, T, 2D) up to the next bucket of `batch_buckets(B)` × LENGTHS (the extra sentences
one real position each, the extra positions masked out as keys), runs reder/inference.py's trunk unpacked
(`run_inference(..., pack=False)`: no host sync, no data-dependent shape) under `torch.compile` — mode
"reduce-overhead" (CUDA graphs) on CUDA, the default mode (inductor's fused kernels) on CPU — and slices the real
batch back, its padded positions zero as the eager trunk leaves them. One graph per bucket and direction, compiled
at its first call (seconds to a minute each). Padding changes no real position's arithmetic: a padded key is masked
out of every real query's softmax, and every other op is per position; the tests compare tokens with the eager
path (tests/reder/test_static.py). Options: `reder.load(dir, compile=True)`, `--compile` of `reder.translate`.
"""
from typing import Callable, Optional

import torch
from torch import nn

from reder.inference import Op, run_inference

LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # upsampled positions T': ≤ 1.5× apart
MAX_BATCH_BUCKET = 1024  # batch buckets: the powers of two up to this, then multiples of it
RECOMPILE_LIMIT = 256  # graphs per compiled function: buckets × 2 directions (torch's default, 8, is too few)


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


class StaticTrunk:
    """`REDER.layers`' inference trunk at bucketed static shapes under torch.compile (see the module doc).
    `backend`: torch.compile's ("inductor"), or None: the same padded shapes run eagerly, not compiled (for tests)."""

    def __init__(self, device: torch.device, backend: Optional[str] = "inductor") -> None:
        self.run: Callable[..., torch.Tensor] = run_inference
        if backend is not None:
            mode = "reduce-overhead" if device.type == "cuda" and backend == "inductor" else None
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            self.run = torch.compile(run_inference, mode=mode, backend=backend, dynamic=False)

    def __call__(self, h: torch.Tensor, mask: torch.Tensor, ops: list[Op]) -> torch.Tensor:
        """run_inference(h, mask, ops) at the bucket's shape: (B, T, 2D), padded positions zero."""
        batch, length, _ = h.shape
        padded, padded_mask = pad_to_bucket(h, mask)
        out = self.run(padded, padded_mask, ops, False)[:batch, :length]  # (B, T, 2D)
        # masked_fill makes a new tensor: a CUDA graph's output buffer is overwritten by its next replay
        return out.masked_fill(~mask[..., None], 0.0)


def compiled(model: nn.Module, backend: Optional[str] = "inductor") -> nn.Module:
    """`model` (a REDER) with its inference trunk run by a StaticTrunk on the model's device (in place; returned)."""
    model.static_trunk = StaticTrunk(next(model.parameters()).device, backend)
    return model
