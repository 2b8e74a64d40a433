"""The reversible duplex layer (regular form and exact inverse) and the invertible ActNorm."""
import contextlib
from collections.abc import Iterator
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from reder.attention import RelativeSelfAttention
from reder.config import ModelConfig


class RngState:
    """The RNG state one sub-layer drew its dropout masks from; replaying it reproduces the masks exactly.

    `capture()` records the current state and lets the sub-layer draw from the global generator as usual;
    `replay()` runs the sub-layer on a forked generator set to the recorded state, leaving the global one
    untouched (RevNet-style recomputation; the global RNG is never re-seeded).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.accelerator = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type="cuda" if devices else "cpu"):
            torch.set_rng_state(self.cpu)
            if self.accelerator is not None:
                torch.cuda.set_rng_state(self.accelerator, self.device)
            yield


LayerRng = tuple[Optional[RngState], Optional[RngState]]  # (attention branch, feed-forward branch)


class AttentionBranch(nn.Module):
    """Drop(SAN(LN(x))), LayerNorm without affine parameters."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention = RelativeSelfAttention(cfg.d_model, cfg.n_heads, cfg.max_relative_distance, cfg.attention_dropout)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        normed = F.layer_norm(x, x.shape[-1:])
        return self.dropout(self.attention(normed, mask))


class FeedForwardBranch(nn.Module):
    """Drop(Linear(Dropout(GELU(Linear(LN(x)))))), LayerNorm without affine parameters."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.inner = nn.Linear(cfg.d_model, cfg.ffn_dim)
        self.outer = nn.Linear(cfg.ffn_dim, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout(F.gelu(self.inner(F.layer_norm(x, x.shape[-1:]))))  # (B, T, ffn_dim)
        return self.dropout(self.outer(hidden))


class DuplexLayer(nn.Module):
    """F: A' = A + S(B); B' = B + G(A').  F⁻¹: B = B' − G(A'); A = A' − S(B).  State (B, T, 2D) = [A; B]."""

    # Whether a branch is handed a contiguous copy of its input. A half of the state is a strided view (stride 2D)
    # where a sum is contiguous (stride D), and each branch sees both: eager kernels take either, but a compiled
    # branch would be compiled again for each layout (set by the harness's `compile_branches`, nowhere else, so
    # the eager trunk's arithmetic stays as it is).
    contiguous_branch_inputs = False

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention = AttentionBranch(cfg)
        self.feed_forward = FeedForwardBranch(cfg)
        self.stochastic = cfg.dropout > 0 or cfg.attention_dropout > 0

    def run_branch(
        self, branch: nn.Module, x: torch.Tensor, mask: torch.Tensor, rng: Optional[RngState], record: bool
    ) -> tuple[torch.Tensor, Optional[RngState]]:
        """Run one branch, recording its RNG state (record=True) or replaying a recorded one."""
        extra = (mask,) if branch is self.attention else ()
        if self.contiguous_branch_inputs:
            x = x.contiguous()
        if record:
            rng = RngState(x.device)
        if rng is None or record:
            return branch(x, *extra), rng
        with rng.replay():
            return branch(x, *extra), rng

    def step(
        self, h: torch.Tensor, mask: torch.Tensor, inverse: bool, rng: Optional[LayerRng] = None
    ) -> tuple[torch.Tensor, LayerRng]:
        """Apply F (inverse=False) or F⁻¹ (inverse=True); replay `rng` if given, else record it when dropout is live."""
        record = rng is None and self.training and self.stochastic
        rng_attention, rng_feed_forward = rng if rng is not None else (None, None)
        first, second = h.chunk(2, dim=-1)  # (B, T, D) each
        if not inverse:
            update, rng_attention = self.run_branch(self.attention, second, mask, rng_attention, record)
            first = first + update
            update, rng_feed_forward = self.run_branch(self.feed_forward, first, mask, rng_feed_forward, record)
            second = second + update
        else:
            update, rng_feed_forward = self.run_branch(self.feed_forward, first, mask, rng_feed_forward, record)
            second = second - update
            update, rng_attention = self.run_branch(self.attention, second, mask, rng_attention, record)
            first = first - update
        return torch.cat([first, second], dim=-1), (rng_attention, rng_feed_forward)


class ActNorm(nn.Module):
    """y = x·exp(s) + b per feature, initialised from the first batch to zero mean and unit variance."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.register_buffer("initialized", torch.tensor(False))
        # The buffer's value on the host: reading a CUDA buffer in every forward would sync host and device.
        # None after a load (the loaded buffer is read once, at the next `is_initialized`).
        self._initialized_on_host: Optional[bool] = False

    def is_initialized(self) -> bool:
        """Whether the data-dependent init has run (the `initialized` buffer, read from the device at most once)."""
        if self._initialized_on_host is None:
            self._initialized_on_host = bool(self.initialized)
        return self._initialized_on_host

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._initialized_on_host = None  # the loaded buffer decides

    @torch.no_grad()
    def initialize(self, x: torch.Tensor, mask: torch.Tensor) -> None:
        """Data-dependent init over real positions; statistics are summed over DDP ranks so replicas agree."""
        weight = mask[..., None].double()  # (B, T, 1): masked sums, not x[mask], whose shape would need a sync
        x = x.double()
        stats = torch.stack([(x * weight).sum((0, 1)), (x.pow(2) * weight).sum((0, 1)), weight.sum().expand(x.shape[-1])])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(stats)
        mean = stats[0] / stats[2]
        std = (stats[1] / stats[2] - mean.pow(2)).clamp_min(0).sqrt()
        self.log_scale.copy_(-torch.log(std + 1e-6))
        self.bias.copy_(-mean * torch.exp(self.log_scale.double()))
        self.initialized.fill_(True)
        self._initialized_on_host = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.exp(self.log_scale) + self.bias

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return (y - self.bias) * torch.exp(-self.log_scale)
