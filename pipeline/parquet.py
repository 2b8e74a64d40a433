"""The on-disk layout of a split, shared by every stage that writes or reads one.

A split is a directory of `part-NNNNN.parquet` files of at most ROWS_PER_FILE rows each, numbered in
row order, so reading the files in name order gives the rows back in the order they were written. An
empty split still gets one (empty) file, which carries the schema. This module imports no stage.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROWS_PER_FILE = 4096  # several files per split let Ray Data read them in parallel downstream


def write_split(table: pa.Table, out_dir: Path) -> None:
    """Write `table` into the new directory `out_dir` as `part-NNNNN.parquet` files, rows in order."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True)
    for index, start in enumerate(range(0, max(table.num_rows, 1), ROWS_PER_FILE)):
        pq.write_table(table.slice(start, ROWS_PER_FILE), out_dir / f"part-{index:05d}.parquet")


def read_split(path: Path, schema: pa.Schema | None = None) -> pa.Table:
    """A split as one table (files in name order, which is row order).

    With no part files, `schema` gives the empty table to return; without a schema that is an error."""
    files = sorted(Path(path).glob("part-*.parquet"))
    if files:
        return pa.concat_tables([pq.read_table(f) for f in files])
    if schema is None:
        raise FileNotFoundError(f"no part-*.parquet files in {path}")
    return schema.empty_table()
