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

import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

import sentencepiece
import torch

from reder.autoregressive import Transformer
from reder.checkpoint import SPM_FILE, direction_of, load_model_dir, read_meta
from reder.cmlm import CMLM
from reder.decoding.ct2 import ct2_model
from reder.decoding.run import choose, encode_lines, translate_ids, translate_lines
from reder.runtime.onednn import quantized
from reder.model import REDER
from reder.runtime.compiled import compiled
from reder.text import line_problem

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


def load_sentencepiece(path: Path) -> sentencepiece.SentencePieceProcessor:
    try:
        return sentencepiece.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError) as error:
        raise ValueError(f"{path}: not a SentencePiece model ({str(error).splitlines()[0]})") from None


def check_device(device: str) -> None:
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"--device {device}: not a device (cpu, cuda, cuda:N)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available on this machine (use --device cpu)")


def fast_model(model: REDER | Transformer | CMLM, device: str, int8: bool = False,
               compile: bool = False) -> REDER | Transformer | CMLM:
    """`model` with the decoding options asked for: `int8` (a REDER on CPU with its trunk's linear layers
    dynamically quantized, reder.runtime.onednn.quantized) or `compile` (a REDER's trunk at static shapes under
    torch.compile, reder.runtime.compiled.compiled), not both; ValueError otherwise."""
    if int8 and compile:
        raise ValueError("--int8 and --compile: choose one (the int8 trunk is not compiled)")
    if compile and not isinstance(model, REDER):
        raise ValueError(f"--compile is for a REDER model (got a {type(model).__name__})")
    if compile:
        return compiled(model)
    if int8 and (not isinstance(model, REDER) or torch.device(device).type != "cpu"):
        raise ValueError(f"--int8 is for a REDER model on CPU (got a {type(model).__name__} on {device})")
    return quantized(model) if int8 else model


class Translator:
    """A loaded model directory. `translate(text, src, tgt, beam=1, decoder="greedy")`, the decoders of
    reder/decoding/ by name: CTC models greedy or `beam` (prefix beam search of size `beam`); DAG models greedy,
    lookahead, viterbi or beam; a Transformer greedy or beam; a CMLM mask_predict with `iterations` and `beam`
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
                  refine_steps: int = 0, notes: Optional[list[tuple[int, str]]] = None,
                  scores: bool = False) -> str | list[str] | dict[str, Any] | list[dict[str, Any]]:
        """One sentence (a str) or a list of them, from language `src` into `tgt`. With a `notes` list every
        sentence is translated, mended where it must be (`reder.decoding.run.translate_lines`: a control character
        becomes a space, a sentence longer than the model reads is cut), each change appended as (index, what).
        With `scores`, each translation is a dict: {"translation", "score", "forward", "round_trip", "reason"}, the
        model's round-trip confidence in it (reder/confidence.py; None with the reason where there is none)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        lines = [text] if isinstance(text, str) else list(text)
        direction = direction_of(self.meta, src, tgt, self.directory)
        chosen = choose(self.model, decoder, beam, **({"iterations": iterations} if isinstance(self.model, CMLM) else {}))
        refine: dict[str, Any] = {}
        if refiner is not None or refine_steps:
            if refiner is None or not isinstance(refiner.model, CMLM):
                raise ValueError("refine_steps needs refiner=<a Translator of a CMLM model directory>")
            if direction_of(refiner.meta, src, tgt, refiner.directory) != direction:
                raise ValueError(f"{refiner.directory}: its direction differs from this model's {direction} for {src}->{tgt}")
            refine.update(refiner=refiner.model, refine_steps=refine_steps)
        with torch.inference_mode():
            out = translate_lines(self.model, self.sp, lines, direction, chosen, batch_size, notes=notes,
                                  scores=scores, **refine)
        return out[0] if isinstance(text, str) else out

    def __repr__(self) -> str:
        kind = type(self.model).__name__
        return f"Translator({str(self.directory)!r}, {kind}, {self.languages[0]}<->{self.languages[1]})"


class Ct2Translator:
    """A teacher model directory served through CTranslate2, as `Translator` serves it with our search:
    `translate(text, src, tgt, beam, decoder)` with the same decoder names, text in and detokenized text out, its
    own direction only. The teacher is converted (float32) into `work` (a temporary directory by default) when it
    loads; decoding is CTranslate2 as one runs it (reder/decoding/ct2.py, `mirror` off)."""

    def __init__(self, teacher_dir: str | Path, device: str = "cpu", threads: int = 1, work: str | Path | None = None) -> None:
        from reder.ct2 import convert

        self.directory = Path(teacher_dir)
        self.meta = read_meta(self.directory)
        self._work = None if work else tempfile.TemporaryDirectory(prefix="ct2-")
        self.model = ct2_model(convert(self.directory, Path(work or self._work.name) / "ct2"), device, threads)
        self.sp = load_sentencepiece(self.directory / SPM_FILE)
        self.languages = (self.meta.get("src_lang"), self.meta.get("tgt_lang"))

    def translate(self, text: str | Sequence[str], src: str, tgt: str, beam: int = 4, decoder: str = "greedy",
                  batch_size: int = 64) -> str | list[str]:
        direction = direction_of(self.meta, src, tgt, self.directory)
        chosen = choose(self.model, decoder, beam, mirror=False)
        lines = [text] if isinstance(text, str) else list(text)
        out = [self.sp.decode(h) for h in translate_ids(self.model, encode_lines(self.sp, lines), direction, chosen,
                                                        batch_size)]
        return out[0] if isinstance(text, str) else out


REGISTRY = "models:/"


def load(directory: str | Path, device: str = "cpu", int8: bool = False, compile: bool = False) -> Translator:
    """The model directory `directory` ready to translate (see the module doc); or a model the pipeline registered
    in MLflow, by URI: `models:/reder-en-de@champion` (an alias), `models:/reder-en-de/3` (a version). `int8`: a
    REDER on CPU with its trunk's linear layers dynamically quantized (reder.runtime.onednn.quantized; faster, not
    bit-equal). `compile`: a REDER's trunk under torch.compile (reder/runtime/compiled.py; the same tokens): CUDA graphs at
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
