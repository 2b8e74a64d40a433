"""A DAG REDER's decoders (reder/dag.py, reder/dag_beam.py): `greedy` and `lookahead` (from vertex 0 the best
next vertex, by its link alone or by link + its best token's log-probability), `viterbi` (the best path of every
length, picked by score / length^`length_penalty`), and `beam` (beam search over output strings by their exact
probability, the top 5 tokens of each vertex as candidates; never below greedy or lookahead on that score), and
`path_beam` (DA-Transformer's beam over paths and tokens together, `top_transitions` next vertices and
`top_tokens` tokens a vertex: linear in the graph where `beam` scores every candidate string exactly).
`max_transition` bounds every decoder's jumps (0: no bound); `no_repeat_ngram` N blocks consecutive repeated
n-grams up to N in greedy and lookahead."""
from abc import abstractmethod
from dataclasses import dataclass

import torch

from reder.config import PAD_ID
from reder.dag import dag_greedy, dag_viterbi
from reder.dag import limit_transitions
from reder.dag_beam import dag_beam, dag_path_beam
from reder.decode import strip_special
from reder.decoding.base import Decoder, check
from reder.heads import HeadOutput
from reder.model import REDER


@dataclass(frozen=True)
class DagDecoder(Decoder):
    """What the DAG decoders share: the model's output with its links, hypotheses with specials stripped."""

    family = "dag"
    max_transition: int = 0

    def decode(self, model: REDER, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> list[list[int]]:
        output = model.outputs(tokens, lengths, direction)
        return [strip_special(h, model.cfg.blank_id) for h in self.search(model, output)]

    @abstractmethod
    def search(self, model: REDER, output: HeadOutput) -> list[list[int]]:
        """Raw ids (BOS/EOS kept) of one hypothesis per graph."""


@dataclass(frozen=True)
class DagGreedy(DagDecoder):
    name = "greedy"
    no_repeat_ngram: int = 0
    lookahead = 0.0

    def __post_init__(self) -> None:
        check(self, max_transition=">= 0", no_repeat_ngram=">= 0")

    def search(self, model: REDER, output: HeadOutput) -> list[list[int]]:
        return dag_greedy(output.extra["log_edges"], output.log_probs, output.lengths, self.lookahead,
                          self.max_transition, self.no_repeat_ngram)


@dataclass(frozen=True)
class DagLookahead(DagGreedy):
    name = "lookahead"
    lookahead = 1.0  # β: the next vertex by log E + β · its best token's log-probability


@dataclass(frozen=True)
class DagViterbi(DagDecoder):
    name = "viterbi"
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        check(self, max_transition=">= 0", length_penalty=">= 0")

    def search(self, model: REDER, output: HeadOutput) -> list[list[int]]:
        return dag_viterbi(output.extra["log_edges"], output.log_probs, output.lengths, self.length_penalty,
                           self.max_transition)


@dataclass(frozen=True)
class DagBeam(DagDecoder):
    name = "beam"
    beam_size: int = 5
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        check(self, beam_size=">= 1", max_transition=">= 0", length_penalty=">= 0")

    def search(self, model: REDER, output: HeadOutput) -> list[list[int]]:
        return [string for string, _ in dag_beam(output.extra["log_edges"], output.log_probs, output.lengths,
                                                 self.beam_size, length_penalty=self.length_penalty,
                                                 excluded=(PAD_ID, model.cfg.blank_id),
                                                 max_transition=self.max_transition)]


@dataclass(frozen=True)
class DagPathBeam(DagDecoder):
    name = "path_beam"
    beam_size: int = 5
    top_transitions: int = 5
    top_tokens: int = 2
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        check(self, beam_size=">= 1", max_transition=">= 0", top_transitions=">= 1", top_tokens=">= 1",
              length_penalty=">= 0")

    def search(self, model: REDER, output: HeadOutput) -> list[list[int]]:
        log_edges = limit_transitions(output.extra["log_edges"], self.max_transition)
        return [ids for ids, _ in dag_path_beam(log_edges, output.log_probs, output.lengths, self.beam_size,
                                                self.top_transitions, self.top_tokens, self.length_penalty,
                                                excluded=(PAD_ID, model.cfg.blank_id))]
