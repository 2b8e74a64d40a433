"""What the tokenize stage's Ray Data actors run: `Tokenizer`, text batch -> SentencePiece ids, lengths and each
direction's feasibility flag. Apart from the stage's module so that an actor imports NumPy, PyArrow, SentencePiece and
reder.feasibility only: the stage's module reaches torch through the pipeline's config (~150 MB more in each actor,
bench/data_scale.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from reder import feasibility


class Tokenizer:
    """Ray Data UDF: text batch -> id lists, lengths and feasibility flags (one model per actor)."""

    def __init__(self, model_proto: bytes, upsample_ratio: float, head: str = "ctc") -> None:
        import sentencepiece

        self.processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        self.upsample_ratio = upsample_ratio  # r for CTC, λ (graph_upsample_ratio) for DAG
        self.feasible = feasibility.rule(head)  # feasible(input_len, target, ratio)

    def __call__(self, batch: pa.Table) -> pa.Table:
        # num_threads=1: parallelism comes from the actor pool, not from threads inside each actor
        src = self.processor.encode(batch.column("src").to_pylist(), num_threads=1)
        tgt = self.processor.encode(batch.column("tgt").to_pylist(), num_threads=1)
        src_ids, src_len = _list_column(src)
        tgt_ids, tgt_len = _list_column(tgt)
        ratio, feasible = self.upsample_ratio, self.feasible
        splits = [Path(path).parent.name for path in batch.column("path").to_pylist()]
        return pa.table({
            "split": pa.array(splits, pa.string()), "id": batch.column("id"), "src_ids": src_ids, "tgt_ids": tgt_ids,
            "src_len": pa.array(src_len, pa.int32()), "tgt_len": pa.array(tgt_len, pa.int32()),
            "feasible_src2tgt": pa.array([feasible(len(x), y, ratio) for x, y in zip(src, tgt)]),
            "feasible_tgt2src": pa.array([feasible(len(y), x, ratio) for x, y in zip(src, tgt)]),
        })


def _list_column(sequences: list[list[int]]) -> tuple[pa.Array, np.ndarray]:
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int32, count=len(sequences))
    offsets = np.zeros(len(sequences) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.fromiter((i for s in sequences for i in s), dtype=np.int32, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)), lengths
