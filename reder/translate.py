"""Translate text with a model directory, in either direction.

    python -m reder.translate --checkpoint DIR (--src LANG --tgt LANG | --direction src2tgt|tgt2src)
        [--blank-penalty C] [--int8 | --compile] [--beam N [--rerank self [--rerank-weight W] | --teacher DIR] [--cutoff-top-n N] [--cutoff-prob P]
         | --decoder D] [--refine-steps K --refine-model CMLM_DIR] [--iterations T] [--batch-size B] < in > out

(installed with `pip install -e .`: `duplex-translate ...`; from Python: `reder.load(DIR).translate(...)`.)
The direction is named by language codes (those the model directory records, e.g. --src en --tgt de) or
as src2tgt/tgt2src.

CTC models decode greedily or with prefix beam search (--beam N; each frame offers the beam its top
--cutoff-top-n tokens, of which those within cumulative probability --cutoff-prob), the blank's logit lowered
by the penalty the model directory records (tuned on the validation split; --blank-penalty C instead), whose n-best can be
reranked (--rerank): `self` scores each candidate ŷ by its forward score + W · the model's own reverse
direction's log P(x | ŷ) (--rerank-weight W; no second model), `teacher` by an autoregressive teacher of the
same direction (--teacher DIR, a Transformer model directory; --teacher alone implies it); DAG models
(head "dag") decode with --decoder greedy | lookahead | viterbi (default greedy), or --beam N: beam search
over output strings by their exact probability (reder.dag_beam.dag_beam). --checkpoint may also be
a Transformer model directory (the AR baseline): --direction must be the one it was trained for, and
--beam is its beam size (1 = greedy). --checkpoint may be a CMLM model directory (reder/cmlm.py, one direction):
mask-predict with --iterations T and --beam l length candidates. --refine-steps K --refine-model DIR refine any
model's output with K mask-predict iterations of the CMLM in DIR (the same direction).

--int8 (a REDER model on CPU): the trunk's linear layers dynamically quantized to int8 (reder.inference.quantized),
faster on CPU, not the float32 model's arithmetic (its output may differ).
--compile (a REDER model): the trunk under torch.compile (reder/static.py), the same tokens. On CUDA at bucketed
static shapes with CUDA graphs (mode "reduce-overhead"): no per-kernel launch cost; the first batch of each shape
bucket compiles (seconds to minutes). On a CPU a batch without padding (--batch-size 1) runs through inductor with
the weights frozen in (one graph per direction, lengths dynamic, compiled at its first batch), a padded batch the
eager trunk. Compiling takes seconds to a minute, so it pays for long inputs or a server only.

One sentence per line in, one per line out, in the input order. SentencePiece is applied inside: input is
plain text, output is detokenized text. A line is what `reder.text` says (the ingest stage's rule too): it
ends at "\n" (a CRLF's "\r" is dropped), a leading BOM is removed, and another line terminator (a lone CR,
U+2028, NEL, VT, FF) or control character inside a line is no text. Every input line is translated, one output
line each, always: such a character becomes a space, bytes that are not UTF-8 become U+FFFD, a line longer than
the model reads is cut to it, and each mended line is named on stderr (`warning: <stdin> line 5: ...`), so one
odd line in a million does not cost the other 999,999 (an exception to "bad input is an error", on purpose).
--strict refuses the input instead, at the first such line, as one error line naming it (exit 2). Bad options or
model files are a one-line error and exit status 2.
"""
import argparse
import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import sentencepiece
import torch

from reder.autoregressive import Transformer
from reder.checkpoint import SPM_FILE, direction_of, load_cmlm_dir, load_model_dir, load_teacher_dir
from reder.cmlm import CMLM
from reder.config import DIRECTIONS, EOS_ID
from reder.ctc import pad_batch
from reder.decode import CUTOFF_PROB, CUTOFF_TOP_N, ctc_greedy, strip_special
from reder.heads import HeadOutput, all_decoders
from reder.inference import quantized
from reder.model import REDER
from reder.rerank import RERANK_WEIGHT, RERANKERS, self_rerank
from reder.rerank import rerank as teacher_rerank
from reder.static import compiled
from reder.text import normalise, read_lines, split_lines  # noqa: F401 (split_lines: tests)


