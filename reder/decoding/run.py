"""Running a decoder: over id sequences in length-sorted batches (`translate_ids`), over plain text
(`translate_lines`), on one padded batch (`decode`); and `choose`, the one mapping from what a user says (a decoder
name, a beam size, options) to a decoder, which the CLI, the Python API, the MLflow pyfunc and the Serve app share.
"""
from dataclasses import fields
from typing import Any, Iterable, Optional

import sentencepiece
import torch

from reder.cmlm import CMLM
from reder.config import EOS_ID
from reder.confidence import confidences
from reder.decoding import DECODERS, decoder_names, default_decoder, make_decoder
from reder.decoding.base import Decoder, Model, family_of, length_batches
from reder.model import REDER
from reder.text import normalise


def choose(model: Model, decoder: Optional[str] = None, beam: int = 1, **options: Any) -> Decoder:
    """The decoder a user means by a name and a beam size: `beam` > 1 with no name (or greedy) is the family's
    `beam` of that size; a CMLM's `beam` is mask-predict's length candidates; a decoder with a beam (`beam`,
    a DAG's `path_beam`) takes `beam` as its size. `options`: the decoder's own (a ValueError names those it
    takes)."""
    if not isinstance(beam, int) or isinstance(beam, bool) or beam < 1:
        raise ValueError(f"beam must be an int >= 1, got {beam!r}")
    family = family_of(model)
    name = decoder or default_decoder(model)
    if name not in decoder_names(family) and not (family == "cmlm" and name == "greedy"):
        make_decoder(model, name)  # the error naming the family's decoders
    if family == "cmlm" and name in ("greedy", "mask_predict"):
        return make_decoder(model, "mask_predict", length_beam=beam, **options)
    if name == "greedy" and beam > 1:
        name = "beam"
    if "beam_size" in {f.name for f in fields(DECODERS[family, name])}:
        return make_decoder(model, name, beam_size=beam, **options)
    if beam > 1:
        raise ValueError(f"decoder {name!r} with beam {beam}: a beam search is its own decoder (give beam > 1 with "
                         "decoder greedy or beam, or beam 1 with this one)")
    return make_decoder(model, name, **options)


def _decoder(model: Model, decoder: str | Decoder | None, options: dict[str, Any]) -> Decoder:
    if isinstance(decoder, Decoder):
        if options:
            raise TypeError(f"options {sorted(options)} go to the decoder when it is built, not beside it")
        if decoder.family != family_of(model):
            raise ValueError(f"decoder {decoder.name!r} is for {decoder.family} models, not {family_of(model)}")
        return decoder
    return make_decoder(model, decoder, **options)


def _limit_detail(model: Model) -> str:
    detail = f"max_positions {model.cfg.max_positions if hasattr(model, 'cfg') else model.max_positions}"
    if isinstance(model, REDER):
        detail += f", {model.head.ratio_name} {getattr(model.cfg, model.head.ratio_name)}"
    return detail


def input_limits(model: Model, decoder: Decoder, refiner: Optional[CMLM] = None,
                 refine_steps: int = 0) -> list[tuple[int, str]]:
    """The longest inputs (pieces with EOS) the model, the decoder's own models and the refiner read, each with
    what it is."""
    limits = [(model.max_input_length(), f"the model's limit of {model.max_input_length()} ({_limit_detail(model)})")]
    limits += decoder.limits()
    if refiner is not None and refine_steps:
        limits.append((refiner.max_input_length(), f"the refiner's limit of {refiner.max_input_length()} "
                                                   "(its max_positions)"))
    return limits


