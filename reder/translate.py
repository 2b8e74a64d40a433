"""Translate text with a model directory, in either direction.

    python -m reder.translate --checkpoint DIR --direction src2tgt|tgt2src [--beam N | --decoder D] [--batch-size B] < in > out

CTC models decode greedily or with prefix beam search (--beam N); DAG models (head "dag") with
--decoder greedy | lookahead | viterbi (default greedy).

One sentence per line in, one per line out, in the input order. SentencePiece is applied inside: input is
plain text, output is detokenized text.
"""
import argparse
import sys
from pathlib import Path
from typing import Iterable

import sentencepiece
import torch

from reder.checkpoint import SPM_FILE, load_model_dir
from reder.config import DIRECTIONS, EOS_ID, PAD_ID
from reder.dag import DAG_DECODERS
from reder.model import REDER


def encode_lines(sp: sentencepiece.SentencePieceProcessor, lines: Iterable[str]) -> list[list[int]]:
    """Text → piece ids with the EOS the model expects at the end."""
    return [sp.encode(line.rstrip("\n")) + [EOS_ID] for line in lines]


def pad_batch(sequences: list[list[int]], device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) token tensor and (B,) lengths."""
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    tokens = torch.full((len(sequences), int(lengths.max())), PAD_ID, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        tokens[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
    return tokens.to(device), lengths.to(device)


def translate_ids(model: REDER, sequences: list[list[int]], direction: str, beam_size: int = 1,
                  batch_size: int = 64, decoder: str = "greedy") -> list[list[int]]:
    """Translate id sequences (each ending in EOS) in length-sorted batches; results in input order."""
    limit = model.max_input_length()
    ratio = ("graph_upsample_ratio", model.cfg.graph_upsample_ratio) if model.cfg.head == "dag" else ("upsample_ratio", model.cfg.upsample_ratio)
    for number, sequence in enumerate(sequences, start=1):
        if len(sequence) > limit:
            raise ValueError(f"input {number}: {len(sequence)} pieces (with EOS) exceed the model's limit of {limit} "
                             f"(max_positions {model.cfg.max_positions}, {ratio[0]} {ratio[1]})")
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    outputs: list[list[int]] = [[] for _ in sequences]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        tokens, lengths = pad_batch([sequences[i] for i in chunk], device)
        for index, hypothesis in zip(chunk, model.translate(tokens, lengths, direction, beam_size=beam_size, decoder=decoder)):
            outputs[index] = hypothesis
    return outputs


def translate_lines(model: REDER, sp: sentencepiece.SentencePieceProcessor, lines: list[str], direction: str,
                    beam_size: int = 1, batch_size: int = 64, decoder: str = "greedy") -> list[str]:
    """Plain text in, detokenized text out."""
    hypotheses = translate_ids(model, encode_lines(sp, lines), direction, beam_size, batch_size, decoder)
    return [sp.decode(h) for h in hypotheses]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="model directory (model.pt, config.json, spm.model)")
    parser.add_argument("--direction", required=True, choices=DIRECTIONS)
    parser.add_argument("--beam", type=int, default=1, help="CTC prefix beam size (1 = greedy)")
    parser.add_argument("--decoder", choices=DAG_DECODERS, help="DAG models: greedy, lookahead or viterbi")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    try:
        model, _ = load_model_dir(Path(args.checkpoint), args.device)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if model.cfg.head != "dag" and args.decoder not in (None, "greedy"):
        print(f"error: --decoder {args.decoder} needs a DAG model; this one has a CTC head (use --beam)", file=sys.stderr)
        return 2
    decoder = args.decoder or "greedy"
    sp = sentencepiece.SentencePieceProcessor(model_file=str(Path(args.checkpoint) / SPM_FILE))
    lines = sys.stdin.read().splitlines()
    try:
        outputs = translate_lines(model, sp, lines, args.direction, args.beam, args.batch_size, decoder)
    except ValueError as error:
        print(f"error: <stdin> {error}", file=sys.stderr)
        return 2
    sys.stdout.write("".join(line + "\n" for line in outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
