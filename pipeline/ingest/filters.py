"""Filtering one split into the ingest output table (`id` int64, `src`, `tgt` string), streamed.

Both sides are stripped. A pair is flagged for the first of: an empty side, a side over `max_chars`,
a character length ratio over `max_length_ratio`, a repeat of an earlier pair (`dedupe`). Flagged pairs
are dropped from train and only counted (`flagged`) in valid/test, so test sets stay intact; pairs that
could not be decoded (`lenient` mode) are dropped from every split as `invalid_utf8`. Rows are taken BATCH at
a time and written as they pass (`pipeline.parquet.SplitWriter`); a repeat is found by an 8-byte BLAKE2b
digest of the pair in `SeenPairs`, which holds 8 bytes per distinct pair and never the text (two different
pairs share a digest with probability ~n²/2⁶⁵: about 2·10⁻⁵ for 29M pairs, and then the later one is dropped).
"""
from __future__ import annotations

import hashlib
from collections import Counter
from itertools import islice
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from pipeline.config import DataConfig
from pipeline.ingest.readers import Row
from pipeline.parquet import SplitWriter

SCHEMA = pa.schema([("id", pa.int64()), ("src", pa.string()), ("tgt", pa.string())])
BATCH = 8192  # rows filtered at a time (65536 peaked ~90 MB higher at 10x, no faster)


class SeenPairs:
    """A set of 64-bit digests in sorted numpy runs merged like a binary counter (each run at least twice the
    next one's size, so at most log2(n) runs): membership is a binary search per run, 8 bytes per member."""

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []

    def first_seen(self, digests: np.ndarray) -> np.ndarray:
        """Per digest (in order): True where neither an earlier call nor an earlier element had it; adds them."""
        fresh = np.zeros(len(digests), dtype=bool)
        fresh[np.unique(digests, return_index=True)[1]] = True  # the first of equal elements
        for run in self.runs:
            at = np.minimum(np.searchsorted(run, digests), len(run) - 1)
            fresh &= run[at] != digests
        if fresh.any():
            self.runs.append(np.sort(digests[fresh]))
        while len(self.runs) > 1 and len(self.runs[-2]) <= 2 * len(self.runs[-1]):
            last = self.runs.pop()
            self.runs[-1] = np.sort(np.concatenate([self.runs[-1], last]), kind="stable")
        return fresh


def filter_split(rows: Iterable[Row], data: DataConfig, drop: bool, writer: SplitWriter) -> dict[str, Any]:
    """Apply the filters to `rows` and write what is kept to `writer`; `drop` removes flagged pairs (train),
    otherwise they are only counted. Returns the split's counts for report.json."""
    reasons: Counter[str] = Counter()
    seen = SeenPairs()
    read = kept = 0
    rows = iter(rows)
    while batch := list(islice(rows, BATCH)):
        read += len(batch)
        pairs, flags = [], []
        for line_id, src, tgt in batch:
            if src is None or tgt is None:  # undecodable, lenient mode: cannot be kept in any split
                reasons["invalid_utf8"] += 1
                continue
            src, tgt = src.strip(), tgt.strip()
            pairs.append((line_id, src, tgt))
            flags.append(_flag(src, tgt, data))
        if data.dedupe:
            _flag_repeats(pairs, flags, seen)
        reasons.update(flag for flag in flags if flag)
        keep = [pair for pair, flag in zip(pairs, flags) if not (drop and flag)]
        kept += len(keep)
        writer.write_rows({"id": [p[0] for p in keep], "src": [p[1] for p in keep], "tgt": [p[2] for p in keep]})
    counts: dict[str, Any] = {"read": read, "kept": kept}
    undecodable = {"invalid_utf8": reasons["invalid_utf8"]} if reasons["invalid_utf8"] else {}
    if drop:
        counts["dropped"] = dict(sorted(reasons.items()))
    else:
        counts["dropped"] = undecodable
        counts["flagged"] = {k: v for k, v in sorted(reasons.items()) if k != "invalid_utf8"}
    return counts


def _flag(src: str, tgt: str, data: DataConfig) -> str:
    """The first reason before `duplicate` this pair would be dropped for, or ''."""
    if not src or not tgt:
        return "empty"
    if len(src) > data.max_chars or len(tgt) > data.max_chars:
        return "too_long"
    if max(len(src), len(tgt)) > data.max_length_ratio * min(len(src), len(tgt)):
        return "length_ratio"
    return ""


def _flag_repeats(pairs: list[tuple[int, str, str]], flags: list[str], seen: SeenPairs) -> None:
    """Flag `duplicate` the pairs not flagged otherwise whose text an earlier such pair had."""
    candidates = [i for i, flag in enumerate(flags) if not flag]
    if not candidates:
        return
    digests = np.frombuffer(b"".join(hashlib.blake2b(f"{pairs[i][1]}\t{pairs[i][2]}".encode("utf-8"),
                                                     digest_size=8).digest() for i in candidates), dtype=np.uint64)
    for i, fresh in zip(candidates, seen.first_seen(digests)):
        if not fresh:
            flags[i] = "duplicate"
