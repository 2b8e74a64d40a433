"""The loss of a head's output (reder/heads.py): what the main term and cycle consistency score, per head.

`output_loss(cfg, output, y, y_lengths)` returns the head's loss of targets y (B, U) ending in EOS and its
counters; `COUNTERS[head]` names the counters a head reports (logged, never added to a total).
- CTC: label-smoothed CTC (`ctc_loss`, ε = `model.label_smoothing`); no counters.
- DAG: −log P(Y|x)/|Y| of Y = [BOS, y…, EOS] over the graph (`dag_loss`, no label smoothing), and `dropped`,
  the samples left out because their graph has fewer vertices than Y has tokens.
"""
import torch
import torch.nn.functional as F

from reder.config import BOS_ID, ModelConfig
from reder.heads import HeadOutput
from reder.objectives.terms import ctc_loss, dag_loss

COUNTERS: dict[str, tuple[str, ...]] = {"ctc": (), "dag": ("dropped",)}


def output_loss(cfg: ModelConfig, output: HeadOutput, y: torch.Tensor,
                y_lengths: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of targets y (B, U) under a writing end's `output`, for the head `cfg.head`, and its counters."""
    if cfg.head == "ctc":
        return ctc_loss(output.log_probs, output.lengths, y, y_lengths, cfg.blank_id, cfg.label_smoothing), {}
    if cfg.head == "dag":
        targets = F.pad(y, (1, 0), value=BOS_ID)  # (B, M)
        main, dropped = dag_loss(output.extra["log_edges"], output.log_probs, output.lengths, targets, y_lengths + 1,
                                 cfg.dag_dp)
        return main, {"dropped": dropped}
    raise ValueError(f"no loss for head {cfg.head!r}; known: {sorted(COUNTERS)}")