def encode_lines(sp: sentencepiece.SentencePieceProcessor, lines: Iterable[str]) -> list[list[int]]:
    """Text → piece ids with the EOS the model expects at the end."""
    return [sp.encode(line.rstrip("\n")) + [EOS_ID] for line in lines]


def translate_ids(model: REDER | Transformer | CMLM, sequences: list[list[int]], direction: str, beam_size: int = 1,
                  batch_size: int = 64, decoder: str = "greedy", teacher: Optional[Transformer] = None,
                  rerank: Optional[str] = None, rerank_weight: float = RERANK_WEIGHT, cutoff_top_n: int = CUTOFF_TOP_N,
                  cutoff_prob: float = CUTOFF_PROB, max_transition: int = 0, no_repeat_ngram: int = 0,
                  dag_length_penalty: float = 1.0, iterations: int = 10, refiner: Optional[CMLM] = None,
                  refine_steps: int = 0, blank_penalty: Optional[float] = None, **search: float) -> list[list[int]]:
    """Translate id sequences (each ending in EOS) in length-sorted batches; results in input order.

    A Transformer `model` (the teacher of `direction`) decodes with beam search (beam 1 = greedy; `search`:
    its length_penalty, max_len_a, max_len_b). A CTC REDER's n-best of size beam_size > 1 (per-frame
    cutoffs: reder.decode.frame_candidates) can be reranked: `rerank` "self" (reder.rerank.self_rerank with
    `rerank_weight`) or "teacher" (by `teacher`, a Transformer for this direction); None means "teacher"
    when a teacher is given, else "none". A DAG REDER's decoders take max_transition, no_repeat_ngram and
    dag_length_penalty (reder.heads.DagHead.decode). A CMLM decodes with mask-predict: `iterations` and
    beam_size length candidates. With `refiner` (a CMLM of `direction`) and refine_steps K > 0, every
    hypothesis is then refined by K mask-predict iterations (CMLM.refine). A CTC REDER lowers the blank's logit by
    `blank_penalty` in every decoder (None: the model's own, REDER.blank_penalty, from its model directory)."""
    if isinstance(model, CMLM):
        if decoder != "greedy" or rerank not in (None, "none") or teacher is not None or search:
            raise ValueError("a CMLM decodes with mask-predict only (iterations, beam_size length candidates)")
        autoregressive = False
    else:
        autoregressive = isinstance(model, Transformer)
    if refine_steps < 0 or iterations < 1:
        raise ValueError(f"need refine_steps >= 0 and iterations >= 1, got {refine_steps} and {iterations}")
    if refine_steps and refiner is None:
        raise ValueError(f"refine_steps {refine_steps} needs a refiner (a CMLM model of direction {direction})")
    rerank = rerank or ("teacher" if teacher is not None else "none")
    if rerank not in RERANKERS:
        raise ValueError(f"rerank must be one of {RERANKERS}, got {rerank!r}")
    if (rerank == "teacher") != (teacher is not None):
        raise ValueError("teacher reranking needs a teacher, and a teacher is only for rerank='teacher'")
    if autoregressive and (decoder != "greedy" or rerank != "none"):
        raise ValueError("a Transformer model decodes with beam search only (no DAG decoder, no reranking)")
    if search and not autoregressive:
        raise ValueError(f"search options {sorted(search)} are the autoregressive Transformer's")
    if blank_penalty is not None and not isinstance(model, REDER):
        raise ValueError("a blank penalty is for a CTC REDER model")
    if rerank != "none" and (not model.head.reranks or beam_size < 2):
        raise ValueError(f"{rerank} reranking needs a CTC model and beam_size > 1 (head {model.cfg.head!r}, beam_size {beam_size})")
    cutoffs = {} if autoregressive else {"cutoff_top_n": cutoff_top_n, "cutoff_prob": cutoff_prob}
    detail = f"max_positions {model.cfg.max_positions}"
    if isinstance(model, REDER):
        detail += f", {model.head.ratio_name} {getattr(model.cfg, model.head.ratio_name)}"
    limits = [(model.max_input_length(), f"the model's limit of {model.max_input_length()} ({detail})")]
    if teacher is not None:
        limits.append((teacher.max_input_length(), f"the teacher's limit of {teacher.max_input_length()} (its max_positions)"))
    if refiner is not None and refine_steps:
        limits.append((refiner.max_input_length(), f"the refiner's limit of {refiner.max_input_length()} (its max_positions)"))
    for number, sequence in enumerate(sequences, start=1):
        for limit, detail in limits:
            if len(sequence) > limit:
                raise ValueError(f"input {number}: {len(sequence)} pieces (with EOS) exceed {detail}")
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    outputs: list[list[int]] = [[] for _ in sequences]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        tokens, lengths = pad_batch([sequences[i] for i in chunk], device)
        if autoregressive:
            hypotheses = model.translate(tokens, lengths, beam_size=beam_size, **search)
        elif isinstance(model, CMLM):
            hypotheses = model.translate(tokens, lengths, beam_size=beam_size, iterations=iterations)
        elif rerank != "none":
            nbest = model.nbest(tokens, lengths, direction, beam_size, **cutoffs, blank_penalty=blank_penalty)
            hypotheses = rerank_nbest(model, tokens, lengths, direction, nbest, rerank, rerank_weight, teacher)
        else:
            hypotheses = model.translate(tokens, lengths, direction, beam_size=beam_size, decoder=decoder, **cutoffs,
                                         max_transition=max_transition, no_repeat_ngram=no_repeat_ngram,
                                         dag_length_penalty=dag_length_penalty, blank_penalty=blank_penalty)
        if refine_steps:
            hypotheses = refiner.refine(tokens, lengths, hypotheses, refine_steps)
        for index, hypothesis in zip(chunk, hypotheses):
            outputs[index] = hypothesis
    return outputs


