"""Translate text with a model directory, in either direction.

    python -m reder.translate --checkpoint DIR (--src LANG --tgt LANG | --direction src2tgt|tgt2src)
        [--blank-penalty C] [--int8 | --compile] [--beam N [--rerank self [--rerank-weight W] | --teacher DIR] [--cutoff-top-n N] [--cutoff-prob P]
         | --decoder D] [--refine-steps K --refine-model CMLM_DIR] [--iterations T] [--batch-size B] [--scores] [--flag P] < in > out

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
over output strings by their exact probability (reder.dag_beam.dag_beam). Every decoder is named as the Python
API, the MLflow pyfunc, the Serve app and the evaluate stage name it (reder/decoding/): --decoder beam --beam N is
--beam N; a decoding option the chosen decoder does not take is an error. --checkpoint may also be
a Transformer model directory (the AR baseline): --direction must be the one it was trained for, and
--beam is its beam size (1 = greedy). --checkpoint may be a CMLM model directory (reder/cmlm.py, one direction):
mask-predict with --iterations T and --beam l length candidates. --refine-steps K --refine-model DIR refine any
model's output with K mask-predict iterations of the CMLM in DIR (the same direction).

--int8 (a REDER model on CPU): the trunk's linear layers dynamically quantized to int8 (reder.runtime.onednn.quantized),
faster on CPU, not the float32 model's arithmetic (its output may differ).
--compile (a REDER model): the trunk under torch.compile (reder/runtime/compiled.py), the same tokens. On CUDA at bucketed
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

--scores: one JSON line per input line instead, {"translation": ..., "score": ..., "forward": ..., "round_trip": ...,
"reason": ...}: how sure the model is of the translation (forward: log P(ŷ | x) per output token) and how well it
reads back into the source through the same weights run the other way (round_trip: log P(x | ŷ) per source
token), score their mean (reder/confidence.py); null with the reason where a value cannot be had. --flag P
(implies --scores) adds "flagged" to each line: true for the lowest P % by score, those to check first, and names
their line numbers on stderr.
"""
import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from reder.api import check_device, fast_model, load_sentencepiece
from reder.autoregressive import Transformer
from reder.checkpoint import SPM_FILE, direction_of, load_cmlm_dir, load_model_dir, load_teacher_dir
from reder.cmlm import CMLM
from reder.confidence import lowest
from reder.config import CUTOFF_PROB, CUTOFF_TOP_N, DIRECTIONS, RERANK_WEIGHT, RERANKERS
from reder.decoding import decoder_names
from reder.decoding.base import Decoder, family_of
from reder.decoding.run import choose, translate_lines
from reder.model import REDER
from reder.text import read_lines


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


# command-line option → the decoder option it sets (given only when the user gives it)
DECODER_OPTIONS = {"rerank": "rerank", "rerank_weight": "rerank_weight", "cutoff_top_n": "cutoff_top_n",
                   "cutoff_prob": "cutoff_prob", "blank_penalty": "blank_penalty", "max_transition": "max_transition",
                   "no_repeat_ngram": "no_repeat_ngram", "dag_length_penalty": "length_penalty",
                   "iterations": "iterations"}


