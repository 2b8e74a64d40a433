"""A CTC REDER's decoders: `greedy` (the per-frame argmax, repeats merged, blanks dropped) and `beam` (prefix beam
search over each frame's top `cutoff_top_n` tokens within cumulative probability `cutoff_prob`, its n-best
rescored exactly; `rerank` "self" picks by forward score + `rerank_weight` · the model's own reverse direction's
log P(x | ŷ), "teacher" by an autoregressive `teacher` of the direction). Both lower the blank's logit by
`blank_penalty` (None: the model's own, tuned on the validation split and kept in its model directory).

`nbest`, `greedy_by_penalty` and `reranked_by_penalty` serve the train and evaluate stages' tuning: one run of
the model for several blank penalties, one n-best for several rerankers, each output equal to the decoder's.
"""
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import torch

from reder.autoregressive import Transformer
from reder.config import CUTOFF_PROB, CUTOFF_TOP_N, RERANK_WEIGHT, RERANKERS
from reder.decode import ctc_greedy, ctc_nbest, strip_special
from reder.decoding.base import Decoder, check, length_batches, optional_model
from reder.heads import HeadOutput
from reder.model import REDER
from reder.rerank import self_rerank
from reder.rerank import rerank as teacher_rerank

NBest = list[list[tuple[list[int], float]]]  # per sentence: (ids, normalised forward score), best first


def check_penalty(decoder: Decoder) -> None:
    penalty = getattr(decoder, "blank_penalty")
    if penalty is not None and (isinstance(penalty, bool) or not isinstance(penalty, (int, float))
                                or not math.isfinite(penalty)):
        raise ValueError(f"decoder {decoder.name!r}: blank_penalty must be a finite number or None, got {penalty!r}")