@torch.inference_mode()
def greedy_by_penalty(model: REDER, sequences: list[list[int]], direction: str, penalties: Iterable[float],
                      batch_size: int = 64) -> dict[float, list[list[int]]]:
    """CTC greedy output (ids, specials stripped, input order) of `sequences` for each blank penalty, the model
    run once per batch: equal to `translate_ids(..., blank_penalty=p)` for each p, at the cost of one."""
    if not model.head.emits_blank:
        raise ValueError(f"blank penalties need a CTC model; this model's head is {model.cfg.head!r}")
    penalties = list(dict.fromkeys(float(p) for p in penalties))
    device, blank = next(model.parameters()).device, model.cfg.blank_id
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    outputs = {penalty: [[] for _ in sequences] for penalty in penalties}
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        tokens, lengths = pad_batch([sequences[i] for i in chunk], device)
        output = model.outputs(tokens, lengths, direction, normalise=False)  # logits (B, T', V)
        for penalty in penalties:
            logits = model.penalise(output.log_probs, penalty, normalise=False)
            for index, hypothesis in zip(chunk, ctc_greedy(logits, output.lengths, blank)):
                outputs[penalty][index] = strip_special(hypothesis, blank)
    return outputs


def rerank_nbest(model: REDER, tokens: torch.Tensor, lengths: torch.Tensor, direction: str,
                 nbest: list[list[tuple[list[int], float]]], rerank: str = "none", rerank_weight: float = RERANK_WEIGHT,
                 teacher: Optional[Transformer] = None) -> list[list[int]]:
    """One hypothesis per sentence of the batch `tokens` from its CTC beam's n-best (REDER.nbest): the beam's best
    (`rerank` "none"), self-reranked (reder.rerank.self_rerank with `rerank_weight`) or reranked by `teacher`."""
    if rerank == "teacher":
        return teacher_rerank(teacher, tokens, lengths, [[ids for ids, _ in entries] for entries in nbest])
    if rerank == "self":
        return self_rerank(model, tokens, lengths, direction, nbest, rerank_weight)
    return [entries[0][0] for entries in nbest]


