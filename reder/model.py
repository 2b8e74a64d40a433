"""REDER: one end of reversible layers per language; x→y runs x's end regular then y's end inverse."""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from reder.config import BOS_ID, DIRECTIONS, EOS_ID, PAD_ID, LossConfig, ModelConfig
from reder.ctc import collapse_frames, pad_batch, smoothed_ctc_loss, valid_mask, viterbi_align
from reder.dag import DagLinks, dag_decode, dag_greedy, dag_loss, graph_lengths_for, target_emissions
from reder.dag import viterbi_align as dag_viterbi_align
from reder.decode import ctc_beam_search, ctc_greedy, ctc_nbest, strip_special
from reder.layers import ActNorm, DuplexLayer, LayerRng
from reder.losses import forward_backward_agreement
from reder.reversible import Op, invert_ops, run_trunk

ENDS = {"src2tgt": ("src", "tgt"), "tgt2src": ("tgt", "src")}  # direction → (reading end, writing end)
REVERSE = {"src2tgt": "tgt2src", "tgt2src": "src2tgt"}


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


class REDER(nn.Module):
    """The reversible duplex Transformer (Zheng et al., NeurIPS 2021), CTC or DAG output at both ends.

    Convention: the reading end runs its layers 1..L/2 in regular form, the writing end its layers L/2..1
    in inverse form, so tgt2src is exactly the inverse map of src2tgt (DESIGN.md). With head="dag" each
    end also owns a DagLinks module; the trunk is the same, only the upsampling and the output differ.
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
        if cfg.head == "dag":
            self.links = nn.ModuleDict({end: DagLinks(cfg.d_model, cfg.link_heads, cfg.max_positions) for end in ("src", "tgt")})

    def ops(self, direction: str) -> list[Op]:
        """The trunk's steps for a direction: reading end regular 1..L/2, then writing end inverse L/2..1."""
        _check_direction(direction)
        reading, writing = ENDS[direction]
        return [(layer, False) for layer in self.ends[reading]] + [(layer, True) for layer in reversed(self.ends[writing])]

    def layers(self, h: torch.Tensor, mask: torch.Tensor, direction: str) -> torch.Tensor:
        """The trunk alone on continuous states h (B, T, 2D); layers(layers(h, m, d), m, reverse d) == h."""
        states, _ = run_trunk(h, mask, self.ops(direction), self.cfg.memory_efficient)
        return states[-1]

    def upsample(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """CTC: each token r times (x1 x1 x2 x2 … eos eos). DAG: BOS x… EOS (S_b tokens) copied uniformly onto
        L_b = int(λ·S_b) positions, position j reading token ⌊j·S_b/L_b⌋ (the same repetition as CTC's for an
        integer λ), so the first vertex reads BOS and the last reads EOS: the anchors of every path."""
        if self.cfg.head == "ctc":
            return tokens.repeat_interleave(self.cfg.upsample_ratio, dim=1), lengths * self.cfg.upsample_ratio
        tokens, lengths = F.pad(tokens, (1, 0), value=BOS_ID), lengths + 1
        graph_lengths = graph_lengths_for(lengths, self.cfg.graph_upsample_ratio)
        index = torch.arange(int(graph_lengths.max()), device=tokens.device)
        source = (index[None, :] * lengths[:, None]) // graph_lengths[:, None]  # (B, L)
        tokens = tokens.gather(1, source.clamp(max=tokens.shape[1] - 1))  # (B, L)
        return tokens.masked_fill(~valid_mask(graph_lengths, index.shape[0]), PAD_ID), graph_lengths

    def max_input_length(self) -> int:
        """The longest input (pieces with EOS) whose upsampled sequence fits in max_positions."""
        if self.cfg.head == "ctc":
            return self.cfg.max_positions // self.cfg.upsample_ratio
        ratio, length = self.cfg.graph_upsample_ratio, int((self.cfg.max_positions + 1) / self.cfg.graph_upsample_ratio)
        while length > 0 and int(graph_lengths_for(torch.tensor([length + 1]), ratio)) > self.cfg.max_positions:
            length -= 1
        return length

    def embed_input(
        self, tokens: torch.Tensor, lengths: torch.Tensor, end: str, upsample: bool = True, dropout: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens (B, T) ending in EOS → H₀ (B, T', 2D) after ActNorm, its mask and lengths; T' = r·T (CTC),
        the graph size (DAG), or T without upsampling (FBA's reverse pass reads an already laid-out target)."""
        if upsample:
            tokens, lengths = self.upsample(tokens, lengths)
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

    def project(self, h: torch.Tensor, lengths: torch.Tensor, end: str) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Writing end: inverse ActNorm, average the halves into output states o (B, T, D), tied logits →
        log-probs (B, T, V) in float32 (DAG: or wider); with the DAG head also log E (B, T, T) over o."""
        first, second = self.actnorm[end].inverse(h).chunk(2, dim=-1)
        states = (first + second) / 2  # (B, T, D)
        logits = states @ self.embed.weight.t()  # (B, T, V)
        if self.cfg.head == "ctc":
            return F.log_softmax(logits.float(), dim=-1), None
        return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1), self.links[end](states, lengths)

    def outputs(self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """tokens (B, T) → log-probabilities (B, T', V), the DAG's log E (B, T', T') (None for CTC), lengths (B,)."""
        _check_direction(direction)
        reading, writing = ENDS[direction]
        h, mask, out_lengths = self.embed_input(tokens, lengths, reading)
        log_probs, log_edges = self.project(self.layers(h, mask, direction), out_lengths, writing)
        return log_probs, log_edges, out_lengths

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, T) → log-probabilities (B, T', V) and output lengths (B,); T' = r·T or the graph size."""
        log_probs, _, out_lengths = self.outputs(tokens, lengths, direction)
        return log_probs, out_lengths

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

        The main term is `ctc_<direction>` or `dag_<direction>`; a DAG model also reports how many samples
        each term dropped because the graph was shorter than the target (`dropped_…`, `dropped_cc_…`).

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
        zero, head = src_tokens.new_zeros((), dtype=torch.float32), self.cfg.head
        terms: dict[str, torch.Tensor] = {}
        pairs = {"src2tgt": (src_tokens, src_lengths, tgt_tokens, tgt_lengths), "tgt2src": (tgt_tokens, tgt_lengths, src_tokens, src_lengths)}
        for direction in directions:
            x, x_lengths, y, y_lengths = pairs[direction]
            main, fba, cc, dropped = self._direction_loss(direction, x, x_lengths, y, y_lengths, use_fba, use_cc)
            terms[f"{head}_{direction}"], terms[f"fba_{direction}"], terms[f"cc_{direction}"] = main, fba or zero, cc or zero
            if head == "dag":
                terms[f"dropped_{direction}"], terms[f"dropped_cc_{direction}"] = (zero + d if d is not None else zero for d in dropped)
        terms["total"] = sum(
            terms[f"{head}_{d}"] + config.lambda_fba * terms[f"fba_{d}"] + config.lambda_cc * terms[f"cc_{d}"] for d in directions
        )
        return terms

    def _direction_loss(
        self, direction: str, x: torch.Tensor, x_lengths: torch.Tensor, y: torch.Tensor, y_lengths: torch.Tensor, use_fba: bool, use_cc: bool
    ) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]:
        reading, writing = ENDS[direction]
        h0, mask, out_lengths = self.embed_input(x, x_lengths, reading)
        ops = self.ops(direction)
        states, rngs = run_trunk(h0, mask, ops, self.cfg.memory_efficient, keep_all=use_fba)
        log_probs, log_edges = self.project(states[-1], out_lengths, writing)  # (B, T', V), DAG: (B, T', T')
        main, dropped = self._head_loss(log_probs, log_edges, out_lengths, y, y_lengths)
        output = (log_probs.detach(), None if log_edges is None else log_edges.detach(), out_lengths)
        fba = self._agreement([h0, *states], mask, *output, y, y_lengths, ops, rngs, writing) if use_fba else None
        cc, cc_dropped = self._cycle(*output, x, x_lengths, REVERSE[direction]) if use_cc else (None, None)
        return main, fba, cc, (dropped, cc_dropped)

    def _head_loss(
        self, log_probs: torch.Tensor, log_edges: Optional[torch.Tensor], lengths: torch.Tensor, y: torch.Tensor, y_lengths: torch.Tensor
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """CTC: label-smoothed CTC of y. DAG: −log P(Y|x)/|Y| of Y = [BOS, y…, EOS] over the graph (no label
        smoothing), and how many samples were dropped for a graph shorter than Y (None for CTC)."""
        if log_edges is None:
            return smoothed_ctc_loss(log_probs, lengths, y, y_lengths, self.cfg.blank_id, self.cfg.label_smoothing), None
        return dag_loss(log_edges, log_probs, lengths, F.pad(y, (1, 0), value=BOS_ID), y_lengths + 1)

    def _agreement(
        self,
        forward_states: list[torch.Tensor],
        mask: torch.Tensor,
        log_probs: torch.Tensor,
        log_edges: Optional[torch.Tensor],
        lengths: torch.Tensor,
        y: torch.Tensor,
        y_lengths: torch.Tensor,
        ops: list[Op],
        rngs: list[LayerRng],
        writing: str,
    ) -> torch.Tensor:
        """FBA: run the reverse direction on y laid out on the output positions (no upsampling, same dropout
        masks, no gradient) and pull every forward state towards the reverse state it lines up with. CTC: the
        best alignment a*, all positions compared. DAG: Y on its Viterbi path, the skip token elsewhere, only
        on-path positions compared."""
        with torch.no_grad():
            if log_edges is None:
                layout, feasible, _ = viterbi_align(log_probs, lengths, y, y_lengths, self.cfg.blank_id)  # (B, rT)
                compared = mask
            else:
                layout, compared, feasible = self._lay_out_on_path(log_probs, log_edges, lengths, y, y_lengths)
            g0, _, _ = self.embed_input(layout, lengths, writing, upsample=False, dropout=False)
            reverse_states = self.reverse_states(g0, mask, ops, rngs)
        return forward_backward_agreement(forward_states, reverse_states, compared & feasible[:, None])

    def _lay_out_on_path(
        self, log_probs: torch.Tensor, log_edges: torch.Tensor, lengths: torch.Tensor, y: torch.Tensor, y_lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Y = [BOS, y…, EOS] on its Viterbi path: tokens (B, L) (Y_i at vertex a_i, the skip token — the
        blank id, unused as a DAG target — on every other vertex, PAD past L_b), on-path mask, feasible (B,)."""
        targets = F.pad(y, (1, 0), value=BOS_ID)  # (B, M)
        path, feasible, _ = dag_viterbi_align(log_edges, target_emissions(log_probs, targets), lengths, y_lengths + 1)
        batch, length = log_probs.shape[:2]
        column = torch.where(path >= 0, path, length)  # (B, M); past M_b into a spill column
        tokens = torch.full((batch, length + 1), self.cfg.blank_id, dtype=torch.long, device=y.device)
        tokens.scatter_(1, column, targets)
        on_path = torch.zeros(batch, length + 1, dtype=torch.bool, device=y.device).scatter_(1, column, True)
        tokens = tokens[:, :length].masked_fill(~valid_mask(lengths, length), PAD_ID)
        return tokens, on_path[:, :length], feasible

    @staticmethod
    def reverse_states(g0: torch.Tensor, mask: torch.Tensor, ops: list[Op], rngs: list[LayerRng]) -> list[torch.Tensor]:
        """Run the inverse of `ops` from g0 with the forward pass's dropout masks; return its L+1 states in
        reverse order, so entry k lines up with the forward state after k steps."""
        reverse, _ = run_trunk(g0, mask, invert_ops(ops), memory_efficient=False, keep_all=True, rngs=rngs[::-1])
        return [g0, *reverse][::-1]

    def _cycle(
        self, log_probs: torch.Tensor, log_edges: Optional[torch.Tensor], lengths: torch.Tensor, x: torch.Tensor, x_lengths: torch.Tensor, back: str
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """CC: decode the output with hard tokens — CTC: per-frame argmax collapsed (blanks kept); DAG: the
        greedy decoder's output with EOS (cut to max_input_length) — translate it back, score the original x."""
        if log_edges is None:
            y_bar, y_bar_lengths = collapse_frames(log_probs.argmax(dim=-1), lengths, self.cfg.blank_id, keep_blank=True)
        else:
            limit = self.max_input_length() - 1
            decoded = [strip_special(h, self.cfg.blank_id)[:limit] + [EOS_ID] for h in dag_greedy(log_edges, log_probs, lengths)]
            y_bar, y_bar_lengths = pad_batch(decoded, x.device)
        back_log_probs, back_edges, back_lengths = self.outputs(y_bar, y_bar_lengths, back)
        return self._head_loss(back_log_probs, back_edges, back_lengths, x, x_lengths)

    @torch.no_grad()
    def translate(
        self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str, beam_size: int = 1, decoder: str = "greedy"
    ) -> list[list[int]]:
        """Token ids (B, T) ending in EOS → one hypothesis per sentence (ids; BOS, EOS and blanks removed).

        CTC: greedy, or prefix beam search with beam_size > 1. DAG: decoder greedy, lookahead or viterbi."""
        log_probs, log_edges, out_lengths = self.outputs(tokens, lengths, direction)
        if log_edges is not None:
            if beam_size != 1:
                raise ValueError("beam search is not implemented for the DAG head: use decoder greedy, lookahead or viterbi")
            hypotheses = dag_decode(decoder, log_edges, log_probs, out_lengths)
        elif decoder != "greedy":
            raise ValueError(f"decoder {decoder!r} needs head='dag'; a CTC model decodes greedily or with beam_size > 1")
        elif beam_size == 1:
            hypotheses = ctc_greedy(log_probs, out_lengths, self.cfg.blank_id)
        else:
            hypotheses = [labels for labels, _ in ctc_beam_search(log_probs, out_lengths, self.cfg.blank_id, beam_size)]
        return [strip_special(h, self.cfg.blank_id) for h in hypotheses]


    @torch.no_grad()
    def candidates(self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str, beam_size: int) -> list[list[list[int]]]:
        """CTC n-best per sentence (best first, specials stripped, duplicates after stripping merged): for reranking."""
        if self.cfg.head != "ctc":
            raise ValueError(f"candidates need a CTC head, this model's head is {self.cfg.head!r}")
        log_probs, _, out_lengths = self.outputs(tokens, lengths, direction)
        nbest = ctc_nbest(log_probs, out_lengths, self.cfg.blank_id, beam_size)
        return [list(map(list, dict.fromkeys(tuple(strip_special(h, self.cfg.blank_id)) for h, _ in entries))) for entries in nbest]
