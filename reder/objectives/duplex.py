"""REDER's objective (docs/DESIGN.md, "Losses"): per direction the head's loss, forward–backward agreement and
cycle consistency, with glancing; `DuplexLoss`, the module a trainer wraps in DistributedDataParallel.

Total = Σ_directions [ main + λ_fba·FBA + λ_cc·CC ], FBA from `config.start_step("fba")`, CC from
`start_step("cc")`, the weights and steps a `LossConfig`'s: the objective owns them, the model (reder/model.py)
knows nothing of its loss. The model gives embedding, trunk and heads; this module only calls them.
"""
from typing import Optional

import torch
from torch import nn

from reder.config import DIRECTIONS, ENDS, REVERSE, LossConfig, check_direction
from reder.heads import HeadOutput
from reder.layers import LayerRng
from reder.model import REDER
from reder.objectives.outputs import COUNTERS, output_loss
from reder.objectives.terms import ctc_ngram_loss, forward_backward_agreement, glance_mask
from reder.reversible import Op, invert_ops, run_trunk


def duplex_loss(model: REDER, config: LossConfig, src_tokens: torch.Tensor, src_lengths: torch.Tensor,
                tgt_tokens: torch.Tensor, tgt_lengths: torch.Tensor, step: int,
                directions: Optional[tuple[str, ...]] = None) -> dict[str, torch.Tensor]:
    """Named loss terms per direction (default: `config.directions`) and their weighted `total` (FBA from
    `config.start_step("fba")`, CC from `start_step("cc")`).

    The main term is `<head>_<direction>` (`ctc_…`, `dag_…`); `fba_…` and `cc_…` only while that term is on
    (step past its start, weight > 0): a term that was not computed is absent, not a zero, so a trainer's
    mean over updates averages it over the updates that computed it. A head's counters follow, for the main
    term and for CC (DAG: the samples dropped because the graph was shorter than the target, `dropped_…`,
    `dropped_cc_…` while CC is on); counters are logged, never added to `total`.

    Passing one direction at a time and calling backward on each total bounds memory: with one joint
    backward, each layer's parameter gradient from one direction waits in autograd's buffers until the
    other direction's backward reaches that layer (one extra copy of the trunk's gradients at peak).
    """
    directions = config.directions if directions is None else directions
    for direction in directions:
        check_direction(direction)
    if model.training:
        model.initialize(src_tokens, src_lengths, tgt_tokens, tgt_lengths)
    use_fba = step >= config.start_step("fba") and config.lambda_fba > 0
    use_cc = step >= config.start_step("cc") and config.lambda_cc > 0
    nmla = config.nmla(step)
    if nmla and model.cfg.head != "ctc":
        raise ValueError(f"loss.nmla_start_step: NMLA is a loss over CTC's alignments; this model's head is "
                         f"{model.cfg.head!r}")
    zero = src_tokens.new_zeros((), dtype=torch.float32)
    terms: dict[str, torch.Tensor] = {}
    pairs = {"src2tgt": (src_tokens, src_lengths, tgt_tokens, tgt_lengths), "tgt2src": (tgt_tokens, tgt_lengths, src_tokens, src_lengths)}
    ratio = config.glance_ratio(step) if model.training else 0.0
    total = zero
    for direction in directions:
        x, x_lengths, y, y_lengths = pairs[direction]
        mains, fba, cc, counts, cc_counts = direction_loss(model, config, direction, x, x_lengths, y, y_lengths, use_fba,
                                                           use_cc, ratio, nmla)
        for name, (main, weight) in mains.items():
            terms[f"{name}_{direction}"] = main
            total = total + (main if weight == 1.0 else weight * main)
        if fba is not None:
            terms[f"fba_{direction}"] = fba
            total = total + config.lambda_fba * fba
        if cc is not None:
            terms[f"cc_{direction}"] = cc
            total = total + config.lambda_cc * cc
        for counter in COUNTERS[model.cfg.head]:
            terms[f"{counter}_{direction}"] = zero + counts[counter]
            if counter in cc_counts:
                terms[f"{counter}_cc_{direction}"] = zero + cc_counts[counter]
    terms["total"] = total
    return terms


def direction_loss(
    model: REDER, config: LossConfig, direction: str, x: torch.Tensor, x_lengths: torch.Tensor, y: torch.Tensor,
    y_lengths: torch.Tensor, use_fba: bool, use_cc: bool, glance_ratio: float = 0.0, nmla: bool = False,
) -> tuple[dict[str, tuple[torch.Tensor, float]], Optional[torch.Tensor], Optional[torch.Tensor], dict[str, torch.Tensor],
           dict[str, torch.Tensor]]:
    """One direction's (main terms by name with their weights, FBA or None, CC or None, the main term's counters,
    CC's counters). The main term is the head's loss (`ctc`, `dag`), or with `nmla` NMLA's bag of n-grams (`nmla`,
    plus `ctc` at `config.nmla_ctc_weight` when > 0)."""
    reading, writing = ENDS[direction]
    glance_input = glance(model, direction, x, x_lengths, y, y_lengths, glance_ratio,
                          blanks=config.glance_blanks) if glance_ratio > 0 else None
    h0, mask, out_lengths = model.embed_input(x, x_lengths, reading, glance=glance_input)
    ops = model.ops(direction)
    states, rngs = run_trunk(h0, mask, ops, model.cfg.memory_efficient, keep_all=use_fba)
    output = model.project(states[-1], out_lengths, writing)  # log-probs (B, T', V), DAG: log E (B, T', T')
    if nmla:
        mains = {"nmla": (ctc_ngram_loss(output.log_probs, output.lengths, y, y_lengths, model.cfg.blank_id,
                                         config.nmla_ngram), 1.0)}
        if config.nmla_ctc_weight > 0:
            mains["ctc"] = (output_loss(model.cfg, output, y, y_lengths)[0], config.nmla_ctc_weight)
        counts: dict[str, torch.Tensor] = {}
    else:
        main, counts = output_loss(model.cfg, output, y, y_lengths)
        mains = {model.cfg.head: (main, 1.0)}
    output = output.detach()
    fba = agreement(model, [h0, *states], mask, output, y, y_lengths, ops, rngs, writing) if use_fba else None
    cc, cc_counts = cycle_consistency(model, output, x, x_lengths, REVERSE[direction]) if use_cc else (None, {})
    return mains, fba, cc, counts, cc_counts


