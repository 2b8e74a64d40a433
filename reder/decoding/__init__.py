"""Decoding, one interface for every method (fairseq's search.py, without its global registry): each decoder is
a small class in this package, registered below by (family, name), whose fields are its options, checked when it
is built. The CLI (`--decoder`), the Python API (`reder.load(dir).translate(..., decoder=...)`), the MLflow pyfunc,
the Ray Serve app and the evaluate stage all name decoders from here.

- base.py: `Decoder` (what a decoder is), `family_of(model)`, `Ct2Model`;
- ctc.py: a CTC REDER's `greedy` and `beam` (reranked by the model itself or by a teacher), and the stages'
  one-model-run helpers `greedy_by_penalty`, `reranked_by_penalty`, `nbest`;
- dag.py: a DAG REDER's `greedy`, `lookahead`, `viterbi`, `beam`, `path_beam`;
- autoregressive.py, ct2.py: the teacher's `greedy` and `beam`, ours and through CTranslate2;
- cmlm.py: the CMLM's `mask_predict`;
- run.py: `translate_ids` (length-sorted batches, length limits, refinement) and `translate_lines` (text).

Adding a decoder: its class in one of these files (or a new one), its line in `DECODERS`, a test.
"""
from dataclasses import fields
from typing import Any

from reder.decoding.autoregressive import TeacherBeam, TeacherGreedy
from reder.decoding.base import Decoder, Model, family_of
from reder.decoding.cmlm import MaskPredict
from reder.decoding.ct2 import Ct2Beam, Ct2Greedy
from reder.decoding.ctc import CtcBeam, CtcGreedy
from reder.decoding.dag import DagBeam, DagGreedy, DagLookahead, DagPathBeam, DagViterbi

DECODERS: dict[tuple[str, str], type[Decoder]] = {
    (cls.family, cls.name): cls
    for cls in (CtcGreedy, CtcBeam, DagGreedy, DagLookahead, DagViterbi, DagBeam, DagPathBeam, TeacherGreedy, TeacherBeam,
                Ct2Greedy, Ct2Beam, MaskPredict)
}
DEFAULT = {"cmlm": "mask_predict"}  # every other family's default is greedy
KINDS = {"ctc": "a CTC REDER", "dag": "a DAG REDER", "transformer": "a Transformer teacher", "cmlm": "a CMLM",
         "ct2": "a CTranslate2 teacher"}  # what a family's models are called in messages


def decoder_names(family: str | None = None) -> tuple[str, ...]:
    """The decoders of one family (every name, without), in registration order."""
    return tuple(dict.fromkeys(name for fam, name in DECODERS if family in (None, fam)))


def default_decoder(model: Model) -> str:
    """The name a model decodes with when none is given: greedy, or a CMLM's mask_predict."""
    return DEFAULT.get(family_of(model), "greedy")


def make_decoder(model: Model, name: str | None = None, **options: Any) -> Decoder:
    """The decoder `name` (default: `default_decoder`) for `model`'s family with `options`; a ValueError names
    the decoders of that family, or the options this one takes."""
    family = family_of(model)
    name = default_decoder(model) if name is None else name
    cls = DECODERS.get((family, name))
    if cls is None:
        raise ValueError(f"decoder {name!r}: {KINDS[family]} decodes with {', '.join(decoder_names(family))}")
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"decoder {name!r} of {family}: unknown options {unknown}; it takes {known or 'none'}")
    return cls(**options)
