"""Output heads: everything that differs between CTC and DAG outputs, behind the one interface the trunk calls.

A head owns the upsampling of the reading end's input and `max_input_length`, what it adds to the writing
end's log-probs (`extra`; DAG: log E from its links), FBA's layout of the target, CC's hard decode, and the
feasibility rule the tokenize stage filters pairs with. Its loss is the objectives' (reder/objectives/outputs.py,
the main term named `<name>_<direction>`), its decoders reder/decoding/'s (the family named as the head). A new
head is a class registered in HEADS, with its name added to reder.config.HEADS (config validation), its length
rule, ratio key and blank fact to reder/feasibility.py, its loss to the objectives' and its decoders to
reder/decoding/.
"""
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from reder.feasibility import EMITS_BLANK, RATIO_KEYS, RULES
from reder.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig
from reder.ctc import collapse_frames, pad_batch, valid_mask, viterbi_align
from reder.dag import DagLinks, dag_greedy, graph_lengths_for, target_emissions
from reder.dag import viterbi_align as dag_viterbi_align
from reder.decode import strip_special


@dataclass
class HeadOutput:
    """A writing end's output: log-probs (B, T, V) (the logits, for CTC's greedy argmax), lengths
    (B,), the head's own tensors (DAG: "log_edges", log E (B, T, T))."""

    log_probs: torch.Tensor
    lengths: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)

    def detach(self) -> "HeadOutput":
        """The same output cut from the graph (what FBA and CC read)."""
        return HeadOutput(self.log_probs.detach(), self.lengths, {k: v.detach() for k, v in self.extra.items()})


