"""REDER: one end of reversible layers per language; x→y runs x's end regular then y's end inverse."""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from reder.config import DIRECTIONS, PAD_ID, LossConfig, ModelConfig
from reder.ctc import collapse_frames, smoothed_ctc_loss, valid_mask, viterbi_align
from reder.decode import ctc_beam_search, ctc_greedy, strip_special
from reder.layers import ActNorm, DuplexLayer, LayerRng
from reder.losses import forward_backward_agreement
from reder.reversible import Op, invert_ops, run_trunk

ENDS = {"src2tgt": ("src", "tgt"), "tgt2src": ("tgt", "src")}  # direction → (reading end, writing end)
REVERSE = {"src2tgt": "tgt2src", "tgt2src": "src2tgt"}


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


class REDER(nn.Module):
    """The reversible duplex Transformer (Zheng et al., NeurIPS 2021), CTC output at both ends.

    Convention: the reading end runs its layers 1..L/2 in regular form, the writing end its layers L/2..1
    in inverse form, so tgt2src is exactly the inverse map of src2tgt (DESIGN.md).
    """

    def __init__(self, cfg: ModelConfig, loss_config: Optional[LossConfig] = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.loss_config = loss_config or LossConfig()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD_ID)
        nn.init.normal_(self.embed.weight, std=cfg.d_model**-0.5)
        self.positions = nn.ModuleDict({end: nn.Embedding(cfg.max_positions, cfg.d_model) for end in ("src", "tgt")})
        src_end = nn.ModuleList(DuplexLayer(cfg) for _ in range(cfg.layers_per_end))
        tgt_end = src_end if cfg.share_ends else nn.ModuleList(DuplexLayer(cfg) for _ in range(cfg.layers_per_end))
        self.ends = nn.ModuleDict({"src": src_end, "tgt": tgt_end})
        self.actnorm = nn.ModuleDict({end: ActNorm(2 * cfg.d_model) for end in ("src", "tgt")})
        self.dropout = nn.Dropout(cfg.dropout)

    def ops(self, direction: str) -> list[Op]:
        """The trunk's steps for a direction: reading end regular 1..L/2, then writing end inverse L/2..1."""
        _check_direction(direction)
        reading, writing = ENDS[direction]
        return [(layer, False) for layer in self.ends[reading]] + [(layer, True) for layer in reversed(self.ends[writing])]

    def layers(self, h: torch.Tensor, mask: torch.Tensor, direction: str) -> torch.Tensor:
        """The trunk alone on continuous states h (B, T, 2D); layers(layers(h, m, d), m, reverse d) == h."""
        states, _ = run_trunk(h, mask, self.ops(direction), self.cfg.memory_efficient)
        return states[-1]

    def embed_input(
        self, tokens: torch.Tensor, lengths: torch.Tensor, end: str, upsample: bool = True, dropout: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens (B, T) ending in EOS → H₀ (B, r·T, 2D) after ActNorm, its mask and lengths."""
        ratio = self.cfg.upsample_ratio if upsample else 1
        tokens, lengths = tokens.repeat_interleave(ratio, dim=1), lengths * ratio  # x1 x1 x2 x2 … eos eos
        length = tokens.shape[1]
        if length > self.cfg.max_positions:
            raise ValueError(f"input of {length} positions (after upsampling) exceeds max_positions={self.cfg.max_positions}")
        mask = valid_mask(lengths, length)
        e = math.sqrt(self.cfg.d_model) * self.embed(tokens) + self.positions[end].weight[:length]  # (B, rT, D)
        if dropout:
            e = self.dropout(e)
        h = torch.cat([e, e], dim=-1)  # (B, rT, 2D)
        if self.training and not self.actnorm[end].initialized:
            self.actnorm[end].initialize(h, mask)
        return self.actnorm[end](h), mask, lengths

    def project(self, h: torch.Tensor, end: str) -> torch.Tensor:
        """Writing end: inverse ActNorm, average the halves, tied logits → float32 log-probs (B, T, V)."""
        first, second = self.actnorm[end].inverse(h).chunk(2, dim=-1)
        logits = ((first + second) / 2) @ self.embed.weight.t()  # (B, T, V)
        return F.log_softmax(logits.float(), dim=-1)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, T) → CTC log-probabilities (B, r·T, V) and output lengths (B,)."""
        _check_direction(direction)
        reading, writing = ENDS[direction]
        h, mask, out_lengths = self.embed_input(tokens, lengths, reading)
        return self.project(self.layers(h, mask, direction), writing), out_lengths

    def initialize(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor, tgt_tokens: torch.Tensor, tgt_lengths: torch.Tensor) -> None:
        """Data-initialise both ends' ActNorm from one batch (done by the first `loss` call in training)."""
        with torch.no_grad():
            for tokens, lengths, end in ((src_tokens, src_lengths, "src"), (tgt_tokens, tgt_lengths, "tgt")):
                if not self.actnorm[end].initialized:
                    self.embed_input(tokens, lengths, end)

    def loss(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        tgt_tokens: torch.Tensor,
        tgt_lengths: torch.Tensor,
        step: int,
        directions: tuple[str, ...] = DIRECTIONS,
    ) -> dict[str, torch.Tensor]:
        """Named loss terms per direction and their weighted `total` (auxiliary terms from aux_start_step).

        Passing one direction at a time and calling backward on each total bounds memory: with one joint
        backward, each layer's parameter gradient from one direction waits in autograd's buffers until the
        other direction's backward reaches that layer (one extra copy of the trunk's gradients at peak).
        """
        for direction in directions:
            _check_direction(direction)
        if self.training:
            self.initialize(src_tokens, src_lengths, tgt_tokens, tgt_lengths)
        config = self.loss_config
        aux_on = step >= config.aux_start_step
        use_fba, use_cc = aux_on and config.lambda_fba > 0, aux_on and config.lambda_cc > 0
        zero = src_tokens.new_zeros((), dtype=torch.float32)
        terms: dict[str, torch.Tensor] = {}
        pairs = {"src2tgt": (src_tokens, src_lengths, tgt_tokens, tgt_lengths), "tgt2src": (tgt_tokens, tgt_lengths, src_tokens, src_lengths)}
        for direction in directions:
            x, x_lengths, y, y_lengths = pairs[direction]
            ctc, fba, cc = self._direction_loss(direction, x, x_lengths, y, y_lengths, use_fba, use_cc)
            terms[f"ctc_{direction}"], terms[f"fba_{direction}"], terms[f"cc_{direction}"] = ctc, fba or zero, cc or zero
        terms["total"] = sum(
            terms[f"ctc_{d}"] + config.lambda_fba * terms[f"fba_{d}"] + config.lambda_cc * terms[f"cc_{d}"] for d in directions
        )
        return terms

    def _direction_loss(
        self, direction: str, x: torch.Tensor, x_lengths: torch.Tensor, y: torch.Tensor, y_lengths: torch.Tensor, use_fba: bool, use_cc: bool
    ) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        reading, writing = ENDS[direction]
        h0, mask, out_lengths = self.embed_input(x, x_lengths, reading)
        ops = self.ops(direction)
        states, rngs = run_trunk(h0, mask, ops, self.cfg.memory_efficient, keep_all=use_fba)
        log_probs = self.project(states[-1], writing)  # (B, rT, V)
        ctc = smoothed_ctc_loss(log_probs, out_lengths, y, y_lengths, self.cfg.blank_id, self.cfg.label_smoothing)
        fba = self._agreement([h0, *states], mask, log_probs.detach(), out_lengths, y, y_lengths, ops, rngs, writing) if use_fba else None
        cc = self._cycle(log_probs.detach(), out_lengths, x, x_lengths, REVERSE[direction]) if use_cc else None
        return ctc, fba, cc

    def _agreement(
        self,
        forward_states: list[torch.Tensor],
        mask: torch.Tensor,
        log_probs: torch.Tensor,
        lengths: torch.Tensor,
        y: torch.Tensor,
        y_lengths: torch.Tensor,
        ops: list[Op],
        rngs: list[LayerRng],
        writing: str,
    ) -> torch.Tensor:
        """FBA: run the reverse direction on y's best CTC alignment a* (no upsampling, same dropout masks,
        no gradient) and pull every forward state towards the reverse state it lines up with."""
        with torch.no_grad():
            alignment, feasible, _ = viterbi_align(log_probs, lengths, y, y_lengths, self.cfg.blank_id)  # (B, rT)
            g0, _, _ = self.embed_input(alignment, lengths, writing, upsample=False, dropout=False)
            reverse_states = self.reverse_states(g0, mask, ops, rngs)
        return forward_backward_agreement(forward_states, reverse_states, mask & feasible[:, None])

    @staticmethod
    def reverse_states(g0: torch.Tensor, mask: torch.Tensor, ops: list[Op], rngs: list[LayerRng]) -> list[torch.Tensor]:
        """Run the inverse of `ops` from g0 with the forward pass's dropout masks; return its L+1 states in
        reverse order, so entry k lines up with the forward state after k steps."""
        reverse, _ = run_trunk(g0, mask, invert_ops(ops), memory_efficient=False, keep_all=True, rngs=rngs[::-1])
        return [g0, *reverse][::-1]

    def _cycle(self, log_probs: torch.Tensor, lengths: torch.Tensor, x: torch.Tensor, x_lengths: torch.Tensor, back: str) -> torch.Tensor:
        """CC: collapse the per-frame argmax (blanks kept), translate it back, CTC against the original x."""
        y_bar, y_bar_lengths = collapse_frames(log_probs.argmax(dim=-1), lengths, self.cfg.blank_id, keep_blank=True)
        back_log_probs, back_lengths = self(y_bar, y_bar_lengths, back)
        return smoothed_ctc_loss(back_log_probs, back_lengths, x, x_lengths, self.cfg.blank_id, self.cfg.label_smoothing)

    @torch.no_grad()
    def translate(self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str, beam_size: int = 1) -> list[list[int]]:
        """Token ids (B, T) ending in EOS → one hypothesis per sentence (ids, EOS and blanks removed)."""
        log_probs, out_lengths = self(tokens, lengths, direction)
        if beam_size == 1:
            hypotheses = ctc_greedy(log_probs, out_lengths, self.cfg.blank_id)
        else:
            hypotheses = [labels for labels, _ in ctc_beam_search(log_probs, out_lengths, self.cfg.blank_id, beam_size)]
        return [strip_special(h, self.cfg.blank_id) for h in hypotheses]