def glance(model: REDER, direction: str, x: torch.Tensor, x_lengths: torch.Tensor, y: torch.Tensor,
           y_lengths: torch.Tensor, ratio: float, generator: Optional[torch.Generator] = None,
           blanks: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Glancing's first pass (no gradient): y laid out on the output positions by the head (FBA's layout:
    CTC its best alignment, DAG its Viterbi path), and the positions whose aligned target token goes into
    the second pass's input (`glance_mask`: among the aligned target tokens of feasible samples — not blanks
    unless `blanks` (CTC), never off-path vertices). Returns (positions (B, T') bool, layout tokens (B, T'))."""
    with torch.no_grad():
        first = model.outputs(x, x_lengths, direction)
        layout, compared, feasible = model.head.fba_layout(first, y, y_lengths)
        candidates = compared & feasible[:, None]
        if not blanks:
            candidates = candidates & (layout != model.cfg.blank_id)
        return glance_mask(layout, candidates, first.log_probs.argmax(dim=-1), ratio, generator), layout


def agreement(
    model: REDER,
    forward_states: list[torch.Tensor],
    mask: torch.Tensor,
    output: HeadOutput,
    y: torch.Tensor,
    y_lengths: torch.Tensor,
    ops: list[Op],
    rngs: list[LayerRng],
    writing: str,
) -> torch.Tensor:
    """FBA: run the reverse direction on y laid out on the output positions by the head (no upsampling,
    same dropout masks, no gradient) and pull every compared forward state towards the reverse state it
    lines up with (`forward_backward_agreement`). CTC: the best alignment a*, all positions compared. DAG: Y
    on its Viterbi path, the skip token elsewhere, only on-path positions compared."""
    with torch.no_grad():
        layout, compared, feasible = model.head.fba_layout(output, y, y_lengths)  # (B, T'), (B, T'), (B,)
        g0, _, _ = model.embed_input(layout, output.lengths, writing, upsample=False, dropout=False)
        reverse = reverse_states(g0, mask, ops, rngs)
    return forward_backward_agreement(forward_states, reverse, compared & feasible[:, None])


def reverse_states(g0: torch.Tensor, mask: torch.Tensor, ops: list[Op], rngs: list[LayerRng]) -> list[torch.Tensor]:
    """Run the inverse of `ops` from g0 with the forward pass's dropout masks; return its L+1 states in
    reverse order, so entry k lines up with the forward state after k steps."""
    reverse, _ = run_trunk(g0, mask, invert_ops(ops), memory_efficient=False, keep_all=True, rngs=rngs[::-1])
    return [g0, *reverse][::-1]


def cycle_consistency(
    model: REDER, output: HeadOutput, x: torch.Tensor, x_lengths: torch.Tensor, back: str
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CC = the head's loss of the original x under the reverse direction run on ȳ, the hard tokens of the
    (detached) output: CTC per-frame argmax collapsed, blanks kept; DAG greedy with EOS. No gradient through
    the argmax; the gradient flows through the reverse pass. Returns (loss, the head's counters)."""
    y_bar, y_bar_lengths = model.head.cycle_input(output)
    return output_loss(model.cfg, model.outputs(y_bar, y_bar_lengths, back), x, x_lengths)


class DuplexLoss(nn.Module):
    """REDER's objective under a `LossConfig` (its weights, start steps, glancing and directions): `forward` is
    `duplex_loss(model, config, ...)`, so DDP (which hooks `forward`) can wrap it, as fairseq's criterions are
    built from their own hyper-parameters and called on (model, sample).

    `tgt2src_batch` (src, src_lengths, tgt, tgt_lengths) gives tgt2src its own pairs (sequence-level KD:
    src2tgt learns (x, teacher(x)), tgt2src learns (teacher(y), y)); both directions still go through one
    forward call, so DDP sees every parameter used in every update. `directions` default to the config's (a
    simplex model trains one; DDP then needs find_unused_parameters, pipeline/training/trainloop.py)."""

    def __init__(self, model: REDER, config: Optional[LossConfig] = None) -> None:
        super().__init__()
        self.model = model
        self.config = config or LossConfig()

    @property
    def directions(self) -> tuple[str, ...]:
        """The directions this objective trains."""
        return self.config.directions

    def forward(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        tgt_tokens: torch.Tensor,
        tgt_lengths: torch.Tensor,
        step: int,
        directions: Optional[tuple[str, ...]] = None,
        tgt2src_batch: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = None,
    ) -> dict[str, torch.Tensor]:
        directions = self.config.directions if directions is None else directions
        if tgt2src_batch is None:
            return duplex_loss(self.model, self.config, src_tokens, src_lengths, tgt_tokens, tgt_lengths, step, directions)
        batches = {"src2tgt": (src_tokens, src_lengths, tgt_tokens, tgt_lengths), "tgt2src": tgt2src_batch}
        parts = [duplex_loss(self.model, self.config, *batches[d], step, (d,)) for d in DIRECTIONS if d in directions]
        return {**{k: v for part in parts for k, v in part.items()}, "total": sum(part["total"] for part in parts)}
