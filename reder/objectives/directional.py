"""The teacher's (reder/autoregressive.py) and the CMLM's (reder/cmlm.py) losses, `teacher_loss` and `cmlm_loss`
(the models give log-probabilities and know nothing of their loss), their one-direction objectives, and
`PairObjective`, both directions' as one, each with REDER's `DuplexLoss` call signature so the one training
harness (pipeline/training/harness.py) and DDP wrap them alike. The objectives read a batch in their direction and name
the terms by it."""
from typing import Optional

import torch

from reder.autoregressive import Transformer
from reder.cmlm import CMLM
from reder.config import PAD_ID
from reder.ctc import valid_mask
from reder.objectives.terms import uniform_mask

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # src, src_lengths, tgt, tgt_lengths


def teacher_loss(model: Transformer, src_tokens: torch.Tensor, src_lengths: torch.Tensor, tgt_tokens: torch.Tensor,
                 tgt_lengths: torch.Tensor) -> dict[str, torch.Tensor]:
    """The teacher's label-smoothed cross-entropy (fairseq's), per target token. With p_t = p(· | x, y_<t) the
    decoder's distribution at target position t (teacher forcing; EOS in, pads out), N the batch's target tokens
    and ε = `label_smoothing`:

        nll = (1/N) Σ_t −log p_t(y_t),    total = (1−ε)·nll + ε·(1/N) Σ_t mean_v(−log p_t(v)).

    Sources (B, S) and targets (B, T): right-padded rows ending in EOS."""
    log_probs = model.target_log_probs(*model.encode(src_tokens, src_lengths), tgt_tokens)  # (B, T, V)
    mask = valid_mask(tgt_lengths, tgt_tokens.shape[1])
    nll = -log_probs.gather(-1, tgt_tokens[..., None]).squeeze(-1)[mask].mean()
    uniform = -log_probs.mean(dim=-1)[mask].mean()
    smoothing = model.cfg.label_smoothing
    return {"nll": nll, "total": (1 - smoothing) * nll + smoothing * uniform}


def cmlm_loss(model: CMLM, src_tokens: torch.Tensor, src_lengths: torch.Tensor, tgt_tokens: torch.Tensor,
              tgt_lengths: torch.Tensor) -> dict[str, torch.Tensor]:
    """The CMLM's loss (Ghazvininejad et al., 2019; fairseq's cmlm). Targets (B, T) end in EOS, as every batch of
    the training core; it is dropped here: y without EOS, n = |y|. M: the masked positions (`uniform_mask`,
    |M| ~ U{1..n} per target), p_t = p(· | x, y with M replaced by [MASK]) at position t, |M| counted over the
    batch (at least 1), ε = `label_smoothing`, λ = `length_loss_factor`:

        nll = (1/|M|) Σ_{t∈M} −log p_t(y_t),    length = mean over the batch of −log p_len(n | x),
        total = (1−ε)·nll + ε·(1/|M|) Σ_{t∈M} mean_v(−log p_t(v)) + λ·length,

    n capped at the length head's largest class, max_positions − 1."""
    memory, src_mask = model.encode(src_tokens, src_lengths)
    lengths = (tgt_lengths - 1).clamp(min=0)
    width = max(1, int(lengths.max()))
    target = tgt_tokens[:, :width].masked_fill(~valid_mask(lengths, width), PAD_ID)  # (B, T') without EOS
    masked = uniform_mask(lengths, width)
    log_probs = model.decode_log_probs(model.cross(memory), src_mask, target.masked_fill(masked, model.cfg.mask_id),
                                       lengths)  # (B, T', V)
    count = masked.sum().clamp(min=1)
    nll = -(log_probs.gather(-1, target[..., None]).squeeze(-1) * masked).sum() / count
    uniform = -(log_probs.mean(dim=-1) * masked).sum() / count
    length_targets = lengths.clamp(max=model.cfg.max_positions - 1)[:, None]
    length = -model.length_log_probs(memory, src_mask).gather(1, length_targets).mean()
    smoothing = model.cfg.label_smoothing
    total = (1 - smoothing) * nll + smoothing * uniform + model.cfg.length_loss_factor * length
    return {"nll": nll, "length": length, "total": total}


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
        terms = teacher_loss(self.model, src, src_lengths, tgt, tgt_lengths)
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
        terms = cmlm_loss(self.model, src, src_lengths, tgt, tgt_lengths)
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
