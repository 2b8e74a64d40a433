"""Translation from Python in two lines:

    import reder
    model = reder.load("runs/default/train-<hash>/model")
    model.translate(["A man is walking."], src="en", tgt="de", beam=5)   # -> ["Ein Mann geht."]

`load` reads a model directory (what the train stage publishes; `python -m reder.translate` reads the
same), or a registered model's URI (`reder.load("models:/reder-en-de@champion")`, MLflow installed): a REDER translates both ways with the same weights, a Transformer teacher or a CMLM only its own
direction. A CMLM (another Translator) can refine any model's output: `translate(..., refiner=cmlm, refine_steps=K)`.
Languages are the codes the directory records (`Translator.languages`). Text in, detokenized text out;
SentencePiece is applied inside.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from reder.checkpoint import SPM_FILE, direction_of, load_model_dir
from reder.cmlm import CMLM
from reder.text import line_problem
from reder.translate import check_device, fast_model, load_sentencepiece, translate_lines

MAX_CHARS = 2000  # per sentence a service takes (pipeline.serve, the MLflow pyfunc): sentences, not books


def sentence_problem(line: object, strict: bool = True) -> Optional[str]:
    """What keeps `line` from being one sentence a service translates, or None: a string, not blank, at most
    MAX_CHARS characters; with `strict` also one line of text as `reder.text` defines it (the ingest stage's
    rule: no line terminator, no control character but TAB; without it the service mends such a line,
    `reder.text.normalise`, and says so). The services put their own name of the field in front."""
    if not isinstance(line, str):
        return f"must be a string, got {type(line).__name__}"
    if not line.strip():
        return "is empty"
    if len(line) > MAX_CHARS:
        return f"has {len(line)} characters, more than {MAX_CHARS}"
    return line_problem(line) if strict else None


class Translator:
    """A loaded model directory. `translate(text, src, tgt, beam=1, decoder="greedy")`: CTC models decode
    greedily or with prefix beam search (`beam` > 1); DAG models with `decoder` greedy, lookahead or
    viterbi; a Transformer with beam search of size `beam`; a CMLM with mask-predict, `iterations` and `beam`
    length candidates. `refiner` (a Translator of a CMLM for this direction) refines the output with
    `refine_steps` mask-predict iterations."""

    def __init__(self, directory: str | Path, device: str = "cpu", int8: bool = False, compile: bool = False) -> None:
        check_device(device)
        self.directory = Path(directory)
        self.model, self.meta = load_model_dir(self.directory, device)
        self.model = fast_model(self.model, device, int8, compile)
        self.sp = load_sentencepiece(self.directory / SPM_FILE)
        self.languages = (self.meta.get("src_lang"), self.meta.get("tgt_lang"))

    def translate(self, text: str | Sequence[str], src: str, tgt: str, beam: int = 1, decoder: str = "greedy",
                  batch_size: int = 64, iterations: int = 10, refiner: Optional[Translator] = None,
                  refine_steps: int = 0, notes: Optional[list[tuple[int, str]]] = None) -> str | list[str]:
        """One sentence (a str) or a list of them, from language `src` into `tgt`. With a `notes` list every
        sentence is translated, mended where it must be (`reder.translate.translate_lines`: a control character
        becomes a space, a sentence longer than the model reads is cut), each change appended as (index, what)."""
        if beam < 1 or batch_size < 1:
            raise ValueError(f"beam and batch_size must be >= 1, got {beam} and {batch_size}")
        decoders = getattr(getattr(self.model, "head", None), "decoders", ("greedy",))
        if decoder not in decoders:
            raise ValueError(f"decoder {decoder!r}: this model decodes with {', '.join(decoders)}")
        lines = [text] if isinstance(text, str) else list(text)
        direction = direction_of(self.meta, src, tgt, self.directory)
        options: dict[str, Any] = {"iterations": iterations} if isinstance(self.model, CMLM) else {}
        if refiner is not None or refine_steps:
            if refiner is None or not isinstance(refiner.model, CMLM):
                raise ValueError("refine_steps needs refiner=<a Translator of a CMLM model directory>")
            if direction_of(refiner.meta, src, tgt, refiner.directory) != direction:
                raise ValueError(f"{refiner.directory}: its direction differs from this model's {direction} for {src}->{tgt}")
            options.update(refiner=refiner.model, refine_steps=refine_steps)
        with torch.inference_mode():
            out = translate_lines(self.model, self.sp, lines, direction, beam, batch_size, decoder, notes=notes, **options)
        return out[0] if isinstance(text, str) else out

    def __repr__(self) -> str:
        kind = type(self.model).__name__
        return f"Translator({str(self.directory)!r}, {kind}, {self.languages[0]}<->{self.languages[1]})"


REGISTRY = "models:/"


def load(directory: str | Path, device: str = "cpu", int8: bool = False, compile: bool = False) -> Translator:
    """The model directory `directory` ready to translate (see the module doc); or a model the pipeline registered
    in MLflow, by URI: `models:/reder-en-de@champion` (an alias), `models:/reder-en-de/3` (a version). `int8`: a
    REDER on CPU with its trunk's linear layers dynamically quantized (reder.inference.quantized; faster, not
    bit-equal). `compile`: a REDER's trunk under torch.compile (reder/static.py; the same tokens): CUDA graphs at
    bucketed static shapes on CUDA, each bucket compiled at its first batch; on a CPU unpadded batches with the
    weights frozen in (a later change to them raises), one graph per direction compiled at its first batch."""
    if str(directory).startswith(REGISTRY):
        directory = registered_model_dir(str(directory))
    return Translator(directory, device, int8, compile)


def registered_model_dir(uri: str) -> Path:
    """The local model directory of a registered pyfunc (pipeline/mlflow_model.py keeps it as its artifact `model`),
    downloaded by MLflow from the tracking server that $MLFLOW_TRACKING_URI names. MLflow is imported here only:
    reder needs it for registry URIs alone."""
    import mlflow.artifacts

    return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri)) / "artifacts" / "model"
