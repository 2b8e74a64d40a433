"""REDER: one end of reversible layers per language; x→y runs x's end regular then y's end inverse."""
import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from reder.config import DIRECTIONS, ENDS, PAD_ID, ModelConfig, check_direction
from reder.ctc import valid_mask
from reder.heads import HeadOutput, make_head
from reder.runtime.onednn import real_rows, run_inference, tied_logits
from reder.layers import ActNorm, DuplexLayer
from reder.reversible import Op, run_trunk



class REDER(nn.Module):
    """The reversible duplex Transformer (Zheng et al., NeurIPS 2021), with an output head at both ends.

    Convention: the reading end runs its layers 1..L/2 in regular form, the writing end its layers L/2..1
    in inverse form, so tgt2src is exactly the inverse map of src2tgt (docs/DESIGN.md, "The model"). The
    head (reder/heads.py, `cfg.head`: CTC or DAG) upsamples the input and owns the output side; the trunk is
    the same for all.
    The model knows nothing of its training objective: reder/objectives/duplex.py's `DuplexLoss(model, loss_config)`
    calls it. Its parameters are saved under its own names (model directories of the older layout, the head's
    `links.*` at the top level, are converted when they load: reder/checkpoint.py, `upgrade_state_dict`).
    `blank_penalty` (direction → c) is subtracted from the CTC blank's logit whenever the model decodes (greedy,
    beam, n-best), not in training: tuned on the validation split by the train stage, it is no parameter but
    travels in the model directory's config.json (reder/checkpoint.py); 0 = the model's own calibration.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD_ID)
        nn.init.normal_(self.embed.weight, std=cfg.d_model**-0.5)
        self.positions = nn.ModuleDict({end: nn.Embedding(cfg.max_positions, cfg.d_model) for end in ("src", "tgt")})
        src_end = nn.ModuleList(DuplexLayer(cfg) for _ in range(cfg.layers_per_end))
        tgt_end = src_end if cfg.share_ends else nn.ModuleList(DuplexLayer(cfg) for _ in range(cfg.layers_per_end))
        self.ends = nn.ModuleDict({"src": src_end, "tgt": tgt_end})
        self.actnorm = nn.ModuleDict({end: ActNorm(2 * cfg.d_model) for end in ("src", "tgt")})
        self.dropout = nn.Dropout(cfg.dropout)
        self.head = make_head(cfg)  # last: parameter order and initialisation are those of the model before heads
        self.blank_penalty: dict[str, float] = dict.fromkeys(DIRECTIONS, 0.0)
        self.fast_inference = True  # eval without gradients: reder/runtime/onednn.py's trunk (False: the reference path)
        self.static_trunk: Optional[Callable[..., torch.Tensor]] = None  # reder/runtime/compiled.py's compiled trunk, an option

    def ops(self, direction: str) -> list[Op]:
        """The trunk's steps for a direction: reading end regular 1..L/2, then writing end inverse L/2..1."""
        check_direction(direction)
        reading, writing = ENDS[direction]
        return [(layer, False) for layer in self.ends[reading]] + [(layer, True) for layer in reversed(self.ends[writing])]

    def layers(self, h: torch.Tensor, mask: torch.Tensor, direction: str) -> torch.Tensor:
        """The trunk alone on continuous states h (B, T, 2D); layers(layers(h, m, d), m, reverse d) == h. In eval
        mode without gradients (and `fast_inference`), reder/runtime/onednn.py's trunk, or the `static_trunk` when set
        (reder/runtime/compiled.py: at bucketed shapes under torch.compile): padded positions come out zero."""
        if self._fast_path():
            if self.static_trunk is not None:
                return self.static_trunk(h, mask, self.ops(direction))
            return run_inference(h, mask, self.ops(direction))
        states, _ = run_trunk(h, mask, self.ops(direction), self.cfg.memory_efficient)
        return states[-1]

    def max_input_length(self) -> int:
        """The longest input (pieces with EOS) whose upsampled sequence fits in max_positions."""
        return self.head.max_input_length()

    def embed_input(
        self, tokens: torch.Tensor, lengths: torch.Tensor, end: str, upsample: bool = True, dropout: bool = True,
        glance: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens (B, T) ending in EOS → H₀ (B, T', 2D) after ActNorm, its mask and lengths; T' the head's
        upsampled length, or T without upsampling (FBA's reverse pass reads an already laid-out target).
        `glance` (positions (B, T') bool, tokens (B, T')): those tokens replace the upsampled input there."""
        if upsample:
            tokens, lengths = self.head.upsample(tokens, lengths)
        if glance is not None:
            tokens = torch.where(glance[0], glance[1], tokens)
        length = tokens.shape[1]
        if length > self.cfg.max_positions:
            raise ValueError(f"input of {length} positions (after upsampling) exceeds max_positions={self.cfg.max_positions}")
        mask = valid_mask(lengths, length)
        e = math.sqrt(self.cfg.d_model) * self.embed(tokens) + self.positions[end].weight[:length]  # (B, rT, D)
        if dropout:
            e = self.dropout(e)
        h = torch.cat([e, e], dim=-1)  # (B, rT, 2D)
        if self.training and not self.actnorm[end].is_initialized():
            self.actnorm[end].initialize(h, mask)
        return self.actnorm[end](h), mask, lengths

    def project(self, h: torch.Tensor, lengths: torch.Tensor, end: str, normalise: bool = True,
                blank_penalty: float = 0.0, rows: Optional[torch.Tensor] = None) -> HeadOutput:
        """Writing end: inverse ActNorm, average the halves into output states o (B, T, D), tied logits →
        log-probs (B, T, V) in the head's dtype (float32 or wider), plus what the head adds over o. With
        normalise=False the log_probs field holds the logits themselves (for an argmax, which they share).
        `blank_penalty` c is subtracted from the blank's logit before normalising: P(blank) lowered by e^c
        relative to every other token, a proper distribution still (decoding only). `rows` (the inference path's
        real positions in B·T, reder/runtime/onednn.py): logits only there, zero logits at padded positions."""
        first, second = self.actnorm[end].inverse(h).chunk(2, dim=-1)
        states = (first + second) / 2  # (B, T, D)
        if rows is None and self._fast_path():  # nothing padded: every position, through the inference path's kernel
            logits = tied_logits(states.flatten(0, 1), self.embed.weight).view(*states.shape[:2], -1)  # (B, T, V)
        elif rows is None:
            logits = states @ self.embed.weight.t()  # (B, T, V)
        else:
            batch, length, width = states.shape
            real = states.reshape(batch * length, width).index_select(0, rows)  # (N, D)
            packed = tied_logits(real, self.embed.weight)  # (N, V)
            logits = packed.new_zeros(batch * length, packed.shape[-1]).index_copy_(0, rows, packed).view(batch, length, -1)
        return HeadOutput(self.penalise(logits, blank_penalty, normalise), lengths, self.head.extra(states, lengths, end))

    def penalise(self, logits: torch.Tensor, blank_penalty: float, normalise: bool = True) -> torch.Tensor:
        """Logits (B, T, V) with the blank's lowered by `blank_penalty`, then log-probabilities in the head's dtype
        (the logits themselves with normalise=False): what `project` returns of them, so that one run of the model
        serves several penalties (`reder.decoding.ctc.greedy_by_penalty`, `reranked_by_penalty`)."""
        if blank_penalty:
            logits = logits.clone()
            logits[..., self.cfg.blank_id] -= blank_penalty
        return F.log_softmax(logits.to(self.head.log_prob_dtype(logits.dtype)), dim=-1) if normalise else logits

    def outputs(self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str, normalise: bool = True,
                blank_penalty: float = 0.0) -> HeadOutput:
        """tokens (B, T) → the writing end's output: log-probabilities (B, T', V) (logits with normalise=False;
        the blank's lowered by `blank_penalty`), lengths (B,), the head's extras."""
        check_direction(direction)
        reading, writing = ENDS[direction]
        h, mask, out_lengths = self.embed_input(tokens, lengths, reading)
        rows = real_rows(mask) if self._fast_path() else None  # the output projection skips padded positions too
        return self.project(self.layers(h, mask, direction), out_lengths, writing, normalise, blank_penalty, rows)

    def _fast_path(self) -> bool:
        return self.fast_inference and not self.training and not torch.is_grad_enabled()

    def decoding_penalty(self, direction: str, blank_penalty: Optional[float] = None) -> float:
        """The blank penalty decoding `direction` applies: `blank_penalty` if given, else the model's own."""
        penalty = self.blank_penalty[direction] if blank_penalty is None else float(blank_penalty)
        if penalty and not self.head.emits_blank:
            raise ValueError(f"a blank penalty ({penalty}) needs a CTC model; this model's head is {self.cfg.head!r}")
        return penalty

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, T) → log-probabilities (B, T', V) and output lengths (B,); T' the head's upsampled length."""
        output = self.outputs(tokens, lengths, direction)
        return output.log_probs, output.lengths

    def initialize(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor, tgt_tokens: torch.Tensor, tgt_lengths: torch.Tensor) -> None:
        """Data-initialise both ends' ActNorm from one batch (done by the objective's first call in training)."""
        with torch.no_grad():
            for tokens, lengths, end in ((src_tokens, src_lengths, "src"), (tgt_tokens, tgt_lengths, "tgt")):
                if not self.actnorm[end].is_initialized():
                    self.embed_input(tokens, lengths, end)