def _load(args: argparse.Namespace) -> tuple[REDER | Transformer | CMLM, Decoder, Optional[CMLM]]:
    """The model, its decoder (with the teacher that reranks, if any) and the optional refiner, checked against
    the options; ValueError/FileNotFoundError explain."""
    check_device(args.device)
    if args.teacher and args.rerank is None:
        args.rerank = "teacher"
    if args.rerank == "teacher" and not args.teacher:
        raise ValueError("--rerank teacher needs --teacher DIR")
    if args.teacher and args.rerank != "teacher":
        raise ValueError(f"--teacher DIR is the reranker of --rerank teacher, not of --rerank {args.rerank}")
    if args.blank_penalty is not None and not math.isfinite(args.blank_penalty):
        raise ValueError(f"--blank-penalty needs a finite number, got {args.blank_penalty}")
    if bool(args.refine_steps) != bool(args.refine_model):
        raise ValueError("--refine-steps K (> 0) and --refine-model DIR (a CMLM of the direction) go together")
    model, meta = load_model_dir(Path(args.checkpoint), args.device)
    model = fast_model(model, args.device, args.int8, args.compile)
    if args.src or args.tgt:
        if not (args.src and args.tgt) or args.direction:
            raise ValueError("name the direction either by --src LANG --tgt LANG (both) or by --direction")
        args.direction = direction_of(meta, args.src, args.tgt, args.checkpoint)
    elif not args.direction:
        raise ValueError(f"name the direction: --src {meta.get('src_lang')} --tgt {meta.get('tgt_lang')} (or the "
                         f"reverse), or --direction src2tgt|tgt2src")
    if isinstance(model, (Transformer, CMLM)) and meta.get("direction") != args.direction:
        raise ValueError(f"{args.checkpoint} is a {type(model).__name__} for direction {meta.get('direction')!r}, "
                         f"not {args.direction!r}")
    options: dict[str, Any] = {option: getattr(args, flag) for flag, option in DECODER_OPTIONS.items()
                               if getattr(args, flag) is not None}
    if args.teacher:
        options["teacher"] = load_teacher_dir(Path(args.teacher), args.direction, model.cfg.vocab_size, args.device)
    try:
        decoder = choose(model, args.decoder, args.beam, **options)
    except ValueError as error:
        raise ValueError(f"{error} ({family_of(model)} model {args.checkpoint})") from None
    if not args.refine_model:
        return model, decoder, None
    return model, decoder, load_cmlm_dir(Path(args.refine_model), args.direction, model.cfg.vocab_size, args.device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="model directory (model.pt, config.json, spm.model): REDER, Transformer or CMLM")
    parser.add_argument("--src", help="source language code (as the model directory records it, e.g. en)")
    parser.add_argument("--tgt", help="target language code")
    parser.add_argument("--direction", choices=DIRECTIONS, help="instead of --src/--tgt")
    parser.add_argument("--decoder", choices=decoder_names(), help="the decoder (default: greedy; a CMLM's "
                        "mask_predict): greedy or beam for every model but a CMLM; a DAG model's lookahead or viterbi too")
    parser.add_argument("--beam", type=_positive_int, default=1, help="the beam size (1 = greedy; > 1 = --decoder beam), "
                        "or a CMLM's length candidates")
    parser.add_argument("--rerank", choices=RERANKERS, help="rerank the CTC beam's n-best (needs --beam > 1): by the "
                        "model's own reverse direction (self) or by --teacher (teacher); default: teacher with "
                        "--teacher, else none")
    parser.add_argument("--rerank-weight", type=float, help=f"--rerank self: forward score + this weight x reverse "
                        f"score (default {RERANK_WEIGHT})")
    parser.add_argument("--teacher", help="Transformer model directory for --direction: reranks the CTC beam (needs --beam > 1)")
    parser.add_argument("--cutoff-top-n", type=_positive_int, help=f"CTC beam: tokens each frame offers the beam "
                        f"(default {CUTOFF_TOP_N})")
    parser.add_argument("--cutoff-prob", type=float, help="CTC beam: of those, only the most likely reaching this "
                        f"cumulative probability (default {CUTOFF_PROB})")
    parser.add_argument("--blank-penalty", type=float, default=None,
                        help="CTC models: lower the blank's logit by this at decoding (default: the model "
                             "directory's, tuned on the validation split by the train stage)")
    parser.add_argument("--max-transition", type=_non_negative_int,
                        help="DAG models: the longest jump between vertices a path may take (default 0: no bound)")
    parser.add_argument("--no-repeat-ngram", type=_non_negative_int,
                        help="DAG greedy/lookahead: block consecutive repeated n-grams up to this n (default 0: off)")
    parser.add_argument("--dag-length-penalty", type=float, help="DAG Viterbi and beam: score / length**this (default 1)")
    parser.add_argument("--iterations", type=_positive_int,
                        help="a CMLM --checkpoint: mask-predict iterations T (default 10; --beam: its length candidates)")
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
    parser.add_argument("--scores", action="store_true",
                        help="write JSON lines {\"translation\", \"score\", \"forward\", \"round_trip\", \"reason\"}: "
                             "the model's confidence in each translation, read back by its reverse direction "
                             "(reder/confidence.py; null with the reason for a model that is not duplex)")
    parser.add_argument("--flag", type=float, metavar="P",
                        help="with --scores (implied): mark the lowest P %% of the input by score, a field "
                             "\"flagged\" on each line, for a person to check (those the model cannot score first)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.flag is not None:
        if not 0 < args.flag < 100:
            print(f"error: --flag needs a share in percent between 0 and 100, got {args.flag:g}", file=sys.stderr)
            return 2
        args.scores = True
    try:
        model, decoder, refiner = _load(args)
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
        outputs = translate_lines(model, sp, lines, args.direction, decoder, args.batch_size, notes, refiner,
                                  args.refine_steps, args.scores)
    except ValueError as error:
        print(f"error: <stdin> {error}", file=sys.stderr)
        return 2
    for index, note in notes or []:
        print(f"warning: <stdin> line {index + 1}: {note}", file=sys.stderr)
    if args.flag is not None:
        marked = set(lowest([entry["score"] for entry in outputs], args.flag))
        outputs = [{**entry, "flagged": index in marked} for index, entry in enumerate(outputs)]
        print(f"flagged {len(marked)} of {len(outputs)} lines, the lowest {args.flag:g} % by score: "
              f"{', '.join(str(index + 1) for index in sorted(marked)) or 'none'}", file=sys.stderr)
    if args.scores:
        outputs = [json.dumps(entry, ensure_ascii=False) for entry in outputs]
    sys.stdout.write("".join(line + "\n" for line in outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