@dataclass(frozen=True)
class CtcGreedy(Decoder):
    name = "greedy"
    family = "ctc"
    blank_penalty: Optional[float] = None

    def __post_init__(self) -> None:
        check_penalty(self)

    def decode(self, model: REDER, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> list[list[int]]:
        # greedy is a per-frame argmax: the logits serve, without the log-softmax
        output = model.outputs(tokens, lengths, direction, False, model.decoding_penalty(direction, self.blank_penalty))
        blank = model.cfg.blank_id
        return [strip_special(h, blank) for h in ctc_greedy(output.log_probs, output.lengths, blank)]


@dataclass(frozen=True)
class CtcBeam(Decoder):
    name = "beam"
    family = "ctc"
    beam_size: int = 5
    cutoff_top_n: int = CUTOFF_TOP_N
    cutoff_prob: float = CUTOFF_PROB
    blank_penalty: Optional[float] = None
    rerank: str = "none"
    rerank_weight: float = RERANK_WEIGHT
    teacher: Optional[Transformer] = None

    def __post_init__(self) -> None:
        check(self, beam_size=">= 1", cutoff_top_n=">= 1", cutoff_prob="in (0, 1]", rerank_weight=">= 0")
        check_penalty(self)
        if self.rerank not in RERANKERS:
            raise ValueError(f"decoder 'beam': rerank must be one of {list(RERANKERS)}, got {self.rerank!r}")
        optional_model(self, "teacher", Transformer, "a Transformer (the teacher of the direction)")
        if (self.rerank == "teacher") != (self.teacher is not None):
            raise ValueError("decoder 'beam': rerank='teacher' needs a teacher, and a teacher is only for rerank='teacher'")

    def limits(self) -> list[tuple[int, str]]:
        if self.teacher is None:
            return []
        return [(self.teacher.max_input_length(), f"the teacher's limit of {self.teacher.max_input_length()} "
                                                  "(its max_positions)")]

    def decode(self, model: REDER, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> list[list[int]]:
        penalty = model.decoding_penalty(direction, self.blank_penalty)
        output = model.outputs(tokens, lengths, direction, blank_penalty=penalty)
        return self.pick(model, tokens, lengths, direction, nbest_of(model, output, self.beam_size, self.cutoff_top_n,
                                                                      self.cutoff_prob))

    def pick(self, model: REDER, tokens: torch.Tensor, lengths: torch.Tensor, direction: str,
             nbest: NBest) -> list[list[int]]:
        """One hypothesis per sentence of the batch from its n-best: the beam's best, or the reranker's."""
        if self.rerank == "teacher":
            return teacher_rerank(self.teacher, tokens, lengths, [[ids for ids, _ in entries] for entries in nbest])
        if self.rerank == "self":
            return self_rerank(model, tokens, lengths, direction, nbest, self.rerank_weight)
        return [entries[0][0] for entries in nbest]


def nbest_of(model: REDER, output: HeadOutput, beam_size: int, cutoff_top_n: int = CUTOFF_TOP_N,
             cutoff_prob: float = CUTOFF_PROB) -> NBest:
    """The CTC beam's n-best of a model's output (log-probabilities, under whatever penalty they carry): per
    sentence (ids with specials stripped, the normalised forward score log P(y|x)/|y| of the raw labels), best
    first; of raw labels equal after stripping only the best stays."""
    results = []
    for entries in ctc_nbest(output.log_probs, output.lengths, model.cfg.blank_id, beam_size, cutoff_top_n, cutoff_prob):
        seen: dict[tuple[int, ...], float] = {}
        for labels, score in entries:
            seen.setdefault(tuple(strip_special(labels, model.cfg.blank_id)), score)
        results.append([(list(ids), score) for ids, score in seen.items()])
    return results


@torch.inference_mode()
def nbest(model: REDER, tokens: torch.Tensor, lengths: torch.Tensor, direction: str, beam_size: int,
          cutoff_top_n: int = CUTOFF_TOP_N, cutoff_prob: float = CUTOFF_PROB,
          blank_penalty: Optional[float] = None) -> NBest:
    """`nbest_of` a padded batch, under the blank penalty the beam decoder applies (None: the model's own)."""
    if model.cfg.head != "ctc":
        raise ValueError(f"an n-best needs a CTC model; this model's head is {model.cfg.head!r}")
    output = model.outputs(tokens, lengths, direction, blank_penalty=model.decoding_penalty(direction, blank_penalty))
    return nbest_of(model, output, beam_size, cutoff_top_n, cutoff_prob)


@torch.inference_mode()
def greedy_by_penalty(model: REDER, sequences: list[list[int]], direction: str, penalties: Iterable[float],
                      batch_size: int = 64) -> dict[float, list[list[int]]]:
    """CTC greedy output (ids, specials stripped, input order) of `sequences` for each blank penalty, the model
    run once per batch: equal to `CtcGreedy(blank_penalty=p)`'s for each p, at the cost of one."""
    if model.cfg.head != "ctc":
        raise ValueError(f"blank penalties need a CTC model; this model's head is {model.cfg.head!r}")
    penalties = list(dict.fromkeys(float(p) for p in penalties))
    device, blank = next(model.parameters()).device, model.cfg.blank_id
    outputs = {penalty: [[] for _ in sequences] for penalty in penalties}
    for chunk, tokens, lengths in length_batches(sequences, batch_size, device):
        output = model.outputs(tokens, lengths, direction, normalise=False)  # logits (B, T', V)
        for penalty in penalties:
            logits = model.penalise(output.log_probs, penalty, normalise=False)
            for index, hypothesis in zip(chunk, ctc_greedy(logits, output.lengths, blank)):
                outputs[penalty][index] = strip_special(hypothesis, blank)
    return outputs


@torch.inference_mode()
def reranked_by_penalty(model: REDER, sequences: list[list[int]], direction: str, penalties: Iterable[float],
                        decoders: dict[str, CtcBeam], batch_size: int = 64,
                        on_batch: Optional[Callable[[int], None]] = None) -> dict[float, dict[str, list[list[int]]]]:
    """For each blank penalty, each of `decoders`' output (name → a `CtcBeam`, whose own blank_penalty is not
    read; ids in input order): the model run once per batch, the beam once per batch, penalty and beam settings,
    its n-best shared by the decoders that search alike. Equal to each decoder's own output with
    blank_penalty=p, without their repeated model runs and beams (a reranker's own pass, e.g. self-reranking's
    reverse direction, is still one per penalty). `on_batch(sentences)` after each batch."""
    if model.cfg.head != "ctc":
        raise ValueError(f"an n-best needs a CTC model; this model's head is {model.cfg.head!r}")
    penalties = list(dict.fromkeys(float(p) for p in penalties))
    device = next(model.parameters()).device
    outputs = {penalty: {name: [[] for _ in sequences] for name in decoders} for penalty in penalties}
    for chunk, tokens, lengths in length_batches(sequences, batch_size, device):
        output = model.outputs(tokens, lengths, direction, normalise=False)  # logits (B, T', V)
        for penalty in penalties:
            penalised = HeadOutput(model.penalise(output.log_probs, penalty), output.lengths, output.extra)
            shared: dict[tuple[int, int, float], NBest] = {}
            for name, decoder in decoders.items():
                search = (decoder.beam_size, decoder.cutoff_top_n, decoder.cutoff_prob)
                if search not in shared:
                    shared[search] = nbest_of(model, penalised, *search)
                for index, hypothesis in zip(chunk, decoder.pick(model, tokens, lengths, direction, shared[search])):
                    outputs[penalty][name][index] = hypothesis
        if on_batch is not None:
            on_batch(len(chunk))
    return outputs