@torch.inference_mode()
def reranked_by_penalty(model: REDER, sequences: list[list[int]], direction: str, beam_size: int,
                        penalties: Iterable[float], rerankers: dict[str, dict[str, Any]], batch_size: int = 64,
                        cutoff_top_n: int = CUTOFF_TOP_N, cutoff_prob: float = CUTOFF_PROB,
                        on_batch: Optional[Callable[[int], None]] = None) -> dict[float, dict[str, list[list[int]]]]:
    """For each blank penalty, each of `rerankers`' output (name → `rerank_nbest`'s rerank, rerank_weight,
    teacher; ids in input order) from the CTC beam (beam_size, cutoffs) over `sequences`: the model run once
    per batch, the beam once per batch and penalty, its n-best shared by every reranker. Equal to
    `translate_ids(model, sequences, direction, beam_size, batch_size, blank_penalty=p, **reranker)` for each p
    and reranker, without their repeated model runs and beams (a reranker's own pass, e.g. self-reranking's reverse
    direction, is still one per penalty). `on_batch(sentences)` after each batch."""
    if not model.head.reranks:
        raise ValueError(f"an n-best needs a CTC model; this model's head is {model.cfg.head!r}")
    penalties = list(dict.fromkeys(float(p) for p in penalties))
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    outputs = {penalty: {name: [[] for _ in sequences] for name in rerankers} for penalty in penalties}
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        tokens, lengths = pad_batch([sequences[i] for i in chunk], device)
        output = model.outputs(tokens, lengths, direction, normalise=False)  # logits (B, T', V)
        for penalty in penalties:
            penalised = HeadOutput(model.penalise(output.log_probs, penalty), output.lengths, output.extra)
            nbest = model.nbest_of(penalised, beam_size, cutoff_top_n, cutoff_prob)
            for name, how in rerankers.items():
                for index, hypothesis in zip(chunk, rerank_nbest(model, tokens, lengths, direction, nbest, **how)):
                    outputs[penalty][name][index] = hypothesis
        if on_batch is not None:
            on_batch(len(chunk))
    return outputs


def read_input(stream, strict: bool = True) -> tuple[list[str], list[str]]:
    """`read_lines` of a text stream: its bytes when it has them (a real stdin), so bad UTF-8 is caught."""
    buffer = getattr(stream, "buffer", None)
    return read_lines(buffer.read() if buffer is not None else stream.read(), strict)


def _positive_int(text: str) -> int:
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


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


def int8_model(model: REDER | Transformer | CMLM, device: str) -> REDER:
    """The int8 option: a REDER on CPU with its trunk's linear layers dynamically quantized; ValueError otherwise."""
    if not isinstance(model, REDER) or torch.device(device).type != "cpu":
        raise ValueError(f"--int8 is for a REDER model on CPU (got a {type(model).__name__} on {device})")
    return quantized(model)


def fast_model(model: REDER | Transformer | CMLM, device: str, int8: bool = False,
               compile: bool = False) -> REDER | Transformer | CMLM:
    """`model` with the decoding options asked for: `int8` (int8_model) or `compile` (a REDER's trunk at static
    shapes under torch.compile, reder.static.compiled), not both; ValueError otherwise."""
    if int8 and compile:
        raise ValueError("--int8 and --compile: choose one (the int8 trunk is not compiled)")
    if compile and not isinstance(model, REDER):
        raise ValueError(f"--compile is for a REDER model (got a {type(model).__name__})")
    if compile:
        return compiled(model)
    return int8_model(model, device) if int8 else model


