"""Filtering one split into the ingest output table (`id` int64, `src`, `tgt` string), streamed.

Both sides are stripped. A pair is flagged for the first of: an empty side, a side over `max_chars`,
a character length ratio over `max_length_ratio`, a repeat of an earlier pair (`dedupe`). Flagged pairs
are dropped from train and only counted (`flagged`) in valid/test, so test sets stay intact; pairs that
could not be decoded (`lenient` mode) are dropped from every split as `invalid_utf8`. Rows are taken BATCH at
a time and written as they pass (`pipeline.parquet.SplitWriter`); a repeat is found by an 8-byte BLAKE2b
digest of the pair in `SeenPairs`, which never holds the text: 8 bytes per distinct pair in memory up to
IN_MEMORY of them, the older ones on disk behind a Bloom filter of 1.5 bytes per pair (two different pairs share
a digest with probability ~n²/2⁶⁵: about 2·10⁻⁵ for 29M pairs, and then the later one is dropped).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator

import numpy as np
import pyarrow as pa

from pipeline.config import DataConfig
from pipeline.ingest.readers import Row
from pipeline.parquet import SplitWriter

SCHEMA = pa.schema([("id", pa.int64()), ("src", pa.string()), ("tgt", pa.string())])
BATCH = 8192  # rows filtered at a time (65536 peaked ~90 MB higher at 10x, no faster)
IN_MEMORY = 1 << 21  # digests held in memory (16 MB) before they go to disk as one sorted run
BLOCK = 512  # digests per block read from a spilled run (4 KB)
BLOOM_BITS, BLOOM_HASHES = 12, 8  # per spilled digest; ~0.3 % of new digests then read a block from disk


class SeenPairs:
    """An exact set of 64-bit digests in bounded memory. The newest digests are held in sorted numpy runs merged
    like a binary counter (each run at least twice the next one's size); when they reach `in_memory` digests they
    are merged into one sorted run that goes to a temporary file in `spill_dir`, of which memory keeps a Bloom
    filter (`bloom_bits` bits per digest) and every `block`-th digest: a digest the filter lets through (a member,
    or ~0.3 % of the others) is looked up in its one block on disk. 8 bytes per digest up to `in_memory`, then
    `bloom_bits`/8 bytes per digest (1.5: 41 MB more at 29M)."""

    def __init__(self, spill_dir: Path | None = None, in_memory: int = IN_MEMORY, block: int = BLOCK,
                 bloom_bits: int = BLOOM_BITS) -> None:
        self.spill_dir, self.in_memory, self.block, self.bloom_bits = spill_dir, in_memory, block, bloom_bits
        self.runs: list[np.ndarray] = []
        self.spilled: list[_SpilledRun] = []
        self.file: BinaryIO | None = None  # the spilled runs, one after another (unlinked: gone when closed)

    def first_seen(self, digests: np.ndarray) -> np.ndarray:
        """Per digest (in order): True where neither an earlier call nor an earlier element had it; adds them."""
        distinct, first = np.unique(digests, return_index=True)  # sorted (so searches go left to right)
        new = np.ones(len(distinct), dtype=bool)
        for run in self.runs:
            new &= ~_members(run, distinct)
        for spilled in self.spilled:
            candidates = np.flatnonzero(new)
            new[candidates] = ~spilled.contains(distinct[candidates])
        if new.any():
            self.runs.append(distinct[new])
        fresh = np.zeros(len(digests), dtype=bool)
        fresh[first[new]] = True  # the first of equal elements
        while len(self.runs) > 1 and len(self.runs[-2]) <= 2 * len(self.runs[-1]):
            self.runs.append(_merge(self.runs.pop(-2), self.runs.pop()))
        if sum(map(len, self.runs)) >= self.in_memory:
            self._spill()
        return fresh

    def _spill(self) -> None:
        """Merge the runs in memory into one and move it to the file."""
        if self.file is None:
            self.file = tempfile.TemporaryFile(dir=self.spill_dir)
        while len(self.runs) > 1:
            self.runs.append(_merge(self.runs.pop(-2), self.runs.pop()))
        self.spilled.append(_SpilledRun(self.runs.pop(), self.file, self.block, self.bloom_bits))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.runs, self.spilled, self.file = [], [], None

    def __enter__(self) -> SeenPairs:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class _SpilledRun:
    """A sorted run of digests in `file` at the end it had: a Bloom filter and every `block`-th digest in memory."""

    def __init__(self, run: np.ndarray, file: BinaryIO, block: int, bloom_bits: int) -> None:
        self.offset = file.seek(0, os.SEEK_END)
        file.write(run.data)
        file.flush()
        self.fd, self.size, self.block = file.fileno(), len(run), block
        self.fence = run[::block].copy()  # the first digest of each block
        self.bloom = _Bloom(run, bloom_bits)

    def contains(self, digests: np.ndarray) -> np.ndarray:
        """Per digest: whether the run has it (read from disk only where the Bloom filter cannot rule it out)."""
        found = np.zeros(len(digests), dtype=bool)
        maybe = np.flatnonzero(self.bloom.might_contain(digests))
        blocks = np.searchsorted(self.fence, digests[maybe], side="right") - 1  # -1: below the run's first digest
        order = np.argsort(blocks, kind="stable")
        maybe, blocks = maybe[order], blocks[order]
        starts = np.flatnonzero(np.diff(blocks, prepend=-2))
        for start, end in zip(starts, [*starts[1:], len(blocks)]):
            if blocks[start] < 0:
                continue
            first = int(blocks[start]) * self.block
            count = min(self.block, self.size - first)
            stored = np.frombuffer(os.pread(self.fd, 8 * count, self.offset + 8 * first), dtype=np.uint64)
            found[maybe[start:end]] = _members(stored, digests[maybe[start:end]])
        return found


class _Bloom:
    """A Bloom filter over 64-bit digests (uniform already): BLOOM_HASHES positions by double hashing of the
    digest's two 32-bit halves; no false negatives."""

    def __init__(self, digests: np.ndarray, bits_per_digest: int) -> None:
        self.bits = max(8, bits_per_digest * len(digests))  # under 2**32, so `_positions` cannot overflow
        self.bytes = np.zeros(-(-self.bits // 8), dtype=np.uint8)
        for start in range(0, len(digests), 1 << 16):  # in slices: the temporaries stay small
            for position in self._positions(digests[start:start + (1 << 16)]):
                for bit in range(8):  # one bit per pass, so an index given twice sets the same bit twice
                    self.bytes[position[position & 7 == bit] >> 3] |= np.uint8(1 << bit)

    def might_contain(self, digests: np.ndarray) -> np.ndarray:
        """False where the digest is certainly not in the filter."""
        maybe = np.arange(len(digests))
        for position in self._positions(digests):
            position = position[maybe]
            maybe = maybe[(self.bytes[position >> 3] >> (position & 7)) & 1 == 1]  # later hashes test fewer
        result = np.zeros(len(digests), dtype=bool)
        result[maybe] = True
        return result

    def _positions(self, digests: np.ndarray) -> Iterator[np.ndarray]:
        low, high = digests & 0xFFFFFFFF, digests >> 32
        for i in range(BLOOM_HASHES):
            yield (((low + i * high) & 0xFFFFFFFF) * self.bits) >> 32  # onto [0, bits)


def _members(run: np.ndarray, digests: np.ndarray) -> np.ndarray:
    """Per digest: whether the sorted `run` has it."""
    if len(run) == 0:
        return np.zeros(len(digests), dtype=bool)
    return run[np.minimum(np.searchsorted(run, digests), len(run) - 1)] == digests


def _merge(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Two sorted runs as one (timsort finds the two runs: linear)."""
    merged = np.concatenate([first, second])
    merged.sort(kind="stable")
    return merged


def filter_split(rows: Iterable[Row], data: DataConfig, drop: bool, writer: SplitWriter,
                 spill_dir: Path | None = None) -> dict[str, Any]:
    """Apply the filters to `rows` and write what is kept to `writer`; `drop` removes flagged pairs (train),
    otherwise they are only counted; de-duplication spills to a temporary file in `spill_dir` (None: the
    system's). Returns the split's counts for report.json."""
    with SeenPairs(spill_dir) as seen:
        return _filter(iter(rows), data, drop, writer, seen)


def _filter(rows: Iterator[Row], data: DataConfig, drop: bool, writer: SplitWriter, seen: SeenPairs) -> dict[str, Any]:
    reasons: Counter[str] = Counter()
    read = kept = 0
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
