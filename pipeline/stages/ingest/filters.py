"""Filtering one split into the ingest output table (`id` int64, `src`, `tgt` string), streamed.

Both sides are stripped. A pair is flagged for the first of: an empty side, a side over `max_chars`,
a character length ratio over `max_length_ratio`, a repeat of an earlier pair (`dedupe`). Flagged pairs
are dropped from train and only counted (`flagged`) in valid/test, so test sets stay intact; pairs that
could not be decoded (`lenient` mode) are dropped from every split as `invalid_utf8`. Rows are taken BATCH at
a time and written as they pass (`pipeline.parquet.SplitWriter`); a repeat is found by a 16-byte BLAKE2b
digest of the pair (source length, source, target: no text can stand for another pair) in `SeenPairs`, which
never holds the text: 16 bytes per distinct pair in memory up to IN_MEMORY of them, the older ones on disk behind
a Bloom filter of 1.5 bytes per pair. Two different pairs share a digest with probability ~n²/2¹²⁹ (~10⁻²⁴ for 29M
pairs): exact in practice. (8-byte digests, as this filter once used, made it ~2·10⁻⁵, a pair then dropped unsaid.)
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from pipeline.config import DataConfig
from pipeline.parquet import SplitWriter
from pipeline.stages.ingest.readers import Row

SCHEMA = pa.schema([("id", pa.int64()), ("src", pa.string()), ("tgt", pa.string())])
BATCH = 8192  # rows filtered at a time (65536 peaked ~90 MB higher at 10x, no faster)
DIGEST = np.dtype("S16")  # a pair's 128-bit digest as 16 raw bytes
IN_MEMORY = 1 << 21  # digests held in memory (32 MB) before they go to disk as one sorted run
BLOCK = 512  # digests per block read from a spilled run (8 KB)
BLOOM_BITS, BLOOM_HASHES = 12, 8  # per spilled digest; ~0.3 % of new digests then read a block from disk


class _Run(NamedTuple):
    """Digests as two aligned uint64 arrays (their first and last 8 bytes), sorted by `high`: numpy's radix sort
    and binary search on a uint64 key, twice as fast as on 16-byte strings. Digests of equal `high` (different
    pairs equal in 64 bits: ~2·10⁻⁵ at 29M pairs) sit side by side in any order; `_members` looks at them all."""

    high: np.ndarray
    low: np.ndarray

    @staticmethod
    def of(digests: np.ndarray) -> _Run:
        halves = np.ascontiguousarray(digests).view("<u8").reshape(-1, 2)  # (N, 2)
        return _Run(halves[:, 0].copy(), halves[:, 1].copy())

    def __len__(self) -> int:
        return len(self.high)

    def take(self, index: np.ndarray) -> _Run:
        return _Run(self.high[index], self.low[index])


class SeenPairs:
    """An exact set of 128-bit digests (DIGEST) in bounded memory. The newest digests are held in sorted numpy runs
    merged like a binary counter (each run at least twice the next one's size); when they reach `in_memory` digests
    they are merged into one sorted run that goes to a temporary file in `spill_dir`, of which memory keeps a Bloom
    filter (`bloom_bits` bits per digest) and every `block`-th digest: a digest the filter lets through (a member,
    or ~0.3 % of the others) is looked up in its one block on disk. 16 bytes per digest up to `in_memory`, then
    `bloom_bits`/8 bytes per digest (1.5: 41 MB more at 29M)."""

    def __init__(self, spill_dir: Path | None = None, in_memory: int = IN_MEMORY, block: int = BLOCK,
                 bloom_bits: int = BLOOM_BITS) -> None:
        self.spill_dir, self.in_memory, self.block, self.bloom_bits = spill_dir, in_memory, block, bloom_bits
        self.runs: list[_Run] = []
        self.spilled: list[_SpilledRun] = []
        self.file: BinaryIO | None = None  # the spilled runs, one after another (unlinked: gone when closed)

    def first_seen(self, digests: np.ndarray) -> np.ndarray:
        """Per digest (DIGEST, in order): True where neither an earlier call nor an earlier element had it; adds them."""
        run = _Run.of(digests)
        order = np.lexsort((run.low, run.high))  # stable: the first of equal digests leads its group
        ordered = run.take(order)
        starts = np.ones(len(order), dtype=bool)
        starts[1:] = (np.diff(ordered.high) != 0) | (np.diff(ordered.low) != 0)
        distinct, first = ordered.take(starts), order[starts]  # sorted (so searches go left to right)
        new = np.ones(len(distinct), dtype=bool)
        for held in self.runs:
            new &= ~_members(held, distinct)
        for spilled in self.spilled:
            candidates = np.flatnonzero(new)
            new[candidates] = ~spilled.contains(distinct.take(candidates))
        if new.any():
            self.runs.append(distinct.take(new))
        fresh = np.zeros(len(digests), dtype=bool)
        fresh[first[new]] = True
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
    """A sorted run of digests in `file` at the end it had (high and low interleaved): a Bloom filter and every
    `block`-th digest's `high` in memory."""

    def __init__(self, run: _Run, file: BinaryIO, block: int, bloom_bits: int) -> None:
        self.offset = file.seek(0, os.SEEK_END)
        file.write(np.column_stack([run.high, run.low]).data)  # (N, 2)
        file.flush()
        self.fd, self.size, self.block = file.fileno(), len(run), block
        self.fence = run.high[::block].copy()  # the first digest of each block
        self.bloom = _Bloom(run.low, bloom_bits)

    def _read(self, first: int, count: int) -> _Run:
        stored = np.frombuffer(os.pread(self.fd, 16 * count, self.offset + 16 * first), dtype="<u8").reshape(-1, 2)
        return _Run(stored[:, 0].copy(), stored[:, 1].copy())

    def contains(self, digests: _Run) -> np.ndarray:
        """Per digest: whether the run has it (read from disk only where the Bloom filter cannot rule it out)."""
        found = np.zeros(len(digests), dtype=bool)
        maybe = np.flatnonzero(self.bloom.might_contain(digests.low))
        blocks = np.searchsorted(self.fence, digests.high[maybe], side="right") - 1  # -1: below the run's first
        order = np.argsort(blocks, kind="stable")
        maybe, blocks = maybe[order], blocks[order]
        starts = np.flatnonzero(np.diff(blocks, prepend=-2))
        for start, end in zip(starts, [*starts[1:], len(blocks)]):
            if blocks[start] < 0:
                continue
            first = int(blocks[start]) * self.block
            stored = self._read(first, min(self.block, self.size - first))
            asked = digests.take(maybe[start:end])
            found[maybe[start:end]] = _members(stored, asked)
            # A block's first `high` equal to an absent digest's: digests of that `high` may begin in earlier
            # blocks (different pairs equal in 64 bits, ~never): the whole run answers for those.
            unsure = (asked.high == stored.high[0]) & ~found[maybe[start:end]]
            if unsure.any() and first > 0:
                found[maybe[start:end][unsure]] = _members(self._read(0, self.size), asked.take(unsure))
        return found


class _Bloom:
    """A Bloom filter over uniform 64-bit keys (a digest's `low`): BLOOM_HASHES positions by double hashing of the
    key's two 32-bit halves; no false negatives."""

    def __init__(self, keys: np.ndarray, bits_per_key: int) -> None:
        self.bits = max(8, bits_per_key * len(keys))  # under 2**32, so `_positions` cannot overflow
        self.bytes = np.zeros(-(-self.bits // 8), dtype=np.uint8)
        for start in range(0, len(keys), 1 << 16):  # in slices: the temporaries stay small
            for position in self._positions(keys[start:start + (1 << 16)]):
                for bit in range(8):  # one bit per pass, so an index given twice sets the same bit twice
                    self.bytes[position[position & 7 == bit] >> 3] |= np.uint8(1 << bit)

    def might_contain(self, keys: np.ndarray) -> np.ndarray:
        """False where the key is certainly not in the filter."""
        maybe = np.arange(len(keys))
        for position in self._positions(keys):
            position = position[maybe]
            maybe = maybe[(self.bytes[position >> 3] >> (position & 7)) & 1 == 1]  # later hashes test fewer
        result = np.zeros(len(keys), dtype=bool)
        result[maybe] = True
        return result

    def _positions(self, keys: np.ndarray) -> Iterator[np.ndarray]:
        low, high = keys & 0xFFFFFFFF, keys >> 32
        for i in range(BLOOM_HASHES):
            yield (((low + i * high) & 0xFFFFFFFF) * self.bits) >> 32  # onto [0, bits)


def _members(run: _Run, digests: _Run) -> np.ndarray:
    """Per digest: whether the `run` (sorted by high) has it: the first of its `high`, or (64-bit twins) a later one."""
    if len(run) == 0:
        return np.zeros(len(digests), dtype=bool)
    at = np.searchsorted(run.high, digests.high)
    near = np.minimum(at, len(run) - 1)
    same_high = run.high[near] == digests.high
    found = same_high & (run.low[near] == digests.low)
    for i in np.flatnonzero(same_high & ~found):  # different pairs equal in 64 bits: every digest of that high
        stop = np.searchsorted(run.high, digests.high[i], side="right")
        found[i] = bool((run.low[at[i]:stop] == digests.low[i]).any())
    return found


def _merge(first: _Run, second: _Run) -> _Run:
    """Two sorted runs as one (a stable radix sort of the uint64 key)."""
    merged = _Run(np.concatenate([first.high, second.high]), np.concatenate([first.low, second.low]))
    return merged.take(np.argsort(merged.high, kind="stable"))


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


def pair_digest(src: str, tgt: str) -> bytes:
    """The pair's 16-byte BLAKE2b digest, of its source's length, source and target: a tab (or any text) in one side
    cannot make it another pair's."""
    return hashlib.blake2b(f"{len(src)}:{src}{tgt}".encode("utf-8"), digest_size=DIGEST.itemsize).digest()


def _flag_repeats(pairs: list[tuple[int, str, str]], flags: list[str], seen: SeenPairs) -> None:
    """Flag `duplicate` the pairs not flagged otherwise whose text an earlier such pair had."""
    candidates = [i for i, flag in enumerate(flags) if not flag]
    if not candidates:
        return
    digests = np.frombuffer(b"".join(pair_digest(pairs[i][1], pairs[i][2]) for i in candidates), dtype=DIGEST)
    for i, fresh in zip(candidates, seen.first_seen(digests)):
        if not fresh:
            flags[i] = "duplicate"
