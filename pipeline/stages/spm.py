"""SentencePiece stage: one joint model for both languages, with the project's fixed special ids.

Ids: pad 0, unk 1, bos 2, eos 3, learned pieces 4 .. V-2, and the CTC blank `<blank>` at V-1, where
V = `model.vocab_size`. SentencePiece always places user-defined and control symbols right after the
special ids, so the blank is appended to the trained model's proto afterwards as a CONTROL piece: it
has an id, but encoding never produces it (control pieces are not matched in text, not even the literal
string "<blank>"), and decoding drops it.
"""
from __future__ import annotations

import io
import logging
import random
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import sentencepiece as sentencepiece
from sentencepiece import sentencepiece_model_pb2

from pipeline.stage import StageError, StageRun, drill_hold
from reder.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger(__name__)

BLANK_PIECE = "<blank>"
MODEL_FILE = "spm.model"
VOCAB_FILE = "spm.vocab"
SAMPLE_BATCH_ROWS = 65_536  # rows of one column read at a time while drawing the sample


def build(run: StageRun, tmp: Path) -> dict[str, Any]:
    """Train the joint model on a sample of the ingested train split (input `ingest`) into `tmp`."""
    cfg, corpus = run.cfg, run.inputs["ingest"]
    sample = training_sample(corpus / "train", cfg.spm.sample_size, cfg.spm.seed)
    drill_hold("spm")  # tests/faults: a signal here finds the sample drawn, the model not trained
    proto = train(sample, cfg.model.vocab_size, cfg.spm.model_type, cfg.spm.character_coverage,
                  cfg.spm.num_threads)
    (tmp / MODEL_FILE).write_bytes(proto)
    processor = load(tmp / MODEL_FILE, cfg.model.vocab_size)
    with open(tmp / VOCAB_FILE, "w", encoding="utf-8") as vocab:
        for piece_id in range(processor.get_piece_size()):
            vocab.write(f"{processor.id_to_piece(piece_id)}\t{processor.get_score(piece_id):g}\n")
    return {"sample_sentences": len(sample), "vocab_size": processor.get_piece_size(),
            "blank_id": processor.get_piece_size() - 1}


def summary(output: Path, counts: dict[str, Any]) -> list[str]:
    """The vocabulary's size and the CTC blank's id."""
    return [f"vocab_size {counts['vocab_size']} (blank id {counts['blank_id']})"]


def training_sample(train_dir: Path, size: int, seed: int) -> list[str]:
    """Up to `size` sentences drawn (seeded) from both sides of the train split, pooled.

    The pool is the src column then the tgt column (n = 2 x rows); with more than `size` sentences the sample
    is `random.Random(seed).sample` of it, which draws from a sequence by its length and indices only, so
    the indices are drawn from `range(n)` and the columns streamed a record batch at a time to pick them: the
    same sentences in the same order as sampling the pooled list, without ever holding the corpus (memory:
    the sample and one batch of one column)."""
    files = ds.dataset(train_dir, format="parquet").files  # the files, in the order pq.read_table reads them
    rows = sum(pq.ParquetFile(path).metadata.num_rows for path in files)
    pooled = 2 * rows
    chosen = random.Random(seed).sample(range(pooled), size) if pooled > size else range(pooled)
    order = sorted(range(len(chosen)), key=chosen.__getitem__)  # sample positions by pooled index
    sample: list[str] = [""] * len(chosen)
    start, next_pick = 0, 0  # pooled index of the batch's first row; first of `order` not yet picked
    for column in ("src", "tgt"):
        for path in files:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=SAMPLE_BATCH_ROWS, columns=[column]):
                stop, picks = start + batch.num_rows, []
                while next_pick < len(order) and chosen[order[next_pick]] < stop:
                    picks.append(order[next_pick])
                    next_pick += 1
                if picks:
                    values = batch.column(0).take([chosen[p] - start for p in picks]).to_pylist()
                    for position, value in zip(picks, values):
                        sample[position] = value
                start = stop
    return sample


def train(sentences: list[str], vocab_size: int, model_type: str = "bpe", character_coverage: float = 1.0,
          num_threads: int = 1) -> bytes:
    """A serialized SentencePiece model of exactly `vocab_size` pieces, blank last (see module doc)."""
    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size - 1,
            model_type=model_type, character_coverage=character_coverage, num_threads=num_threads,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_piece="<pad>",
            unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>", minloglevel=2,
            max_sentence_length=1 << 16)
    except RuntimeError as error:
        raise StageError(f"SentencePiece training failed for vocab_size={vocab_size} on "
                         f"{len(sentences)} sentences: {error}. A small corpus needs a smaller "
                         f"model.vocab_size") from error
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    blank = proto.pieces.add()
    blank.piece = BLANK_PIECE
    blank.score = 0.0
    blank.type = sentencepiece_model_pb2.ModelProto.SentencePiece.CONTROL
    return proto.SerializeToString()


def load(path_or_proto: Path | str | bytes, vocab_size: int | None = None) -> sentencepiece.SentencePieceProcessor:
    """Load a model (path or serialized bytes) and check the project's id layout."""
    if isinstance(path_or_proto, bytes):
        processor = sentencepiece.SentencePieceProcessor(model_proto=path_or_proto)
    else:
        processor = sentencepiece.SentencePieceProcessor(model_file=str(path_or_proto))
    size = processor.get_piece_size()
    expected = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>", size - 1: BLANK_PIECE}
    layout = {piece_id: processor.id_to_piece(piece_id) for piece_id in expected}
    if layout != expected or (vocab_size is not None and size != vocab_size):
        raise StageError(f"SentencePiece model has ids {layout} and {size} pieces; expected {expected} "
                         f"and {vocab_size} pieces (model.vocab_size)")
    return processor
