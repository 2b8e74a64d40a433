"""Translate text with a model directory, in either direction.

    python -m reder.translate --checkpoint DIR --direction src2tgt|tgt2src [--beam N [--teacher DIR] | --decoder D]
        [--batch-size B] < in > out

CTC models decode greedily or with prefix beam search (--beam N), whose n-best can be reranked by an
autoregressive teacher of the same direction (--teacher DIR, a Transformer model directory); DAG models
(head "dag") decode with --decoder greedy | lookahead | viterbi (default greedy). --checkpoint may also be
a Transformer model directory (the AR baseline): --direction must be the one it was trained for, and
--beam is its beam size (1 = greedy).

One sentence per line in, one per line out, in the input order. SentencePiece is applied inside: input is
plain text, output is detokenized text.
"""
import argparse
import sys
from pathlib import Path
from typing import Iterable, Optional

import sentencepiece
import torch

from reder.autoregressive import Transformer
from reder.checkpoint import SPM_FILE, load_model_dir, load_teacher_dir
from reder.config import DIRECTIONS, EOS_ID
from reder.ctc import pad_batch
from reder.heads import all_decoders
from reder.model import REDER
from reder.rerank import rerank


def encode_lines(sp: sentencepiece.SentencePieceProcessor, lines: Iterable[str]) -> list[list[int]]:
    """Text → piece ids with the EOS the model expects at the end."""
    return [sp.encode(line.rstrip("\n")) + [EOS_ID] for line in lines]


def translate_ids(model: REDER | Transformer, sequences: list[list[int]], direction: str, beam_size: int = 1,
                  batch_size: int = 64, decoder: str = "greedy", teacher: Optional[Transformer] = None,
                  **search: float) -> list[list[int]]:
    """Translate id sequences (each ending in EOS) in length-sorted batches; results in input order.

    A Transformer `model` (the teacher of `direction`) decodes with beam search (beam 1 = greedy; `search`:
    its length_penalty, max_len_a, max_len_b); with a `teacher` (a Transformer for this direction), a CTC
    REDER's n-best of size beam_size > 1 is reranked by the teacher."""
    autoregressive = isinstance(model, Transformer)
    if autoregressive and (decoder != "greedy" or teacher is not None):
        raise ValueError("a Transformer model decodes with beam search only (no DAG decoder, no teacher)")
    if search and not autoregressive:
        raise ValueError(f"search options {sorted(search)} are the autoregressive Transformer's")
    if teacher is not None and (not model.head.beam_search or beam_size < 2):
        raise ValueError(f"teacher reranking needs a CTC model and beam_size > 1 (head {model.cfg.head!r}, beam_size {beam_size})")
    detail = f"max_positions {model.cfg.max_positions}"
    if not autoregressive:
        detail += f", {model.head.ratio_name} {getattr(model.cfg, model.head.ratio_name)}"
    limits = [(model.max_input_length(), f"the model's limit of {model.max_input_length()} ({detail})")]
    if teacher is not None:
        limits.append((teacher.max_input_length(), f"the teacher's limit of {teacher.max_input_length()} (its max_positions)"))
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
        elif teacher is not None:
            hypotheses = rerank(teacher, tokens, lengths, model.candidates(tokens, lengths, direction, beam_size))
        else:
            hypotheses = model.translate(tokens, lengths, direction, beam_size=beam_size, decoder=decoder)
        for index, hypothesis in zip(chunk, hypotheses):
            outputs[index] = hypothesis
    return outputs


def translate_lines(model: REDER | Transformer, sp: sentencepiece.SentencePieceProcessor, lines: list[str], direction: str,
                    beam_size: int = 1, batch_size: int = 64, decoder: str = "greedy",
                    teacher: Optional[Transformer] = None) -> list[str]:
    """Plain text in, detokenized text out."""
    hypotheses = translate_ids(model, encode_lines(sp, lines), direction, beam_size, batch_size, decoder, teacher)
    return [sp.decode(h) for h in hypotheses]


def _load(args: argparse.Namespace) -> tuple[REDER | Transformer, Optional[Transformer]]:
    """The model and the optional teacher, checked against the options; ValueError/FileNotFoundError explain."""
    model, meta = load_model_dir(Path(args.checkpoint), args.device)
    if isinstance(model, Transformer):
        if meta.get("direction") != args.direction:
            raise ValueError(f"{args.checkpoint} is a Transformer for direction {meta.get('direction')!r}, "
                             f"not {args.direction!r}")
        if args.decoder not in (None, "greedy") or args.teacher:
            raise ValueError(f"{args.checkpoint} is a Transformer: it takes --beam, not --decoder or --teacher")
        return model, None
    if args.decoder not in (None, *model.head.decoders):
        raise ValueError(f"--decoder {args.decoder} needs a DAG model; this one has a CTC head (use --beam)")
    if not args.teacher:
        return model, None
    if not model.head.beam_search or args.beam < 2:
        raise ValueError("--teacher reranks a CTC model's beam: it needs a CTC model and --beam > 1")
    return model, load_teacher_dir(Path(args.teacher), args.direction, model.cfg.vocab_size, args.device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="model directory (model.pt, config.json, spm.model): REDER or Transformer")
    parser.add_argument("--direction", required=True, choices=DIRECTIONS)
    parser.add_argument("--beam", type=int, default=1, help="CTC prefix beam size, or a Transformer's beam size (1 = greedy)")
    parser.add_argument("--teacher", help="Transformer model directory for --direction: reranks the CTC beam (needs --beam > 1)")
    parser.add_argument("--decoder", choices=all_decoders(), help="DAG models: greedy, lookahead or viterbi")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    try:
        model, teacher = _load(args)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    sp = sentencepiece.SentencePieceProcessor(model_file=str(Path(args.checkpoint) / SPM_FILE))
    lines = sys.stdin.read().splitlines()
    try:
        outputs = translate_lines(model, sp, lines, args.direction, args.beam, args.batch_size, args.decoder or "greedy", teacher)
    except ValueError as error:
        print(f"error: <stdin> {error}", file=sys.stderr)
        return 2
    sys.stdout.write("".join(line + "\n" for line in outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