class CtcHead(nn.Module):
    """CTC at both ends: each input token r times; blank-separated alignments."""

    name = "ctc"  # the main loss term is ctc_<direction>
    ratio_name = RATIO_KEYS["ctc"]
    emits_blank = EMITS_BLANK["ctc"]  # decoders drop blanks from the output: a blank penalty applies

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def upsample(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, T) → each token r times (B, rT): x1 x1 x2 x2 … eos eos, and lengths (B,)."""
        return tokens.repeat_interleave(self.cfg.upsample_ratio, dim=1), lengths * self.cfg.upsample_ratio

    def max_input_length(self) -> int:
        """The longest input (pieces with EOS) whose upsampled sequence fits in max_positions."""
        return self.cfg.max_positions // self.cfg.upsample_ratio

    def log_prob_dtype(self, logits_dtype: torch.dtype) -> torch.dtype:
        """float32, whatever the logits' dtype."""
        return torch.float32

    def extra(self, states: torch.Tensor, lengths: torch.Tensor, end: str) -> dict[str, torch.Tensor]:
        """Nothing beyond the log-probs."""
        return {}

    def fba_layout(self, output: HeadOutput, y: torch.Tensor, y_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """y on its best alignment a*: tokens (B, T) (blanks included, PAD past each length), compared
        positions (B, T) (all valid ones), feasible (B,)."""
        layout, feasible, _ = viterbi_align(output.log_probs, output.lengths, y, y_lengths, self.cfg.blank_id)
        return layout, valid_mask(output.lengths, layout.shape[1]), feasible

    def cycle_input(self, output: HeadOutput) -> tuple[torch.Tensor, torch.Tensor]:
        """Hard tokens for CC: per-frame argmax, repeats merged, blanks kept (B, T'), and lengths (B,); cut to
        max_input_length, since r·|x| frames upsampled again by r can exceed max_positions (long sources)."""
        tokens, lengths = collapse_frames(output.log_probs.argmax(dim=-1), output.lengths, self.cfg.blank_id,
                                          keep_blank=True)
        limit = self.max_input_length()
        return tokens[:, :limit], lengths.clamp(max=limit)

    feasible = staticmethod(RULES["ctc"])  # feasible(input_len, target, ratio): the tokenize stage's filter


class DagHead(nn.Module):
    """DA-Transformer output at both ends (reder/dag.py): a graph over the upsampled input, one DagLinks per end."""

    name = "dag"  # the main loss term is dag_<direction>
    ratio_name = RATIO_KEYS["dag"]
    emits_blank = EMITS_BLANK["dag"]  # the blank id is only FBA's skip token: no blank penalty

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.links = nn.ModuleDict({end: DagLinks(cfg.d_model, cfg.link_heads, cfg.max_positions) for end in ("src", "tgt")})

    def upsample(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """BOS x… EOS (S_b tokens) copied uniformly onto L_b = int(λ·S_b) positions, position j reading token
        ⌊j·S_b/L_b⌋ (CTC's repetition for an integer λ), so the first vertex reads BOS and the last EOS: the
        anchors of every path. Returns tokens (B, L) and graph lengths (B,)."""
        tokens, lengths = F.pad(tokens, (1, 0), value=BOS_ID), lengths + 1
        graph_lengths = graph_lengths_for(lengths, self.cfg.graph_upsample_ratio)
        index = torch.arange(int(graph_lengths.max()), device=tokens.device)
        source = (index[None, :] * lengths[:, None]) // graph_lengths[:, None]  # (B, L)
        tokens = tokens.gather(1, source.clamp(max=tokens.shape[1] - 1))  # (B, L)
        return tokens.masked_fill(~valid_mask(graph_lengths, index.shape[0]), PAD_ID), graph_lengths

    def max_input_length(self) -> int:
        """The longest input (pieces with EOS) whose graph fits in max_positions."""
        ratio, length = self.cfg.graph_upsample_ratio, int((self.cfg.max_positions + 1) / self.cfg.graph_upsample_ratio)
        while length > 0 and int(graph_lengths_for(torch.tensor([length + 1]), ratio)) > self.cfg.max_positions:
            length -= 1
        return length

    def log_prob_dtype(self, logits_dtype: torch.dtype) -> torch.dtype:
        """float32 or wider: a float64 model keeps float64 for the DP."""
        return torch.promote_types(logits_dtype, torch.float32)

    def extra(self, states: torch.Tensor, lengths: torch.Tensor, end: str) -> dict[str, torch.Tensor]:
        """log E (B, T, T) of the writing end's links over its output states (B, T, D)."""
        return {"log_edges": self.links[end](states, lengths)}

    def fba_layout(self, output: HeadOutput, y: torch.Tensor, y_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Y = [BOS, y…, EOS] on its Viterbi path: tokens (B, L) (Y_i at vertex a_i, the skip token — the
        blank id, unused as a DAG target — on every other vertex, PAD past L_b), on-path mask, feasible (B,)."""
        log_probs, lengths = output.log_probs, output.lengths
        targets = F.pad(y, (1, 0), value=BOS_ID)  # (B, M)
        path, feasible, _ = dag_viterbi_align(output.extra["log_edges"], target_emissions(log_probs, targets), lengths, y_lengths + 1)
        batch, length = log_probs.shape[:2]
        column = torch.where(path >= 0, path, length)  # (B, M); past M_b into a spill column
        tokens = torch.full((batch, length + 1), self.cfg.blank_id, dtype=torch.long, device=y.device)
        tokens.scatter_(1, column, targets)
        on_path = torch.zeros(batch, length + 1, dtype=torch.bool, device=y.device).scatter_(1, column, True)
        tokens = tokens[:, :length].masked_fill(~valid_mask(lengths, length), PAD_ID)
        return tokens, on_path[:, :length], feasible

    def cycle_input(self, output: HeadOutput) -> tuple[torch.Tensor, torch.Tensor]:
        """Hard tokens for CC: the greedy decoder's output with EOS, cut to max_input_length (B, T'), lengths (B,)."""
        limit, blank = self.max_input_length() - 1, self.cfg.blank_id
        hypotheses = dag_greedy(output.extra["log_edges"], output.log_probs, output.lengths)
        return pad_batch([strip_special(h, blank)[:limit] + [EOS_ID] for h in hypotheses], output.log_probs.device)

    feasible = staticmethod(RULES["dag"])  # feasible(input_len, target, ratio): the tokenize stage's filter


Head = CtcHead | DagHead
HEADS: dict[str, type[Head]] = {"ctc": CtcHead, "dag": DagHead}


def head_class(name: str) -> type[Head]:
    """The head class of a ModelConfig.head name."""
    if name not in HEADS:
        raise ValueError(f"unknown head {name!r}; known heads are {sorted(HEADS)}")
    return HEADS[name]


def make_head(cfg: ModelConfig) -> Head:
    """The output head of a model config (both ends)."""
    return head_class(cfg.head)(cfg)
