"""The one-direction objectives of the teacher (reder/autoregressive.py) and the CMLM (reder/cmlm.py), and
`PairObjective`, both directions' as one, each with REDER's `DuplexLoss` call signature so the one training
harness (pipeline/harness.py) and DDP wrap them alike. The models' own `loss` gives the label-smoothed NLL
(and the CMLM's length term); these read a batch in their direction and name the terms by it."""
from typing import Optional

import torch

from reder.autoregressive import Transformer
from reder.cmlm import CMLM

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # src, src_lengths, tgt, tgt_lengths


class TeacherObjective(torch.nn.Module):
    """One direction's teacher as a DDP-wrappable objective with REDER's call signature: the batch's
    (src, tgt) pairs are read in the teacher's direction; terms are named by direction."""

    def __init__(self, model: Transformer, direction: str) -> None:
        super().__init__()
        self.model, self.direction = model, direction

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt: torch.Tensor, tgt_lengths: torch.Tensor,
                step: int, tgt2src_batch: None = None) -> dict[str, torch.Tensor]:
        if self.direction == "tgt2src":
            src, src_lengths, tgt, tgt_lengths = tgt, tgt_lengths, src, src_lengths
        terms = self.model.loss(src, src_lengths, tgt, tgt_lengths)
        return {f"nll_{self.direction}": terms["nll"], "total": terms["total"]}


class CmlmObjective(torch.nn.Module):
    """One direction's CMLM as a DDP-wrappable objective with REDER's call signature. With KD batches it trains
    on its own direction's pairs: src2tgt on the batch (x, teacher(x)), tgt2src on `tgt2src_batch`
    (teacher(y), y) read backwards (y → teacher(y)); without KD on the references read in its direction."""

    def __init__(self, model: CMLM, direction: str) -> None:
        super().__init__()
        self.model, self.direction = model, direction

    def reads(self, batch: Batch, reverse: Optional[Batch]) -> Batch:
        """The one batch of a micro-batch this direction trains on (read backwards for tgt2src); the harness
        counts its tokens only."""
        return reverse if self.direction == "tgt2src" and reverse is not None else batch

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt: torch.Tensor, tgt_lengths: torch.Tensor,
                step: int, tgt2src_batch: Optional[Batch] = None) -> dict[str, torch.Tensor]:
        src, src_lengths, tgt, tgt_lengths = self.reads((src, src_lengths, tgt, tgt_lengths), tgt2src_batch)
        if self.direction == "tgt2src":
            src, src_lengths, tgt, tgt_lengths = tgt, tgt_lengths, src, src_lengths
        terms = self.model.loss(src, src_lengths, tgt, tgt_lengths)
        return {f"nll_{self.direction}": terms["nll"], f"length_{self.direction}": terms["length"], "total": terms["total"]}


class PairObjective(torch.nn.Module):
    """Both directions' objectives (`TeacherObjective`, `CmlmObjective`) as one: every update trains both models on
    the same micro-batch, each reading it in its own direction (REDER's duplex update does the same). Returns each
    one's terms (named by direction) and the sum of their totals: the models share no parameter, so each gets the
    gradient of its own loss, as in a run of its own."""

    def __init__(self, objectives: dict[str, torch.nn.Module]) -> None:
        super().__init__()
        self.objectives = torch.nn.ModuleDict(objectives)

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt: torch.Tensor, tgt_lengths: torch.Tensor,
                step: int, tgt2src_batch: Optional[Batch] = None) -> dict[str, torch.Tensor]:
        terms: dict[str, torch.Tensor] = {}
        totals = []
        for objective in self.objectives.values():
            own = objective(src, src_lengths, tgt, tgt_lengths, step, tgt2src_batch=tgt2src_batch)
            totals.append(own.pop("total"))
            terms.update(own)
        return {**terms, "total": torch.stack(totals).sum()}