def translate_lines(model: REDER | Transformer | CMLM, sp: sentencepiece.SentencePieceProcessor, lines: list[str], direction: str,
                    beam_size: int = 1, batch_size: int = 64, decoder: str = "greedy",
                    teacher: Optional[Transformer] = None, notes: Optional[list[tuple[int, str]]] = None,
                    **options: Any) -> list[str]:
    """Plain text in, detokenized text out (`options`: translate_ids' reranking and decoding options).

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
        limit = min(m.max_input_length() for m in (model, teacher, options.get("refiner") if options.get("refine_steps")
                                                   else None) if m is not None)
        for index, sequence in enumerate(sequences):
            if len(sequence) > limit:
                notes.append((index, f"{len(sequence) - 1} pieces, more than the model reads ({limit - 1}): its first "
                                     f"{limit - 1} translated"))
                sequences[index] = sequence[: limit - 1] + [EOS_ID]
    hypotheses = translate_ids(model, sequences, direction, beam_size, batch_size, decoder, teacher, **options)
    return [sp.decode(h) for h in hypotheses]


def _load(args: argparse.Namespace) -> tuple[REDER | Transformer | CMLM, Optional[Transformer], Optional[CMLM]]:
    """The model, the optional teacher and the optional refiner, checked against the options;
    ValueError/FileNotFoundError explain."""
    model, teacher = _load_model(args)
    if bool(args.refine_steps) != bool(args.refine_model):
        raise ValueError("--refine-steps K (> 0) and --refine-model DIR (a CMLM of the direction) go together")
    if not args.refine_model:
        return model, teacher, None
    return model, teacher, load_cmlm_dir(Path(args.refine_model), args.direction, model.cfg.vocab_size, args.device)


def _load_model(args: argparse.Namespace) -> tuple[REDER | Transformer | CMLM, Optional[Transformer]]:
    check_device(args.device)
    args.rerank = args.rerank or ("teacher" if args.teacher else "none")
    if (args.rerank == "teacher") != bool(args.teacher):
        raise ValueError("--rerank teacher needs --teacher DIR" if args.teacher is None
                         else f"--teacher DIR is the reranker of --rerank teacher, not of --rerank {args.rerank}")
    if args.rerank_weight < 0 or args.cutoff_top_n < 1 or not 0 < args.cutoff_prob <= 1:
        raise ValueError("need --rerank-weight >= 0, --cutoff-top-n >= 1 and 0 < --cutoff-prob <= 1")
    model, meta = load_model_dir(Path(args.checkpoint), args.device)
    model = fast_model(model, args.device, args.int8, args.compile)
    if args.src or args.tgt:
        if not (args.src and args.tgt) or args.direction:
            raise ValueError("name the direction either by --src LANG --tgt LANG (both) or by --direction")
        args.direction = direction_of(meta, args.src, args.tgt, args.checkpoint)
    elif not args.direction:
        raise ValueError(f"name the direction: --src {meta.get('src_lang')} --tgt {meta.get('tgt_lang')} (or the "
                         f"reverse), or --direction src2tgt|tgt2src")
    if isinstance(model, (Transformer, CMLM)):
        kind = type(model).__name__
        if meta.get("direction") != args.direction:
            raise ValueError(f"{args.checkpoint} is a {kind} for direction {meta.get('direction')!r}, "
                             f"not {args.direction!r}")
        if args.decoder not in (None, "greedy") or args.rerank != "none" or args.blank_penalty is not None:
            raise ValueError(f"{args.checkpoint} is a {kind}: it takes --beam, not --decoder, --rerank, --teacher or "
                             f"--blank-penalty")
        return model, None
    if args.blank_penalty is not None and not (model.head.emits_blank and math.isfinite(args.blank_penalty)):
        raise ValueError(f"--blank-penalty needs a CTC model and a finite number (head {model.cfg.head!r}, "
                         f"--blank-penalty {args.blank_penalty})")
    if args.decoder not in (None, *model.head.decoders):
        raise ValueError(f"--decoder {args.decoder} needs a DAG model; this one has a CTC head (use --beam)")
    if args.rerank != "none" and (not model.head.reranks or args.beam < 2):
        raise ValueError(f"--rerank {args.rerank} reranks a CTC model's beam: it needs a CTC model and --beam > 1")
    if not args.teacher:
        return model, None
    return model, load_teacher_dir(Path(args.teacher), args.direction, model.cfg.vocab_size, args.device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="model directory (model.pt, config.json, spm.model): REDER, Transformer or CMLM")
    parser.add_argument("--src", help="source language code (as the model directory records it, e.g. en)")
    parser.add_argument("--tgt", help="target language code")
    parser.add_argument("--direction", choices=DIRECTIONS, help="instead of --src/--tgt")
    parser.add_argument("--beam", type=_positive_int, default=1, help="CTC prefix beam size, or a Transformer's beam size (1 = greedy)")
    parser.add_argument("--rerank", choices=RERANKERS, help="rerank the CTC beam's n-best (needs --beam > 1): by the "
                        "model's own reverse direction (self) or by --teacher (teacher); default: teacher with "
                        "--teacher, else none")
    parser.add_argument("--rerank-weight", type=float, default=RERANK_WEIGHT,
                        help="--rerank self: forward score + this weight x reverse score")
    parser.add_argument("--teacher", help="Transformer model directory for --direction: reranks the CTC beam (needs --beam > 1)")
    parser.add_argument("--cutoff-top-n", type=_positive_int, default=CUTOFF_TOP_N,
                        help="CTC beam: tokens each frame offers the beam")
    parser.add_argument("--cutoff-prob", type=float, default=CUTOFF_PROB,
                        help="CTC beam: of those, only the most likely reaching this cumulative probability")
    parser.add_argument("--blank-penalty", type=float, default=None,
                        help="CTC models: lower the blank's logit by this at decoding (default: the model "
                             "directory's, tuned on the validation split by the train stage)")
    parser.add_argument("--decoder", choices=all_decoders(), help="DAG models: greedy, lookahead or viterbi (or --beam N alone)")
    parser.add_argument("--max-transition", type=_non_negative_int, default=0,
                        help="DAG models: the longest jump between vertices a path may take (0: no bound)")
    parser.add_argument("--no-repeat-ngram", type=_non_negative_int, default=0,
                        help="DAG greedy/lookahead: block consecutive repeated n-grams up to this n (0: off)")
    parser.add_argument("--dag-length-penalty", type=float, default=1.0,
                        help="DAG Viterbi and beam: score / length**this")
    parser.add_argument("--iterations", type=_positive_int, default=10,
                        help="a CMLM --checkpoint: mask-predict iterations T (--beam: its length candidates)")
    parser.add_argument("--refine-steps", type=_non_negative_int, default=0,
                        help="refine the output with this many mask-predict iterations of --refine-model")
    parser.add_argument("--refine-model", help="a CMLM model directory of the direction: refines the output (--refine-steps)")
    parser.add_argument("--batch-size", type=_positive_int, default=64)
    parser.add_argument("--strict", action="store_true",
                        help="refuse the whole input (exit 2) at the first line that is not UTF-8, holds a control "
                             "character or line terminator, or is longer than the model reads; by default every line "
                             "is translated, such lines mended and each mended line named on stderr")
    parser.add_argument("--int8", action="store_true",
                        help="REDER on CPU: the trunk's linear layers dynamically quantized to int8 (faster, not bit-equal)")
    parser.add_argument("--compile", action="store_true",
                        help="REDER: the trunk under torch.compile (CUDA graphs on CUDA, frozen weights on a CPU); same tokens")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    try:
        model, teacher, refiner = _load(args)
        sp = load_sentencepiece(Path(args.checkpoint) / SPM_FILE)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        lines, read_notes = read_input(sys.stdin, args.strict)
    except ValueError as error:
        print(f"error: <stdin> {error}", file=sys.stderr)
        return 2
    for note in read_notes:
        print(f"warning: <stdin> {note}", file=sys.stderr)
    notes: Optional[list[tuple[int, str]]] = None if args.strict else []
    try:
        options: dict[str, Any] = {"refiner": refiner, "refine_steps": args.refine_steps}
        if isinstance(model, CMLM):
            options["iterations"] = args.iterations
        elif isinstance(model, REDER):
            options.update(rerank=args.rerank, rerank_weight=args.rerank_weight, cutoff_top_n=args.cutoff_top_n,
                           cutoff_prob=args.cutoff_prob, max_transition=args.max_transition,
                           no_repeat_ngram=args.no_repeat_ngram, dag_length_penalty=args.dag_length_penalty,
                           blank_penalty=args.blank_penalty)
        outputs = translate_lines(model, sp, lines, args.direction, args.beam, args.batch_size, args.decoder or "greedy",
                                  teacher, notes, **options)
    except ValueError as error:
        print(f"error: <stdin> {error}", file=sys.stderr)
        return 2
    for index, note in notes or []:
        print(f"warning: <stdin> line {index + 1}: {note}", file=sys.stderr)
    sys.stdout.write("".join(line + "\n" for line in outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
