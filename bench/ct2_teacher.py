"""Beam-4 speed of our AR teacher (its `greedy` and `beam` decoders) against the same weights in CTranslate2, CPU.

    OMP_NUM_THREADS=1 python -m bench.ct2_teacher --spm SPM_MODEL [--teacher MODEL_DIR] [--sentences 100]
        [--threads 1] [--d-model 512 --heads 4 --ffn 1024 --layers 3]

With `--teacher` (a teacher model directory) its weights; without, an untrained Transformer of the given size
(speed only: untrained outputs run to their length limit, int(1.2·|x| + 10), in both engines) over the vocabulary
of `--spm`. Inputs: the first `--sentences` lines of Multi30k test-2016 English (`--source` to change). Prints one
JSON object: sentences/s at batch 1 and batch 64 (all sentences in one call, length-sorted) for
  - `ours`: `reder.translate.translate_ids` (length-sorted batches, beam 4);
  - `ct2_mirror`: `reder.ct2.translate_ids` (what mirrors ours: sentences that a batch's longer limit let
    run past their own decoded again, a greedy pass beside the beam, hypotheses cut at the limit rescored
    with EOS; untrained weights are its worst case: every hypothesis is cut, so every sentence of a batch
    with mixed limits is decoded again);
  - `ct2_plain`: one `translate_batch` per length-sorted batch, beam 4, `max_decoding_length` = the batch's
    longest limit (CTranslate2 as one would run it, outputs not exactly ours).
Torch and CTranslate2 both use `--threads` threads (intra-op; one CTranslate2 worker).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from bench import MULTI30K
from bench.peers import teacher_model


def _rate(translate, sequences: list[list[int]], batch_size: int) -> float:
    """Sentences/s of translate(sequences, batch_size) over all sequences in one call (after a one-sentence warm-up)."""
    translate(sequences[:1], 1)
    start = time.perf_counter()
    translate(sequences, batch_size)
    return len(sequences) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spm", required=True, help="a SentencePiece model of the project's layout (blank last)")
    parser.add_argument("--teacher", help="a teacher model directory (default: untrained weights)")
    parser.add_argument("--source", default=str(MULTI30K / "test_2016_flickr.en"))
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    parser.add_argument("--batches", default="1,64")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import ctranslate2
    import sentencepiece

    from reder import ct2
    from reder.decoding.run import encode_lines, translate_ids

    processor = sentencepiece.SentencePieceProcessor(model_file=args.spm)
    args.device = "cpu"
    model = teacher_model(args, processor.get_piece_size())  # bench.peers' teacher: the same weights for a seed
    lines = Path(args.source).read_text(encoding="utf-8").splitlines()[: args.sentences]
    sequences = encode_lines(processor, lines)
    with tempfile.TemporaryDirectory() as tmp:
        ct2_dir = ct2.convert_model(model, Path(args.spm), Path(tmp) / "ct2")
        translator = ct2.load_translator(ct2_dir, threads=args.threads)
        engines = {
            "ours": lambda batch, size: translate_ids(model, batch, "src2tgt", "beam", size, beam_size=4),
            "ct2_mirror": lambda batch, size: ct2.translate_ids(translator, ct2_dir, batch, beam_size=4, batch_size=size),
            "ct2_plain": lambda batch, size: ct2.translate_plain(translator, ct2_dir, batch, 4, batch_size=size),
        }
        rates = {}
        with torch.inference_mode():
            for batch_size in (int(b) for b in args.batches.split(",")):
                for name, translate in engines.items():
                    rates[f"{name}_batch{batch_size}"] = round(_rate(translate, sequences, batch_size), 2)
    result = {
        "sentences_per_s": rates,
        "model": {"d_model": model.cfg.d_model, "n_heads": model.cfg.n_heads, "ffn_dim": model.cfg.ffn_dim,
                  "layers": [model.cfg.encoder_layers, model.cfg.decoder_layers], "vocab_size": model.cfg.vocab_size,
                  "weights": args.teacher or "untrained"},
        "sentences": len(sequences), "beam_size": 4, "threads": args.threads,
        "torch": torch.__version__, "ctranslate2": ctranslate2.__version__,
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