@torch.inference_mode()
def translate_ids(model: Model, sequences: list[list[int]], direction: str, decoder: str | Decoder | None = None,
                  batch_size: int = 64, refiner: Optional[CMLM] = None, refine_steps: int = 0,
                  **options: Any) -> list[list[int]]:
    """Translate id sequences (each ending in EOS) with `decoder` (a name and its `options`, or a built Decoder;
    None: the model's default) in length-sorted batches; results (ids without specials) in input order. With
    `refiner` (a CMLM of `direction`) and refine_steps K > 0, every hypothesis is then refined by K mask-predict
    iterations (CMLM.refine). An input longer than a model reads is a ValueError naming it."""
    chosen = _decoder(model, decoder, options)
    if refine_steps < 0:
        raise ValueError(f"need refine_steps >= 0, got {refine_steps}")
    if refine_steps and not isinstance(refiner, CMLM):
        raise ValueError(f"refine_steps {refine_steps} needs a refiner (a CMLM model of direction {direction})")
    for number, sequence in enumerate(sequences, start=1):
        for limit, detail in input_limits(model, chosen, refiner, refine_steps):
            if len(sequence) > limit:
                raise ValueError(f"input {number}: {len(sequence)} pieces (with EOS) exceed {detail}")
    outputs = chosen.decode_sequences(model, sequences, direction, batch_size)
    if refine_steps:
        outputs = refine(refiner, sequences, outputs, refine_steps, batch_size)
    return outputs


def refine(refiner: CMLM, sequences: list[list[int]], hypotheses: list[list[int]], steps: int,
           batch_size: int) -> list[list[int]]:
    """Each hypothesis refined by `steps` mask-predict iterations of `refiner` given its source, in the same
    length-sorted batches of sources as the decoding."""
    outputs = list(hypotheses)
    for chunk, tokens, lengths in length_batches(sequences, batch_size, next(refiner.parameters()).device):
        for index, refined in zip(chunk, refiner.refine(tokens, lengths, [hypotheses[i] for i in chunk], steps)):
            outputs[index] = refined
    return outputs


@torch.inference_mode()
def decode(model: Model, tokens: torch.Tensor, lengths: torch.Tensor, direction: str,
           decoder: str | Decoder | None = None, **options: Any) -> list[list[int]]:
    """One padded batch (B, T) of ids ending in EOS → one hypothesis per sentence (ids without specials)."""
    return _decoder(model, decoder, options).decode(model, tokens, lengths, direction)


def encode_lines(sp: sentencepiece.SentencePieceProcessor, lines: Iterable[str]) -> list[list[int]]:
    """Text → piece ids with the EOS the model expects at the end."""
    return [sp.encode(line.rstrip("\n")) + [EOS_ID] for line in lines]


def translate_lines(model: Model, sp: sentencepiece.SentencePieceProcessor, lines: list[str], direction: str,
                    decoder: Decoder, batch_size: int = 64, notes: Optional[list[tuple[int, str]]] = None,
                    refiner: Optional[CMLM] = None, refine_steps: int = 0,
                    scores: bool = False) -> list[str] | list[dict[str, Any]]:
    """Plain text in, detokenized text out, with a built `decoder` (`choose`). With `scores`, one dict per line
    instead: {"translation": text, "score", "forward", "round_trip", "reason"} (reder/confidence.py: the model
    reads each translation back; computed only when asked for).

    Strict without `notes`: a line holding a character `reder.text` does not allow in a line is translated as it
    is, and one longer than the model reads is a ValueError. With a `notes` list every line is translated, one
    output per line always (the translators' rule, docs/USAGE.md): such characters become spaces and a line
    longer than the model (or teacher, or refiner) reads is cut to it; each change is appended to `notes` as
    (index of the line, what was done)."""
    if notes is not None:
        cleaned = []
        for index, line in enumerate(lines):
            line, note = normalise(line)
            if note:
                notes.append((index, note))
            cleaned.append(line)
        lines = cleaned
    sequences = encode_lines(sp, lines)
    if notes is not None:
        limit = min(limit for limit, _ in input_limits(model, decoder, refiner, refine_steps))
        for index, sequence in enumerate(sequences):
            if len(sequence) > limit:
                notes.append((index, f"{len(sequence) - 1} pieces, more than the model reads ({limit - 1}): its first "
                                     f"{limit - 1} translated"))
                sequences[index] = sequence[: limit - 1] + [EOS_ID]
    hypotheses = translate_ids(model, sequences, direction, decoder, batch_size, refiner, refine_steps)
    texts = [sp.decode(h) for h in hypotheses]
    if not scores:
        return texts
    judged = confidences(model, sequences, hypotheses, direction, batch_size)
    return [{"translation": text, **confidence.as_dict()} for text, confidence in zip(texts, judged)]
