"""Round-trip confidence: a duplex model's own judge of each translation it makes, from the same weights.

For a source x (its pieces) translated into ŷ in a direction:

- `forward`: log P(ŷ + EOS | x) / (|ŷ| + 1), the exact likelihood of the output under the direction that wrote it
  (CTC: summed over every alignment of the upsampled frames; DAG: over every path through the graph, BOS and EOS
  included), per output token: how sure the model was of what it wrote;
- `round_trip`: log P(x + EOS | ŷ) / (|x| + 1), the same weights run the other way: the reverse direction reads
  ŷ and the likelihood of the source is taken, per source token. A translation that dropped or invented content
  does not read back into its source, however fluent it is;
- `score`: their mean, the per-token log-likelihood of the pair read both ways (dual conditional cross-entropy,
  Junczys-Dowmunt 2018, without its disagreement term: one model instead of two). Higher is more trusted.

All three are natural-log likelihoods per token (≤ 0). They read the model's own distribution: the blank penalty
is a decoding choice (it shapes what greedy picks), not what the model believes, so it does not enter. A value
that cannot be computed is None with the reason beside it: a hypothesis longer than the reverse direction reads,
or one that the other end cannot emit the source from (too few upsampled frames or graph vertices for it). Models
that are not duplex (the autoregressive teacher, the CMLM, CTranslate2) have no reverse direction: every value
None, reason `NOT_DUPLEX`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch

from reder.config import BOS_ID, EOS_ID, REVERSE
from reder.dag_beam import string_log_likelihood
from reder.decode import ctc_log_likelihoods
from reder.decoding.base import length_batches
from reder.model import REDER

NOT_DUPLEX = "not a duplex model: no reverse direction to read the translation back"


@dataclass(frozen=True)
class Confidence:
    """One translation's scores (see the module doc); `reason` says why a value is None."""

    score: Optional[float]
    forward: Optional[float]
    round_trip: Optional[float]
    reason: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def likelihoods(model: REDER, inputs: list[list[int]], outputs: list[list[int]], direction: str,
                batch_size: int = 64) -> list[tuple[Optional[float], Optional[str]]]:
    """Per pair: log P(output + EOS | input) / (|output| + 1) in `direction` (inputs are ids ending in EOS,
    outputs ids without specials), or None with the reason: an input longer than the model reads, or an output
    that the input's frames (CTC) or vertices (DAG) cannot emit."""
    if len(inputs) != len(outputs):
        raise ValueError(f"likelihoods: {len(inputs)} inputs for {len(outputs)} outputs")
    limit = model.max_input_length()
    results: list[tuple[Optional[float], Optional[str]]] = [
        (None, f"{len(sequence)} pieces (with EOS) to read, more than the model reads ({limit})")
        if len(sequence) > limit else (None, None) for sequence in inputs]
    readable = [index for index, sequence in enumerate(inputs) if len(sequence) <= limit]
    for batch, tokens, lengths in length_batches([inputs[i] for i in readable], batch_size,
                                                 next(model.parameters()).device):
        chunk = [readable[i] for i in batch]
        with torch.inference_mode():
            output = model.outputs(tokens, lengths, direction)
            if model.cfg.head == "dag":
                strings = [[BOS_ID, *outputs[i], EOS_ID] for i in chunk]
                values = string_log_likelihood(output.extra["log_edges"], output.log_probs, output.lengths,
                                               strings).tolist()
                values = [value / (len(outputs[i]) + 1) for value, i in zip(values, chunk)]
            else:  # CTC: normalised by the target's length, EOS counted
                values = ctc_log_likelihoods(output.log_probs, output.lengths, torch.arange(len(chunk)),
                                             [[*outputs[i], EOS_ID] for i in chunk], model.cfg.blank_id)
        for row, (index, value) in enumerate(zip(chunk, values)):
            if math.isfinite(value):
                results[index] = (float(value), None)
            else:
                kind = "vertices" if model.cfg.head == "dag" else "frames"
                results[index] = (None, f"{len(outputs[index]) + 1} tokens (with EOS) cannot be emitted from the "
                                        f"{int(output.lengths[row])} {kind} of {len(inputs[index])} pieces read")
    return results


def confidences(model: Any, sources: list[list[int]], hypotheses: list[list[int]], direction: str,
                batch_size: int = 64) -> list[Confidence]:
    """Each translation's `Confidence` (the module doc): `sources` as translated (ids ending in EOS),
    `hypotheses` what came out (ids without specials)."""
    if not isinstance(model, REDER):
        return [Confidence(None, None, None, NOT_DUPLEX) for _ in sources]
    forward = likelihoods(model, sources, hypotheses, direction, batch_size)
    readback = likelihoods(model, [[*h, EOS_ID] for h in hypotheses], [s[:-1] for s in sources], REVERSE[direction],
                           batch_size)
    result = []
    for (ahead, why_not_ahead), (back, why_not_back) in zip(forward, readback):
        reasons = [f"forward: {why_not_ahead}"] * (why_not_ahead is not None) + \
                  [f"round trip: {why_not_back}"] * (why_not_back is not None)
        score = None if ahead is None or back is None else (ahead + back) / 2
        result.append(Confidence(score, ahead, back, "; ".join(reasons) or None))
    return result


def lowest(values: list[Optional[float]], percent: float) -> list[int]:
    """The indices of the lowest `percent` % of `values` (round(n · percent / 100), at least one of a non-empty
    list; None ranks lowest, equals in input order): the translations `--flag` marks for a person to check."""
    if not 0 < percent < 100:
        raise ValueError(f"a share in percent between 0 and 100 is needed, got {percent}")
    count = max(1, round(len(values) * percent / 100)) if values else 0
    order = sorted(range(len(values)), key=lambda i: -math.inf if values[i] is None else values[i])
    return sorted(order[:count])
