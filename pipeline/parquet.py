"""The on-disk layout of a split, shared by every stage that writes or reads one.

A split is a directory of `part-NNNNN.parquet` files of at most ROWS_PER_FILE rows each, numbered in
row order, so reading the files in name order gives the rows back in the order they were written. An
empty split still gets one (empty) file, which carries the schema. This module imports no stage.
"""
from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROWS_PER_FILE = 4096  # several files per split let Ray Data read them in parallel downstream
SHARD_PIECES = 64  # pieces per rank in `shard_ranges`


def write_split(table: pa.Table, out_dir: Path) -> None:
    """Write `table` into the new directory `out_dir` as `part-NNNNN.parquet` files, rows in order."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True)
    for index, start in enumerate(range(0, max(table.num_rows, 1), ROWS_PER_FILE)):
        write_file(table.slice(start, ROWS_PER_FILE), out_dir / f"part-{index:05d}.parquet")


def write_file(table: pa.Table, path: Path) -> None:
    """`pq.write_table`, whose OSError (a full disk, ...) names no file: re-raised naming `path`."""
    try:
        pq.write_table(table, path)
    except OSError as error:
        if error.filename is not None or not error.errno:
            raise
        raise OSError(error.errno, os.strerror(error.errno), str(path)) from error


class SplitWriter:
    """A split written as it comes: `write` takes tables (or `write_rows` columns of Python values) in row
    order and writes each `part-NNNNN.parquet` as soon as ROWS_PER_FILE rows are there, so at most one file's
    rows are held; `close` writes the rest (or the one empty file). The files are byte for byte those of
    `write_split` of the whole table (tests/pipeline/test_parquet.py); ingest and tokenize write their splits so."""

    def __init__(self, out_dir: Path, schema: pa.Schema) -> None:
        self.out_dir, self.schema = Path(out_dir), schema
        self.out_dir.mkdir(parents=True)
        self.pending: list[pa.Table] = []
        self.rows = self.files = 0

    def write_rows(self, columns: dict[str, list]) -> None:
        self.write(pa.table({name: pa.array(columns[name], field.type) for name, field in
                             zip(self.schema.names, self.schema)}, schema=self.schema))

    def write(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.rows += table.num_rows
        if self.rows >= ROWS_PER_FILE:
            whole = pa.concat_tables(self.pending).combine_chunks()
            start = 0
            while whole.num_rows - start >= ROWS_PER_FILE:
                self._file(whole.slice(start, ROWS_PER_FILE))
                start += ROWS_PER_FILE
            self.pending, self.rows = [whole.slice(start)], whole.num_rows - start

    def close(self) -> None:
        if self.rows or not self.files:
            self._file(pa.concat_tables(self.pending).combine_chunks() if self.pending else self.schema.empty_table())
        self.pending, self.rows = [], 0

    def _file(self, table: pa.Table) -> None:
        write_file(table, self.out_dir / f"part-{self.files:05d}.parquet")
        self.files += 1

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is None:
            self.close()


def read_split(path: Path, schema: pa.Schema | None = None) -> pa.Table:
    """A split as one table (files in name order, which is row order).

    With no part files, `schema` gives the empty table to return; without a schema that is an error."""
    files = sorted(Path(path).glob("part-*.parquet"))
    if files:
        return pa.concat_tables([pq.read_table(f) for f in files])
    if schema is None:
        raise FileNotFoundError(f"no part-*.parquet files in {path}")
    return schema.empty_table()


def shard_ranges(rows: int, rank: int, world_size: int, pieces: int = SHARD_PIECES) -> list[tuple[int, int]]:
    """The row ranges [start, stop) of a split of `rows` rows that rank `rank` of `world_size` reads. Each rank's
    share (the shares differ by at most one row) is cut into `pieces` near-equal pieces (fewer when there are
    fewer rows), laid out in turn: piece 0 of rank 0, of rank 1, ..., piece 1 of rank 0, ... The ranks' rows are
    disjoint and cover the split, and every rank draws from all over it (a corpus concatenated from several
    sources gives each rank the same mix, so the ranks' batch counts, cut to the smallest, stay close)."""
    shares = [rows // world_size + (r < rows % world_size) for r in range(world_size)]  # the first ranks get the rest
    count = max(1, min(pieces, rows // world_size))
    ranges, start = [], 0
    for k in range(count):
        for r, share in enumerate(shares):
            stop = start + share * (k + 1) // count - share * k // count
            if r == rank and stop > start:
                ranges.append((start, stop))
            start = stop
    return ranges


def read_shard(path: Path, rank: int, world_size: int, columns: list[str] | None = None) -> pa.Table:
    """Rank `rank`'s rows of split `path` (`shard_ranges` over its rows; all of them for one rank), in row order,
    only `columns` (default: all). Only the files holding some of them are read; file sizes come from the
    Parquet footers."""
    files = sorted(Path(path).glob("part-*.parquet"))
    if not files:
        raise FileNotFoundError(f"no part-*.parquet files in {path}")
    sizes = [pq.read_metadata(file).num_rows for file in files]
    ranges = shard_ranges(sum(sizes), rank, world_size)
    pieces, first_row = [], 0
    for file, size in zip(files, sizes):
        last_row = first_row + size
        wanted = [(max(start, first_row), min(stop, last_row)) for start, stop in ranges
                  if start < last_row and stop > first_row]
        if wanted:
            table = pq.read_table(file, columns=columns)
            pieces.extend(table.slice(start - first_row, stop - start) for start, stop in wanted)
        first_row = last_row
    if pieces:
        return pa.concat_tables(pieces)
    schema = pq.read_schema(files[0])
    return schema.empty_table().select(columns if columns is not None else schema.names)
